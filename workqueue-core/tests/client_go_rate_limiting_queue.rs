//! Port of client-go's `util/workqueue/rate_limiting_queue_test.go`.
//!
//! Go reads each entry's `readyAt` from the delaying queue's channel. Our queue exposes no
//! deadlines, so each deadline is checked by when the key becomes available on a [`ManualClock`]:
//! not one nanosecond before it, and exactly at it. And where Go sends both `AddRateLimited`
//! entries to a loop-less channel, our waiting entries de-duplicate (earliest wins), so each key
//! is taken and finished before its next rate-limited add.

mod common;

use std::time::Duration;

use common::{ms, ns, secs};
use workqueue_core::ratelimit::ExponentialFailure;
use workqueue_core::state::{AddStatus, Counts};
use workqueue_core::{ManualClock, WorkQueue};

/// Asserts that `key` becomes available exactly `delay` from now (and not a nanosecond earlier),
/// then takes it and finishes it with `done` (which keeps the limiter's failure count).
#[track_caller]
fn assert_fires_after(
    queue: &WorkQueue<&'static str>,
    clock: &ManualClock,
    key: &str,
    delay: Duration,
) {
    clock.advance(delay - ns(1));
    assert!(
        queue.try_get().is_none(),
        "{key} available before {delay:?}"
    );
    clock.advance(ns(1));
    let lease = queue
        .try_get()
        .unwrap_or_else(|| panic!("{key} not available after {delay:?}"));
    assert_eq!(*lease, key);
    lease.done();
    assert!(queue.try_get().is_none());
}

// Go: TestRateLimitingQueue.
#[test]
fn rate_limiting_queue() {
    let clock = ManualClock::new();
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ms(1), secs(1)))
        .build();

    assert_eq!(queue.add_rate_limited("one"), AddStatus::Waiting);
    assert_fires_after(&queue, &clock, "one", ms(1));
    assert_eq!(queue.add_rate_limited("one"), AddStatus::Waiting);
    assert_fires_after(&queue, &clock, "one", ms(2));
    assert_eq!(queue.num_requeues(&"one"), 2);

    assert_eq!(queue.add_rate_limited("two"), AddStatus::Waiting);
    assert_fires_after(&queue, &clock, "two", ms(1));
    assert_eq!(queue.add_rate_limited("two"), AddStatus::Waiting);
    assert_fires_after(&queue, &clock, "two", ms(2));

    queue.forget(&"one");
    assert_eq!(queue.num_requeues(&"one"), 0);
    assert_eq!(queue.add_rate_limited("one"), AddStatus::Waiting);
    assert_fires_after(&queue, &clock, "one", ms(1));

    assert_eq!(queue.counts(), Counts::default());
}
