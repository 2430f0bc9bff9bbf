//! Per-reconcile timeouts and the cancel grace, and graces too long to be an instant.
//!
//! Time-dependent tests run on tokio's paused clock.

mod common;
mod runner_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use common::{ms, secs, within};
use runner_support::*;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_tokio::runner::{Action, Context, Failure, Runner};

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
                        () = ctx.token().cancelled() => {
                            assert!(ctx.token().is_cancelled());
                            cancelled.push((key, cancelled.elapsed()));
                            return Ok(Action::await_change());
                        }
                        () = sleep(secs(3600)) => {}
                    }
                }
                assert!(!ctx.token().is_cancelled());
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
                assert!(!ctx.token().is_cancelled());
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
