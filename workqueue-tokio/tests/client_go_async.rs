//! Ports of client-go's `util/workqueue` tests (`queue_test.go`, `delaying_queue_test.go`,
//! `rate_limiting_queue_test.go`) to the async [`WorkQueue`], with client-go's numbers.
//!
//! Go steps a `FakeClock` and polls `Len()`; here every test runs on tokio's paused clock
//! (`start_paused = true`), where `sleep(d)` advances virtual time by exactly `d` at once, and
//! `tokio::time::advance` moves it by any amount (down to a nanosecond). So each delay is checked
//! exactly: a key is not available a nanosecond before its deadline, is available at it, and a
//! waiting `get().await` returns at exactly that virtual instant.
//!
//! client-go's `Touch` trace (TestCollapse, TestCollapseWhileProcessing) corresponds to
//! `AddStatus::AlreadyQueued`: the add found the key sitting in the queue.

mod common;

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{ms, ns, secs, within};
use tokio::task::JoinSet;
use tokio::time::Instant;
use workqueue_core::state::{AddStatus, Counts};
use workqueue_ratelimit::ExponentialFailure;
use workqueue_tokio::{Outcome, WorkQueue};

/// The two shutdown variants client-go's concurrent tests run with.
#[derive(Debug, Clone, Copy)]
enum Shutdown {
    Plain,
    Drain,
}

async fn shut_down<T>(queue: &WorkQueue<T>, how: Shutdown)
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
{
    match how {
        Shutdown::Plain => queue.shut_down(),
        Shutdown::Drain => queue.shut_down_with_drain().await,
    }
}

#[track_caller]
fn assert_not_ready<T>(queue: &WorkQueue<T>, what: &str)
where
    T: Hash + Eq + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    if let Some(lease) = queue.try_get() {
        panic!("{what}: {:?} available too early", *lease);
    }
}

/// Asserts that `key` becomes available exactly `delay` from now on the paused clock: not one
/// nanosecond earlier, and at `delay`. Takes it and finishes it with `done` (which keeps the
/// limiter's failure count, as Go's test does).
async fn assert_fires_after(queue: &WorkQueue<&'static str>, key: &'static str, delay: Duration) {
    tokio::time::advance(delay - ns(1)).await;
    assert_not_ready(queue, &format!("{key} at {delay:?} - 1ns"));
    tokio::time::advance(ns(1)).await;
    let lease = queue
        .try_get()
        .unwrap_or_else(|| panic!("{key} not available after {delay:?}"));
    assert_eq!(*lease, key);
    lease.done();
    assert!(queue.try_get().is_none());
}

/// Awaits `get` and asserts it returns `key` exactly `delay` after `since` (virtual time).
async fn assert_get_at(
    queue: &WorkQueue<&'static str>,
    key: &'static str,
    since: Instant,
    delay: Duration,
) -> workqueue_tokio::Lease<&'static str> {
    let lease = tokio::time::timeout(secs(3600), queue.get())
        .await
        .unwrap_or_else(|_| panic!("{key} never handed out"))
        .expect("queue is not shut down");
    assert_eq!(*lease, key);
    assert_eq!(since.elapsed(), delay, "{key} handed out at the wrong time");
    lease
}

// ---- queue_test.go ------------------------------------------------------------------------------

// Go: TestBasic. 50 producers add their number 50 times, 1 ms apart; 10 consumers take, sleep
// 3 ms and finish; after the producers, shut down and add one more key, which must be ignored.
async fn basic(how: Shutdown) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let mut producers = JoinSet::new();
    for i in 0..50 {
        let q = queue.clone();
        producers.spawn(async move {
            for _ in 0..50 {
                q.add(i.to_string());
                tokio::time::sleep(ms(1)).await;
            }
        });
    }
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let mut consumers = JoinSet::new();
    for _ in 0..10 {
        let q = queue.clone();
        let seen = seen.clone();
        consumers.spawn(async move {
            while let Some(lease) = within(q.get()).await {
                assert_ne!(
                    lease.as_str(),
                    "added after shutdown!",
                    "got an item added after shutdown"
                );
                seen.lock().unwrap().insert(lease.clone());
                tokio::time::sleep(ms(3)).await;
                lease.done();
            }
        });
    }
    producers.join_all().await;
    shut_down(&queue, how).await;
    assert_eq!(
        queue.add("added after shutdown!".to_string()),
        AddStatus::ShutDown
    );
    consumers.join_all().await;

    assert_eq!(queue.len(), 0, "expected the queue to be empty");
    assert_eq!(queue.counts(), Counts::default());
    // Every key was added before the shutdown, so it was processed (a plain shutdown still drains).
    assert_eq!(seen.lock().unwrap().len(), 50);
}

#[tokio::test(start_paused = true)]
async fn basic_shut_down() {
    basic(Shutdown::Plain).await;
}

#[tokio::test(start_paused = true)]
async fn basic_shut_down_with_drain() {
    basic(Shutdown::Drain).await;
}

// Go: TestAddWhileProcessing. 50 producers add their number once; 10 consumers re-add each item
// (before finishing it) until their own counter for it reaches 2. On a multi-thread runtime (no
// delays here, so real threads add interleavings instead).
async fn add_while_processing(how: Shutdown) {
    let queue: WorkQueue<u32> = WorkQueue::new();
    let mut producers = JoinSet::new();
    for i in 0..50 {
        let q = queue.clone();
        producers.spawn(async move {
            q.add(i);
        });
    }
    let processed = Arc::new(Mutex::new(HashSet::new()));
    let mut consumers = JoinSet::new();
    for _ in 0..10 {
        let q = queue.clone();
        let processed = processed.clone();
        consumers.spawn(async move {
            let mut counters: HashMap<u32, u32> = HashMap::new();
            while let Some(lease) = q.get().await {
                let count = counters.entry(*lease).or_insert(0);
                *count += 1;
                if *count < 2 {
                    q.add(*lease);
                }
                processed.lock().unwrap().insert(*lease);
                tokio::task::yield_now().await;
                lease.done();
            }
        });
    }
    // Real time (multi-thread runtime): a generous watchdog turns a hang into a failure.
    tokio::time::timeout(secs(30), async {
        producers.join_all().await;
        shut_down(&queue, how).await;
        consumers.join_all().await;
    })
    .await
    .expect("hung: a consumer was never woken, or the drain never returned");

    assert_eq!(queue.len(), 0, "expected the queue to be empty");
    assert_eq!(queue.counts(), Counts::default());
    assert_eq!(processed.lock().unwrap().len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_while_processing_shut_down() {
    add_while_processing(Shutdown::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_while_processing_shut_down_with_drain() {
    add_while_processing(Shutdown::Drain).await;
}

// Go: TestLen.
#[tokio::test]
async fn len() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    assert_eq!(queue.add("foo"), AddStatus::Queued);
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.add("bar"), AddStatus::Queued);
    assert_eq!(queue.len(), 2);
    assert_eq!(queue.add("foo"), AddStatus::AlreadyQueued); // should not increase the length
    assert_eq!(queue.len(), 2);
}

// Go: TestReinsert.
#[tokio::test]
async fn reinsert() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");

    // Start processing.
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, "foo");

    // Add it back while processing.
    assert_eq!(queue.add("foo"), AddStatus::Dirty);
    assert_eq!(
        queue.len(),
        0,
        "a dirty key is not queued while it is processed"
    );

    // Finish it up.
    lease.done();

    // It should be back on the queue.
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, "foo");

    // Finish that one up.
    lease.done();
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestCollapse.
#[tokio::test]
async fn collapse() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    // Add a new one twice: the second add touches the queued key.
    assert_eq!(queue.add("bar"), AddStatus::Queued);
    assert_eq!(
        queue.add("bar"),
        AddStatus::AlreadyQueued,
        "bar should be touched"
    );

    // It should get the new one.
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, "bar");

    // Finish it up.
    lease.done();

    // There should be no more objects in the queue.
    assert_eq!(queue.len(), 0);
    assert!(queue.try_get().is_none());
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestCollapseWhileProcessing.
#[tokio::test(start_paused = true)]
async fn collapse_while_processing() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");

    // Start processing.
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, "foo");

    // Add the same one twice while processing: neither touches a queued key.
    assert_eq!(queue.add("foo"), AddStatus::Dirty);
    assert_eq!(queue.add("foo"), AddStatus::AlreadyDirty);

    let q = queue.clone();
    let waiter = tokio::spawn(async move {
        let lease = within(q.get()).await.unwrap();
        assert_eq!(*lease, "foo");
        let at = Instant::now();
        lease.done();
        at
    });

    // The second get must block while foo is in flight.
    tokio::time::sleep(ms(100)).await;
    assert!(
        !waiter.is_finished(),
        "the second get should still be blocked"
    );

    // Finish the first one.
    let released_at = Instant::now();
    lease.done();
    assert_eq!(
        within(waiter).await.unwrap(),
        released_at,
        "the waiting get takes foo as soon as its first lease finishes"
    );

    // There should be no more objects in the queue.
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestQueueDrainageUsingShutDownWithDrain.
#[tokio::test(start_paused = true)]
async fn queue_drainage_using_shut_down_with_drain() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");
    queue.add("bar");
    let foo = within(queue.get()).await.unwrap();
    let bar = within(queue.get()).await.unwrap();

    let q = queue.clone();
    let drain = tokio::spawn(async move {
        q.shut_down_with_drain().await;
        Instant::now()
    });

    // Ensure that the shutdown started: get returns None (client-go: shutdown == true).
    assert!(within(queue.get()).await.is_none());
    assert!(queue.is_shutting_down());

    // The drain waits for both leases.
    tokio::time::sleep(secs(1)).await;
    assert!(
        !drain.is_finished(),
        "the drain returned with leases outstanding"
    );
    foo.done();
    tokio::time::sleep(secs(1)).await;
    assert!(
        !drain.is_finished(),
        "the drain returned with bar outstanding"
    );
    let finished_at = Instant::now();
    bar.done();

    assert_eq!(within(drain).await.unwrap(), finished_at);
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestNoQueueDrainageUsingShutDown.
#[tokio::test(start_paused = true)]
async fn no_queue_drainage_using_shut_down() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");
    queue.add("bar");
    let foo = within(queue.get()).await.unwrap();
    let bar = within(queue.get()).await.unwrap();

    // Plain shutdown returns although neither lease is finished.
    queue.shut_down();
    assert!(queue.is_shutting_down());
    assert!(within(queue.get()).await.is_none());
    assert_eq!(queue.counts().processing, 2);

    drop((foo, bar));
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestForceQueueShutdownUsingShutDown.
#[tokio::test(start_paused = true)]
async fn force_queue_shutdown_using_shut_down() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");
    queue.add("bar");
    let foo = within(queue.get()).await.unwrap();
    let bar = within(queue.get()).await.unwrap();

    let q = queue.clone();
    let drain = tokio::spawn(async move {
        q.shut_down_with_drain().await;
        Instant::now()
    });

    // Ensure that the shutdown started.
    assert!(within(queue.get()).await.is_none());
    tokio::time::sleep(secs(1)).await;
    assert!(!drain.is_finished());

    // Force a shutdown: the drain returns without any lease finishing.
    let forced_at = Instant::now();
    queue.shut_down();
    assert_eq!(within(drain).await.unwrap(), forced_at);
    assert_eq!(queue.counts().processing, 2);

    drop((foo, bar));
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestQueueDrainageUsingShutDownWithDrainWithDirtyItem.
#[tokio::test(start_paused = true)]
async fn queue_drainage_using_shut_down_with_drain_with_dirty_item() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("foo");
    let gotten = within(queue.get()).await.unwrap();
    assert_eq!(queue.add("foo"), AddStatus::Dirty);

    let q = queue.clone();
    let drain = tokio::spawn(async move { q.shut_down_with_drain().await });

    // Ensure that the shutdown started: the store is empty, foo is only dirty.
    assert!(within(queue.get()).await.is_none());

    // Finishing the lease re-queues the dirty key, even after shutdown.
    gotten.done();
    let lease = queue
        .get()
        .await
        .expect("the dirty item is re-queued after shutdown");
    assert_eq!(*lease, "foo");
    lease.done();

    assert!(within(queue.get()).await.is_none());
    within(drain).await.unwrap();
    assert_eq!(queue.counts(), Counts::default());
}

/// client-go's drain waits only for leases: it returns when the dirty key's lease finishes, while
/// the re-queued key is still waiting to be taken. `drain_includes_queued(true)` also waits for it
/// (kubernetes#141079).
#[tokio::test(start_paused = true)]
async fn drain_with_dirty_item_and_drain_includes_queued() {
    for includes_queued in [false, true] {
        let queue: WorkQueue<&'static str> = WorkQueue::builder()
            .drain_includes_queued(includes_queued)
            .build();
        queue.add("foo");
        let gotten = within(queue.get()).await.unwrap();
        queue.add("foo");

        let q = queue.clone();
        let drain = tokio::spawn(async move { q.shut_down_with_drain().await });
        assert!(within(queue.get()).await.is_none());

        gotten.done();
        tokio::time::sleep(secs(1)).await;
        assert_eq!(queue.len(), 1);
        assert_eq!(
            drain.is_finished(),
            !includes_queued,
            "drain_includes_queued({includes_queued}) with foo queued again"
        );

        let lease = within(queue.get()).await.unwrap();
        assert_eq!(*lease, "foo");
        lease.done();
        within(drain).await.unwrap();
        assert_eq!(queue.counts(), Counts::default());
    }
}

/// A key whose `Hash`/`Eq` look at its name, holding an `Arc` so a test can see when every copy
/// is gone.
#[derive(Debug, Clone)]
struct Object(Arc<String>);

impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Object {}

impl Hash for Object {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

// Go: TestGarbageCollection. In Rust: every copy of the key is dropped once it is done.
#[tokio::test(start_paused = true)]
async fn garbage_collection() {
    let queue: WorkQueue<Object> = WorkQueue::new();

    let object = Arc::new("default/web".to_string());
    let weak = Arc::downgrade(&object);
    queue.add(Object(object));
    let lease = within(queue.get()).await.unwrap();
    lease.done();
    assert!(
        weak.upgrade().is_none(),
        "the queue still holds the key after done"
    );

    // The same through a delayed add, a re-add while processing, and a retry.
    let object = Arc::new("default/db".to_string());
    let weak = Arc::downgrade(&object);
    queue.add_after(Object(object.clone()), secs(1));
    tokio::time::sleep(secs(1)).await;
    let lease = within(queue.get()).await.unwrap();
    queue.add(Object(object.clone()));
    drop(object);
    lease.finish(Outcome::retry()); // dirty: queued again now, and the retry waits 5 ms
    assert_eq!(
        queue.counts(),
        Counts {
            ready: 1,
            processing: 0,
            waiting: 1,
            tracked: 1
        }
    );
    queue
        .try_get()
        .expect("the dirty key is queued")
        .finish(Outcome::forget());
    tokio::time::sleep(secs(10)).await;
    queue
        .try_get()
        .expect("the retry fired")
        .finish(Outcome::forget());
    assert_eq!(queue.counts(), Counts::default());
    assert!(
        weak.upgrade().is_none(),
        "the queue still holds the key after done"
    );

    // A waiting key dropped by shutdown is freed.
    let object = Arc::new("default/cache".to_string());
    let weak = Arc::downgrade(&object);
    queue.add_after(Object(object), secs(60));
    queue.shut_down();
    assert!(weak.upgrade().is_none(), "shutdown kept a waiting key");
}

// ---- delaying_queue_test.go ---------------------------------------------------------------------

// Go: TestSimpleQueue.
#[tokio::test(start_paused = true)]
async fn simple_queue() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();

    let first = "foo";
    assert_eq!(queue.add_after(first, ms(50)), AddStatus::Waiting);
    assert_eq!(queue.len(), 0, "should not have added");

    tokio::time::sleep(ms(60)).await;
    assert_eq!(queue.len(), 1, "should have added");
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, first);
    lease.done();

    // Step past the next heartbeat: nothing fires again.
    tokio::time::sleep(secs(10)).await;
    assert_eq!(queue.len(), 0, "added to queue");
    assert!(queue.try_get().is_none());
    assert_eq!(queue.counts(), Counts::default());
}

/// TestSimpleQueue's delay, exactly: the key is not ready a nanosecond early, and a waiting `get`
/// returns at exactly 50 ms.
#[tokio::test(start_paused = true)]
async fn simple_queue_fires_exactly() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add_after("foo", ms(50));
    assert_fires_after(&queue, "foo", ms(50)).await;

    let start = Instant::now();
    queue.add_after("foo", ms(50));
    assert_get_at(&queue, "foo", start, ms(50)).await.done();
    assert!(
        tokio::time::timeout(secs(10), queue.get()).await.is_err(),
        "nothing fires again"
    );
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestDeduping.
#[tokio::test(start_paused = true)]
async fn deduping() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();

    let first = "foo";
    assert_eq!(queue.add_after(first, ms(50)), AddStatus::Waiting);
    assert_eq!(queue.add_after(first, ms(70)), AddStatus::AlreadyWaiting);
    assert_eq!(queue.len(), 0, "should not have added");

    // Step past the first block: we should receive now.
    tokio::time::sleep(ms(60)).await;
    assert_eq!(queue.len(), 1, "should have added");
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, first);
    lease.done();

    // Step past the second add: the 70 ms request was dropped.
    tokio::time::sleep(ms(20)).await;
    assert_eq!(queue.len(), 0, "should not have added");

    // Test again, but this time the earlier request should override.
    assert_eq!(queue.add_after(first, ms(50)), AddStatus::Waiting);
    assert_eq!(queue.add_after(first, ms(30)), AddStatus::Waiting);
    assert_eq!(queue.len(), 0, "should not have added");

    tokio::time::sleep(ms(40)).await;
    assert_eq!(queue.len(), 1, "should have added");
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, first);
    lease.done();

    // Step past the second add: the 50 ms request does not fire separately.
    tokio::time::sleep(ms(20)).await;
    assert_eq!(queue.len(), 0, "should not have added");
    assert_eq!(queue.counts(), Counts::default());
}

/// TestDeduping's deadlines, exactly, seen by a waiting `get`.
#[tokio::test(start_paused = true)]
async fn deduping_fires_exactly() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let start = Instant::now();
    queue.add_after("foo", ms(50));
    queue.add_after("foo", ms(70));
    assert_get_at(&queue, "foo", start, ms(50)).await.done();
    assert!(tokio::time::timeout(ms(100), queue.get()).await.is_err());

    let start = Instant::now();
    queue.add_after("foo", ms(50));
    queue.add_after("foo", ms(30));
    assert_get_at(&queue, "foo", start, ms(30)).await.done();
    assert!(tokio::time::timeout(ms(100), queue.get()).await.is_err());
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestAddTwoFireEarly.
#[tokio::test(start_paused = true)]
async fn add_two_fire_early() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();

    let (first, second, third) = ("foo", "bar", "baz");
    queue.add_after(first, secs(1));
    queue.add_after(second, ms(50));
    assert_eq!(queue.len(), 0, "should not have added");

    tokio::time::sleep(ms(60)).await;
    assert_eq!(queue.len(), 1, "should have added");
    let bar = within(queue.get()).await.unwrap();
    assert_eq!(*bar, second);

    queue.add_after(third, secs(2));

    tokio::time::sleep(secs(1)).await;
    assert_eq!(queue.len(), 1, "should have added");
    let foo = within(queue.get()).await.unwrap();
    assert_eq!(*foo, first);

    tokio::time::sleep(secs(2)).await;
    assert_eq!(queue.len(), 1, "should have added");
    let baz = within(queue.get()).await.unwrap();
    assert_eq!(*baz, third);

    // Go never calls Done here; the leases finish when they drop.
    drop((bar, foo, baz));
    assert_eq!(queue.counts(), Counts::default());
}

/// TestAddTwoFireEarly's deadlines, exactly, seen by a waiting `get`.
#[tokio::test(start_paused = true)]
async fn add_two_fire_early_exactly() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let start = Instant::now();
    queue.add_after("foo", secs(1));
    queue.add_after("bar", ms(50));
    let bar = assert_get_at(&queue, "bar", start, ms(50)).await;
    queue.add_after("baz", secs(2));
    let foo = assert_get_at(&queue, "foo", start, secs(1)).await;
    let baz = assert_get_at(&queue, "baz", start, ms(50) + secs(2)).await;
    drop((bar, foo, baz));
    assert_eq!(queue.counts(), Counts::default());
}

// Go: TestCopyShifting.
#[tokio::test(start_paused = true)]
async fn copy_shifting() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();

    let (first, second, third) = ("foo", "bar", "baz");
    queue.add_after(first, secs(1));
    queue.add_after(second, ms(500));
    queue.add_after(third, ms(250));
    assert_eq!(queue.len(), 0, "should not have added");

    tokio::time::sleep(secs(2)).await;
    assert_eq!(queue.len(), 3, "unexpected number of items");

    // All three were due at once; they come out in ready-time order.
    let mut order = Vec::new();
    for _ in 0..3 {
        let lease = within(queue.get()).await.unwrap();
        order.push(*lease);
        lease.done();
    }
    assert_eq!(order, [third, second, first]);
    assert_eq!(queue.counts(), Counts::default());
}

// ---- rate_limiting_queue_test.go ----------------------------------------------------------------

fn exp_1ms_1s_queue() -> WorkQueue<&'static str> {
    WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(ms(1), secs(1)))
        .build()
}

// Go: TestRateLimitingQueue. Go reads each entry's `readyAt` from the delaying queue's channel;
// here each deadline is checked by when the key becomes available on the paused clock. Waiting
// entries de-duplicate (earliest wins), so each key is taken before its next rate-limited add.
#[tokio::test(start_paused = true)]
async fn rate_limiting_queue() {
    let queue = exp_1ms_1s_queue();

    assert_eq!(queue.add_rate_limited("one"), AddStatus::Waiting);
    assert_fires_after(&queue, "one", ms(1)).await;
    assert_eq!(queue.add_rate_limited("one"), AddStatus::Waiting);
    assert_fires_after(&queue, "one", ms(2)).await;
    assert_eq!(queue.num_requeues(&"one"), 2, "unexpected requeue count");

    assert_eq!(queue.add_rate_limited("two"), AddStatus::Waiting);
    assert_fires_after(&queue, "two", ms(1)).await;
    assert_eq!(queue.add_rate_limited("two"), AddStatus::Waiting);
    assert_fires_after(&queue, "two", ms(2)).await;

    queue.forget(&"one");
    assert_eq!(queue.num_requeues(&"one"), 0, "unexpected requeue count");
    assert_eq!(queue.add_rate_limited("one"), AddStatus::Waiting);
    assert_fires_after(&queue, "one", ms(1)).await;

    assert_eq!(queue.counts(), Counts::default());
}

/// TestRateLimitingQueue as Go writes it, two rate-limited adds back to back: both count as
/// failures (1 ms, then 2 ms), and the key waits once, for the earlier deadline. A waiting `get`
/// sees each deadline exactly.
#[tokio::test(start_paused = true)]
async fn rate_limiting_queue_back_to_back() {
    let queue = exp_1ms_1s_queue();

    let start = Instant::now();
    assert_eq!(queue.add_rate_limited("one"), AddStatus::Waiting);
    assert_eq!(queue.add_rate_limited("one"), AddStatus::AlreadyWaiting);
    assert_eq!(queue.num_requeues(&"one"), 2, "unexpected requeue count");
    assert_get_at(&queue, "one", start, ms(1)).await.done();
    assert!(
        tokio::time::timeout(secs(1), queue.get()).await.is_err(),
        "the 2 ms entry was de-duplicated into the 1 ms one"
    );

    let start = Instant::now();
    assert_eq!(queue.add_rate_limited("two"), AddStatus::Waiting);
    assert_get_at(&queue, "two", start, ms(1)).await.done();
    let start = Instant::now();
    assert_eq!(queue.add_rate_limited("two"), AddStatus::Waiting);
    assert_get_at(&queue, "two", start, ms(2)).await.done();

    queue.forget(&"one");
    assert_eq!(queue.num_requeues(&"one"), 0, "unexpected requeue count");
    let start = Instant::now();
    queue.add_rate_limited("one");
    assert_get_at(&queue, "one", start, ms(1)).await.done();
    assert_eq!(queue.counts(), Counts::default());
}
