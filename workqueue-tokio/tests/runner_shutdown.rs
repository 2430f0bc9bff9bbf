//! Graceful shutdown: intake stops, in-flight reconciles finish within the grace, then are
//! cancelled and dropped; a queue shut down and drained ends the run.
//!
//! Time-dependent tests run on tokio's paused clock.

mod common;
mod runner_support;

use std::time::Duration;

use common::{ms, secs, within};
use runner_support::*;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_core::state::Counts;
use workqueue_tokio::runner::{Action, Context, Runner};

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
                        assert!(
                            !ctx.token().is_cancelled(),
                            "cancelled within the shutdown grace"
                        );
                        events.push((key, "finished", events.elapsed()));
                        Ok(Action::await_change())
                    }
                    "coop" => {
                        ctx.token().cancelled().await;
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
                assert!(!ctx.token().is_cancelled());
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
