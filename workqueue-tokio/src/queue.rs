//! The async work queue: [`QueueCore`] with `tokio::sync::Notify` and tokio timers.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use workqueue_core::driver::{CoreConfig, Locked, Notifier, QueueCore};
use workqueue_core::state::{AddStatus, Counts, DefaultHashBuilder, Get};
use workqueue_core::{BuildQueue, Builder, DrainIncomplete, DrainStop, Instant, Lease};

use crate::clock::TokioClock;

/// A Kubernetes-style work queue for tokio tasks: de-duplicating, delaying, rate-limited.
///
/// The same operations and semantics as the blocking
/// [`workqueue_core::WorkQueue`], driven by the same state machine: adds are plain methods
/// (informer callbacks are synchronous), [`get`](WorkQueue::get) and the drains are `async`.
/// Time is tokio's: with `tokio::time::pause()` every delay is exact and instant.
///
/// No task runs per queue or per delayed key: a waiting `get` sleeps until the earliest deadline
/// or until it is notified.
///
/// ```
/// use std::time::Duration;
/// use workqueue_tokio::WorkQueue;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let queue: WorkQueue<String> = WorkQueue::new();
/// queue.add_after("default/web".to_string(), Duration::from_secs(30));
/// let lease = queue.get().await.unwrap(); // paused time: returns at once, 30 s later
/// assert_eq!(lease.as_str(), "default/web");
/// lease.forget();
/// # }
/// ```
pub struct WorkQueue<T, S = DefaultHashBuilder> {
    core: Arc<QueueCore<T, S, Notifies>>,
    clock: TokioClock,
}

/// The async driver's [`Notifier`]: one `Notify` for getters, one for drains.
#[derive(Debug, Default)]
pub struct Notifies {
    getters: Notify,
    drainers: Notify,
}

impl<T, S> Notifier<T, S> for Notifies
where
    T: Send + Sync + 'static,
    S: Send + Sync + 'static,
{
    #[inline]
    fn wake_getter(&self, _: &Locked<T, S>) {
        // Stores a permit when nobody waits, so a getter about to wait does not miss it; a
        // cancelled getter that was notified passes the notification on (tokio guarantees it).
        self.getters.notify_one();
    }

    fn wake_all(&self, _: &Locked<T, S>) {
        self.getters.notify_waiters();
        self.drainers.notify_waiters();
    }

    fn wake_drainers(&self, _: &Locked<T, S>) {
        self.drainers.notify_waiters();
    }
}

/// Marks a [`Builder`] for the async [`WorkQueue`]: `WorkQueue::builder()` returns
/// `Builder<T, S, Tokio>`.
#[derive(Debug, Clone, Copy)]
pub struct Tokio;

impl<T, S> BuildQueue<T, S> for Tokio
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    type Queue = WorkQueue<T, S>;

    fn build(mut config: CoreConfig<T, S>) -> WorkQueue<T, S> {
        let clock = TokioClock::new();
        config.clock = Arc::new(clock);
        let core = Arc::new(QueueCore::new(config, Notifies::default()));
        // The metrics refresher thread reads the clock inside this runtime, so it sees the
        // runtime's time (paused or not).
        if core.has_metrics()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            core.set_refresh_context(move |refresh| {
                let _entered = handle.enter();
                refresh();
            });
        }
        WorkQueue { core, clock }
    }
}

impl<T> WorkQueue<T>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// An unnamed queue with the default controller rate limiter.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder for a queue with a name, rate limiter or hasher of your choice.
    ///
    /// The clock is always tokio's, with its epoch at `build` (a token bucket shared between
    /// queues built far apart in time refills late for the gap: build them together).
    pub fn builder() -> Builder<T, DefaultHashBuilder, Tokio> {
        Builder::new()
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
            clock: self.clock,
        }
    }
}

impl<T, S> WorkQueue<T, S>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// The queue's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.core.name()
    }

    /// The queue's clock (tokio's, from the queue's epoch).
    pub fn clock(&self) -> TokioClock {
        self.clock
    }

    // ---- adds ----------------------------------------------------------------------------------

    /// Queues `key`, unless it is already queued; a key being processed is queued again when its
    /// lease finishes. Ignored after shutdown.
    pub fn add(&self, key: T) -> AddStatus {
        self.core.add(key)
    }

    /// [`add`](WorkQueue::add) from a borrowed key, cloning it only if the queue does not track it.
    pub fn add_ref<Q>(&self, key: &Q) -> AddStatus
    where
        T: Borrow<Q> + for<'a> From<&'a Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.core.add_ref(key)
    }

    /// Adds every key under one lock acquisition.
    pub fn add_batch(&self, keys: impl IntoIterator<Item = T>) {
        self.core.add_batch(keys)
    }

    /// Adds `key` once `delay` has passed (`Duration::ZERO` adds it now). A key already waiting
    /// keeps the earlier deadline. Ignored after shutdown.
    pub fn add_after(&self, key: T, delay: Duration) -> AddStatus {
        self.core.add_after(key, delay)
    }

    /// Adds `key` after the delay the rate limiter chooses for it (recording one failure).
    pub fn add_rate_limited(&self, key: T) -> AddStatus {
        self.core.add_rate_limited(key)
    }

    /// Clears the rate limiter's failures for `key`. Does not cancel a waiting re-add.
    pub fn forget(&self, key: &T) {
        self.core.forget(key)
    }

    /// How many failures the rate limiter has recorded for `key`.
    pub fn num_requeues(&self, key: &T) -> u32 {
        self.core.num_requeues(key)
    }

    // ---- gets ----------------------------------------------------------------------------------

    /// Waits until a key is ready and leases it; `None` once the queue is shut down and empty.
    ///
    /// Cancel-safe: dropping the future (in `select!`, on a timeout) never loses or holds a key.
    /// A key is taken from the queue and returned in the same poll, and a wake-up addressed to a
    /// dropped `get` is passed on to another.
    pub async fn get(&self) -> Option<Lease<T>> {
        let getters = &self.core.notifier().getters;
        loop {
            // Register for wake-ups before looking at the state, so none is lost in between.
            let mut notified = pin!(getters.notified());
            notified.as_mut().enable();
            let timer = {
                let mut g = self.core.lock();
                let now = self.core.now_for(&g.state);
                match self.core.take(&mut g, now) {
                    Ok(lease) => return Some(lease),
                    Err(Get::Empty { next_deadline }) => {
                        let deadline = self.core.claim_timer(&mut g, next_deadline);
                        deadline.map(|deadline| TimerClaim {
                            core: &self.core,
                            deadline,
                            woke: false,
                        })
                    }
                    Err(_) => return None,
                }
            };
            match timer.as_ref().and_then(|t| self.clock.to_tokio(t.deadline)) {
                Some(at) => {
                    tokio::select! {
                        biased;
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
            if let Some(mut timer) = timer {
                timer.woke = true;
            }
        }
    }

    /// Leases a ready key without waiting.
    pub fn try_get(&self) -> Option<Lease<T>> {
        let mut g = self.core.lock();
        let now = self.core.now_for(&g.state);
        self.core.take(&mut g, now).ok()
    }

    /// Leases up to `max` ready keys without waiting.
    pub fn try_get_batch(&self, max: usize) -> Vec<Lease<T>> {
        self.core.take_batch(max)
    }

    // ---- observation ---------------------------------------------------------------------------

    /// Number of keys ready to be handed out (not processing, not waiting for a delay).
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Whether no key is ready.
    pub fn is_empty(&self) -> bool {
        self.core.is_empty()
    }

    /// Counters of the queue's state (ready, processing, waiting, tracked).
    pub fn counts(&self) -> Counts {
        self.core.counts()
    }

    // ---- shutdown ------------------------------------------------------------------------------

    /// Stops intake: adds are ignored from now on, delayed keys are dropped, and waiting getters
    /// wake. Getters still receive the keys already queued, then `None`. Does not wait for leases;
    /// releases any drain in progress. Idempotent.
    pub fn shut_down(&self) {
        self.core.shut_down()
    }

    /// Whether the queue is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.core.is_shutting_down()
    }

    /// [`shut_down`](WorkQueue::shut_down), then waits until no lease is outstanding (and, with
    /// `drain_includes_queued`, until nothing is queued). A later `shut_down()` releases it.
    pub async fn shut_down_with_drain(&self) {
        let _ = self.drain(None).await;
    }

    /// [`shut_down_with_drain`](WorkQueue::shut_down_with_drain) that waits at most `timeout`, and
    /// reports the keys still in flight if the drain did not complete.
    pub async fn shut_down_with_drain_timeout(
        &self,
        timeout: Duration,
    ) -> Result<(), DrainIncomplete<T>> {
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        self.drain(Some(deadline)).await
    }

    /// `deadline`: `None` waits without limit; `Some(None)` is a limit too far to represent.
    async fn drain(
        &self,
        deadline: Option<Option<tokio::time::Instant>>,
    ) -> Result<(), DrainIncomplete<T>> {
        let core = &self.core;
        let drain = core.begin_drain();
        let drainers = &core.notifier().drainers;
        loop {
            let mut notified = pin!(drainers.notified());
            notified.as_mut().enable();
            {
                let g = core.lock();
                if core.is_drained(&g) {
                    return Ok(());
                }
                let timed_out =
                    matches!(deadline, Some(Some(d)) if tokio::time::Instant::now() >= d);
                let stop = if drain.is_released(&g) {
                    Some(DrainStop::Released)
                } else if timed_out {
                    Some(DrainStop::TimedOut)
                } else {
                    None
                };
                if let Some(stop) = stop {
                    return Err(DrainIncomplete {
                        stop,
                        in_flight: g.state.processing_keys(),
                        queued: g.state.ready_len(),
                    });
                }
            }
            match deadline {
                Some(Some(at)) => {
                    tokio::select! {
                        biased;
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                _ => notified.await,
            }
        }
    }

    /// Refreshes the queue's "unfinished work" gauges now, on the queue's clock (see
    /// [`workqueue_core::metrics`]). A background thread does this every 500 ms for named
    /// queues; a no-op for an unnamed queue or without the `metrics` feature.
    pub fn refresh_metrics(&self) {
        self.core.refresh_metrics()
    }

    /// The current time on the queue's clock.
    pub fn now(&self) -> Instant {
        use workqueue_core::Clock;
        self.clock.now()
    }
}

/// The timer a waiting `get` claimed. Released when the `get` wakes (it looks at the state again
/// itself) or is cancelled (then another getter is woken to take the timer over).
struct TimerClaim<'a, T, S>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    core: &'a QueueCore<T, S, Notifies>,
    deadline: Instant,
    woke: bool,
}

impl<T, S> Drop for TimerClaim<'_, T, S>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    fn drop(&mut self) {
        let mut g = self.core.lock();
        self.core.release_timer(&mut g, self.deadline);
        if !self.woke {
            self.core.hand_off_timer(&g);
        }
    }
}

impl<T, S> fmt::Debug for WorkQueue<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WorkQueue").field(&self.core).finish()
    }
}
