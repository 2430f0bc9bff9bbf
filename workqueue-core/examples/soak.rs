//! Soak test: many threads hammer one blocking `WorkQueue` with random operations.
//!
//! ```text
//! cargo run --release -p workqueue-core --example soak -- --seconds 20 --threads 4
//! ```
//!
//! Options: `--seconds N` (default 10), `--threads T` (default 4), `--keys K` (default 256),
//! `--rounds R` (default 4), `--seed S`, `--named` (a named queue: keeps per-key timing for
//! metrics as well).
//!
//! Each round, `T` threads run random operations for `N / R` seconds: `add`, `add_ref`,
//! `add_after` (up to 500 µs), `add_rate_limited`, `add_batch` (including bursts of fresh keys that
//! grow the queue's buffers), `get_timeout`/`try_get`/`try_get_batch`, and every way to finish a
//! lease (`done`, `forget`, `retry`, `retry_after`, `requeue_after`, `finish`, drop). Then the
//! round drains the queue. Checked:
//!
//! - no key is ever held by two leases at once (a per-key flag, swapped on every lease);
//! - counts stay consistent (`tracked <= ready + processing + waiting`, processing bounded by the
//!   leases the threads can hold);
//! - every key added is processed at least once after its last add (per key: the stamp of its
//!   last lease is later than the stamp of its last add, once drained);
//! - memory follows the live size: one key is processing (a lease the main thread holds) and one
//!   waits (an hour's delay) throughout, so a drain leaves two keys and the queue must give the
//!   bursts' memory back by compacting, not by emptying. After every drain and one more get
//!   (which finds nothing ready, and compacts: see the `state` module docs), `allocated_bytes()`
//!   is at most 4x what a fresh queue of the same configuration holds with `COMPACT_MIN` keys
//!   in that shape (states under `COMPACT_MIN` live keys do not compact), and stays flat:
//!   never above twice what the first drain left, however large the bursts made the queue.
//!
//! It exits non-zero on any violation and prints operation counts and throughput.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant as StdInstant};

use clap::Parser;
use workqueue_core::__private::COMPACT_MIN;
use workqueue_core::ratelimit::{ExponentialFailure, MaxPair, TokenBucket};
use workqueue_core::{Builder, Lease, Outcome, WorkQueue};
use workqueue_model::SplitMix64;
use workqueue_model::soak::{
    self, BOUND, BURST, Book, HELD, Key, MAX_BATCH, RESIDUAL, Tally, WAITING, rss_kib, show_kib,
};

/// Soak test: many threads hammer one blocking work queue with random operations.
#[derive(Debug, Clone, Copy, Parser)]
#[command(name = "soak")]
struct Config {
    #[command(flatten)]
    common: soak::Args,
    /// Threads running random operations (at least 1).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Rounds, each ending in a drain (at least 1).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// A named queue: keeps per-key timing for metrics as well.
    #[arg(long)]
    named: bool,
}

fn parse_args() -> Config {
    let mut c = Config::parse();
    c.common = c.common.normalized();
    c.threads = c.threads.max(1);
    c.rounds = c.rounds.max(1);
    c
}

fn finish(book: &Book, rng: &mut SplitMix64, lease: Lease<Key>) {
    let i = book.leased(&lease);
    // A little "work".
    for _ in 0..rng.below(64) {
        std::hint::spin_loop();
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

fn worker(
    q: WorkQueue<Key>,
    book: Arc<Book>,
    stop: Arc<AtomicBool>,
    cfg: Config,
    seed: u64,
) -> Tally {
    let mut rng = SplitMix64::new(seed);
    let mut t = Tally::default();
    let keys = cfg.common.keys as u64;
    while !stop.load(Relaxed) {
        t.ops += 1;
        let k = rng.below(keys) as usize;
        match rng.below(1000) {
            0..250 => {
                book.ledger.adding(k);
                q.add(book.names[k].clone());
                t.adds += 1;
            }
            250..330 => {
                book.ledger.adding(k);
                q.add_ref(&*book.names[k]);
                t.adds += 1;
            }
            330..420 => {
                book.ledger.adding(k);
                q.add_after(book.names[k].clone(), Duration::from_micros(rng.below(500)));
                t.adds += 1;
            }
            420..460 => {
                book.ledger.adding(k);
                q.add_rate_limited(book.names[k].clone());
                t.adds += 1;
            }
            460..490 => {
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
            490..492 => {
                // A burst of fresh keys: grows every buffer of the queue.
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
            492..800 => {
                if let Some(lease) = q.get_timeout(Duration::from_millis(1)) {
                    t.gets += 1;
                    finish(&book, &mut rng, lease);
                }
            }
            800..880 => {
                if let Some(lease) = q.try_get() {
                    t.gets += 1;
                    finish(&book, &mut rng, lease);
                }
            }
            880..940 => {
                let leases = q.try_get_batch(1 + rng.below(MAX_BATCH as u64) as usize);
                t.gets += leases.len() as u64;
                for lease in leases {
                    finish(&book, &mut rng, lease);
                }
            }
            940..960 => q.forget(&book.names[k]),
            _ => {
                let c = q.counts();
                if c.tracked > c.ready + c.processing + c.waiting {
                    book.ledger
                        .violation(format_args!("counts inconsistent: {c:?}"));
                }
                if c.processing > cfg.threads * MAX_BATCH {
                    book.ledger
                        .violation(format_args!("{} processing, too many: {c:?}", c.processing));
                }
                let _ = q.len();
            }
        }
    }
    t
}

/// Adds the keys held and waiting throughout; returns the held lease.
fn hold_residual(q: &WorkQueue<Key>) -> Lease<Key> {
    q.add(Key::from(HELD));
    let held = q.try_get().expect("the held key");
    assert_eq!(&**held, HELD);
    q.add_after(Key::from(WAITING), Duration::from_secs(3600));
    held
}

/// The bytes of a fresh queue of this configuration holding `n` keys in the drained shape (one
/// processing, one waiting, the rest queued).
fn fresh_bytes(cfg: &Config, n: usize) -> usize {
    let q = builder(cfg).build();
    let held = hold_residual(&q);
    for i in 0..n.saturating_sub(RESIDUAL) {
        q.add(Key::from(format!("fresh/{i}")));
    }
    let bytes = q.allocated_bytes();
    held.done();
    bytes
}

fn builder(cfg: &Config) -> Builder<Key> {
    let limiter = MaxPair::new(
        ExponentialFailure::new(Duration::from_micros(50), Duration::from_millis(5)),
        TokenBucket::new(200_000.0, 1_000).expect("valid bucket"),
    );
    let builder = WorkQueue::builder().rate_limiter(limiter);
    if cfg.named {
        builder.name("soak")
    } else {
        builder
    }
}

/// Processes everything left (waiting keys included) until the queue tracks only the residual
/// keys.
fn drain(q: &WorkQueue<Key>, book: &Book, limit: Duration) -> Result<u64, String> {
    let start = StdInstant::now();
    let mut gets = 0;
    loop {
        let c = q.counts();
        if c.tracked == RESIDUAL {
            return Ok(gets);
        }
        if start.elapsed() > limit {
            return Err(format!("not drained after {limit:?}: {c:?}"));
        }
        if let Some(lease) = q.get_timeout(Duration::from_millis(20)) {
            gets += 1;
            let i = book.leased(&lease);
            book.ledger.releasing(i);
            lease.finish(Outcome::forget());
        }
    }
}

fn main() -> ExitCode {
    let cfg = parse_args();
    let q: WorkQueue<Key> = builder(&cfg).build();
    let held = hold_residual(&q);
    let bound = BOUND * fresh_bytes(&cfg, COMPACT_MIN);
    let book = Arc::new(Book::new(cfg.common.keys, "soak"));
    let per_round = Duration::from_secs_f64(cfg.common.seconds / cfg.rounds as f64);
    println!(
        "soak: {} threads, {} keys (+{BURST} burst keys), {} rounds of {per_round:?}, {} queue",
        cfg.threads,
        cfg.common.keys,
        cfg.rounds,
        if cfg.named { "named" } else { "unnamed" }
    );

    let idle_bytes = q.allocated_bytes();
    let rss_start = rss_kib();
    let started = StdInstant::now();
    let mut total = Tally::default();
    let mut peak_bytes = idle_bytes;
    let mut after_drain = Vec::new();
    for round in 0..cfg.rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let round_start = StdInstant::now();
        let handles: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let (q, book, stop) = (q.clone(), book.clone(), stop.clone());
                let seed = cfg.common.seed_of(round, t);
                thread::spawn(move || worker(q, book, stop, cfg, seed))
            })
            .collect();
        while round_start.elapsed() < per_round {
            thread::sleep(Duration::from_millis(10));
            peak_bytes = peak_bytes.max(q.allocated_bytes());
        }
        stop.store(true, Relaxed);
        let mut round_tally = Tally::default();
        for h in handles {
            round_tally.merge(h.join().expect("worker panicked"));
        }
        let drained = match drain(&q, &book, Duration::from_secs(30)) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("soak: round {round}: {e}");
                return ExitCode::FAILURE;
            }
        };
        round_tally.gets += drained;
        // A worker's next get finds nothing ready: the drain is over, and the queue compacts
        // there (a drain under way never settles long enough to). It hands nothing out.
        if let Some(lease) = q.try_get() {
            book.ledger.violation(format_args!(
                "round {round}: a get after the drain handed out {:?}",
                lease.key()
            ));
        }
        // Every key was processed after its last add.
        book.ledger.check_processed("");
        let bytes = q.allocated_bytes();
        after_drain.push(bytes);
        book.check_drained(round, q.counts(), bytes, bound);
        let secs = round_start.elapsed().as_secs_f64();
        println!(
            "soak: round {round}: {} ops ({:.0} ops/s), {} adds, {} gets ({drained} in the drain), allocated_bytes after drain {bytes}",
            round_tally.ops,
            round_tally.ops as f64 / secs,
            round_tally.adds,
            round_tally.gets,
        );
        total.merge(round_tally);
    }
    let secs = started.elapsed().as_secs_f64();
    let rss_end = rss_kib();

    // Memory is flat too: no drain leaves more than twice what the first did, whatever the
    // bursts did. (Not necessarily the same number each time: the residual keys keep the queue
    // from emptying, and what a compaction keeps depends on the round's slots and buffers.)
    let first = after_drain[0];
    if after_drain.iter().any(|&b| b > 2 * first.max(16 * 1024)) {
        book.ledger.violation(format_args!(
            "allocated_bytes after drains grows: {after_drain:?}"
        ));
    }
    let compactions = q.compactions();
    held.done();
    q.shut_down_with_drain();
    let violations = book.ledger.violations();
    println!(
        "soak: {} ops in {secs:.1} s ({:.0} ops/s) on {} threads: {} adds, {} gets",
        total.ops,
        total.ops as f64 / secs,
        cfg.threads,
        total.adds,
        total.gets
    );
    println!(
        "soak: allocated_bytes idle {idle_bytes}, peak {peak_bytes}, after each drain {after_drain:?} (bound {bound}), {compactions} compactions; RSS {} -> {}",
        show_kib(rss_start),
        show_kib(rss_end),
    );
    if violations > 0 {
        eprintln!("soak: FAILED with {violations} violation(s)");
        ExitCode::FAILURE
    } else {
        println!(
            "soak: OK (no key held twice, counts consistent, every add processed, memory within the bound after every drain)"
        );
        ExitCode::SUCCESS
    }
}
