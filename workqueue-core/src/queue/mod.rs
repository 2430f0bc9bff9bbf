//! The blocking, thread-safe work queue: [`QueueCore`] with condition variables.

mod builder;

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Weak};
use std::time::Duration;

use workqueue_ratelimit::Instant;

pub use builder::{Blocking, BuildQueue, Builder};

use crate::clock::ClockWaker;
use crate::drain::DrainIncomplete;
use crate::driver::{CoreConfig, Locked, Notifier, QueueCore};
use crate::lease::Lease;
use crate::state::{DefaultHashBuilder, Get};
use crate::sync::{Condvar, MutexGuard};

/// A Kubernetes-style work queue for threads: de-duplicating, delaying, rate-limited.
///
/// A cheap handle (`Clone` shares the queue). Producers [`add`](WorkQueue::add) keys; workers
/// [`get`](WorkQueue::get) a [`Lease`] for one key at a time, process it, and finish the lease.
/// A key is never held by two leases at once; a key added while it is processed runs again after.
/// The semantics are client-go's (see the README's table); they live in
/// [`QueueState`](crate::state::QueueState), which this type drives under one mutex.
///
/// ```
/// use std::thread;
/// use workqueue_core::{Outcome, WorkQueue};
///
/// let queue: WorkQueue<String> = WorkQueue::new();
/// let worker = {
///     let queue = queue.clone();
///     thread::spawn(move || {
///         let mut seen = Vec::new();
///         while let Some(lease) = queue.get() {
///             seen.push(lease.clone());
///             lease.finish(Outcome::forget()); // success
///         }
///         seen
///     })
/// };
/// for name in ["a", "b", "a"] {
///     queue.add(format!("default/{name}"));
/// }
/// queue.shut_down_with_drain(); // get() drains what is queued, then returns None
/// let seen = worker.join().unwrap();
/// assert!(seen.contains(&"default/a".to_string()) && seen.contains(&"default/b".to_string()));
/// ```
///
/// Waiting: a blocked [`get`](WorkQueue::get) sleeps exactly until a key is added or the earliest
/// delayed key is due (no polling); on a [`ManualClock`](crate::ManualClock) it sleeps until the
/// clock is advanced.
pub struct WorkQueue<T, S = DefaultHashBuilder> {
    core: Arc<QueueCore<T, S, Condvars>>,
}

/// The blocking driver's [`Notifier`]: one condition variable for getters, one for drains.
///
/// Waits on a virtual clock are untimed; the clock wakes the queue when it moves
/// (see [`ClockWaker`]).
#[derive(Debug, Default)]
pub(crate) struct Condvars {
    getters: Condvar,
    drainers: Condvar,
}

impl<T, S> Notifier<T, S> for Condvars
where
    T: Send + Sync + 'static,
    S: Send + Sync + 'static,
{
    #[inline]
    fn wake_getter(&self, _: &Locked<T, S>) {
        self.getters.notify_one();
    }

    fn wake_all(&self, _: &Locked<T, S>) {
        self.getters.notify_all();
        self.drainers.notify_all();
    }

    fn wake_drainers(&self, _: &Locked<T, S>) {
        self.drainers.notify_all();
    }
}

impl<T, S> ClockWaker for QueueCore<T, S, Condvars>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    fn wake(&self) {
        // Taking the lock orders this wake-up after any waiter's check of the clock: a waiter
        // reads the time and starts waiting without releasing the lock in between.
        let g = self.lock();
        Notifier::wake_all(self.notifier(), &*g);
    }
}

impl<T> WorkQueue<T>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// An unnamed queue with the default controller rate limiter and the system clock.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder for a queue with a name, rate limiter, clock or hasher of your choice.
    pub fn builder() -> Builder<T> {
        Builder::default()
    }
}

impl<T> Default for WorkQueue<T>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T, S> Clone for WorkQueue<T, S> {
    fn clone(&self) -> Self {
        WorkQueue {
            core: Arc::clone(&self.core),
        }
    }
}

impl<T, S> WorkQueue<T, S>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    fn from_config(config: CoreConfig<T, S>) -> Self {
        let virtual_clock = config.clock.is_virtual();
        let core = Arc::new(QueueCore::new(config, Condvars::default()));
        core.join_refresher();
        if virtual_clock {
            let weak: Weak<QueueCore<T, S, Condvars>> = Arc::downgrade(&core);
            core.clock().register(weak);
        }
        WorkQueue { core }
    }

    // The operations every driver offers unchanged (adds, non-waiting gets, observation,
    // shut_down) are defined once, in `driver/handle_methods.rs`.
    crate::__queue_handle_methods!();

    /// The current time on the queue's clock.
    fn now(&self) -> Instant {
        self.core.clock().now()
    }

    // ---- waiting operations: the driver's own ----------------------------------------------

    /// Blocks until a key is ready and leases it; `None` once the queue is shut down and empty.
    ///
    /// After [`shut_down`](WorkQueue::shut_down) it still hands out the keys already queued.
    pub fn get(&self) -> Option<Lease<T>> {
        self.get_until(None)
    }

    /// [`get`](WorkQueue::get) that gives up after `timeout` on the queue's clock.
    pub fn get_timeout(&self, timeout: Duration) -> Option<Lease<T>> {
        let deadline = self.now().saturating_add(timeout);
        self.get_until(Some(deadline))
    }

    fn get_until(&self, give_up: Option<Instant>) -> Option<Lease<T>> {
        let core = &self.core;
        let mut g = core.lock();
        loop {
            let now = core.now_for(&g.state);
            let next_deadline = match core.take(&mut g, now) {
                Ok(lease) => return Some(lease),
                Err(Get::Empty { next_deadline }) => next_deadline,
                Err(_) => return None,
            };
            let now = if next_deadline.is_some() || give_up.is_some() {
                core.clock().now()
            } else {
                now
            };
            if give_up.is_some_and(|t| now >= t) {
                core.hand_off_timer(&g);
                return None;
            }
            let timer = core.claim_timer(&mut g, next_deadline);
            let wake_at = match (timer, give_up) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            g.idle_getters += 1;
            self.wait(&core.notifier().getters, &mut g, now, wake_at);
            g.idle_getters -= 1;
            if let Some(deadline) = timer {
                core.release_timer(&mut g, deadline);
            }
        }
    }

    /// Waits on `cv` until notified, or until `until` on the queue's clock. On a virtual clock the
    /// wait is untimed: the clock wakes the queue whenever it moves.
    fn wait(
        &self,
        cv: &Condvar,
        g: &mut MutexGuard<'_, Locked<T, S>>,
        now: Instant,
        until: Option<Instant>,
    ) {
        match until {
            Some(t) if !self.core.clock().is_virtual() => {
                let _ = cv.wait_for(g, t.saturating_duration_since(now));
            }
            _ => cv.wait(g),
        }
    }

    /// [`shut_down`](WorkQueue::shut_down), then waits until no lease is outstanding (and, with
    /// [`Builder::drain_includes_queued`], until nothing is queued). A later `shut_down()` releases
    /// it early. Idempotent and safe from several threads.
    ///
    /// Waits forever for a lease that is never finished (one held by this thread, or passed to
    /// `mem::forget`): use [`shut_down_with_drain_timeout`](WorkQueue::shut_down_with_drain_timeout)
    /// to bound the wait.
    pub fn shut_down_with_drain(&self) {
        let _ = self.drain(None);
    }

    /// [`shut_down_with_drain`](WorkQueue::shut_down_with_drain) that waits at most `timeout` on
    /// the queue's clock, and reports the keys still in flight if the drain did not complete.
    pub fn shut_down_with_drain_timeout(
        &self,
        timeout: Duration,
    ) -> Result<(), DrainIncomplete<T>> {
        let deadline = self.now().saturating_add(timeout);
        self.drain(Some(deadline))
    }

    fn drain(&self, deadline: Option<Instant>) -> Result<(), DrainIncomplete<T>> {
        let core = &self.core;
        let drain = core.begin_drain();
        let mut g = core.lock();
        loop {
            let now = core.clock().now();
            let timed_out = deadline.is_some_and(|d| now >= d);
            if let Some(outcome) = drain.outcome(&g, timed_out) {
                return outcome;
            }
            self.wait(&core.notifier().drainers, &mut g, now, deadline);
        }
    }
}

impl<T, S> fmt::Debug for WorkQueue<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WorkQueue").field(&self.core).finish()
    }
}
