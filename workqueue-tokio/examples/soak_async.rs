//! Soak test: many tokio tasks hammer one async `WorkQueue` with random operations.
//!
//! ```text
//! cargo run --release -p workqueue-tokio --example soak_async -- --seconds 20
//! ```
//!
//! Options: `--seconds N` (default 10), `--threads T` (runtime worker threads, default 4),
//! `--tasks M` (default 16), `--keys K` (default 256), `--rounds R` (default one per second, at
//! least 2), `--seed S`.
//!
//! Each round, `M` tasks on a multi-thread runtime run random operations for `N / R` seconds:
//! `add`, `add_ref`, `add_after` (real delays up to 2 ms), `add_rate_limited` (per-key exponential
//! backoff from 1 µs to 1 ms), `add_batch` (including rare bursts of fresh keys that grow the
//! queue's buffers), `get().await`, `try_get`, `try_get_batch`, and gets that are cancelled: by
//! `tokio::time::timeout` with a tiny duration, or in `select!` against another `get` of the
//! same queue or against a task yield. Leases are finished every way there is (`done`,
//! `forget`, `retry`, `retry_after`, `requeue_after`, `finish`, drop), sometimes after holding
//! them across an `.await`. Then the producers stop and drain tasks blocked in plain
//! `get().await` process everything left until only two keys are tracked, under a watchdog that
//! fails the run (a lost wake-up or a leaked key shows up as a drain that never finishes).
//! Checked:
//!
//! - no key is ever held by two leases at once (a per-key flag, swapped on every lease);
//! - counts stay consistent (`tracked <= ready + processing + waiting`, processing bounded by the
//!   leases the tasks can hold);
//! - every key added is processed at least once after its last add (per key: the stamp of its
//!   last lease is later than the stamp of its last add, once drained);
//! - memory follows the live size: one key is processing (a lease held by the main task) and one
//!   waits (an hour's delay) throughout, so after each drain the queue tracks exactly those two
//!   and must give the bursts' memory back by compacting, not by emptying: `allocated_bytes()`
//!   after one more get (which finds nothing ready, and compacts) is at most 4x what a fresh queue holds with `COMPACT_MIN` keys in that shape (states
//!   under `COMPACT_MIN` live keys do not compact); and the process RSS (`VmRSS` of `/proc/self/status`)
//!   after the last drain is at most twice the RSS after the first one (a generous bound
//!   against leaks, not a measurement);
//! - the final `shut_down_with_drain().await` completes and `get().await` then returns `None`.
//!
//! It exits non-zero on any violation and prints operation counts, throughput and RSS figures.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use clap::Parser;
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout};
use workqueue_core::__private::COMPACT_MIN;
use workqueue_model::SplitMix64;
use workqueue_model::soak::{
    self, BOUND, BURST, Book, HELD, Key, MAX_BATCH, RESIDUAL, Tally, WAITING, rss_kib, show_kib,
};
use workqueue_tokio::ratelimit::ExponentialFailure;
use workqueue_tokio::{CancellationToken, Lease, Outcome, WorkQueue};

/// A round's producers must stop, and its drain must finish, within this long.
const WATCHDOG: Duration = Duration::from_secs(30);
/// RSS after the last drain may be at most this many times the RSS after the first.
const RSS_FACTOR: u64 = 2;

fn queue() -> WorkQueue<Key> {
    let limiter = ExponentialFailure::new(Duration::from_micros(1), Duration::from_millis(1));
    WorkQueue::builder().rate_limiter(limiter).build()
}

/// Adds the keys held and waiting throughout; returns the held lease.
fn hold_residual(q: &WorkQueue<Key>) -> Lease<Key> {
    q.add(Key::from(HELD));
    let held = q.try_get().expect("the held key");
    assert_eq!(&**held, HELD);
    q.add_after(Key::from(WAITING), Duration::from_secs(3600));
    held
}

/// The bytes of a fresh queue holding `n` keys in the drained shape (one processing, one
/// waiting, the rest queued).
fn fresh_bytes(n: usize) -> usize {
    let q = queue();
    let held = hold_residual(&q);
    for i in 0..n.saturating_sub(RESIDUAL) {
        q.add(Key::from(format!("fresh/{i}")));
    }
    let bytes = q.allocated_bytes();
    held.done();
    bytes
}

/// Soak test: many tokio tasks hammer one async work queue with random operations.
#[derive(Debug, Clone, Copy, Parser)]
#[command(name = "soak_async")]
struct Config {
    #[command(flatten)]
    common: soak::Args,
    /// The runtime's worker threads (at least 1).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Tasks running random operations (at least 1).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
    /// Rounds, each ending in a drain; 0: one per second, at least 2.
    #[arg(long, default_value_t = 0)]
    rounds: usize,
}

fn parse_args() -> Config {
    let mut c = Config::parse();
    c.common = c.common.normalized();
    c.threads = c.threads.max(1);
    c.tasks = c.tasks.max(1);
    if c.rounds == 0 {
        // One round per second: many drains, each checked.
        c.rounds = (c.common.seconds as usize).clamp(2, 1000);
    }
    c
}

/// Processes a lease (sometimes holding it across an `.await`) and finishes it some way.
async fn finish(book: &Book, rng: &mut SplitMix64, lease: Lease<Key>) {
    let i = book.leased(&lease);
    match rng.below(100) {
        0..10 => tokio::task::yield_now().await,
        10..12 => sleep(Duration::from_micros(rng.below(500))).await,
        _ => {
            for _ in 0..rng.below(64) {
                std::hint::spin_loop();
            }
        }
    }
    book.ledger.releasing(i);
    let us = |n| Duration::from_micros(n);
    match rng.below(100) {
        0..40 => lease.done(),
        40..55 => lease.finish(Outcome::forget()),
        55..65 => lease.finish(Outcome::retry()),
        65..75 => lease.finish(Outcome::retry_after(us(rng.below(300)))),
        75..80 => lease.finish(Outcome::requeue_after(us(rng.below(300)))),
        80..85 => lease.finish(Outcome::retry_after(Duration::ZERO)),
        _ => drop(lease),
    }
}

/// One hammering task: random operations until `stop` is cancelled.
async fn hammer(
    q: WorkQueue<Key>,
    book: Arc<Book>,
    stop: CancellationToken,
    cfg: Config,
    seed: u64,
) -> Tally {
    let mut rng = SplitMix64::new(seed);
    let mut t = Tally::default();
    let keys = cfg.common.keys as u64;
    while !stop.is_cancelled() {
        t.ops += 1;
        // Operations that do not wait never yield: let the other tasks (and the timers) run.
        if t.ops % 32 == 0 {
            tokio::task::yield_now().await;
        }
        let k = rng.below(keys) as usize;
        match rng.below(1000) {
            0..200 => {
                book.ledger.adding(k);
                q.add(book.names[k].clone());
                t.adds += 1;
            }
            200..260 => {
                book.ledger.adding(k);
                q.add_ref(&*book.names[k]);
                t.adds += 1;
            }
            260..340 => {
                book.ledger.adding(k);
                q.add_after(
                    book.names[k].clone(),
                    Duration::from_micros(rng.below(2001)),
                );
                t.adds += 1;
            }
            340..380 => {
                book.ledger.adding(k);
                q.add_rate_limited(book.names[k].clone());
                t.adds += 1;
            }
            380..405 => {
                let n = 1 + rng.below(16) as usize;
                let batch: Vec<Key> = (0..n)
                    .map(|_| {
                        let k = rng.below(keys) as usize;
                        book.ledger.adding(k);
                        book.names[k].clone()
                    })
                    .collect();
                t.adds += n as u64;
                q.add_batch(batch);
            }
            405 if rng.below(4) == 0 => {
                // A rare burst of fresh keys: grows every buffer of the queue.
                let base = cfg.common.keys;
                let batch: Vec<Key> = (base..base + BURST)
                    .map(|k| {
                        book.ledger.adding(k);
                        book.names[k].clone()
                    })
                    .collect();
                t.adds += BURST as u64;
                q.add_batch(batch);
            }
            406..600 => {
                // A plain waiting get, given up only when the round stops.
                tokio::select! {
                    lease = q.get() => {
                        if let Some(lease) = lease {
                            t.gets += 1;
                            finish(&book, &mut rng, lease).await;
                        }
                    }
                    () = stop.cancelled() => t.cancelled += 1,
                }
            }
            600..700 => {
                // A get with a tiny timeout (zero: polled once, then cancelled).
                let limit = Duration::from_micros(rng.below(4) * 500);
                match timeout(limit, q.get()).await {
                    Ok(Some(lease)) => {
                        t.gets += 1;
                        finish(&book, &mut rng, lease).await;
                    }
                    Ok(None) => {}
                    Err(_) => t.cancelled += 1,
                }
            }
            700..760 => {
                // Two gets of the same queue racing: the loser is dropped mid-wait.
                tokio::select! {
                    lease = q.get() => {
                        if let Some(lease) = lease {
                            t.gets += 1;
                            finish(&book, &mut rng, lease).await;
                        }
                    }
                    lease = q.get() => {
                        if let Some(lease) = lease {
                            t.gets += 1;
                            finish(&book, &mut rng, lease).await;
                        }
                    }
                    () = stop.cancelled() => {}
                }
                t.cancelled += 1;
            }
            760..800 => {
                // A get against a yield: cancelled after one poll unless a key is ready.
                tokio::select! {
                    biased;
                    lease = q.get() => {
                        if let Some(lease) = lease {
                            t.gets += 1;
                            finish(&book, &mut rng, lease).await;
                        }
                    }
                    () = tokio::task::yield_now() => t.cancelled += 1,
                }
            }
            800..880 => {
                if let Some(lease) = q.try_get() {
                    t.gets += 1;
                    finish(&book, &mut rng, lease).await;
                }
            }
            880..930 => {
                let leases = q.try_get_batch(1 + rng.below(MAX_BATCH as u64) as usize);
                t.gets += leases.len() as u64;
                for lease in leases {
                    finish(&book, &mut rng, lease).await;
                }
            }
            930..950 => q.forget(&book.names[k]),
            _ => {
                let c = q.counts();
                if c.tracked > c.ready + c.processing + c.waiting {
                    book.ledger
                        .violation(format_args!("counts inconsistent: {c:?}"));
                }
                if c.processing > cfg.tasks * MAX_BATCH {
                    book.ledger
                        .violation(format_args!("{} processing, too many: {c:?}", c.processing));
                }
                let _ = q.len();
            }
        }
    }
    t
}

/// Processes everything left (waiting keys included) with `workers` tasks blocked in plain
/// `get().await`, until the queue tracks only the residual keys. Returns the number of leases
/// taken.
async fn drain(q: &WorkQueue<Key>, book: &Arc<Book>, workers: usize) -> u64 {
    let done = CancellationToken::new();
    let mut set = JoinSet::new();
    for _ in 0..workers {
        let (q, book, done) = (q.clone(), book.clone(), done.clone());
        set.spawn(async move {
            let mut gets = 0u64;
            loop {
                tokio::select! {
                    lease = q.get() => match lease {
                        Some(lease) => {
                            gets += 1;
                            let i = book.leased(&lease);
                            book.ledger.releasing(i);
                            lease.finish(Outcome::forget());
                        }
                        None => break,
                    },
                    () = done.cancelled() => break,
                }
            }
            gets
        });
    }
    while q.counts().tracked != RESIDUAL {
        sleep(Duration::from_millis(1)).await;
    }
    done.cancel();
    let mut gets = 0;
    while let Some(n) = set.join_next().await {
        gets += n.expect("drain task panicked");
    }
    gets
}

async fn run(cfg: Config) -> ExitCode {
    let q = queue();
    let held = hold_residual(&q);
    let bound = BOUND * fresh_bytes(COMPACT_MIN);
    let mut bytes_after = Vec::with_capacity(cfg.rounds);
    let book = Arc::new(Book::new(cfg.common.keys, "soak_async"));
    let per_round = Duration::from_secs_f64(cfg.common.seconds / cfg.rounds as f64);
    println!(
        "soak_async: {} worker threads, {} tasks, {} keys (+{BURST} burst keys), {} rounds of {per_round:?}",
        cfg.threads, cfg.tasks, cfg.common.keys, cfg.rounds
    );

    let rss_start = rss_kib();
    let mut rss_peak = rss_start;
    let mut rss_after = Vec::with_capacity(cfg.rounds);
    let started = StdInstant::now();
    let mut total = Tally::default();
    let mut total_drained = 0;
    for round in 0..cfg.rounds {
        let stop = CancellationToken::new();
        let round_start = StdInstant::now();
        let mut set = JoinSet::new();
        for t in 0..cfg.tasks {
            let (q, book, stop) = (q.clone(), book.clone(), stop.clone());
            let seed = cfg.common.seed_of(round, t);
            set.spawn(hammer(q, book, stop, cfg, seed));
        }
        while round_start.elapsed() < per_round {
            sleep(Duration::from_millis(10)).await;
            rss_peak = rss_peak.max(rss_kib());
        }
        stop.cancel();
        let mut tally = Tally::default();
        let joined = timeout(WATCHDOG, async {
            while let Some(t) = set.join_next().await {
                tally.merge(t.expect("hammer task panicked"));
            }
        })
        .await;
        if joined.is_err() {
            eprintln!(
                "soak_async: round {round}: tasks did not stop within {WATCHDOG:?}: {:?}",
                q.counts()
            );
            return ExitCode::FAILURE;
        }
        let drained = match timeout(WATCHDOG, drain(&q, &book, cfg.tasks.min(8))).await {
            Ok(n) => n,
            Err(_) => {
                eprintln!(
                    "soak_async: round {round}: not drained after {WATCHDOG:?}: {:?}",
                    q.counts()
                );
                return ExitCode::FAILURE;
            }
        };
        tally.gets += drained;
        total_drained += drained;
        // A worker's next get finds nothing ready: the drain is over, and the queue compacts
        // there (a drain under way never settles long enough to). It hands nothing out.
        if let Some(lease) = q.try_get() {
            book.ledger.violation(format_args!(
                "round {round}: a get after the drain handed out {:?}",
                lease.key()
            ));
        }
        let bytes = q.allocated_bytes();
        bytes_after.push(bytes);
        book.check_drained(round, q.counts(), bytes, bound);
        // Every key was processed after its last add, and none is still held.
        let context = format!("round {round}: ");
        book.ledger.check_processed(&context);
        book.ledger.check_released(&context);
        let rss = rss_kib();
        rss_after.push(rss);
        let secs = round_start.elapsed().as_secs_f64();
        println!(
            "soak_async: round {round}: {} ops ({:.0} ops/s), {} adds, {} gets ({drained} in the drain), {} cancelled gets, RSS after drain {}",
            tally.ops,
            tally.ops as f64 / secs,
            tally.adds,
            tally.gets,
            tally.cancelled,
            show_kib(rss),
        );
        total.merge(tally);
    }
    let secs = started.elapsed().as_secs_f64();

    // Shutdown: the drain completes (no lease is outstanding once the held one is done) and
    // getters then see `None`.
    let compactions = q.compactions();
    held.done();
    if timeout(WATCHDOG, q.shut_down_with_drain()).await.is_err() {
        book.ledger.violation(format_args!(
            "shut_down_with_drain did not finish: {:?}",
            q.counts()
        ));
    }
    match timeout(WATCHDOG, q.get()).await {
        Ok(None) => {}
        Ok(Some(lease)) => {
            book.ledger
                .violation(format_args!("get after shutdown returned {:?}", &*lease));
            lease.done();
        }
        Err(_) => book
            .ledger
            .violation(format_args!("get after shutdown did not return")),
    }

    // Memory is flat: the last drain leaves at most RSS_FACTOR times what the first one left.
    let (first, last) = (rss_after[0], rss_after[rss_after.len() - 1]);
    if let (Some(first), Some(last)) = (first, last)
        && last > first * RSS_FACTOR
    {
        book.ledger.violation(format_args!(
            "RSS grows: {first} KiB after the first drain, {last} KiB after the last"
        ));
    }

    let violations = book.ledger.violations();
    println!(
        "soak_async: {} ops in {secs:.1} s ({:.0} ops/s), {} rounds, {} tasks on {} threads: {} adds, {} gets ({total_drained} in drains), {} cancelled gets",
        total.ops,
        total.ops as f64 / secs,
        cfg.rounds,
        cfg.tasks,
        cfg.threads,
        total.adds,
        total.gets,
        total.cancelled,
    );
    println!(
        "soak_async: allocated_bytes after each drain {bytes_after:?} (bound {bound}), {compactions} compactions"
    );
    let after: Vec<String> = rss_after.iter().map(|r| show_kib(*r)).collect();
    println!(
        "soak_async: RSS start {}, peak {}, after first drain {}, after last drain {} (bound {RSS_FACTOR}x); after each drain [{}]",
        show_kib(rss_start),
        show_kib(rss_peak),
        show_kib(first),
        show_kib(last),
        after.join(", "),
    );
    if violations > 0 {
        eprintln!("soak_async: FAILED with {violations} violation(s)");
        ExitCode::FAILURE
    } else {
        println!(
            "soak_async: OK (no key held twice, counts consistent, every add processed, drained every round, memory within the bound after every drain)"
        );
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    let cfg = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(run(cfg));
    // A task stuck past the watchdog must not keep the process alive.
    rt.shutdown_background();
    code
}
