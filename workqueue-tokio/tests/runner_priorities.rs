//! Priorities through the runner: a requeue or retry at a chosen priority, and the lease's own.
//!
//! Time-dependent tests run on tokio's paused clock.

mod common;
mod runner_support;

use std::time::Duration;

use common::{ms, secs, within};
use runner_support::*;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_tokio::runner::{Action, Context, Failure, Runner};
use workqueue_tokio::{AddOptions, LOW_PRIORITY};

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
