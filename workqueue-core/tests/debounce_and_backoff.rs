//! The add rules that look at why a key waits, on a manual clock: debounced adds
//! (`AddOptions::debounced`, kube-runtime's trailing edge) and `Builder::keep_backoff` (events
//! do not defeat a rate-limited retry).

use std::time::Duration;

use workqueue_core::ratelimit::ExponentialFailure;
use workqueue_core::{AddOptions, AddStatus, ManualClock, Outcome, WorkQueue};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn debounce(d: Duration) -> AddOptions {
    AddOptions::new().after(d).debounced(true)
}

fn queue(clock: &ManualClock, keep_backoff: bool) -> WorkQueue<&'static str> {
    WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(secs(1), secs(1000)))
        .keep_backoff(keep_backoff)
        .build()
}

/// Takes every ready key, finishing each with `done`.
fn drain(queue: &WorkQueue<&'static str>) -> Vec<&'static str> {
    std::iter::from_fn(|| queue.try_get().map(|l| *l)).collect()
}

// ---- debounce --------------------------------------------------------------------------------

/// A burst of debounced adds each less than the debounce apart runs the key once, the debounce
/// after the last; an isolated one waits the debounce.
#[test]
fn a_burst_runs_once_a_debounce_after_the_last_add() {
    let clock = ManualClock::new();
    let queue = queue(&clock, false);
    assert_eq!(queue.add_with("a", debounce(secs(3))), AddStatus::Waiting);
    for _ in 0..5 {
        clock.advance(secs(2));
        assert!(queue.try_get().is_none());
        assert_eq!(queue.add_with("a", debounce(secs(3))), AddStatus::Waiting);
    }
    clock.advance(ms(2999));
    assert!(queue.try_get().is_none());
    clock.advance(ms(1));
    assert_eq!(drain(&queue), ["a"]);
    assert!(queue.counts().waiting == 0);
}

/// A debounced add of a queued key changes nothing but its priority; of a key being processed,
/// it waits the debounce as a reminder (not dirty).
#[test]
fn a_debounced_add_of_a_queued_or_processing_key() {
    let clock = ManualClock::new();
    let queue = queue(&clock, false);
    queue.add("q");
    assert_eq!(
        queue.add_with("q", debounce(secs(1))),
        AddStatus::AlreadyQueued
    );
    assert_eq!(
        queue.add_with("q", debounce(secs(1)).priority(2)),
        AddStatus::Raised
    );
    assert_eq!(queue.counts().waiting, 0);
    let lease = queue.try_get().unwrap();
    assert_eq!(lease.priority(), 2);
    assert_eq!(queue.add_with("q", debounce(secs(1))), AddStatus::Waiting);
    lease.done();
    assert!(queue.try_get().is_none(), "not dirty: it waits");
    clock.advance(secs(1));
    assert_eq!(drain(&queue), ["q"]);
}

/// kube-runtime's replace test: the debounced add asks for now, so it wins against any entry
/// that waits (a reminder due sooner is pushed to now + debounce; a later one is brought
/// forward); a plain delayed add keeps the earlier deadline.
#[test]
fn a_debounced_add_replaces_a_waiting_reminder_or_retry() {
    let clock = ManualClock::new();
    let queue = queue(&clock, false);
    queue.add_after("soon", secs(1));
    queue.add_after("late", secs(60));
    queue.add("retry");
    queue.try_get().unwrap().finish(Outcome::retry()); // waits 1 s (the limiter's first delay)
    for key in ["soon", "late", "retry"] {
        assert_eq!(queue.add_with(key, debounce(secs(5))), AddStatus::Waiting);
    }
    clock.advance(secs(4));
    assert!(
        queue.try_get().is_none(),
        "the sooner ones were pushed to 5 s"
    );
    clock.advance(secs(1));
    assert_eq!(drain(&queue), ["soon", "late", "retry"]);
    // A plain delayed add of a debounced key: the earlier deadline wins, as always.
    queue.add_with("d", debounce(secs(5)));
    assert_eq!(queue.add_after("d", secs(2)), AddStatus::Waiting);
    assert_eq!(queue.add_after("d", secs(9)), AddStatus::AlreadyWaiting);
    clock.advance(secs(2));
    assert_eq!(drain(&queue), ["d"]);
    // An add without delay of a debounced key queues it now (the entry is a reminder).
    queue.add_with("n", debounce(secs(5)));
    assert_eq!(queue.add("n"), AddStatus::Queued);
    assert_eq!(drain(&queue), ["n"]);
    assert_eq!(queue.counts().waiting, 1);
}

// ---- keep_backoff ----------------------------------------------------------------------------

/// Off (client-go's rule): an add of a key in backoff runs it at once. On: it keeps waiting
/// until its backoff ends, whatever the add (a priority is kept).
#[test]
fn an_add_of_a_key_in_backoff_keeps_it_waiting_only_with_the_option() {
    for keep in [false, true] {
        let clock = ManualClock::new();
        let queue = queue(&clock, keep);
        queue.add("k");
        queue.try_get().unwrap().finish(Outcome::retry()); // 1 s
        let status = queue.add("k");
        if !keep {
            assert_eq!(status, AddStatus::Queued);
            assert_eq!(drain(&queue), ["k"]);
            continue;
        }
        assert_eq!(status, AddStatus::AlreadyWaiting);
        assert_eq!(queue.add_after("k", ms(1)), AddStatus::AlreadyWaiting);
        assert_eq!(
            queue.add_with("k", debounce(ms(1))),
            AddStatus::AlreadyWaiting
        );
        assert_eq!(
            queue.add_with("k", AddOptions::new().priority(4)),
            AddStatus::Waiting
        );
        assert!(queue.try_get().is_none());
        clock.advance(secs(1));
        let lease = queue.try_get().unwrap();
        assert_eq!((*lease, lease.priority()), ("k", 4));
    }
}

/// With the option, a rate-limited add still keeps the earlier deadline, and a plain delay
/// (`retry_after`) is not a backoff: an add runs such a key at once.
#[test]
fn only_rate_limited_retries_are_kept() {
    let clock = ManualClock::new();
    let queue = queue(&clock, true);
    queue.add("k");
    queue.try_get().unwrap().finish(Outcome::retry()); // 1 s
    assert_eq!(queue.add_rate_limited("k"), AddStatus::AlreadyWaiting); // 2 s: later
    clock.advance(secs(1));
    assert_eq!(drain(&queue), ["k"]);
    queue.add("p");
    queue
        .try_get()
        .unwrap()
        .finish(Outcome::retry_after(secs(60)));
    assert_eq!(queue.add("p"), AddStatus::Queued);
}

/// With the option, a key re-added during a run that ends in a rate-limited retry is not run
/// again at once: the retry carries the re-add, at the higher priority. Without it (and for
/// other outcomes), the re-add runs the key at once.
#[test]
fn a_retry_carries_a_re_add_made_during_the_run() {
    for keep in [false, true] {
        let clock = ManualClock::new();
        let queue = queue(&clock, keep);
        queue.add("k");
        let lease = queue.try_get().unwrap();
        assert_eq!(
            queue.add_with("k", AddOptions::new().priority(3)),
            AddStatus::Dirty
        );
        lease.finish(Outcome::retry());
        if !keep {
            assert_eq!(drain(&queue), ["k"]);
            continue;
        }
        assert!(queue.try_get().is_none());
        assert_eq!(queue.counts().waiting, 1);
        clock.advance(secs(1));
        let lease = queue.try_get().unwrap();
        assert_eq!(lease.priority(), 3);
        // A success with a re-add made meanwhile runs again at once.
        queue.add("k");
        lease.finish(Outcome::forget());
        assert_eq!(drain(&queue), ["k"]);
    }
}
