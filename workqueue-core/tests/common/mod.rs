//! Helpers shared by the integration tests (each test file includes them with `mod common;`).
//!
//! Not every file uses every helper.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::ThreadId;
use std::time::Duration;

use workqueue_core::state::Counts;
use workqueue_core::{Clock, ClockWaker, Instant, ManualClock, WorkQueue};

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// `n` nanoseconds.
pub fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

/// A queue of string keys on a fresh [`ManualClock`], with the default limiter.
pub fn manual_queue() -> (WorkQueue<&'static str>, ManualClock) {
    let clock = ManualClock::new();
    let queue = WorkQueue::builder().clock(clock.clone()).build();
    (queue, clock)
}

/// A key that waits about 136 years: [`probe_queue`] adds it so that a getter has a deadline to
/// check, which makes it read the clock (see [`ProbeClock`]).
pub const SENTINEL: &str = "(probe sentinel)";

/// How far away [`SENTINEL`] waits.
pub const SENTINEL_DELAY: Duration = Duration::from_secs(1 << 32);

/// A queue on a [`ProbeClock`] around a fresh [`ManualClock`], with [`SENTINEL`] waiting.
pub fn probe_queue() -> (WorkQueue<&'static str>, ProbeClock<ManualClock>) {
    let clock = ProbeClock::manual();
    let queue = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_after(SENTINEL, SENTINEL_DELAY);
    (queue, clock)
}

/// The counts of a [`probe_queue`] with nothing but its sentinel.
pub const SENTINEL_ONLY: Counts = Counts {
    ready: 0,
    processing: 0,
    waiting: 1,
    tracked: 1,
};

/// How long [`ProbeClock::wait_for_reads`] waits for a thread's reads before it fails the test.
///
/// With a correct queue the reads come as soon as the thread runs, so this bound is not a
/// measurement: it only turns a thread that never looks at the queue into a failure, and is
/// generous enough for a machine too loaded to run the thread for a while.
const PROBE_PATIENCE: Duration = Duration::from_secs(60);

/// A clock that records which threads read it, wrapped around another clock.
///
/// A blocking `get` that finds nothing ready while a key waits for a deadline must read the clock
/// to know that the key is not due; it does so under the queue's lock, and holds that lock until
/// the condition variable releases it. So once the getter thread has read the clock, any later
/// operation on the queue (which takes the lock) happens after the getter started waiting: a test
/// can prove that a getter was blocked, and woken by what it does next, without sleeping.
/// (A getter without any pending deadline need not read the clock: use [`probe_queue`].)
#[derive(Clone, Debug)]
pub struct ProbeClock<C> {
    inner: C,
    reads: Arc<Reads>,
}

#[derive(Debug, Default)]
struct Reads {
    by_thread: Mutex<HashMap<ThreadId, usize>>,
    changed: Condvar,
}

impl<C: Clock + Clone> ProbeClock<C> {
    /// Wraps `inner`.
    pub fn new(inner: C) -> Self {
        ProbeClock {
            inner,
            reads: Arc::default(),
        }
    }

    /// The wrapped clock (for `advance` on a [`ManualClock`]).
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// How many times `thread` has read this clock.
    pub fn reads_by(&self, thread: ThreadId) -> usize {
        self.reads
            .by_thread
            .lock()
            .unwrap()
            .get(&thread)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until `thread` has read this clock at least `n` times.
    ///
    /// # Panics
    ///
    /// If it has not within [`PROBE_PATIENCE`]: the thread never got as far as the test expects
    /// (it returned early, or hangs before it looks at the queue), so what the test asserts next
    /// would not be tested.
    pub fn wait_for_reads(&self, thread: ThreadId, n: usize) {
        let map = self.reads.by_thread.lock().unwrap();
        let (map, _) = self
            .reads
            .changed
            .wait_timeout_while(map, PROBE_PATIENCE, |m| {
                m.get(&thread).copied().unwrap_or(0) < n
            })
            .unwrap();
        let reads = map.get(&thread).copied().unwrap_or(0);
        assert!(
            reads >= n,
            "thread {thread:?} read the clock {reads} times in {PROBE_PATIENCE:?}, not the {n} \
             the test waits for: it never got that far"
        );
    }
}

impl ProbeClock<ManualClock> {
    /// A probe around a fresh [`ManualClock`].
    pub fn manual() -> Self {
        Self::new(ManualClock::new())
    }

    /// Advances the wrapped [`ManualClock`].
    pub fn advance(&self, d: Duration) {
        self.inner.advance(d);
    }
}

impl<C: Clock> Clock for ProbeClock<C> {
    fn now(&self) -> Instant {
        let now = self.inner.now();
        let mut map = self.reads.by_thread.lock().unwrap();
        *map.entry(std::thread::current().id()).or_default() += 1;
        self.reads.changed.notify_all();
        now
    }

    fn is_virtual(&self) -> bool {
        self.inner.is_virtual()
    }

    fn register(&self, waker: Weak<dyn ClockWaker>) {
        self.inner.register(waker);
    }
}
