//! The controller runner: every row of the result table (the runner module docs), panics, timeouts,
//! graceful shutdown, the report, and the "one key, one worker" property on a real multi-thread
//! runtime.
//!
//! Time-dependent tests run on tokio's paused clock: reconcile start times, retries and grace
//! periods are checked at exact virtual instants. The multi-thread test makes no timing
//! assertions (its only timeout is a generous watchdog against hangs).
//!
//! The panic tests print the reconciles' panic messages to stderr; that is expected.

mod common;

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fragile, GET_PANIC_PAUSE, max_retries, ms, secs, within};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_core::state::Counts;
use workqueue_model::{Ledger, SplitMix64};
use workqueue_ratelimit::ExponentialFailure;
use workqueue_tokio::runner::{Action, Context, Failure, Report, Runner};
use workqueue_tokio::{AddOptions, LOW_PRIORITY, WorkQueue};

type Key = &'static str;

/// A queue with client-go's per-item controller backoff: 5 ms doubling to 1000 s.
fn queue() -> WorkQueue<Key> {
    WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(ms(5), secs(1000)))
        .build()
}

/// One reconcile as the test saw it: key, virtual time since the test's start, attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    key: Key,
    at: Duration,
    attempt: u32,
}

fn run(key: Key, at: Duration, attempt: u32) -> Run {
    Run { key, at, attempt }
}

/// A shared log of reconciles (and of anything else a test records).
#[derive(Debug)]
struct Log<E> {
    start: Instant,
    entries: Arc<Mutex<Vec<E>>>,
}

impl<E> Clone for Log<E> {
    fn clone(&self) -> Self {
        Log {
            start: self.start,
            entries: self.entries.clone(),
        }
    }
}

impl<E: Clone> Log<E> {
    fn new(start: Instant) -> Self {
        Log {
            start,
            entries: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn push(&self, e: E) {
        self.entries.lock().unwrap().push(e);
    }

    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn get(&self) -> Vec<E> {
        self.entries.lock().unwrap().clone()
    }

    fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

impl Log<Run> {
    fn record(&self, key: Key, ctx: &Context) -> usize {
        let mut entries = self.entries.lock().unwrap();
        entries.push(run(key, self.start.elapsed(), ctx.rate_limited_retries()));
        entries.iter().filter(|r| r.key == key).count()
    }
}

/// Records when it is dropped (to see a reconcile's future being dropped).
struct DropProbe(Log<(Key, Duration)>, Key);

impl Drop for DropProbe {
    fn drop(&mut self) {
        self.0.push((self.1, self.0.elapsed()));
    }
}

/// A reconcile that fails its first `failures` runs of each key, then succeeds.
fn fail_first(
    log: &Log<Run>,
    failures: usize,
) -> impl Fn(Key, Context) -> std::future::Ready<Result<Action, &'static str>> + Send + Sync + 'static
{
    let log = log.clone();
    move |key, ctx| {
        let n = log.record(key, &ctx);
        std::future::ready(if n <= failures {
            Err("transient")
        } else {
            Ok(Action::await_change())
        })
    }
}

fn assert_report(
    report: &Report,
    (processed, retried, given_up, errors): (u64, u64, u64, u64),
    (panics, timeouts, interrupted, still_queued): (u64, u64, u64, usize),
) {
    let got = (
        (
            report.processed,
            report.retried,
            report.given_up,
            report.errors,
        ),
        (
            report.panics,
            report.timeouts,
            report.interrupted,
            report.still_queued,
        ),
    );
    assert_eq!(
        got,
        (
            (processed, retried, given_up, errors),
            (panics, timeouts, interrupted, still_queued)
        ),
        "((processed, retried, given_up, errors), (panics, timeouts, interrupted, still_queued)) of {report:?}"
    );
}

// ---- the result table ---------------------------------------------------------------------------

/// `Ok(Done)`: forget + done. The failure count recorded by an earlier failure goes back to 0, and
/// the key does not run again until it is added.
#[tokio::test(start_paused = true)]
async fn ok_done_forgets_the_backoff() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let runner = Runner::new(queue.clone(), fail_first(&log, 1));
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add("a");
    sleep(ms(1)).await;
    assert_eq!(queue.num_requeues(&"a"), 1, "the failure is recorded");
    sleep(secs(1)).await;
    assert_eq!(log.get(), [run("a", ms(0), 0), run("a", ms(5), 1)]);
    assert_eq!(queue.num_requeues(&"a"), 0, "Ok(Done) forgets the key");
    assert_eq!(
        queue.counts(),
        Counts::default(),
        "Ok(Done) does not requeue"
    );

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (1, 1, 0, 1), (0, 0, 0, 0));
}

/// `Ok(RequeueAfter(d))`: forget + add_after(d) + done. The backoff is reset (the requeued run's
/// attempt is 0) and the key runs again after exactly `d`.
#[tokio::test(start_paused = true)]
async fn ok_requeue_after_forgets_and_readds_after_exactly_d() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            let n = log.record(key, &ctx);
            async move {
                match n {
                    1 => Err("transient"),
                    2 => Ok(Action::requeue(secs(30))),
                    _ => Ok(Action::await_change()),
                }
            }
        }
    };
    let handle = tokio::spawn(Runner::new(queue.clone(), reconcile).run(CancellationToken::new()));

    queue.add("a");
    sleep(secs(1)).await;
    assert_eq!(queue.num_requeues(&"a"), 0, "RequeueAfter forgets the key");
    assert_eq!(
        queue.counts().waiting,
        1,
        "RequeueAfter re-adds after a delay"
    );
    sleep(secs(60)).await;
    assert_eq!(
        log.get(),
        [
            run("a", ms(0), 0),
            run("a", ms(5), 1),
            run("a", ms(5) + secs(30), 0),
        ]
    );
    assert_eq!(queue.counts(), Counts::default());

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (2, 1, 0, 1), (0, 0, 0, 0));
}

/// `Err` with the default policy: a rate-limited retry. With `ExponentialFailure(5 ms, 1000 s)`
/// the retries come 5 ms, then 10 ms, then 20 ms after the failures, at exact virtual times, and
/// each run sees its attempt number.
#[tokio::test(start_paused = true)]
async fn err_retries_with_exponential_backoff() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let runner = Runner::new(queue.clone(), fail_first(&log, 3));
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add("a");
    sleep(secs(1)).await;
    assert_eq!(
        log.get(),
        [
            run("a", ms(0), 0),
            run("a", ms(5), 1),
            run("a", ms(15), 2),
            run("a", ms(35), 3),
        ]
    );
    assert_eq!(queue.num_requeues(&"a"), 0);

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (1, 3, 0, 3), (0, 0, 0, 0));
}

/// `Action::requeue(d)` from a policy: re-added after exactly `d`, without consulting the
/// limiter (the retry's attempt stays 0).
#[tokio::test(start_paused = true)]
async fn policy_retry_after_uses_the_fixed_delay() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let seen: Log<(Key, u32)> = Log::new(log.start);
    let policy = {
        let seen = seen.clone();
        move |key: &Key, failure: &Failure<&'static str>, ctx: &Context| {
            assert!(
                matches!(failure, Failure::Error("transient")),
                "{failure:?}"
            );
            seen.push((*key, ctx.rate_limited_retries()));
            Action::requeue(secs(7))
        }
    };
    let runner = Runner::new(queue.clone(), fail_first(&log, 2)).error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add("a");
    sleep(secs(60)).await;
    assert_eq!(
        log.get(),
        [
            run("a", ms(0), 0),
            run("a", secs(7), 0),
            run("a", secs(14), 0)
        ]
    );
    assert_eq!(seen.get(), [("a", 0), ("a", 0)]);

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (1, 2, 0, 2), (0, 0, 0, 0));
}

/// `Action::await_change()`: forget + done. The failure count goes back to 0 and the key is not
/// requeued.
#[tokio::test(start_paused = true)]
async fn policy_give_up_forgets_and_does_not_requeue() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let policy = |_: &Key, _: &Failure<&'static str>, ctx: &Context| {
        if ctx.rate_limited_retries() >= 1 {
            Action::await_change()
        } else {
            Action::backoff()
        }
    };
    let runner = Runner::new(queue.clone(), fail_first(&log, usize::MAX)).error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add("a");
    sleep(ms(1)).await;
    assert_eq!(queue.num_requeues(&"a"), 1);
    sleep(secs(3600)).await;
    assert_eq!(log.get(), [run("a", ms(0), 0), run("a", ms(5), 1)]);
    assert_eq!(queue.num_requeues(&"a"), 0, "GiveUp forgets the key");
    assert_eq!(queue.counts(), Counts::default(), "GiveUp does not requeue");

    // Given up, not blocked: a new add runs it again, from attempt 0.
    queue.add("a");
    sleep(ms(1)).await;
    assert_eq!(log.len(), 3);
    assert_eq!(log.get()[2], run("a", secs(3600) + ms(1), 0));

    queue.shut_down(); // drops the pending retry
    let report = within(handle).await.unwrap();
    assert_report(&report, (0, 2, 1, 3), (0, 0, 0, 0));
}

/// `MaxRetries(n)`: retried with backoff `n` times, given up on the `n + 1`-th failure.
#[tokio::test(start_paused = true)]
async fn max_retries_gives_up_after_n_retries() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let runner =
        Runner::new(queue.clone(), fail_first(&log, usize::MAX)).error_policy(max_retries(3));
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add("a");
    sleep(secs(3600)).await;
    assert_eq!(
        log.get(),
        [
            run("a", ms(0), 0),
            run("a", ms(5), 1),
            run("a", ms(15), 2),
            run("a", ms(35), 3),
        ]
    );
    assert_eq!(queue.num_requeues(&"a"), 0);
    assert_eq!(queue.counts(), Counts::default());

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (0, 3, 1, 4), (0, 0, 0, 0));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReconcileError {
    Transient,
    Terminal,
}

/// A terminal-error policy written as a closure: terminal errors are given up at once, others
/// retried with backoff.
#[tokio::test(start_paused = true)]
async fn terminal_error_policy_as_a_closure() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            let n = log.record(key, &ctx);
            async move {
                match (key, n) {
                    ("broken", _) => Err(ReconcileError::Terminal),
                    ("flaky", 1) => Err(ReconcileError::Transient),
                    _ => Ok(Action::await_change()),
                }
            }
        }
    };
    let decisions: Log<(Key, ReconcileError, u32)> = Log::new(log.start);
    let policy = {
        let decisions = decisions.clone();
        move |key: &Key, failure: &Failure<ReconcileError>, ctx: &Context| match failure {
            Failure::Error(e) => {
                decisions.push((*key, *e, ctx.rate_limited_retries()));
                match e {
                    ReconcileError::Terminal => Action::await_change(),
                    ReconcileError::Transient => Action::backoff(),
                }
            }
            _ => Action::backoff(),
        }
    };
    let runner = Runner::new(queue.clone(), reconcile).error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add("broken");
    queue.add("flaky");
    sleep(secs(3600)).await;
    assert_eq!(
        log.get(),
        [
            run("broken", ms(0), 0),
            run("flaky", ms(0), 0),
            run("flaky", ms(5), 1),
        ]
    );
    assert_eq!(
        decisions.get(),
        [
            ("broken", ReconcileError::Terminal, 0),
            ("flaky", ReconcileError::Transient, 0),
        ]
    );
    assert_eq!(queue.num_requeues(&"broken"), 0);
    assert_eq!(queue.counts(), Counts::default());

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (1, 1, 1, 2), (0, 0, 0, 0));
}

// ---- panics -------------------------------------------------------------------------------------

/// A panic while building the reconcile's future, and one inside its async body, are caught,
/// counted, and handed to the policy as `Failure::Panic` with their messages; the single worker
/// survives and processes the later keys, and the panicked keys are retried with backoff.
#[tokio::test(start_paused = true)]
async fn panics_are_caught_counted_and_retried() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            log.record(key, &ctx);
            if key == "sync-panic" && ctx.rate_limited_retries() == 0 {
                panic!("boom while building the future (expected by this test)");
            }
            async move {
                tokio::task::yield_now().await;
                if key == "async-panic" && ctx.rate_limited_retries() == 0 {
                    panic!("boom inside the async body (expected by this test)");
                }
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    let failures: Log<(Key, String, u32)> = Log::new(log.start);
    let policy = {
        let failures = failures.clone();
        move |key: &Key, failure: &Failure<&'static str>, ctx: &Context| {
            match failure {
                Failure::Panic(message) => {
                    failures.push((*key, message.clone(), ctx.rate_limited_retries()))
                }
                other => panic!("unexpected failure {other:?}"),
            }
            Action::backoff()
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(1)
        .error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add_batch(["sync-panic", "async-panic", "ok-1", "ok-2"]);
    sleep(secs(1)).await;
    assert_eq!(
        log.get(),
        [
            run("sync-panic", ms(0), 0),
            run("async-panic", ms(0), 0),
            run("ok-1", ms(0), 0),
            run("ok-2", ms(0), 0),
            run("sync-panic", ms(5), 1),
            run("async-panic", ms(5), 1),
        ]
    );
    let failures = failures.get();
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert_eq!(failures[0].0, "sync-panic");
    assert!(
        failures[0].1.contains("boom while building the future"),
        "{failures:?}"
    );
    assert_eq!(failures[1].0, "async-panic");
    assert!(
        failures[1].1.contains("boom inside the async body"),
        "{failures:?}"
    );
    assert_eq!((failures[0].2, failures[1].2), (0, 0));
    assert_eq!(queue.counts(), Counts::default());

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (4, 2, 0, 0), (2, 0, 0, 0));
}

/// A panicking policy is user code too: its panic is the key's failure (`Failure::Panic`), about
/// which it is asked once more; when it panics again the key is retried. The worker survives.
#[tokio::test(start_paused = true)]
async fn panicking_policy_retries() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let policy = |_: &Key, _: &Failure<&'static str>, _: &Context| -> Action {
        panic!("policy panicked (expected by this test)")
    };
    let runner = Runner::new(queue.clone(), fail_first(&log, 1))
        .workers(1)
        .error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));
    queue.add("a");
    sleep(secs(1)).await;
    assert_eq!(log.get(), [run("a", ms(0), 0), run("a", ms(5), 1)]);
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (1, 1, 0, 0), (1, 0, 0, 0));
}

/// A policy that panics about one failure is asked again about its own panic, as about any panic
/// in the code the runner calls for a key, and that decision finishes the lease.
#[tokio::test(start_paused = true)]
async fn a_panicking_error_policy_is_asked_about_its_own_panic() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let asked: Log<String> = Log::new(log.start);
    let policy = {
        let asked = asked.clone();
        move |_: &Key, failure: &Failure<&'static str>, _: &Context| {
            asked.push(failure.to_string());
            match failure {
                Failure::Error(_) => panic!("policy panicked (expected by this test)"),
                _ => Action::await_change(),
            }
        }
    };
    let runner = Runner::new(queue.clone(), fail_first(&log, 1))
        .workers(1)
        .error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));
    queue.add("a");
    sleep(secs(1)).await;
    assert_eq!(log.get(), [run("a", ms(0), 0)], "given up: not retried");
    assert_eq!(
        asked.get(),
        [
            "reconcile failed: transient".to_string(),
            "reconcile panicked: policy panicked (expected by this test)".to_string(),
        ]
    );
    assert_eq!(queue.num_requeues(&"a"), 0, "GiveUp forgets the key");
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (0, 0, 1, 0), (1, 0, 0, 0));
}

// ---- per-reconcile timeout ----------------------------------------------------------------------

/// A reconcile that outlives its timeout has its context cancelled at exactly the timeout; one
/// that then returns counts as `Failure::Timeout` (whatever it returned) and is retried with
/// backoff.
#[tokio::test(start_paused = true)]
async fn timeout_cancels_the_context_and_retries() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let cancelled: Log<(Key, Duration)> = Log::new(log.start);
    let reconcile = {
        let (log, cancelled) = (log.clone(), cancelled.clone());
        move |key: Key, ctx: Context| {
            let n = log.record(key, &ctx);
            let cancelled = cancelled.clone();
            async move {
                if n == 1 {
                    tokio::select! {
                        () = ctx.cancelled() => {
                            assert!(ctx.is_cancelled());
                            cancelled.push((key, cancelled.elapsed()));
                            return Ok(Action::await_change());
                        }
                        () = sleep(secs(3600)) => {}
                    }
                }
                assert!(!ctx.is_cancelled());
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    let policy_saw = Arc::new(AtomicU32::new(0));
    let policy = {
        let policy_saw = policy_saw.clone();
        move |_: &Key, failure: &Failure<&'static str>, _: &Context| {
            assert!(matches!(failure, Failure::Timeout), "{failure:?}");
            policy_saw.fetch_add(1, SeqCst);
            Action::backoff()
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .reconcile_timeout(secs(10))
        .cancel_grace(secs(2))
        .error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add("a");
    sleep(secs(60)).await;
    assert_eq!(cancelled.get(), [("a", secs(10))]);
    assert_eq!(
        log.get(),
        [run("a", ms(0), 0), run("a", secs(10) + ms(5), 1)]
    );
    assert_eq!(policy_saw.load(SeqCst), 1);

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (1, 1, 0, 0), (0, 1, 0, 0));
}

/// A reconcile that ignores its cancelled context is dropped after the cancel grace (exactly at
/// timeout + grace), counts as `Failure::Timeout`, and its key is retried with backoff.
#[tokio::test(start_paused = true)]
async fn timeout_drops_a_reconcile_that_ignores_cancellation() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let dropped: Log<(Key, Duration)> = Log::new(log.start);
    let reconcile = {
        let (log, dropped) = (log.clone(), dropped.clone());
        move |key: Key, ctx: Context| {
            let n = log.record(key, &ctx);
            let probe = DropProbe(dropped.clone(), key);
            async move {
                let _probe = probe;
                if n == 1 {
                    sleep(secs(3600)).await; // ignores ctx
                }
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .reconcile_timeout(secs(10))
        .cancel_grace(secs(2));
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add("a");
    sleep(secs(60)).await;
    assert_eq!(
        dropped.get(),
        [("a", secs(12)), ("a", secs(12) + ms(5))],
        "the first future is dropped at timeout + cancel grace; the retry's when it returns"
    );
    assert_eq!(
        log.get(),
        [run("a", ms(0), 0), run("a", secs(12) + ms(5), 1)]
    );

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (1, 1, 0, 0), (0, 1, 0, 0));
}

/// A reconcile that finishes before its timeout is unaffected; the timeout is per reconcile.
#[tokio::test(start_paused = true)]
async fn timeout_is_per_reconcile() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            log.record(key, &ctx);
            async move {
                sleep(secs(9)).await;
                assert!(!ctx.is_cancelled());
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(1)
        .reconcile_timeout(secs(10));
    let handle = tokio::spawn(runner.run(CancellationToken::new()));
    queue.add_batch(["a", "b", "c"]);
    sleep(secs(60)).await;
    assert_eq!(
        log.get(),
        [
            run("a", secs(0), 0),
            run("b", secs(9), 0),
            run("c", secs(18), 0)
        ]
    );
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (3, 0, 0, 0), (0, 0, 0, 0));
}

/// A cancel grace too long to represent as an instant (`Duration::MAX`) means "no limit": a
/// timed-out reconcile that ignores its cancelled context runs until it returns (it still counts
/// as a timeout), and the worker goes on with the next key. The grace's end must not be computed
/// as an overflowing `Instant + Duration`.
#[tokio::test(start_paused = true)]
async fn cancel_grace_of_duration_max_waits_without_limit() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let dropped: Log<(Key, Duration)> = Log::new(log.start);
    let reconcile = {
        let (log, dropped) = (log.clone(), dropped.clone());
        move |key: Key, ctx: Context| {
            let n = log.record(key, &ctx);
            let probe = DropProbe(dropped.clone(), key);
            async move {
                let _probe = probe;
                if key == "slow" && n == 1 {
                    sleep(secs(3600)).await; // ignores ctx
                }
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(1)
        .reconcile_timeout(secs(10))
        .cancel_grace(Duration::MAX);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add_batch(["slow", "next"]);
    sleep(secs(7200)).await;
    assert!(
        !handle.is_finished(),
        "run returned before the queue shut down"
    );
    assert_eq!(
        log.get(),
        [
            run("slow", ms(0), 0),
            run("next", secs(3600), 0),
            run("slow", secs(3600) + ms(5), 1),
        ]
    );
    assert_eq!(
        dropped.get()[0],
        ("slow", secs(3600)),
        "never dropped early"
    );

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (2, 1, 0, 0), (0, 1, 0, 0));
}

/// `shutdown_grace` and `cancel_grace` of `Duration::MAX` at shutdown: the runner waits for the
/// in-flight reconcile without limit instead of overflowing a deadline.
#[tokio::test(start_paused = true)]
async fn shutdown_graces_of_duration_max_wait_without_limit() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            log.record(key, &ctx);
            async move {
                sleep(secs(3600)).await;
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .shutdown_grace(Duration::MAX)
        .cancel_grace(Duration::MAX)
        .reconcile_timeout(Duration::MAX);
    let stop = CancellationToken::new();
    let handle = tokio::spawn(runner.run(stop.clone()));
    queue.add("a");
    sleep(secs(1)).await;
    stop.cancel();
    let report = within(handle).await.unwrap();
    assert_eq!(log.elapsed(), secs(3600));
    assert_report(&report, (1, 0, 0, 0), (0, 0, 0, 0));
}

// ---- shutdown -----------------------------------------------------------------------------------

/// Graceful shutdown with work in flight (shutdown grace 10 s, cancel grace 2 s; the token is
/// cancelled at t = 1 s):
/// - intake stops at once: a key added after the cancel is not reconciled;
/// - "quick" finishes within the grace, its context never cancelled;
/// - "coop" runs past the grace: its context is cancelled at exactly t = 11 s and it returns an
///   error, which is retried;
/// - "stubborn" ignores cancellation: dropped at exactly t = 13 s, its key retried
///   (`Report.interrupted`);
/// - `run` returns at t = 13 s.
#[tokio::test(start_paused = true)]
async fn graceful_shutdown_with_work_in_flight() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let events: Log<(Key, &'static str, Duration)> = Log::new(log.start);
    let reconcile = {
        let (log, events) = (log.clone(), events.clone());
        move |key: Key, ctx: Context| {
            log.record(key, &ctx);
            let events = events.clone();
            async move {
                match key {
                    "quick" => {
                        sleep(secs(3)).await;
                        assert!(!ctx.is_cancelled(), "cancelled within the shutdown grace");
                        events.push((key, "finished", events.elapsed()));
                        Ok(Action::await_change())
                    }
                    "coop" => {
                        ctx.cancelled().await;
                        events.push((key, "cancelled", events.elapsed()));
                        Err("cancelled")
                    }
                    "stubborn" => {
                        let _guard = EventOnDrop(events.clone(), key);
                        sleep(secs(3600)).await;
                        Ok(Action::await_change())
                    }
                    _ => Ok(Action::await_change()),
                }
            }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(3)
        .shutdown_grace(secs(10))
        .cancel_grace(secs(2));
    let stop = CancellationToken::new();
    let handle = tokio::spawn(runner.run(stop.clone()));

    queue.add_batch(["quick", "coop", "stubborn"]);
    sleep(secs(1)).await;
    assert_eq!(queue.counts().processing, 3);
    stop.cancel();
    queue.add("late");

    let report = within(handle).await.unwrap();
    assert_eq!(
        log.elapsed(),
        secs(13),
        "run returns after both grace periods"
    );
    assert_eq!(
        log.get(),
        [
            run("quick", ms(0), 0),
            run("coop", ms(0), 0),
            run("stubborn", ms(0), 0),
        ],
        "no key is taken after the token is cancelled"
    );
    assert_eq!(
        events.get(),
        [
            ("quick", "finished", secs(3)),
            ("coop", "cancelled", secs(11)),
            ("stubborn", "dropped", secs(13)),
        ]
    );
    assert_eq!(queue.num_requeues(&"coop"), 1);
    assert_eq!(
        queue.num_requeues(&"stubborn"),
        1,
        "an interrupted key is retried"
    );
    // Ready at t = 13 s: "late", and coop's retry (due at 11 s + 5 ms); stubborn's is due later.
    assert_report(&report, (1, 1, 0, 1), (0, 0, 1, 2));
    assert_eq!(
        queue.counts(),
        Counts {
            ready: 2,
            processing: 0,
            waiting: 1,
            tracked: 3
        }
    );
}

/// Pushes `(key, "dropped", t)` to an event log when dropped.
struct EventOnDrop(Log<(Key, &'static str, Duration)>, Key);

impl Drop for EventOnDrop {
    fn drop(&mut self) {
        self.0.push((self.1, "dropped", self.0.elapsed()));
    }
}

/// When every in-flight reconcile finishes within the shutdown grace, `run` returns as soon as
/// the last one does, and no context is cancelled.
#[tokio::test(start_paused = true)]
async fn shutdown_returns_when_in_flight_work_finishes_within_the_grace() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            log.record(key, &ctx);
            async move {
                sleep(if key == "a" { secs(3) } else { secs(4) }).await;
                assert!(!ctx.is_cancelled());
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(2)
        .shutdown_grace(secs(10));
    let stop = CancellationToken::new();
    let handle = tokio::spawn(runner.run(stop.clone()));
    queue.add_batch(["a", "b", "c"]);
    sleep(secs(1)).await;
    stop.cancel();
    let report = within(handle).await.unwrap();
    assert_eq!(log.elapsed(), secs(4));
    assert_eq!(log.len(), 2, "c is never taken");
    assert_report(&report, (2, 0, 0, 0), (0, 0, 0, 1));
}

/// A token cancelled before `run` starts: no key is reconciled.
#[tokio::test(start_paused = true)]
async fn run_with_a_cancelled_token_reconciles_nothing() {
    let queue = queue();
    let log = Log::new(Instant::now());
    queue.add("a");
    let stop = CancellationToken::new();
    stop.cancel();
    let report = within(
        Runner::new(queue.clone(), fail_first(&log, 0))
            .workers(4)
            .run(stop),
    )
    .await;
    assert_eq!(log.len(), 0);
    assert_report(&report, (0, 0, 0, 0), (0, 0, 0, 1));
}

/// The runner returns when the queue is shut down and drained: keys already queued at the
/// shutdown are still reconciled, then `run` returns by itself.
#[tokio::test(start_paused = true)]
async fn runner_returns_when_the_queue_is_shut_down_and_drained() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            log.record(key, &ctx);
            async move {
                sleep(secs(1)).await;
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    queue.add_batch(["a", "b", "c", "d", "e"]);
    let runner = Runner::new(queue.clone(), reconcile).workers(2);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_eq!(log.elapsed(), secs(3), "5 keys, 2 workers, 1 s each");
    let mut keys: Vec<_> = log.get().iter().map(|r| r.key).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["a", "b", "c", "d", "e"]);
    assert_report(&report, (5, 0, 0, 0), (0, 0, 0, 0));
    assert_eq!(queue.counts(), Counts::default());
}

// ---- report and re-adds -------------------------------------------------------------------------

/// Report counts over a mixed workload.
#[tokio::test(start_paused = true)]
async fn report_counts() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            let n = log.record(key, &ctx);
            async move {
                match (key, n) {
                    ("hopeless", _) => Err("permanent"),
                    ("flaky-1" | "flaky-2", 1) => Err("transient"),
                    ("flaky-2", 2) => Err("transient"),
                    _ => Ok(Action::await_change()),
                }
            }
        }
    };
    let policy = |key: &Key, _: &Failure<&'static str>, _: &Context| {
        if *key == "hopeless" {
            Action::await_change()
        } else {
            Action::backoff()
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(3)
        .error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));
    queue.add_batch(["ok-1", "ok-2", "ok-3", "flaky-1", "flaky-2", "hopeless"]);
    sleep(secs(1)).await;
    queue.add("late");
    queue.shut_down();
    let report = within(handle).await.unwrap();
    // ok ×3, flaky-1 once after one retry, flaky-2 once after two, late: 6 processed.
    assert_report(&report, (6, 3, 1, 4), (0, 0, 0, 0));
    assert_eq!(queue.counts(), Counts::default());
}

/// A key re-added while it is being reconciled runs again after that reconcile, never alongside
/// it, even with idle workers.
#[tokio::test(start_paused = true)]
async fn key_readded_during_its_reconcile_runs_again_after_it() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let ends: Log<(Key, Duration)> = Log::new(log.start);
    let reconcile = {
        let (log, ends, q) = (log.clone(), ends.clone(), queue.clone());
        move |key: Key, ctx: Context| {
            let n = log.record(key, &ctx);
            let (ends, q) = (ends.clone(), q.clone());
            async move {
                if n == 1 {
                    sleep(ms(500)).await;
                    q.add(key); // dirty: queued again when this lease finishes
                }
                sleep(secs(1)).await;
                ends.push((key, ends.elapsed()));
                Ok::<_, &'static str>(Action::await_change())
            }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile).workers(4);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));
    queue.add("k");
    sleep(secs(10)).await;
    assert_eq!(log.get(), [run("k", ms(0), 0), run("k", ms(1500), 0)]);
    assert_eq!(ends.get(), [("k", ms(1500)), ("k", ms(2500))]);
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (2, 0, 0, 0), (0, 0, 0, 0));
}

// ---- priorities -----------------------------------------------------------------------------------

/// One reconcile with its priority: key, virtual time since the test's start, attempt, priority.
type PrioRun = (Key, Duration, u32, i32);

impl Log<PrioRun> {
    /// Records a reconcile with the priority its context reports; how many runs `key` has had.
    fn record_priority(&self, key: Key, ctx: &Context) -> usize {
        let mut entries = self.entries.lock().unwrap();
        entries.push((
            key,
            self.start.elapsed(),
            ctx.rate_limited_retries(),
            ctx.priority(),
        ));
        entries.iter().filter(|r| r.0 == key).count()
    }
}

/// The future of [`prio_reconcile`] (boxed: a function cannot return a closure whose future is
/// an `impl Trait`).
type PrioFuture = std::pin::Pin<Box<dyn Future<Output = Result<Action, &'static str>> + Send>>;

/// A reconcile that returns `first(key)` on a key's first run when it has one, and otherwise
/// takes 10 ms and succeeds: the 10 ms keep the single worker busy while re-adds come due.
fn prio_reconcile(
    log: &Log<PrioRun>,
    first: fn(Key) -> Option<Result<Action, &'static str>>,
) -> impl Fn(Key, Context) -> PrioFuture + Send + Sync + 'static {
    let log = log.clone();
    move |key, ctx: Context| {
        let n = log.record_priority(key, &ctx);
        let first = first(key);
        Box::pin(async move {
            match first {
                Some(r) if n == 1 => r,
                Some(_) => Ok(Action::await_change()),
                None => {
                    sleep(ms(10)).await;
                    Ok(Action::await_change())
                }
            }
        })
    }
}

/// `Ok(RequeueAfter(d).with_priority(p))` (controller-runtime's `Result.Priority`): the key is
/// requeued at `p`. Raised to 5, "up" is served before keys queued earlier at 0; lowered to
/// `LOW_PRIORITY`, "down" after keys queued later at 0. Both came due at 1 ms, while the one
/// worker was busy.
#[tokio::test(start_paused = true)]
async fn a_requeue_at_a_chosen_priority_is_served_by_that_priority() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = prio_reconcile(&log, |key| match key {
        "up" => Some(Ok(Action::requeue(ms(1)).with_priority(5))),
        "down" => Some(Ok(Action::requeue(ms(1)).with_priority(LOW_PRIORITY))),
        _ => None,
    });
    for key in ["up", "down", "x1", "x2", "x3"] {
        queue.add(key);
    }
    let handle = tokio::spawn(Runner::new(queue.clone(), reconcile).run(CancellationToken::new()));
    sleep(secs(1)).await;
    assert_eq!(
        log.get(),
        [
            ("up", ms(0), 0, 0),
            ("down", ms(0), 0, 0),
            ("x1", ms(0), 0, 0),
            ("up", ms(10), 0, 5),
            ("x2", ms(10), 0, 0),
            ("x3", ms(20), 0, 0),
            ("down", ms(30), 0, LOW_PRIORITY),
        ]
    );
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (7, 0, 0, 0), (0, 0, 0, 0));
}

/// A retry whose policy names no priority keeps the priority the lease had (controller-runtime
/// #3157): a key queued at `LOW_PRIORITY` fails, comes due at 5 ms, and is still served after
/// "b", added at 0 at 6 ms, while "a" kept the worker busy.
#[tokio::test(start_paused = true)]
async fn a_retry_without_a_priority_keeps_the_leases_priority() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            let n = log.record_priority(key, &ctx);
            async move {
                match key {
                    "low" if n == 1 => Err("transient"),
                    "low" => Ok(Action::await_change()),
                    _ => {
                        sleep(ms(10)).await;
                        Ok(Action::await_change())
                    }
                }
            }
        }
    };
    queue.add_with("low", AddOptions::new().priority(LOW_PRIORITY));
    let handle = tokio::spawn(Runner::new(queue.clone(), reconcile).run(CancellationToken::new()));
    sleep(ms(1)).await;
    queue.add("a");
    sleep(ms(5)).await;
    queue.add("b");
    sleep(secs(1)).await;
    assert_eq!(
        log.get(),
        [
            ("low", ms(0), 0, LOW_PRIORITY),
            ("a", ms(1), 0, 0),
            ("b", ms(11), 0, 0),
            ("low", ms(21), 1, LOW_PRIORITY),
        ]
    );
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (3, 1, 0, 1), (0, 0, 0, 0));
}

/// The error policy chooses a retry's priority: `Action::backoff().with_priority(7)` (the limiter's
/// 5 ms) is served before "b", queued earlier at 0; `Action::requeue(1 ms)` at
/// `LOW_PRIORITY` after it. The limiter counts the first failure only (a fixed delay does not
/// consult it), as without a priority.
#[tokio::test(start_paused = true)]
async fn the_error_policy_chooses_the_priority_of_a_retry() {
    let queue = queue();
    let log = Log::new(Instant::now());
    let reconcile = prio_reconcile(&log, |key| match key {
        "up" | "down" => Some(Err("transient")),
        _ => None,
    });
    let policy = |key: &Key, _: &Failure<&'static str>, _: &Context| match *key {
        "up" => Action::backoff().with_priority(7),
        _ => Action::requeue(ms(1)).with_priority(LOW_PRIORITY),
    };
    for key in ["up", "down", "a", "b"] {
        queue.add(key);
    }
    let runner = Runner::new(queue.clone(), reconcile).error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));
    sleep(secs(1)).await;
    assert_eq!(
        log.get(),
        [
            ("up", ms(0), 0, 0),
            ("down", ms(0), 0, 0),
            ("a", ms(0), 0, 0),
            ("up", ms(10), 1, 7),
            ("b", ms(10), 0, 0),
            ("down", ms(20), 0, LOW_PRIORITY),
        ]
    );
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (4, 2, 0, 2), (0, 0, 0, 0));
}

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

// ---- user code around the reconcile -------------------------------------------------------------

/// A rate limiter whose `when` panics for one key (user code, like the policy).
struct PanickyLimiter(ExponentialFailure<Key>);

impl workqueue_ratelimit::RateLimiter<Key> for PanickyLimiter {
    fn when(&self, key: &Key, now: workqueue_ratelimit::Instant) -> Duration {
        if *key == "bad-limiter" {
            panic!("rate limiter panicked (expected by this test)");
        }
        self.0.when(key, now)
    }

    fn forget(&self, key: &Key) {
        self.0.forget(key)
    }

    fn num_requeues(&self, key: &Key) -> u32 {
        self.0.num_requeues(key)
    }
}

/// A rate limiter that panics while a failed key is retried must not take its worker down with
/// it: the runner catches a panicking policy for the same reason. With one worker, the keys after
/// the failing one must still be reconciled, and `run` must keep running until the queue is shut
/// down.
#[tokio::test(start_paused = true)]
async fn panicking_rate_limiter_does_not_kill_the_worker() {
    let queue: WorkQueue<Key> = WorkQueue::builder()
        .rate_limiter(PanickyLimiter(ExponentialFailure::new(ms(5), secs(1000))))
        .build();
    let log = Log::new(Instant::now());
    let reconcile = {
        let log = log.clone();
        move |key: Key, ctx: Context| {
            log.record(key, &ctx);
            std::future::ready(if key == "bad-limiter" {
                Err("fails, and its retry consults the panicking limiter")
            } else {
                Ok(Action::await_change())
            })
        }
    };
    let runner = Runner::new(queue.clone(), reconcile).workers(1);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add_batch(["bad-limiter", "good"]);
    sleep(secs(1)).await;
    assert!(
        !handle.is_finished(),
        "run returned although the queue was not shut down (its only worker died)"
    );
    assert_eq!(
        log.get().iter().map(|r| r.key).collect::<Vec<_>>(),
        ["bad-limiter", "good"],
        "the key after the one whose limiter panicked was not reconciled"
    );
    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_eq!(report.processed, 1);
}

/// A rate limiter whose `num_requeues` panics the first time it is asked about `bad-count`.
struct PanickyNumRequeues {
    inner: ExponentialFailure<Key>,
    armed: AtomicBool,
}

impl workqueue_ratelimit::RateLimiter<Key> for PanickyNumRequeues {
    fn when(&self, key: &Key, now: workqueue_ratelimit::Instant) -> Duration {
        self.inner.when(key, now)
    }

    fn forget(&self, key: &Key) {
        self.inner.forget(key)
    }

    fn num_requeues(&self, key: &Key) -> u32 {
        if *key == "bad-count" && self.armed.swap(false, SeqCst) {
            panic!("num_requeues panicked (expected by this test)");
        }
        self.inner.num_requeues(key)
    }
}

/// A policy that records each failure as `(key, "panic: <message>" or the failure, ctx.rate_limited_retries())` and
/// retries after a fixed 7 s.
fn recording_policy<K: Copy + Send + Sync + 'static>(
    failures: &Log<(K, String, u32)>,
) -> impl Fn(&K, &Failure<&'static str>, &Context) -> Action + Send + Sync + 'static {
    let failures = failures.clone();
    move |key: &K, failure: &Failure<&'static str>, ctx: &Context| {
        let what = match failure {
            Failure::Panic(message) => format!("panic: {message}"),
            other => format!("{other:?}"),
        };
        failures.push((*key, what, ctx.rate_limited_retries()));
        Action::requeue(secs(7))
    }
}

/// The runner asks the limiter for a key's failure count before the reconcile; a panic there is
/// user code failing for that key: a `Failure::Panic` given to the policy (with 0 ctx.rate_limited_retries(), the
/// count being unknown), whose decision finishes the lease. The key is not reconciled that time,
/// the single worker survives, and `run` keeps running until the queue is shut down.
#[tokio::test(start_paused = true)]
async fn a_panicking_num_requeues_does_not_kill_the_worker() {
    let queue: WorkQueue<Key> = WorkQueue::builder()
        .rate_limiter(PanickyNumRequeues {
            inner: ExponentialFailure::new(ms(5), secs(1000)),
            armed: AtomicBool::new(true),
        })
        .build();
    let log = Log::new(Instant::now());
    let failures: Log<(Key, String, u32)> = Log::new(log.start);
    let runner = Runner::new(queue.clone(), fail_first(&log, 0))
        .workers(1)
        .error_policy(recording_policy(&failures));
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add_batch(["bad-count", "good"]);
    sleep(secs(60)).await;
    assert!(!handle.is_finished(), "run returned: its only worker died");
    assert_eq!(
        log.get(),
        [run("good", ms(0), 0), run("bad-count", secs(7), 0)],
        "bad-count is retried by the policy's decision, after the next key"
    );
    let failures = failures.get();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!((failures[0].0, failures[0].2), ("bad-count", 0));
    assert!(
        failures[0].1.starts_with("panic: num_requeues panicked"),
        "{failures:?}"
    );

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (2, 1, 0, 0), (1, 0, 0, 0));
}

fn fragile_queue() -> WorkQueue<Fragile> {
    WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(ms(5), secs(1000)))
        .build()
}

/// A reconcile over `Fragile` keys that logs `(name, when, attempt)` and succeeds.
fn fragile_reconcile(
    log: &Log<Run>,
) -> impl Fn(Fragile, Context) -> std::future::Ready<Result<Action, &'static str>> + Send + Sync + 'static
{
    let log = log.clone();
    move |key, ctx| {
        log.record(key.name, &ctx);
        std::future::ready(Ok(Action::await_change()))
    }
}

/// The runner clones the leased key to hand it to the reconcile; a `Clone` that panics there is a
/// `Failure::Panic` for that key, given to the policy, whose decision finishes the lease. (The
/// queue's `get` clones the key once, so the second clone is the runner's.)
#[tokio::test(start_paused = true)]
async fn a_panicking_key_clone_does_not_kill_the_worker() {
    let queue = fragile_queue();
    let log = Log::new(Instant::now());
    let failures: Log<(&'static str, String, u32)> = Log::new(log.start);
    let policy = {
        let failures = failures.clone();
        let record = recording_policy(&failures);
        move |key: &Fragile, failure: &Failure<&'static str>, ctx: &Context| {
            record(&key.name, failure, ctx)
        }
    };
    let runner = Runner::new(queue.clone(), fragile_reconcile(&log))
        .workers(1)
        .error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add(Fragile::new("bad-clone", |n| n == 2, |_| false));
    queue.add(Fragile::sturdy("good"));
    sleep(secs(60)).await;
    assert!(!handle.is_finished(), "run returned: its only worker died");
    assert_eq!(
        log.get(),
        [run("good", ms(0), 0), run("bad-clone", secs(7), 0)]
    );
    let failures = failures.get();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!((failures[0].0, failures[0].2), ("bad-clone", 0));
    assert!(
        failures[0]
            .1
            .starts_with("panic: clone 2 of bad-clone panicked"),
        "{failures:?}"
    );

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_report(&report, (2, 1, 0, 0), (1, 0, 0, 0));
}

/// A panic that escapes the queue's `get` (here the key's `Clone`, which `get` calls) leases no
/// key: the worker logs and counts it (`Report::get_panics`), pauses for `GET_PANIC_PAUSE`, and
/// goes on. It does not die, and `run` keeps running until the queue is shut down.
#[tokio::test(start_paused = true)]
async fn a_panicking_get_does_not_kill_the_worker() {
    let queue = fragile_queue();
    let log = Log::new(Instant::now());
    let runner = Runner::new(queue.clone(), fragile_reconcile(&log)).workers(1);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add(Fragile::new("bad-get", |n| n == 1, |_| false));
    queue.add(Fragile::sturdy("good"));
    sleep(secs(60)).await;
    assert!(!handle.is_finished(), "run returned: its only worker died");
    assert!(
        log.get().contains(&run("good", GET_PANIC_PAUSE, 0)),
        "the worker goes on after the pause: {:?}",
        log.get()
    );

    queue.shut_down();
    let report = within(handle).await.unwrap();
    assert_eq!(report.get_panics, 1, "{report:?}");
    assert_eq!(report.panics, 0, "no key was leased: {report:?}");
}

/// A `get` that panics on every call (keys whose `Clone` always panics) is not retried in a busy
/// loop: the worker pauses `GET_PANIC_PAUSE` after each panic. The pause ends at once when the
/// shutdown token is cancelled.
#[tokio::test(start_paused = true)]
async fn a_get_that_always_panics_is_retried_after_a_pause_not_in_a_busy_loop() {
    let queue = fragile_queue();
    let log = Log::new(Instant::now());
    let stop = CancellationToken::new();
    let runner = Runner::new(queue.clone(), fragile_reconcile(&log)).workers(1);
    let handle = tokio::spawn(runner.run(stop.clone()));

    // Many keys: a key whose get panicked may stay queued or stay marked processing; either way
    // the next get panics too.
    for id in 0..1000 {
        queue.add(Fragile::new("always-panics", |_| true, |_| false).with_id(id));
    }
    let waited = ms(950);
    sleep(waited).await;
    let cancelled_at = Instant::now();
    stop.cancel();
    let report = within(handle).await.unwrap();
    assert_eq!(
        cancelled_at.elapsed(),
        Duration::ZERO,
        "the pause ends when the token is cancelled"
    );
    let expected = (waited.as_nanos() / GET_PANIC_PAUSE.as_nanos()) as u64 + 1;
    assert_eq!(report.get_panics, expected, "{report:?}");
    assert_eq!(log.len(), 0);
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
