//! Edge cases of the blocking [`WorkQueue`], row by row of the semantics table (the README's),
//! and the traps the lease design documents.
//!
//! No test sleeps. Threads are sequenced with joins, channels and two facts of the queue's
//! public behaviour:
//! - `is_shutting_down()` turns true when a drain has started, so a test that sees it knows that
//!   a `shut_down()` it calls now comes after the drain began (and must release it). Timed drains
//!   on a [`ManualClock`] turn a lost wake-up into a `TimedOut` failure instead of a hang.
//! - a [`ProbeClock`] shows when a getter has read the clock, which it does under the lock right
//!   before it waits when a key waits for a deadline (hence [`probe_queue`]'s sentinel); once a
//!   test sees that read, the getter is blocked and will see whatever the test does next. Every
//!   assertion made on that basis also holds if the read is never seen.

mod common;

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use common::{ProbeClock, SENTINEL_ONLY, manual_queue, ms, ns, probe_queue, secs};
use workqueue_core::__private::registered_wakers;
use workqueue_core::ratelimit::{ExponentialFailure, MaxOf, RateLimiter, TokenBucket};
use workqueue_core::state::{AddStatus, Counts};
use workqueue_core::{Clock, DrainStop, Instant, ManualClock, Outcome, SystemClock, WorkQueue};

/// A queue on a fresh [`ManualClock`] whose limiter is `Exp(1ms, 1s)`.
fn exp_queue() -> (WorkQueue<&'static str>, ManualClock) {
    let clock = ManualClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ms(1), secs(1)))
        .build();
    (queue, clock)
}

/// Takes every ready key without blocking, finishing each with `done`.
fn take_all(queue: &WorkQueue<&'static str>) -> Vec<&'static str> {
    let mut out = Vec::new();
    while let Some(lease) = queue.try_get() {
        out.push(*lease);
        lease.done();
    }
    out
}

/// Asserts that `key` becomes available exactly `delay` from now, not a nanosecond before.
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
}

// ---- add / re-add ------------------------------------------------------------------------------

#[test]
fn re_add_while_processing_runs_again_after_done_at_fifo_tail() {
    let (queue, _clock) = manual_queue();
    queue.add("a");
    let a = queue.get().unwrap();
    assert_eq!(queue.add("a"), AddStatus::Dirty);
    assert_eq!(queue.add("a"), AddStatus::AlreadyDirty);
    assert_eq!(queue.len(), 0, "a dirty key is not queued while processing");
    queue.add("b");
    assert_eq!(queue.counts().processing, 1);
    assert!(queue.try_get().is_some_and(|b| *b == "b"));

    queue.add("c");
    // Re-queued at the tail when its lease finishes: behind c, which was added later than the
    // re-add but before the finish.
    a.done();
    assert_eq!(take_all(&queue), ["c", "a"]);
    assert_eq!(queue.counts(), Counts::default());
}

#[test]
fn add_after_while_processing_fires_into_dirty_and_requeues_after_done() {
    let (queue, clock) = manual_queue();
    queue.add("k");
    let lease = queue.get().unwrap();
    assert_eq!(queue.add_after("k", ms(1)), AddStatus::Waiting);
    clock.advance(ms(1));
    assert_eq!(
        queue.len(),
        0,
        "a due key that is processing waits for its lease"
    );
    assert!(queue.try_get().is_none());
    assert_eq!(queue.counts().waiting, 0);
    lease.done();
    assert_eq!(take_all(&queue), ["k"]);
}

#[test]
fn add_while_waiting_queues_now_and_the_reminder_still_fires() {
    let (queue, clock) = manual_queue();
    assert_eq!(queue.add_after("k", ms(10)), AddStatus::Waiting);
    assert_eq!(queue.add("k"), AddStatus::Queued, "queued now");
    assert_eq!(take_all(&queue), ["k"]);
    assert_eq!(queue.counts().waiting, 1, "the waiting entry stays");

    clock.advance(ms(9));
    assert!(queue.try_get().is_none());
    clock.advance(ms(1));
    assert_eq!(take_all(&queue), ["k"], "the reminder fires later");
    assert_eq!(queue.counts(), Counts::default());
}

#[test]
fn add_after_zero_is_add() {
    let (queue, _clock) = manual_queue();
    assert_eq!(queue.add_after("k", Duration::ZERO), AddStatus::Queued);
    assert_eq!(
        queue.add_after("k", Duration::ZERO),
        AddStatus::AlreadyQueued
    );
    assert_eq!(queue.counts().waiting, 0);
    assert_eq!(take_all(&queue), ["k"]);
}

#[test]
fn equal_deadlines_fire_in_insertion_order() {
    let (queue, clock) = manual_queue();
    for key in ["c", "a", "d", "b"] {
        queue.add_after(key, ms(10));
    }
    // A decrease-key re-inserts: x joins the 10 ms deadline after y.
    queue.add_after("x", ms(20));
    queue.add_after("y", ms(10));
    assert_eq!(queue.add_after("x", ms(10)), AddStatus::Waiting);
    clock.advance(ms(10));
    assert_eq!(take_all(&queue), ["c", "a", "d", "b", "y", "x"]);
}

#[test]
fn promoted_keys_queue_behind_keys_already_ready() {
    let (queue, clock) = manual_queue();
    queue.add_after("late", ms(5));
    queue.add("first");
    clock.advance(ms(5));
    queue.add("second"); // this add promotes "late" first, then queues "second"
    assert_eq!(take_all(&queue), ["first", "late", "second"]);
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Name(String);

static NAME_CONVERSIONS: AtomicUsize = AtomicUsize::new(0);

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        NAME_CONVERSIONS.fetch_add(1, Ordering::SeqCst);
        Name(s.to_owned())
    }
}

#[test]
fn add_ref_deduplicates_without_converting_the_key() {
    let queue: WorkQueue<Name> = WorkQueue::new();
    let conversions = || NAME_CONVERSIONS.load(Ordering::SeqCst);
    assert_eq!(queue.add_ref("default/web"), AddStatus::Queued);
    assert_eq!(conversions(), 1);
    assert_eq!(queue.add_ref("default/web"), AddStatus::AlreadyQueued);
    assert_eq!(
        queue.add(Name("default/web".into())),
        AddStatus::AlreadyQueued
    );
    assert_eq!(queue.len(), 1);
    assert_eq!(conversions(), 1, "a duplicate add_ref converted its key");

    let lease = queue.get().unwrap();
    assert_eq!(lease.0, "default/web");
    assert_eq!(queue.add_ref("default/web"), AddStatus::Dirty);
    assert_eq!(queue.add_ref("default/web"), AddStatus::AlreadyDirty);
    assert_eq!(
        conversions(),
        1,
        "a key being processed was converted again"
    );
    lease.done();
    assert_eq!(queue.len(), 1);
    queue.get().unwrap().done();

    // Once the key is no longer tracked, add_ref converts it again.
    assert_eq!(queue.add_ref("default/web"), AddStatus::Queued);
    assert_eq!(conversions(), 2);
    queue.shut_down();
    assert_eq!(queue.add_ref("default/db"), AddStatus::ShutDown);
    assert_eq!(
        conversions(),
        2,
        "an add_ref after shutdown converted its key"
    );

    // The common owned key types work too.
    let strings: WorkQueue<String> = WorkQueue::new();
    strings.add_ref("a");
    strings.add_ref("a");
    assert_eq!(strings.len(), 1);
    let arcs: WorkQueue<Arc<str>> = WorkQueue::new();
    arcs.add_ref("a");
    arcs.add(Arc::from("a"));
    assert_eq!(arcs.len(), 1);
}

#[test]
fn add_batch_adds_in_order_and_deduplicates() {
    let (queue, _clock) = manual_queue();
    queue.add("b");
    let b = queue.get().unwrap();
    queue.add_batch(["a", "b", "c", "a", "d", "b"]);
    assert_eq!(queue.len(), 3, "b is processing: marked dirty, not queued");
    b.done();
    assert_eq!(take_all(&queue), ["a", "c", "d", "b"]);

    queue.add_batch(std::iter::empty());
    assert_eq!(queue.counts(), Counts::default());

    queue.shut_down();
    queue.add_batch(["x", "y"]);
    assert_eq!(
        queue.counts(),
        Counts::default(),
        "add_batch after shutdown"
    );
}

#[test]
fn try_get_batch_leases_up_to_max_in_fifo_order() {
    let (queue, _clock) = manual_queue();
    queue.add_batch(["a", "b", "c", "d", "e"]);

    assert!(queue.try_get_batch(0).is_empty());
    let first = queue.try_get_batch(3);
    let keys: Vec<_> = first.iter().map(|l| **l).collect();
    assert_eq!(keys, ["a", "b", "c"]);
    assert_eq!(queue.add("a"), AddStatus::Dirty, "a is leased");

    let rest = queue.try_get_batch(10);
    let keys: Vec<_> = rest.iter().map(|l| **l).collect();
    assert_eq!(keys, ["d", "e"]);
    assert!(queue.try_get_batch(10).is_empty());
    assert_eq!(queue.counts().processing, 5);

    drop(first); // finishing a re-queues it
    drop(rest);
    let again = queue.try_get_batch(10);
    assert_eq!(again.iter().map(|l| **l).collect::<Vec<_>>(), ["a"]);
    drop(again);

    // After shutdown, a batch still drains what is queued.
    queue.add_batch(["x", "y"]);
    queue.shut_down();
    let drained = queue.try_get_batch(10);
    assert_eq!(drained.iter().map(|l| **l).collect::<Vec<_>>(), ["x", "y"]);
    drop(drained);
    assert!(queue.try_get_batch(10).is_empty());
    assert_eq!(queue.counts(), Counts::default());
}

// ---- shutdown ----------------------------------------------------------------------------------

#[test]
fn get_after_shut_down_drains_queued_keys_then_returns_none() {
    let (queue, _clock) = manual_queue();
    queue.add_batch(["a", "b"]);
    queue.shut_down();
    assert!(queue.is_shutting_down());
    // get never blocks after shutdown: it hands out the queued keys, then None.
    let a = queue.get().unwrap();
    assert_eq!(*a, "a");
    let b = queue.get_timeout(secs(1)).unwrap();
    assert_eq!(*b, "b");
    assert!(queue.get().is_none());
    assert!(queue.try_get().is_none());
    assert!(queue.get_timeout(secs(3600)).is_none());
    drop((a, b));
    assert!(queue.get().is_none());
    assert_eq!(queue.counts(), Counts::default());
}

#[test]
fn adds_after_shut_down_are_ignored() {
    let (queue, clock) = exp_queue();
    queue.add_after("delayed", ms(5));
    queue.add("leased");
    let leased = queue.get().unwrap();
    assert_eq!(queue.add_rate_limited("retried"), AddStatus::Waiting);
    assert_eq!(queue.num_requeues(&"retried"), 1);

    queue.shut_down();
    queue.shut_down(); // idempotent
    assert_eq!(queue.counts().waiting, 0, "delayed keys are dropped");

    assert_eq!(queue.add("a"), AddStatus::ShutDown);
    assert_eq!(queue.add_after("b", ms(1)), AddStatus::ShutDown);
    assert_eq!(queue.add_after("c", Duration::ZERO), AddStatus::ShutDown);
    assert_eq!(queue.add_rate_limited("retried"), AddStatus::ShutDown);
    assert_eq!(
        queue.num_requeues(&"retried"),
        1,
        "the limiter is not consulted after shutdown"
    );
    assert_eq!(
        queue.add("leased"),
        AddStatus::ShutDown,
        "not even marked dirty"
    );

    // A retry after shutdown finishes the lease and re-adds nothing, without charging the limiter.
    leased.finish(Outcome::retry());
    assert_eq!(queue.num_requeues(&"leased"), 0);

    clock.advance(secs(10));
    assert!(queue.get().is_none());
    assert_eq!(queue.counts(), Counts::default());
}

#[test]
fn dirty_key_is_requeued_after_shut_down() {
    let (queue, _clock) = manual_queue();
    queue.add("k");
    let lease = queue.get().unwrap();
    queue.add("k");
    queue.shut_down();
    lease.done();
    let again = queue
        .get()
        .expect("a dirty key is re-queued after shutdown");
    assert_eq!(*again, "k");
    again.done();
    assert!(queue.get().is_none());
}

#[test]
fn blocked_get_is_woken_by_add() {
    let (queue, clock) = probe_queue();
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || queue.get().map(|l| *l))
    };
    clock.wait_for_reads(getter.thread().id(), 1);
    assert!(!getter.is_finished(), "get returned from an empty queue");
    queue.add("k");
    assert_eq!(getter.join().unwrap(), Some("k"));
}

#[test]
fn blocked_get_on_system_clock_is_woken_by_add() {
    // A real clock without deadlines is never read, so no probe: a barrier gets the getter close
    // to its wait, and the test holds however the two threads interleave.
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let (tx, rx) = mpsc::channel();
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || {
            tx.send(()).unwrap();
            queue.get().map(|l| *l)
        })
    };
    rx.recv().unwrap();
    thread::yield_now();
    queue.add("k");
    assert_eq!(getter.join().unwrap(), Some("k"));
}

#[test]
fn blocked_gets_are_woken_by_shut_down() {
    let (queue, clock) = probe_queue();
    let getters: Vec<_> = (0..3)
        .map(|_| {
            let queue = queue.clone();
            thread::spawn(move || queue.get().map(|l| *l))
        })
        .collect();
    for g in &getters {
        clock.wait_for_reads(g.thread().id(), 1);
    }
    queue.shut_down();
    for g in getters {
        assert_eq!(g.join().unwrap(), None);
    }
}

#[test]
fn blocked_gets_are_all_woken_by_one_add_batch() {
    let (queue, clock) = probe_queue();
    let (tx, rx) = mpsc::channel();
    let getters: Vec<_> = (0..3)
        .map(|_| {
            let (queue, tx) = (queue.clone(), tx.clone());
            thread::spawn(move || {
                let lease = queue.get().expect("three keys for three getters");
                tx.send(*lease).unwrap();
                lease
            })
        })
        .collect();
    for g in &getters {
        clock.wait_for_reads(g.thread().id(), 1);
    }
    // One add wakes one getter; the getter that takes a key passes the wake-up on.
    queue.add_batch(["a", "b", "c"]);
    let mut got: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, ["a", "b", "c"]);
    for g in getters {
        g.join().unwrap().done();
    }
    assert_eq!(queue.counts(), SENTINEL_ONLY);
}

#[test]
fn blocked_get_on_manual_clock_deadline_is_woken_by_advance() {
    let clock = ProbeClock::manual();
    let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_after("k", ms(10));
    let getter = {
        let (queue, clock) = (queue.clone(), clock.clone());
        thread::spawn(move || {
            let lease = queue.get().unwrap();
            (*lease, clock.now())
        })
    };
    let tid = getter.thread().id();
    clock.wait_for_reads(tid, 1);

    // Not yet due: the getter wakes, re-checks (reading the clock at 5 ms) and waits again.
    let reads = clock.reads_by(tid);
    clock.advance(ms(5));
    assert!(queue.try_get().is_none(), "k available before its deadline");
    clock.wait_for_reads(tid, reads + 1);
    assert!(!getter.is_finished(), "get returned k before its deadline");

    clock.advance(ms(5));
    let (key, at) = getter.join().unwrap();
    assert_eq!(key, "k");
    assert!(at >= Instant::from_nanos(10_000_000), "got k at {at:?}");
}

#[test]
fn blocked_get_on_manual_clock_is_woken_by_earlier_add_after() {
    let clock = ProbeClock::manual();
    let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_after("late", secs(10));
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || *queue.get().unwrap())
    };
    clock.wait_for_reads(getter.thread().id(), 1);
    assert_eq!(queue.add_after("early", ms(1)), AddStatus::Waiting);
    clock.advance(ms(1));
    assert_eq!(getter.join().unwrap(), "early");
    assert_eq!(queue.counts().waiting, 1, "late still waits");
}

#[test]
fn blocked_get_on_system_clock_is_woken_by_earlier_add_after() {
    // A getter sleeping until a deadline an hour away must re-compute its sleep when an earlier
    // key arrives: otherwise this test would wait an hour. The only real wait is 1 ms, inside
    // the queue.
    let clock = ProbeClock::new(SystemClock);
    let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_after("late", secs(3600));
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || *queue.get().unwrap())
    };
    clock.wait_for_reads(getter.thread().id(), 1);
    queue.add_after("early", ms(1));
    assert_eq!(getter.join().unwrap(), "early");
    queue.shut_down();
}

#[test]
fn blocked_get_on_system_clock_with_a_far_deadline_is_woken_by_add() {
    // A deadline ~292 years away: the timed wait must neither overflow nor panic.
    let clock = ProbeClock::new(SystemClock);
    let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
    assert_eq!(queue.add_after("far", ns(u64::MAX / 2)), AddStatus::Waiting);
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || *queue.get().unwrap())
    };
    clock.wait_for_reads(getter.thread().id(), 1);
    queue.add("now");
    assert_eq!(getter.join().unwrap(), "now");
}

#[test]
fn get_timeout_on_manual_clock() {
    let (queue, clock) = probe_queue();

    // A zero timeout never waits.
    assert!(queue.get_timeout(Duration::ZERO).is_none());

    // Gives up once the clock passes the timeout (the getter reads the clock once for its
    // deadline, once more under the lock before it waits).
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || queue.get_timeout(secs(1)).map(|l| *l))
    };
    clock.wait_for_reads(getter.thread().id(), 2);
    assert!(
        !getter.is_finished(),
        "get_timeout returned before its time"
    );
    clock.advance(ms(999));
    clock.advance(ms(1));
    assert_eq!(getter.join().unwrap(), None);

    // Returns a key added before the timeout.
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || queue.get_timeout(secs(1)).map(|l| *l))
    };
    clock.wait_for_reads(getter.thread().id(), 2);
    queue.add("k");
    assert_eq!(getter.join().unwrap(), Some("k"));

    // A key ready at once is returned even with the longest timeout (no overflow).
    queue.add("j");
    assert_eq!(queue.get_timeout(Duration::MAX).map(|l| *l), Some("j"));
}

// ---- drain -------------------------------------------------------------------------------------

#[test]
fn drain_is_released_by_shut_down() {
    let (queue, clock) = manual_queue();
    queue.add("held");
    let lease = queue.get().unwrap();
    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain_timeout(secs(1)))
    };
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    assert!(
        !drainer.is_finished(),
        "drain returned with a lease in flight"
    );
    queue.shut_down();
    // A drain that missed the release would wait for the lease: let it time out instead of hang.
    clock.advance(secs(1));
    let err = drainer.join().unwrap().unwrap_err();
    assert_eq!(err.stop, DrainStop::Released);
    assert_eq!(err.in_flight, ["held"]);
    assert_eq!(err.queued, 0);
    drop(lease);
}

#[test]
fn drain_on_system_clock_with_max_timeout_is_released_by_shut_down() {
    // Duration::MAX on a real clock: the wait must neither overflow nor panic.
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("held");
    let lease = queue.get().unwrap();
    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain_timeout(Duration::MAX))
    };
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    // One shut_down() must do (see `shut_down_after_a_drain_has_started_releases_it`); repeat it
    // only so that this test, about overflow, cannot hang on that other bug.
    while !drainer.is_finished() {
        queue.shut_down();
        thread::yield_now();
    }
    let err = drainer.join().unwrap().unwrap_err();
    assert_eq!(err.stop, DrainStop::Released);
    assert_eq!(err.in_flight, ["held"]);
    drop(lease);
}

/// A key that runs a hook when it is dropped: it lets a test act at the moment the queue drops it
/// (outside its lock, in the middle of an operation).
#[derive(Clone)]
struct HookKey {
    id: u32,
    on_drop: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl HookKey {
    fn plain(id: u32) -> Self {
        HookKey { id, on_drop: None }
    }
}

impl fmt::Debug for HookKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HookKey({})", self.id)
    }
}

impl PartialEq for HookKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for HookKey {}

impl Hash for HookKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl Drop for HookKey {
    fn drop(&mut self) {
        if let Some(hook) = self.on_drop.take() {
            hook();
        }
    }
}

#[test]
fn shut_down_after_a_drain_has_started_releases_it() {
    // client-go's ShutDownWithDrain sets `shuttingDown` and `drain` under one lock hold, so any
    // ShutDown that comes after the drain is visible releases it (TestForceQueueShutdownUsingShutDown
    // relies on that). Here the drain's own shutdown drops a delayed key whose Drop holds the
    // draining thread until the test has called shut_down(): a drain that marks itself as
    // draining only after it has made the shutdown visible misses that release.
    let clock = ManualClock::new();
    let queue: WorkQueue<HookKey> = WorkQueue::builder().clock(clock.clone()).build();
    let released = Arc::new((Mutex::new(false), Condvar::new()));
    let hook = {
        let released = released.clone();
        move || {
            let (done, changed) = &*released;
            let guard = done.lock().unwrap();
            // Bounded only as a safety net; the test's verdict does not depend on it.
            let _ = changed
                .wait_timeout_while(guard, secs(10), |done| !*done)
                .unwrap();
        }
    };
    queue.add_after(
        HookKey {
            id: 1,
            on_drop: Some(Arc::new(hook)),
        },
        secs(3600),
    );
    queue.add(HookKey::plain(2));
    let lease = queue.get().unwrap();

    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain_timeout(secs(1)))
    };
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    queue.shut_down(); // after the drain has started: must release it
    {
        let (done, changed) = &*released;
        *done.lock().unwrap() = true;
        changed.notify_all();
    }
    // A drain that missed the release waits for the lease: let it time out instead of hang.
    clock.advance(secs(1));
    let err = drainer.join().unwrap().unwrap_err();
    assert_eq!(
        err.stop,
        DrainStop::Released,
        "a shut_down() after the drain had started did not release it"
    );
    assert_eq!(err.in_flight, [HookKey::plain(2)]);
    drop(lease);
}

#[test]
fn a_drain_released_by_shut_down_stays_released_when_another_drain_starts() {
    // shut_down() releases the drains in progress; a drain that starts right after must not
    // re-arm them. The race (the released drain has not woken up yet when the next drain starts)
    // is narrow, so it is tried many times; a correct queue passes every time.
    for round in 0..500 {
        let clock = ProbeClock::manual();
        let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
        queue.add("held");
        let lease = queue.get().unwrap();
        let first = {
            let queue = queue.clone();
            thread::spawn(move || queue.shut_down_with_drain_timeout(secs(1)))
        };
        // One read for its deadline, one under the lock in its wait loop: then it waits.
        clock.wait_for_reads(first.thread().id(), 2);
        while !queue.is_shutting_down() {
            thread::yield_now();
        }
        queue.shut_down(); // releases `first`
        let second = queue.shut_down_with_drain_timeout(Duration::ZERO);
        assert_eq!(second.unwrap_err().stop, DrainStop::TimedOut);
        // A drain that lost its release would wait for the lease: let it time out instead.
        clock.advance(secs(1));
        let first = first.join().unwrap().unwrap_err();
        assert_eq!(
            first.stop,
            DrainStop::Released,
            "round {round}: a later drain re-armed a drain that shut_down() had released"
        );
        drop(lease);
    }
}

#[test]
fn timed_drain_on_manual_clock_reports_in_flight_keys() {
    let (queue, clock) = manual_queue();
    queue.add_batch(["a", "b", "queued"]);
    let a = queue.get().unwrap();
    let b = queue.get().unwrap();
    let drainer = {
        let (queue, clock) = (queue.clone(), clock.clone());
        thread::spawn(move || {
            let result = queue.shut_down_with_drain_timeout(secs(1));
            (result, clock.now())
        })
    };
    // The drainer computed its deadline before it shut the queue down; once shutdown is visible
    // it waits (or has returned, which the assertion below would catch).
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    clock.advance(ms(999));
    assert!(!drainer.is_finished(), "drain timed out early");
    clock.advance(ms(1));
    let (result, at) = drainer.join().unwrap();
    let mut err = result.unwrap_err();
    err.in_flight.sort_unstable();
    assert_eq!(err.stop, DrainStop::TimedOut);
    assert_eq!(err.in_flight, ["a", "b"]);
    assert_eq!(err.queued, 1);
    assert!(
        at >= Instant::from_nanos(1_000_000_000),
        "timed out at {at:?}"
    );
    assert!(err.to_string().contains("timed out"), "{err}");

    drop((a, b));
    assert_eq!(take_all(&queue), ["queued"]);
    assert_eq!(queue.shut_down_with_drain_timeout(Duration::ZERO), Ok(()));
}

#[test]
fn timed_drain_returns_ok_when_leases_finish_in_time() {
    let (queue, _clock) = manual_queue();
    queue.add("k");
    let lease = queue.get().unwrap();
    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain_timeout(secs(1)))
    };
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    lease.done();
    assert_eq!(drainer.join().unwrap(), Ok(()));
}

#[test]
fn drains_from_several_threads_all_return() {
    let (queue, _clock) = manual_queue();
    queue.add("k");
    let lease = queue.get().unwrap();
    let drainers: Vec<_> = (0..3)
        .map(|_| {
            let queue = queue.clone();
            thread::spawn(move || queue.shut_down_with_drain())
        })
        .collect();
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    lease.done();
    for d in drainers {
        d.join().unwrap();
    }
}

#[test]
fn drain_waits_only_for_leases_by_default() {
    let (queue, _clock) = manual_queue();
    queue.add_batch(["a", "b"]);
    let a = queue.get().unwrap();
    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain())
    };
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    a.done();
    drainer.join().unwrap(); // returns although b is still queued (client-go)
    assert_eq!(take_all(&queue), ["b"]);
}

#[test]
fn drain_includes_queued_waits_for_the_fifo_too() {
    let clock = ManualClock::new();
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(clock)
        .drain_includes_queued(true)
        .build();
    queue.add_batch(["a", "b"]);
    let a = queue.get().unwrap();
    let drainer = {
        let queue = queue.clone();
        thread::spawn(move || queue.shut_down_with_drain())
    };
    while !queue.is_shutting_down() {
        thread::yield_now();
    }
    a.done();
    assert!(!drainer.is_finished(), "drain returned while b is queued");
    let b = queue.get().unwrap();
    assert!(
        !drainer.is_finished(),
        "drain returned while b is processing"
    );
    b.done();
    drainer.join().unwrap();

    // The timed variant reports the queued count.
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(ManualClock::new())
        .drain_includes_queued(true)
        .build();
    queue.add("q");
    let err = queue
        .shut_down_with_drain_timeout(Duration::ZERO)
        .unwrap_err();
    assert_eq!(err.stop, DrainStop::TimedOut);
    assert!(err.in_flight.is_empty());
    assert_eq!(err.queued, 1);
}

// ---- leases ------------------------------------------------------------------------------------

#[test]
fn dropped_lease_is_done() {
    let (queue, _clock) = exp_queue();
    queue.add("k");
    let lease = queue.get().unwrap();
    drop(lease);
    assert_eq!(queue.counts(), Counts::default());
    assert_eq!(
        queue.num_requeues(&"k"),
        0,
        "a dropped lease is not a failure"
    );

    // A lease can be finished on another thread.
    queue.add("k");
    let lease = queue.get().unwrap();
    thread::spawn(move || lease.done()).join().unwrap();
    assert_eq!(queue.counts(), Counts::default());
}

#[test]
fn lease_dropped_while_panicking_is_retried_after_limiter_delay() {
    let (queue, clock) = exp_queue();
    queue.add("k");
    let worker = {
        let queue = queue.clone();
        thread::spawn(move || {
            let lease = queue.get().unwrap();
            catch_unwind(AssertUnwindSafe(move || {
                let _lease = lease;
                panic!("reconcile failed");
            }))
            .is_err()
        })
    };
    assert!(worker.join().unwrap(), "the panic was caught");

    assert_eq!(
        queue.num_requeues(&"k"),
        1,
        "the panic counted as a failure"
    );
    assert_eq!(queue.counts().processing, 0);
    assert_eq!(queue.counts().waiting, 1);
    assert_fires_after(&queue, &clock, "k", ms(1));
    assert_eq!(queue.counts(), Counts::default());
}

#[test]
fn leaked_lease_does_not_corrupt_other_keys() {
    let (queue, clock) = manual_queue();
    queue.add_batch(["leaked", "a", "b"]);
    let leaked = queue.get().unwrap();
    assert_eq!(*leaked, "leaked");
    std::mem::forget(leaked);
    assert_eq!(queue.counts().processing, 1);

    // Other keys are processed normally, many times over (slots are freed and reused).
    assert_eq!(take_all(&queue), ["a", "b"]);
    const KEYS: [&str; 8] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    for round in 0..50 {
        queue.add_batch(KEYS);
        queue.add_after(KEYS[round % KEYS.len()], ms(1));
        clock.advance(ms(1));
        let got = take_all(&queue);
        assert_eq!(got.len(), KEYS.len(), "round {round}: {got:?}");
    }

    // The leaked key is never handed out again, however it is re-added.
    assert_eq!(queue.add("leaked"), AddStatus::Dirty);
    assert_eq!(queue.add("leaked"), AddStatus::AlreadyDirty);
    queue.add_after("leaked", ms(1));
    clock.advance(ms(1));
    assert!(queue.try_get().is_none());
    assert_eq!(queue.counts().processing, 1);
    assert_eq!(queue.counts().tracked, 1);

    // A timed drain reports it.
    let err = queue
        .shut_down_with_drain_timeout(Duration::ZERO)
        .unwrap_err();
    assert_eq!(err.stop, DrainStop::TimedOut);
    assert_eq!(err.in_flight, ["leaked"]);
    assert_eq!(err.queued, 0);
    assert!(queue.get().is_none());
    assert_eq!(queue.counts().processing, 1);
}

#[test]
fn lease_outcomes() {
    let (queue, clock) = exp_queue();

    // forget: the limiter forgets the key.
    queue.add_rate_limited("k");
    queue.add_rate_limited("k");
    assert_eq!(queue.num_requeues(&"k"), 2);
    clock.advance(ms(1));
    queue.get().unwrap().finish(Outcome::forget());
    assert_eq!(queue.num_requeues(&"k"), 0);
    assert_eq!(queue.counts(), Counts::default());

    // retry: re-added after the limiter's delay (1 ms, then 2 ms).
    queue.add("k");
    queue.get().unwrap().finish(Outcome::retry());
    assert_eq!(queue.num_requeues(&"k"), 1);
    assert_fires_after(&queue, &clock, "k", ms(1));
    queue.add("k");
    queue.get().unwrap().finish(Outcome::retry());
    assert_fires_after(&queue, &clock, "k", ms(2));
    assert_eq!(queue.num_requeues(&"k"), 2);

    // retry_after: a fixed delay; the limiter is not consulted.
    queue.add("k");
    queue.get().unwrap().finish(Outcome::retry_after(ms(7)));
    assert_eq!(queue.num_requeues(&"k"), 2);
    assert_fires_after(&queue, &clock, "k", ms(7));

    // requeue_after: the limiter forgets, and the key comes back after the delay.
    queue.add("k");
    queue.get().unwrap().finish(Outcome::requeue_after(ms(3)));
    assert_eq!(queue.num_requeues(&"k"), 0);
    assert_fires_after(&queue, &clock, "k", ms(3));

    // finish(outcome) is the same mapping; a zero retry delay re-queues at once.
    queue.add("k");
    queue
        .get()
        .unwrap()
        .finish(Outcome::retry_after(Duration::ZERO));
    assert_eq!(take_all(&queue), ["k"]);

    // A retry of a key that was re-added meanwhile: queued now (dirty) and waiting (reminder).
    queue.add("k");
    let lease = queue.get().unwrap();
    queue.add("k");
    lease.finish(Outcome::retry());
    assert_eq!(queue.counts().ready, 1);
    assert_eq!(queue.counts().waiting, 1);
    assert_eq!(take_all(&queue), ["k"]);
    assert_fires_after(&queue, &clock, "k", ms(1));
    assert_eq!(queue.counts(), Counts::default());
}

// ---- rate limiting -----------------------------------------------------------------------------

#[test]
fn forget_does_not_cancel_a_waiting_entry() {
    let (queue, clock) = exp_queue();
    assert_eq!(queue.add_rate_limited("k"), AddStatus::Waiting);
    queue.forget(&"k");
    assert_eq!(queue.num_requeues(&"k"), 0);
    assert_eq!(queue.counts().waiting, 1);
    assert_fires_after(&queue, &clock, "k", ms(1));
}

#[test]
fn deduplicated_rate_limited_adds_still_charge_the_limiter() {
    // client-go's behaviour (controller-runtime #1594): `when` runs for every add, even one that
    // is de-duplicated against an earlier waiting entry.
    let (queue, clock) = exp_queue();
    assert_eq!(queue.add_rate_limited("k"), AddStatus::Waiting);
    assert_eq!(queue.add_rate_limited("k"), AddStatus::AlreadyWaiting);
    assert_eq!(queue.num_requeues(&"k"), 2);
    assert_fires_after(&queue, &clock, "k", ms(1)); // the earliest deadline wins
    clock.advance(secs(1));
    assert!(
        queue.try_get().is_none(),
        "the 2 ms request fired separately"
    );
}

#[test]
fn add_after_duration_max_never_fires_and_never_panics() {
    let (queue, clock) = manual_queue();
    assert_eq!(queue.add_after("never", Duration::MAX), AddStatus::Never);
    assert_eq!(queue.counts(), Counts::default(), "nothing is stored");
    clock.advance(secs(1 << 40));
    assert!(queue.try_get().is_none());

    // The largest delay that is still a deadline fires at the end of time; Duration::MAX never.
    let (queue, clock) = manual_queue();
    assert_eq!(
        queue.add_after("last", ns(u64::MAX - 1)),
        AddStatus::Waiting
    );
    assert_eq!(queue.add_after("never", Duration::MAX), AddStatus::Never);
    clock.advance(Duration::MAX); // saturates at the end of time
    assert_eq!(clock.now(), Instant::NEVER);
    assert_eq!(take_all(&queue), ["last"]);
    // At the end of time every delay is "never", but plain adds still work.
    assert_eq!(queue.add_after("k", ns(1)), AddStatus::Never);
    assert_eq!(queue.add("k"), AddStatus::Queued);
    assert_eq!(queue.get_timeout(Duration::MAX).map(|l| *l), Some("k"));
    assert_eq!(queue.counts(), Counts::default());

    // On the system clock too.
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    assert_eq!(queue.add_after("never", Duration::MAX), AddStatus::Never);
    assert_eq!(queue.counts(), Counts::default());
    assert!(queue.try_get().is_none());
}

#[test]
fn limiter_overflow_exponential_base_1ns_10000_failures() {
    let clock = ManualClock::new();
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ns(1), Duration::MAX))
        .build();
    assert_eq!(queue.add_rate_limited("k"), AddStatus::Waiting);
    for _ in 1..10_000 {
        let status = queue.add_rate_limited("k");
        assert!(
            matches!(status, AddStatus::AlreadyWaiting | AddStatus::Never),
            "{status:?}"
        );
    }
    assert_eq!(queue.num_requeues(&"k"), 10_000);
    assert_fires_after(&queue, &clock, "k", ns(1));

    // The same through leases: every retry after that is (nearly) forever.
    for _ in 0..100 {
        queue.add("k");
        queue.get().unwrap().finish(Outcome::retry());
        assert!(queue.try_get().is_none());
    }
    assert_eq!(queue.num_requeues(&"k"), 10_100);
    assert_eq!(
        queue.counts(),
        Counts::default(),
        "a forever retry stores nothing"
    );

    // 2^63 ns, the delay Go turns negative (its float cap test lets exactly 2^63 through), is a
    // plain far deadline here, and the next doubling is past the end of time: never.
    let clock = ManualClock::new();
    let limiter: Arc<ExponentialFailure<&'static str>> =
        Arc::new(ExponentialFailure::new(ns(1), Duration::MAX));
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(limiter.clone())
        .build();
    for _ in 0..63 {
        limiter.when(&"k", Instant::ZERO);
    }
    assert_eq!(queue.add_rate_limited("k"), AddStatus::Waiting);
    assert_eq!(queue.num_requeues(&"k"), 64);
    assert_fires_after(&queue, &clock, "k", ns(1 << 63));
    assert_eq!(queue.add_rate_limited("k"), AddStatus::Never); // 2^64 ns
    queue.add("k");
    queue.get().unwrap().finish(Outcome::retry()); // 2^65 ns
    assert_eq!(queue.num_requeues(&"k"), 66);
    assert_eq!(queue.counts(), Counts::default());
}

#[test]
fn limiter_overflow_base_duration_max_and_base_above_max() {
    // base = Duration::MAX: every delay is forever.
    let clock = ManualClock::new();
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(Duration::MAX, Duration::MAX))
        .build();
    for _ in 0..100 {
        assert_eq!(queue.add_rate_limited("k"), AddStatus::Never);
    }
    queue.add("k");
    queue.get().unwrap().finish(Outcome::retry());
    clock.advance(Duration::MAX);
    assert!(queue.try_get().is_none());
    assert_eq!(queue.counts(), Counts::default());

    // base > max: every delay is max.
    for base in [Duration::MAX, secs(10)] {
        let clock = ManualClock::new();
        let queue: WorkQueue<&'static str> = WorkQueue::builder()
            .clock(clock.clone())
            .rate_limiter(ExponentialFailure::new(base, secs(1)))
            .build();
        for _ in 0..3 {
            assert_eq!(queue.add_rate_limited("k"), AddStatus::Waiting);
            assert_fires_after(&queue, &clock, "k", secs(1));
        }
    }

    // base = 0: every delay is zero, so a rate-limited add is a plain add.
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(ManualClock::new())
        .rate_limiter(ExponentialFailure::new(Duration::ZERO, Duration::MAX))
        .build();
    assert_eq!(queue.add_rate_limited("k"), AddStatus::Queued);
    assert_eq!(queue.num_requeues(&"k"), 1);
}

#[test]
fn exhausted_token_bucket_means_never() {
    // Rate 0, burst 1: one free token, then "forever" (TokenBucket::FOREVER).
    let clock = ManualClock::new();
    let limiter: MaxOf<&'static str> = MaxOf::new()
        .with(ExponentialFailure::new(ms(1), secs(1)))
        .with(TokenBucket::new(0.0, 1).unwrap());
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(limiter)
        .build();
    assert_eq!(queue.add_rate_limited("a"), AddStatus::Waiting);
    assert_eq!(queue.add_rate_limited("b"), AddStatus::Never);
    clock.advance(Duration::MAX);
    assert_eq!(take_all(&queue), ["a"]);
    assert_eq!(queue.counts(), Counts::default());
}

// ---- clock registration ------------------------------------------------------------------------

#[test]
fn dropping_a_queue_unregisters_it_from_its_manual_clock() {
    let clock = ManualClock::new();
    let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
    let other = queue.clone();
    assert_eq!(registered_wakers(&clock), 1);
    drop(queue);
    assert_eq!(
        registered_wakers(&clock),
        1,
        "a clone keeps the queue alive"
    );
    drop(other);
    assert_eq!(registered_wakers(&clock), 0);
    clock.advance(secs(1)); // no queue to wake: must not panic
}

/// The opt-in that keeps de-duplicated rate-limited adds from charging the limiter
/// (controller-runtime #1594).
#[test]
fn skip_limiter_when_pending_leaves_pending_keys_and_the_limiter_alone() {
    use workqueue_core::ratelimit::{ExponentialFailure, TokenBucket};
    use workqueue_core::state::AddStatus;

    let clock = ManualClock::new();
    let q: WorkQueue<&str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(
            Duration::from_millis(10),
            Duration::from_secs(10),
        ))
        .skip_limiter_when_pending(true)
        .build();
    assert_eq!(q.add_rate_limited("waiting"), AddStatus::Waiting);
    assert_eq!(q.add_rate_limited("waiting"), AddStatus::AlreadyWaiting);
    assert_eq!(
        q.num_requeues(&"waiting"),
        1,
        "the skipped add counted no failure"
    );
    q.add("queued");
    assert_eq!(q.add_rate_limited("queued"), AddStatus::AlreadyQueued);
    assert_eq!(q.num_requeues(&"queued"), 0);

    // Default (client-go): every rate-limited add is charged, de-duplicated or not.
    let bucket = TokenBucket::new(1.0, 1).unwrap();
    let q: WorkQueue<&str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(bucket)
        .build();
    assert_eq!(
        q.add_rate_limited("k"),
        AddStatus::Queued,
        "the burst token: no delay"
    );
    assert_eq!(
        q.add_rate_limited("k"),
        AddStatus::Waiting,
        "charged although k is queued"
    );
}
