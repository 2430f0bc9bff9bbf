//! Panics in the reconcile and in the user code around it (the error policy, the rate limiter,
//! the key's `Clone`, the queue's `get`): caught, counted, and never fatal to a worker. A tracing
//! subscriber's panics are in `runner_subscriber_panics.rs`.
//!
//! The tests print the panics' messages to stderr; that is expected.
//!
//! Time-dependent tests run on tokio's paused clock.

mod common;
mod runner_support;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use common::{Fragile, GET_PANIC_PAUSE, ms, secs, within};
use runner_support::*;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_core::state::Counts;
use workqueue_ratelimit::ExponentialFailure;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Failure, Runner};

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

/// A source that is always ready (user code) holds back none of the dispatcher's other events:
/// here the end of the pause after a panicking `get`. Sources are read first, but last right
/// after a read. The runtime never idles, so the paused clock is moved by hand.
#[tokio::test(start_paused = true)]
async fn a_source_always_ready_does_not_hold_back_the_end_of_a_get_pause() {
    let queue = fragile_queue();
    let log = Log::new(Instant::now());
    // One key at each poll, and a wake-up at once in between: ready at every read.
    let mut ready = true;
    let noise = futures_util::stream::poll_fn(move |cx| {
        ready = !ready;
        if ready {
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(Some(Fragile::sturdy("noise")))
    });
    let runner = Runner::new(queue.clone(), fragile_reconcile(&log))
        .workers(1)
        .source("always-ready", noise);
    queue.add(Fragile::new("bad-get", |n| n == 1, |_| false));
    queue.add(Fragile::sturdy("good"));
    let stop = CancellationToken::new();
    let handle = tokio::spawn(runner.run(stop.clone()));
    let ran = |key| log.get().into_iter().filter(|r| r.key == key).count();
    for _ in 0..100 {
        tokio::time::advance(ms(10)).await;
    }
    assert!(ran("noise") > 0, "the source was read and its key ran");
    assert_eq!(ran("good"), 1, "the pause ended and good ran");
    stop.cancel();
    let report = within(handle).await.unwrap();
    assert_eq!(report.get_panics, 1, "{report:?}");
}
