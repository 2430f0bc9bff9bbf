//! The reconcile context (issue 14): the runner's shared data, reached from every reconcile and
//! from the error policy, and the two failure counts (the runner's `failures`, which every
//! failure advances, and the limiter's `attempt`). On tokio's paused clock.

mod common;

use std::sync::{Arc, Mutex};

use common::{max_retries, secs};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Failure, Runner};

/// The shared data: what the reconcile and the policy saw, as (who, attempt, failures).
#[derive(Default)]
struct Shared {
    seen: Mutex<Vec<(&'static str, u32, u32)>>,
    /// How many times in a row the reconcile fails before it succeeds once.
    fail_runs: Mutex<Vec<u32>>,
}

impl Shared {
    fn saw(&self, who: &'static str, ctx: &Context<Shared>) {
        self.seen
            .lock()
            .unwrap()
            .push((who, ctx.rate_limited_retries(), ctx.failures_in_a_row()));
    }
}

/// A reconcile that fails (or succeeds) as `Shared::fail_runs` says, recording its context.
async fn reconcile(_key: &'static str, ctx: Context<Shared>) -> Result<Action, &'static str> {
    ctx.data().saw("reconcile", &ctx);
    let mut runs = ctx.data().fail_runs.lock().unwrap();
    match runs.first_mut() {
        Some(0) => {
            runs.remove(0);
            Ok(Action::await_change())
        }
        Some(n) => {
            *n -= 1;
            Err("failed")
        }
        None => Err("failed"),
    }
}

/// One `Arc`, given once, is what every reconcile and every policy decision reach.
#[tokio::test(start_paused = true)]
async fn the_shared_data_reaches_every_reconcile_and_the_policy() {
    let data = Arc::new(Shared::default());
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add_batch(["a", "b"]);
    let same = Arc::new(Mutex::new(Vec::new()));
    let runner = Runner::with_context(queue.clone(), data.clone(), {
        let (data, same) = (data.clone(), same.clone());
        move |key: &'static str, ctx: Context<Shared>| {
            same.lock().unwrap().push(Arc::ptr_eq(ctx.data(), &data));
            async move {
                if key == "a" {
                    Ok(Action::await_change())
                } else {
                    Err("no")
                }
            }
        }
    })
    .error_policy({
        let (data, same) = (data.clone(), same.clone());
        move |_: &&'static str, _: &Failure<&'static str>, ctx: &Context<Shared>| {
            same.lock().unwrap().push(Arc::ptr_eq(ctx.data(), &data));
            Action::await_change()
        }
    });
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    sleep(secs(1)).await;
    queue.shut_down();
    run.await.unwrap();
    assert_eq!(*same.lock().unwrap(), [true, true, true]);
    assert_eq!(Arc::strong_count(&data), 1, "the runner let go of its Arc");
}

/// "Retry after 30 s, at most 5 times": `RetryAfter(d)` never charges the rate limiter, so its
/// `attempt` stays 0, while the runner's `failures` counts every failure; the policy sees the
/// count before the failure it decides on, and gives up on the sixth failure. A give-up resets
/// the count: the key added again starts from 0.
#[tokio::test(start_paused = true)]
async fn failures_count_every_failure_and_bound_retry_after() {
    let data = Arc::new(Shared::default());
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let policy = |_: &&'static str, _: &Failure<&'static str>, ctx: &Context<Shared>| {
        ctx.data().saw("policy", ctx);
        if ctx.failures_in_a_row() < 5 {
            Action::requeue(secs(30))
        } else {
            Action::await_change()
        }
    };
    let runner = Runner::with_context(queue.clone(), data.clone(), reconcile).error_policy(policy);
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    queue.add("k");
    sleep(secs(3600)).await;
    let seen = std::mem::take(&mut *data.seen.lock().unwrap());
    let expected: Vec<_> = (0..6)
        .flat_map(|n| [("reconcile", 0, n), ("policy", 0, n)])
        .collect();
    assert_eq!(seen, expected);
    // Given up: forgotten by the runner too.
    queue.add("k");
    sleep(secs(1)).await;
    assert_eq!(
        data.seen.lock().unwrap()[..2],
        [("reconcile", 0, 0), ("policy", 0, 0)]
    );
    queue.shut_down();
    let report = run.await.unwrap();
    assert_eq!(report.given_up, 1);
}

/// With the rate limiter's retries, both counts advance together; a success resets both (the
/// runner's count on any success, the limiter's by the success's forget), and a retry bound counts
/// with the runner's.
#[tokio::test(start_paused = true)]
async fn a_success_resets_both_counts() {
    let data = Arc::new(Shared::default());
    *data.fail_runs.lock().unwrap() = vec![2, 1];
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let runner =
        Runner::with_context(queue.clone(), data.clone(), reconcile).error_policy(max_retries(3));
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    queue.add("k");
    sleep(secs(60)).await;
    queue.add("k");
    sleep(secs(60)).await;
    queue.add("k"); // fails for good now: three retries, then given up
    sleep(secs(600)).await;
    queue.shut_down();
    let report = run.await.unwrap();
    let counts: Vec<(u32, u32)> = data
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|&(_, attempt, failures)| (attempt, failures))
        .collect();
    assert_eq!(
        counts,
        [
            (0, 0),
            (1, 1),
            (2, 2), // succeeds
            (0, 0),
            (1, 1), // succeeds
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 3), // the fourth failure in a row: given up
        ]
    );
    assert_eq!((report.processed, report.given_up), (2, 1));
}
