//! The runner's result table (the runner module docs): what each reconcile result and error
//! policy answer does to the queue; the report's counts; a key re-added during its reconcile.
//!
//! Time-dependent tests run on tokio's paused clock.

mod common;
mod runner_support;

use std::time::Duration;

use common::{max_retries, ms, secs, within};
use runner_support::*;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_core::state::Counts;
use workqueue_tokio::runner::{Action, Context, Failure, Runner};

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
