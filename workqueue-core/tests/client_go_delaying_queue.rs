//! Ports of client-go's `util/workqueue/delaying_queue_test.go`, with its exact numbers.
//!
//! Go steps a `FakeClock` and polls `Len()`; here the queue runs on a [`ManualClock`] and `len()`
//! promotes every key due at the clock's time, so no polling (and no waiting for a background
//! loop to drain its channel) is needed: each step is exact.

mod common;

use common::{manual_queue, ms, secs};
use workqueue_core::state::{AddStatus, Counts};

// Go: TestSimpleQueue.
#[test]
fn simple_queue() {
    let (queue, clock) = manual_queue();

    let first = "foo";
    assert_eq!(queue.add_after(first, ms(50)), AddStatus::Waiting);
    assert_eq!(queue.len(), 0, "should not have added");

    clock.advance(ms(60));
    assert_eq!(queue.len(), 1, "should have added");
    let lease = queue.get().unwrap();
    assert_eq!(*lease, first);
    lease.done();

    // Step past the next heartbeat: nothing fires again.
    clock.advance(secs(10));
    assert_eq!(queue.len(), 0, "added to queue");
    assert!(queue.try_get().is_none());
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestDeduping.
#[test]
fn deduping() {
    let (queue, clock) = manual_queue();

    let first = "foo";
    assert_eq!(queue.add_after(first, ms(50)), AddStatus::Waiting);
    assert_eq!(queue.add_after(first, ms(70)), AddStatus::AlreadyWaiting);
    assert_eq!(queue.len(), 0, "should not have added");

    // Step past the first block: we should receive now.
    clock.advance(ms(60));
    assert_eq!(queue.len(), 1, "should have added");
    let lease = queue.get().unwrap();
    assert_eq!(*lease, first);
    lease.done();

    // Step past the second add: the 70 ms request was dropped.
    clock.advance(ms(20));
    assert_eq!(queue.len(), 0, "should not have added");

    // Test again, but this time the earlier request should override.
    assert_eq!(queue.add_after(first, ms(50)), AddStatus::Waiting);
    assert_eq!(queue.add_after(first, ms(30)), AddStatus::Waiting);
    assert_eq!(queue.len(), 0, "should not have added");

    clock.advance(ms(40));
    assert_eq!(queue.len(), 1, "should have added");
    let lease = queue.get().unwrap();
    assert_eq!(*lease, first);
    lease.done();

    // Step past the second add: the 50 ms request does not fire separately.
    clock.advance(ms(20));
    assert_eq!(queue.len(), 0, "should not have added");
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestAddTwoFireEarly.
#[test]
fn add_two_fire_early() {
    let (queue, clock) = manual_queue();

    let (first, second, third) = ("foo", "bar", "baz");
    queue.add_after(first, secs(1));
    queue.add_after(second, ms(50));
    assert_eq!(queue.len(), 0, "should not have added");

    clock.advance(ms(60));
    assert_eq!(queue.len(), 1);
    let bar = queue.get().unwrap();
    assert_eq!(*bar, second);

    queue.add_after(third, secs(2));

    clock.advance(secs(1));
    assert_eq!(queue.len(), 1);
    let foo = queue.get().unwrap();
    assert_eq!(*foo, first);

    clock.advance(secs(2));
    assert_eq!(queue.len(), 1);
    let baz = queue.get().unwrap();
    assert_eq!(*baz, third);

    // Go never calls Done here; the leases are finished when they drop.
    drop((bar, foo, baz));
}

// Go: TestCopyShifting.
#[test]
fn copy_shifting() {
    let (queue, clock) = manual_queue();

    let (first, second, third) = ("foo", "bar", "baz");
    queue.add_after(first, secs(1));
    queue.add_after(second, ms(500));
    queue.add_after(third, ms(250));
    assert_eq!(queue.len(), 0, "should not have added");

    // All three are due after one big step; they come out in ready-time order.
    clock.advance(secs(2));
    assert_eq!(queue.len(), 3);

    let mut order = Vec::new();
    while let Some(lease) = queue.try_get() {
        order.push(*lease);
        lease.done();
    }
    assert_eq!(order, [third, second, first]);
}
