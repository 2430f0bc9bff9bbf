//! The runner on a real multi-thread runtime (one key, one worker: no timing assertions, only a
//! watchdog against hangs), and its cooperation with the runtime (a busy runner does not
//! starve its siblings).
//!
//! Time-dependent tests run on tokio's paused clock.

mod common;
mod runner_support;

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use common::{ms, secs, within};
use runner_support::*;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_model::{Ledger, SplitMix64};
use workqueue_ratelimit::ExponentialFailure;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Failure, Report, Runner};

// ---- exclusivity on a real multi-thread runtime -------------------------------------------------

fn mix(x: u64) -> u64 {
    SplitMix64::new(x).next_u64()
}

/// 8 workers on a 4-thread runtime, producers adding a random workload (seeded splitmix64),
/// reconciles that yield and sometimes fail (retried with backoff, at once, or given up): the
/// same key is never reconciled by two workers at once, and every key added is reconciled at
/// least once after its last add. No timing assertions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_never_reconciled_by_two_workers_at_once() {
    const KEYS: usize = 48;
    const PRODUCERS: u64 = 4;
    const ADDS_PER_PRODUCER: usize = 1_500;
    const SEED: u64 = 0x00c0_ffee;

    let queue: WorkQueue<usize> = WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(Duration::from_micros(1), ms(1)))
        .build();
    // A reconcile holds its key from start to end; every add is stamped before the queue call.
    let ledger = Arc::new(Ledger::new(KEYS, "runner"));
    let reconciles: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let calls = Arc::new(AtomicU64::new(0));

    let reconcile = {
        let (ledger, reconciles, calls) = (ledger.clone(), reconciles.clone(), calls.clone());
        move |key: usize, _ctx: Context| {
            let (ledger, reconciles) = (ledger.clone(), reconciles.clone());
            let mut rng = SplitMix64::new(mix(SEED ^ calls.fetch_add(1, SeqCst)));
            async move {
                ledger.leased(key);
                reconciles[key].fetch_add(1, SeqCst);
                for _ in 0..rng.below(4) {
                    tokio::task::yield_now().await;
                }
                let fail = rng.below(5) == 0;
                ledger.releasing(key);
                if fail {
                    Err(key)
                } else {
                    Ok(Action::await_change())
                }
            }
        }
    };
    let policy = |key: &usize, _: &Failure<usize>, ctx: &Context| match key % 3 {
        0 => Action::backoff(),
        1 => Action::requeue(Duration::ZERO),
        _ if ctx.rate_limited_retries() >= 2 => Action::await_change(),
        _ => Action::backoff(),
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(8)
        .error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    let mut producers = tokio::task::JoinSet::new();
    for id in 0..PRODUCERS {
        let (q, ledger) = (queue.clone(), ledger.clone());
        producers.spawn(async move {
            let mut rng = SplitMix64::new(mix(SEED + id));
            for _ in 0..ADDS_PER_PRODUCER {
                let key = rng.below(KEYS as u64) as usize;
                ledger.adding(key);
                if rng.below(4) == 0 {
                    q.add_after(key, Duration::ZERO);
                } else {
                    q.add(key);
                }
                if rng.below(3) == 0 {
                    tokio::task::yield_now().await;
                }
            }
        });
    }

    let report = tokio::time::timeout(secs(30), async {
        producers.join_all().await;
        queue.shut_down();
        within(handle).await.unwrap()
    })
    .await
    .expect("the runner hung");

    assert_eq!(
        ledger.check_processed(""),
        0,
        "keys not reconciled after their last add (see stderr)"
    );
    assert_eq!(
        ledger.violations(),
        0,
        "a key was reconciled by two workers at once (see stderr)"
    );
    assert!(reconciles.iter().all(|n| n.load(SeqCst) >= 1));
    assert_eq!(report.panics, 0);
    assert_eq!(report.timeouts + report.interrupted, 0);
    assert_eq!(
        report.processed + report.errors,
        calls.load(SeqCst),
        "every reconcile is accounted for: {report:?}"
    );
    assert_eq!(report.errors, report.retried + report.given_up);
    assert_eq!(report.still_queued, 0);
    let counts = queue.counts();
    assert_eq!((counts.ready, counts.processing), (0, 0));
}

// ---- cooperation with the runtime ---------------------------------------------------------------

/// A bound on reconciles before a starved sibling task (the test body) gets to run: tokio's
/// cooperative budget is 128 operations per poll.
const SIBLING_WITHIN: u64 = 1_000;

/// A runner that never yields would never let the test body run again, so the reconciles of these
/// tests stop the run themselves (shut the queue down) after this many: such a runner then fails
/// the assertions instead of hanging the test.
const VALVE: u64 = 20_000;

/// Counts a reconcile; shuts `queue` down at the `VALVE`-th.
fn count_reconcile<K: Hash + Eq + Clone + Send + Sync + 'static>(
    reconciles: &AtomicU64,
    queue: &WorkQueue<K>,
) {
    if reconciles.fetch_add(1, SeqCst) + 1 == VALVE {
        queue.shut_down();
    }
}

/// Spawns `run` on the test's current-thread runtime, waits until it reconciles, and checks that
/// the test body, a sibling task, is served again within `SIBLING_WITHIN` reconciles.
async fn spawn_and_check_a_sibling_is_served<F>(
    run: F,
    reconciles: &AtomicU64,
) -> tokio::task::JoinHandle<Report>
where
    F: std::future::Future<Output = Report> + Send + 'static,
{
    let handle = tokio::spawn(run);
    while reconciles.load(SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    tokio::task::yield_now().await;
    let served_after = reconciles.load(SeqCst);
    assert!(
        served_after < SIBLING_WITHIN,
        "the sibling task ran only after {served_after} reconciles"
    );
    handle
}

/// Cancels `stop` from the test body and checks that the runner stops within `SIBLING_WITHIN`
/// further reconciles.
async fn cancel_and_check_the_runner_stops(
    handle: tokio::task::JoinHandle<Report>,
    stop: &CancellationToken,
    reconciles: &AtomicU64,
) -> Report {
    stop.cancel();
    let cancelled_at = reconciles.load(SeqCst);
    let report = within(handle).await.unwrap();
    let after_cancel = reconciles.load(SeqCst) - cancelled_at;
    assert!(
        after_cancel < SIBLING_WITHIN,
        "the runner went on for {after_cancel} reconciles after the token was cancelled"
    );
    report
}

/// `RequeueAfter(Duration::ZERO)` is a rate-limited requeue without forget (controller-runtime's
/// `Requeue: true`), not an unthrottled loop on one key: the key's runs back off (5 ms, 10 ms,
/// 20 ms) and keep their failure count, the runtime serves a sibling task, and cancelling the
/// token stops the runner. Each run counts as processed (a success).
#[tokio::test(start_paused = true)]
async fn requeue_after_zero_is_a_rate_limited_requeue_and_does_not_starve_the_runtime() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconciles = Arc::new(AtomicU64::new(0));
    let reconcile = {
        let (log, reconciles, q) = (log.clone(), reconciles.clone(), queue.clone());
        move |key: Key, ctx: Context| {
            count_reconcile(&reconciles, &q);
            log.record(key, &ctx);
            std::future::ready(Ok::<_, &'static str>(Action::requeue(Duration::ZERO)))
        }
    };
    let stop = CancellationToken::new();
    queue.add("k");
    let runner = Runner::new(queue.clone(), reconcile).run(stop.clone());
    let handle = spawn_and_check_a_sibling_is_served(runner, &reconciles).await;
    sleep(ms(40)).await;
    let report = cancel_and_check_the_runner_stops(handle, &stop, &reconciles).await;
    assert_eq!(log.len(), 4, "runs in 40 ms");
    assert_eq!(
        log.get(),
        [
            run("k", ms(0), 0),
            run("k", ms(5), 1),
            run("k", ms(15), 2),
            run("k", ms(35), 3),
        ],
        "RequeueAfter(0) requeues with the limiter's backoff, without forgetting"
    );
    assert_eq!(queue.num_requeues(&"k"), 4);
    assert_report(&report, (4, 0, 0, 0), (0, 0, 0, 0));
}

/// A source that keeps every worker busy (10,000 ready keys, a reconcile that returns without
/// awaiting, one worker) does not starve the runtime: the queue's `get` takes part in tokio's
/// cooperative budget, so the worker yields, a sibling task is served, and cancelling the token
/// stops the runner.
#[tokio::test(start_paused = true)]
async fn a_busy_runner_does_not_starve_the_runtime() {
    const KEYS: u32 = 10_000;
    let queue: WorkQueue<u32> = WorkQueue::new();
    for key in 0..KEYS {
        queue.add(key);
    }
    let reconciles = Arc::new(AtomicU64::new(0));
    let reconcile = {
        let (reconciles, q) = (reconciles.clone(), queue.clone());
        move |_key: u32, _ctx: Context| {
            count_reconcile(&reconciles, &q);
            std::future::ready(Ok::<_, &'static str>(Action::await_change()))
        }
    };
    let stop = CancellationToken::new();
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(1)
        .run(stop.clone());
    let handle = spawn_and_check_a_sibling_is_served(runner, &reconciles).await;
    let report = cancel_and_check_the_runner_stops(handle, &stop, &reconciles).await;
    assert_eq!(report.processed, reconciles.load(SeqCst));
    assert_eq!(
        report.still_queued as u64,
        u64::from(KEYS) - report.processed,
        "{report:?}"
    );
}

/// A reconcile that computes before its first `.await` holds only its own job: on a runtime of
/// two threads, while its first poll runs (it waits, computing, until every other key has been
/// reconciled, for at most 10 s), the other 50 keys are handed out and reconciled through the
/// three other slots. Both with the runner awaited outside the runtime's threads (`block_on`, as
/// under `#[tokio::main]`) and as a task on them.
#[test]
fn a_reconcile_computing_before_its_first_await_holds_only_itself() {
    for spawned in [false, true] {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let queue: WorkQueue<u32> = WorkQueue::new();
        queue.add_batch(0..=50);
        queue.shut_down();
        let others = Arc::new(AtomicU32::new(0));
        let saw = Arc::new(AtomicU32::new(0));
        let reconcile = {
            let (others, saw) = (others.clone(), saw.clone());
            move |key: u32, _ctx: Context| {
                let (others, saw) = (others.clone(), saw.clone());
                async move {
                    if key == 0 {
                        let computing = std::time::Instant::now();
                        while others.load(SeqCst) < 50 && computing.elapsed() < secs(10) {
                            std::hint::spin_loop();
                        }
                        saw.store(others.load(SeqCst), SeqCst);
                    } else {
                        others.fetch_add(1, SeqCst);
                    }
                    Ok::<_, ()>(Action::await_change())
                }
            }
        };
        let runner = Runner::new(queue, reconcile).workers(4);
        let report = runtime.block_on(async move {
            if spawned {
                tokio::spawn(runner.run(CancellationToken::new()))
                    .await
                    .unwrap()
            } else {
                runner.run(CancellationToken::new()).await
            }
        });
        assert_eq!(report.processed, 51, "spawned {spawned}");
        assert_eq!(
            saw.load(SeqCst),
            50,
            "spawned {spawned}: the others were reconciled while the first computed"
        );
    }
}
