use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Clock, ClockWaker, Instant};
use crate::sync::{AtomicU64, Mutex};

/// Virtual time that moves only when told to: the clock for tests.
///
/// Clones share one timeline. Advancing it wakes every queue waiting on it, so a test that adds a
/// key with a one-hour delay and advances the clock by an hour sees the key at once, without
/// sleeping.
///
/// ```
/// use std::time::Duration;
/// use workqueue_core::{ManualClock, WorkQueue};
///
/// let clock = ManualClock::new();
/// let queue: WorkQueue<&str> = WorkQueue::builder().clock(clock.clone()).build();
/// queue.add_after("key", Duration::from_secs(3600));
/// assert!(queue.try_get().is_none());
/// clock.advance(Duration::from_secs(3600));
/// assert_eq!(*queue.try_get().unwrap(), "key");
/// ```
#[derive(Clone, Default)]
pub struct ManualClock {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    now: AtomicU64,
    wakers: Mutex<Vec<Weak<dyn ClockWaker>>>,
}

impl ManualClock {
    /// A clock at [`Instant::ZERO`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `d` (saturating) and wakes the waiters.
    pub fn advance(&self, d: Duration) {
        let _ = self
            .inner
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(Instant::from_nanos(n).saturating_add(d).as_nanos())
            });
        self.wake_all();
    }

    /// Moves time forward to `t`; an earlier `t` is ignored (time never goes back).
    pub fn advance_to(&self, t: Instant) {
        self.inner.now.fetch_max(t.as_nanos(), Ordering::SeqCst);
        self.wake_all();
    }

    /// Number of live waiters registered with this clock.
    fn registered(&self) -> usize {
        let mut wakers = self.inner.wakers.lock();
        wakers.retain(|w| w.strong_count() > 0);
        wakers.len()
    }

    fn wake_all(&self) {
        // Upgrade under the lock, wake outside it: a waker takes its queue's lock, and a queue
        // being built registers while holding nothing, so this order cannot deadlock.
        let live: Vec<Arc<dyn ClockWaker>> = {
            let mut wakers = self.inner.wakers.lock();
            wakers.retain(|w| w.strong_count() > 0);
            wakers.iter().filter_map(Weak::upgrade).collect()
        };
        for w in live {
            w.wake();
        }
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::from_nanos(self.inner.now.load(Ordering::SeqCst))
    }

    fn is_virtual(&self) -> bool {
        true
    }

    fn register(&self, waker: Weak<dyn ClockWaker>) {
        self.inner.wakers.lock().push(waker);
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish_non_exhaustive()
    }
}

/// How many queues (live wakers) are registered with `clock`: for tests of the registration.
pub fn registered_wakers(clock: &ManualClock) -> usize {
    clock.registered()
}
