//! `retain` on the blocking queue: removing the keys of a shard that is handed over, whatever
//! they wait for, with their backoff forgotten, while their leases still finish; a `keep` that
//! panics changes nothing.

use std::sync::Arc;
use std::time::Duration;

use workqueue_core::ratelimit::{OutageConfig, RateLimiter};
use workqueue_core::{AddOptions, ManualClock, Outcome, WorkQueue};
use workqueue_model::faults::{self, Fault, FaultyLimiter};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Keys of "shard" 1 are odd.
fn even(k: &u32) -> bool {
    k.is_multiple_of(2)
}

#[test]
fn removes_queued_waiting_debounced_and_backing_off_keys_and_forgets_them() {
    let clock = ManualClock::new();
    let queue: WorkQueue<u32> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_batch([0, 1, 2, 3]);
    queue.add_after(5, ms(100));
    queue.add_with(7, AddOptions::new().after(ms(100)).debounced(true));
    queue.add(9);
    queue.try_get().unwrap().finish(Outcome::retry()); // 0 fails: 5 ms of backoff
    queue.add_rate_limited(11);
    assert_eq!(queue.num_requeues(&0), 1);
    assert_eq!(queue.num_requeues(&11), 1);
    let removed = queue.retain(|k| even(k) && *k != 0);
    assert_eq!(removed, 7, "0, 1, 3, 5, 7, 9 and 11");
    assert_eq!(queue.num_requeues(&0), 0, "forgotten in the limiter");
    assert_eq!(queue.num_requeues(&11), 0);
    assert_eq!(queue.counts().tracked, 1);
    clock.advance(ms(100));
    let left: Vec<u32> = std::iter::from_fn(|| queue.try_get().map(|l| *l)).collect();
    assert_eq!(left, [2]);
}

/// A key being processed stays until its lease finishes; a re-add made meanwhile is dropped, so
/// a `done()` leaves nothing behind; a finish that asks for a re-add still gets it.
#[test]
fn a_processing_key_finishes_and_its_re_add_is_dropped() {
    let queue: WorkQueue<u32> = WorkQueue::builder().clock(ManualClock::new()).build();
    queue.add_batch([1, 3]);
    let one = queue.try_get().unwrap();
    let three = queue.try_get().unwrap();
    queue.add(1); // dirty
    queue.add_after(3, ms(10)); // a reminder
    assert_eq!(queue.retain(even), 0, "both are processing");
    assert_eq!(queue.counts().processing, 2);
    assert_eq!(queue.counts().waiting, 0);
    one.done();
    assert_eq!(queue.counts().tracked, 1, "1 is not queued again");
    three.finish(Outcome::requeue_after(ms(10)));
    assert_eq!(
        queue.counts().waiting,
        1,
        "the caller's re-add is the caller's"
    );
}

#[test]
fn parked_keys_and_the_probe_are_removed_and_the_next_key_is_probed() {
    let clock = ManualClock::new();
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .clock(clock.clone())
        .outage_detection(OutageConfig::default())
        .build();
    queue.add_batch(0..10);
    for _ in 0..20 {
        while let Some(lease) = queue.try_get() {
            lease.finish(Outcome::retry());
        }
        clock.advance(ms(500));
    }
    assert!(queue.is_outage_open());
    assert!(queue.parked_len() >= 8);
    assert_eq!(queue.retain(even), 5);
    assert_eq!(
        queue.parked_len() + 1,
        5,
        "the even keys, and one of them the probe"
    );
    clock.advance(Duration::from_secs(5));
    let probe = queue.try_get().expect("a probe of a key kept");
    assert!(even(&probe));
    probe.finish(Outcome::forget());
    assert!(!queue.is_outage_open());
}

/// `keep` is user code: if it panics, the queue is as it was, and the panic propagates.
#[test]
fn a_keep_that_panics_changes_nothing() {
    let clock = ManualClock::new();
    let queue: WorkQueue<u32> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_batch(0..10);
    queue.add_after(20, ms(5));
    let before = queue.counts();
    let mut calls = 0;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        queue.retain(|k| {
            calls += 1;
            assert!(calls < 5, "keep panicked (expected)");
            even(k)
        })
    }));
    assert!(r.is_err());
    assert_eq!(queue.counts(), before);
    clock.advance(ms(5));
    assert_eq!(queue.len(), 11);
    assert_eq!(queue.retain(even), 5);
}

/// A limiter whose `forget` panics: every removed key is still removed (and forgotten where it
/// can be); the first panic propagates after the lock is released.
#[test]
fn a_limiter_that_panics_in_forget_still_removes_every_key() {
    let limiter = Arc::new(FaultyLimiter(
        workqueue_core::ratelimit::default_controller_rate_limiter::<u32>(),
    ));
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .clock(ManualClock::new())
        .rate_limiter(limiter.clone() as Arc<dyn RateLimiter<u32>>)
        .build();
    queue.add_batch(0..6);
    let r = faults::with_fault(Fault::Limiter, 2, || queue.retain(even));
    assert!(r.is_err());
    assert_eq!(queue.counts().tracked, 3);
    assert_eq!(queue.len(), 3);
}

/// A drain that also waits for the ready queue ends once `retain` has emptied it.
#[test]
fn a_drain_waiting_for_queued_keys_ends_when_they_are_removed() {
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .clock(ManualClock::new())
        .drain_includes_queued(true)
        .build();
    queue.add_batch(0..4);
    let draining = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.shut_down_with_drain())
    };
    while !queue.is_shutting_down() {
        std::thread::yield_now();
    }
    assert_eq!(queue.retain(|_| false), 4);
    draining.join().unwrap();
}
