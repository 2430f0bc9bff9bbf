//! Ports of client-go's `util/workqueue/queue_test.go` (every scenario, same numbers).
//!
//! Differences from the Go tests, all forced by the API or by the no-sleep rule:
//! - `Get`/`Done` are `get()` and a [`Lease`](workqueue_core::Lease): `done()` consumes it.
//! - Go's `time.Sleep` in producers and consumers becomes `thread::yield_now()`.
//! - There is no pluggable store with `Touch`, so the collapse tests assert the observable dedup
//!   instead: the length stays put and the key is processed once (or once more after its lease).
//! - "The second Get blocks" is proven without sleeping: `try_get()` is `None`, and a spawned
//!   getter that the probe clock shows waiting cannot have finished while the key is leased.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use common::{SENTINEL_ONLY, probe_queue};
use workqueue_core::state::{AddStatus, Counts};
use workqueue_core::{DrainStop, ManualClock, WorkQueue};

/// The two ways client-go's `TestBasic` and `TestAddWhileProcessing` shut the queue down.
#[derive(Debug, Clone, Copy)]
enum Shutdown {
    Plain,
    Drain,
}

impl Shutdown {
    fn run(self, queue: &WorkQueue<String>) {
        match self {
            Shutdown::Plain => queue.shut_down(),
            Shutdown::Drain => queue.shut_down_with_drain(),
        }
    }
}

const AFTER_SHUTDOWN: &str = "added after shutdown!";

fn basic(shutdown: Shutdown) {
    let queue: WorkQueue<String> = WorkQueue::new();

    // 50 producers, each adding its own key 50 times.
    let producers: Vec<_> = (0..50)
        .map(|i| {
            let queue = queue.clone();
            thread::spawn(move || {
                for _ in 0..50 {
                    queue.add(i.to_string());
                    thread::yield_now();
                }
            })
        })
        .collect();

    // 10 consumers.
    let saw_late_key = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let consumers: Vec<_> = (0..10)
        .map(|_| {
            let (queue, saw_late_key, seen) = (queue.clone(), saw_late_key.clone(), seen.clone());
            thread::spawn(move || {
                while let Some(lease) = queue.get() {
                    if lease.as_str() == AFTER_SHUTDOWN {
                        saw_late_key.store(true, Ordering::SeqCst);
                    }
                    seen.lock().unwrap().insert(lease.clone());
                    thread::yield_now();
                    lease.done();
                }
            })
        })
        .collect();

    for p in producers {
        p.join().unwrap();
    }
    shutdown.run(&queue);
    assert_eq!(queue.add(AFTER_SHUTDOWN.to_string()), AddStatus::ShutDown);
    for c in consumers {
        c.join().unwrap();
    }

    assert!(
        !saw_late_key.load(Ordering::SeqCst),
        "got an item added after shutdown"
    );
    assert_eq!(queue.len(), 0);
    // Stronger than Go: every key added before shutdown was processed (get drains the queue).
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 50, "{seen:?}");
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestBasic (ShutDown variant).
#[test]
fn basic_shut_down() {
    basic(Shutdown::Plain);
}

// Go: TestBasic (ShutDownWithDrain variant).
#[test]
fn basic_shut_down_with_drain() {
    basic(Shutdown::Drain);
}

fn add_while_processing(shutdown: Shutdown) {
    let queue: WorkQueue<String> = WorkQueue::new();

    // 50 producers, each adding its own key once.
    let producers: Vec<_> = (0..50)
        .map(|i| {
            let queue = queue.clone();
            thread::spawn(move || {
                queue.add(i.to_string());
            })
        })
        .collect();

    // 10 consumers, each re-adding a key it has seen fewer than 2 times before finishing it.
    let consumers: Vec<_> = (0..10)
        .map(|_| {
            let queue = queue.clone();
            thread::spawn(move || {
                let mut counters: HashMap<String, usize> = HashMap::new();
                while let Some(lease) = queue.get() {
                    let count = counters.entry(lease.clone()).or_default();
                    *count += 1;
                    if *count < 2 {
                        queue.add(lease.clone());
                    }
                    lease.done();
                }
            })
        })
        .collect();

    for p in producers {
        p.join().unwrap();
    }
    shutdown.run(&queue);
    for c in consumers {
        c.join().unwrap();
    }
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestAddWhileProcessing (ShutDown variant).
#[test]
fn add_while_processing_shut_down() {
    add_while_processing(Shutdown::Plain);
}

// Go: TestAddWhileProcessing (ShutDownWithDrain variant).
#[test]
fn add_while_processing_shut_down_with_drain() {
    add_while_processing(Shutdown::Drain);
}

// Go: TestLen.
#[test]
fn len() {
    let queue: WorkQueue<&str> = WorkQueue::new();
    assert_eq!(queue.add("foo"), AddStatus::Queued);
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.add("bar"), AddStatus::Queued);
    assert_eq!(queue.len(), 2);
    assert_eq!(queue.add("foo"), AddStatus::AlreadyQueued); // still queued: no change
    assert_eq!(queue.len(), 2);
}

// Go: TestReinsert.
#[test]
fn reinsert() {
    let queue: WorkQueue<&str> = WorkQueue::new();
    queue.add("foo");

    // Start processing.
    let lease = queue.get().unwrap();
    assert_eq!(*lease, "foo");

    // Add it back while processing.
    assert_eq!(queue.add(*lease), AddStatus::Dirty);

    // Finish it up.
    lease.done();

    // It should be back on the queue.
    let lease = queue.get().unwrap();
    assert_eq!(*lease, "foo");

    // Finish that one up.
    lease.done();

    assert_eq!(queue.len(), 0);
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestCollapse.
#[test]
fn collapse() {
    let queue: WorkQueue<&str> = WorkQueue::new();
    // Add a new one twice: the second add is collapsed into the first (Go: Touch is called).
    assert_eq!(queue.add("bar"), AddStatus::Queued);
    assert_eq!(queue.add("bar"), AddStatus::AlreadyQueued);
    assert_eq!(queue.len(), 1);

    // It should get the new one.
    let lease = queue.get().unwrap();
    assert_eq!(*lease, "bar");

    // Finish that one up.
    lease.done();

    // There should be no more objects in the queue: "bar" was processed once.
    assert_eq!(queue.len(), 0);
    assert!(queue.try_get().is_none());
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestCollapseWhileProcessing.
#[test]
fn collapse_while_processing() {
    // The probe queue holds a far-away sentinel key, so a blocked getter reads the probe clock.
    let (queue, clock) = probe_queue();
    queue.add("foo");

    // Start processing.
    let first = queue.get().unwrap();
    assert_eq!(*first, "foo");

    // Add the same one twice while processing: one re-run, not two, and not queued now
    // (Go: Touch is not called).
    assert_eq!(queue.add("foo"), AddStatus::Dirty);
    assert_eq!(queue.add("foo"), AddStatus::AlreadyDirty);
    assert_eq!(queue.len(), 0);
    assert!(queue.try_get().is_none(), "foo handed out twice at once");

    let processed = Arc::new(AtomicUsize::new(0));
    let getter = {
        let (queue, processed) = (queue.clone(), processed.clone());
        thread::spawn(move || {
            // This get must block until the first lease is finished.
            let lease = queue.get().expect("foo is re-queued, not shut down");
            assert_eq!(*lease, "foo");
            processed.fetch_add(1, Ordering::SeqCst);
            lease.done();
        })
    };

    // Go sleeps 100 ms here; instead, wait until the getter has looked at the queue and is about
    // to wait (it reads the clock under the lock just before waiting).
    clock.wait_for_reads(getter.thread().id(), 1);
    assert!(
        !getter.is_finished(),
        "the second get returned while foo was in flight"
    );
    assert_eq!(processed.load(Ordering::SeqCst), 0);
    assert!(queue.try_get().is_none(), "foo handed out twice at once");

    // Let the worker go.
    first.done();
    getter.join().unwrap();

    assert_eq!(processed.load(Ordering::SeqCst), 1);
    assert_eq!(queue.len(), 0);
    assert!(queue.try_get().is_none(), "foo was processed a third time");
    assert_eq!(queue.counts(), SENTINEL_ONLY);
}

// Go: TestQueueDrainageUsingShutDownWithDrain.
#[test]
fn queue_drainage_using_shut_down_with_drain() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");
    queue.add("bar");
    let first = queue.get().unwrap();
    let second = queue.get().unwrap();

    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain())
    };

    // Ensure that shutdown has started: get only returns None once the queue is shutting down
    // (and nothing is queued). It blocks until then.
    let got = queue.get();
    assert!(got.is_none(), "nothing should be queued, got {got:?}");
    assert!(queue.is_shutting_down());
    // Two leases are outstanding: the drain cannot have returned.
    assert!(
        !drainer.is_finished(),
        "drain returned with leases in flight"
    );

    first.done();
    second.done();

    drainer.join().unwrap();
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestNoQueueDrainageUsingShutDown.
#[test]
fn no_queue_drainage_using_shut_down() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");
    queue.add("bar");
    let first = queue.get().unwrap();
    let second = queue.get().unwrap();

    // shut_down does not wait for the leases: it returns although they are never finished here.
    let stopper = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down())
    };
    stopper.join().unwrap();
    assert!(queue.is_shutting_down());
    assert_eq!(queue.counts().processing, 2);

    drop((first, second));
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestForceQueueShutdownUsingShutDown.
//
// The drain is the timed variant on a ManualClock only so that a drain that misses the release
// fails (timed out) instead of hanging; it must report that shut_down() released it.
#[test]
fn force_queue_shutdown_using_shut_down() {
    let clock = ManualClock::new();
    let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add("foo");
    queue.add("bar");
    let first = queue.get().unwrap();
    let second = queue.get().unwrap();

    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain_timeout(common::secs(1)))
    };

    // Ensure that the drain has started: get only returns None once the queue is shutting down.
    let got = queue.get();
    assert!(got.is_none(), "nothing should be queued, got {got:?}");
    assert!(
        !drainer.is_finished(),
        "drain returned with leases in flight"
    );

    // Force a shutdown: the drain must return although no lease was finished.
    queue.shut_down();
    clock.advance(common::secs(1));
    let err = drainer.join().unwrap().unwrap_err();
    assert_eq!(
        err.stop,
        DrainStop::Released,
        "shut_down() did not release the drain"
    );
    assert_eq!(queue.counts().processing, 2);

    drop((first, second));
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestQueueDrainageUsingShutDownWithDrainWithDirtyItem.
#[test]
fn queue_drainage_using_shut_down_with_drain_with_dirty_item() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");
    let gotten = queue.get().unwrap();
    assert_eq!(queue.add("foo"), AddStatus::Dirty);

    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain())
    };

    // Ensure that shutdown has started (the store is empty: foo is only dirty).
    let got = queue.get();
    assert!(got.is_none(), "nothing should be queued, got {got:?}");
    assert!(queue.is_shutting_down());

    // Finishing the lease re-queues the dirty key, even after shutdown.
    gotten.done();
    let again = queue.get().expect("the dirty item was not re-queued");
    assert_eq!(*again, "foo");
    again.done();

    assert!(queue.get().is_none(), "the queue should be shut down");
    drainer.join().unwrap();
    assert_eq!(queue.counts(), Counts::default());
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Object {
    id: u64,
}

// Go: TestGarbageCollection.
#[test]
fn garbage_collection() {
    let queue: WorkQueue<Arc<Object>> = WorkQueue::new();

    // Add, get, done: the queue keeps no reference to the key.
    let obj = Arc::new(Object { id: 1 });
    let weak = Arc::downgrade(&obj);
    queue.add(obj);
    let lease = queue.get().unwrap();
    assert_eq!(lease.id, 1);
    lease.done();
    assert_eq!(weak.strong_count(), 0, "the queue leaked a finished key");
    assert!(weak.upgrade().is_none());

    // The same with a duplicate add and a re-add while processing.
    let obj = Arc::new(Object { id: 2 });
    let weak = Arc::downgrade(&obj);
    queue.add(obj.clone());
    queue.add(obj.clone());
    let lease = queue.get().unwrap();
    queue.add(obj);
    lease.done();
    let lease = queue.get().unwrap();
    lease.done();
    assert!(weak.upgrade().is_none(), "the queue leaked a re-added key");

    // A delayed key dropped by shutdown is freed, and so is a queued key of a dropped queue.
    let delayed = Arc::new(Object { id: 3 });
    let weak_delayed = Arc::downgrade(&delayed);
    queue.add_after(delayed, common::secs(1));
    let queued = Arc::new(Object { id: 4 });
    let weak_queued = Arc::downgrade(&queued);
    queue.add(queued);
    queue.shut_down();
    assert!(
        weak_delayed.upgrade().is_none(),
        "shutdown kept a delayed key"
    );
    assert!(weak_queued.upgrade().is_some(), "a queued key is drained");
    drop(queue);
    assert!(
        weak_queued.upgrade().is_none(),
        "a dropped queue leaked a key"
    );
}
