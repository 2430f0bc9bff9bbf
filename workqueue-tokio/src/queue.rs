//! The async work queue: [`QueueCore`] with `tokio::sync::Notify` and tokio timers.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use workqueue_core::__private::{BuildQueue, CoreConfig, Locked, Notifier, QueueCore};
use workqueue_core::state::{DefaultHashBuilder, Get};
use workqueue_core::{Builder, DrainIncomplete, Instant, Lease};

use crate::clock::TokioClock;

/// A Kubernetes-style work queue for tokio tasks: de-duplicating, delaying, rate-limited.
///
/// The same operations and semantics as the blocking
/// [`workqueue_core::WorkQueue`], driven by the same state machine: adds are plain methods
/// (informer callbacks are synchronous), [`get`](WorkQueue::get) and the drains are `async`.
/// Time is tokio's: with `tokio::time::pause()` (tokio's `test-util` feature) delays take no real
/// time. The queue's state is exact: every operation (`len`, `try_get`, ...) sees a key at its
/// exact deadline. A blocked [`get`](WorkQueue::get) sleeps on tokio's timer, which fires on whole
/// milliseconds, so it returns at the first 1 ms tick at or after the deadline (a key due at
/// 1.5 ms: at 2 ms), or earlier if another operation finds the key due and wakes it. The same
/// holds on real time.
///
/// No task runs per queue or per delayed key: a waiting `get` sleeps until the earliest deadline
/// or until it is notified.
///
/// ```
/// use std::time::Duration;
/// use workqueue_tokio::{Outcome, WorkQueue};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let queue: WorkQueue<String> = WorkQueue::new();
/// queue.add_after("default/web".to_string(), Duration::from_secs(30));
/// let lease = queue.get().await.unwrap(); // paused time: returns at once, 30 s later
/// assert_eq!(lease.as_str(), "default/web");
/// lease.finish(Outcome::forget());
/// # }
/// ```
pub struct WorkQueue<T, S = DefaultHashBuilder> {
    pub(crate) core: Arc<QueueCore<T, S, Notifies>>,
    clock: TokioClock,
}

/// The async driver's [`Notifier`]: one `Notify` for getters, one for drains.
#[derive(Debug, Default)]
pub(crate) struct Notifies {
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
        // Only called while a getter counts itself idle (it enabled its `Notified` before
        // looking at the state): a permit stored before it waits is not lost, and a cancelled
        // getter that was notified passes the notification on (tokio guarantees both).
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
/// `Builder<T, S, Tokio>`. Named only to write the builder's type.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
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
        core.join_refresher();
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
            clock: self.clock,
        }
    }
}

impl<T, S> WorkQueue<T, S>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    // The operations every driver offers unchanged (adds, non-waiting gets, observation,
    // shut_down) are defined once, in workqueue-core's `driver/handle_methods.rs`.
    workqueue_core::__private::queue_handle_methods!();

    /// The queue's clock (tokio's, from the queue's epoch).
    pub fn clock(&self) -> TokioClock {
        self.clock
    }

    // ---- waiting operations: the driver's own ----------------------------------------------

    /// Waits until a key is ready and leases it; `None` once the queue is shut down and empty.
    ///
    /// Cancel-safe: dropping the future (in `select!`, on a timeout) never loses or holds a key.
    /// A key is taken from the queue and returned in the same poll, and a wake-up addressed to a
    /// dropped `get` is passed on to another.
    ///
    /// Takes part in tokio's cooperative scheduling, as tokio's channels do: a `get` that finds a
    /// key ready spends one unit of the task's budget, and once the budget is spent it returns
    /// `Pending` (taking nothing) so that a task looping over a busy queue yields to the runtime.
    pub async fn get(&self) -> Option<Lease<T>> {
        // The busy path: a key is ready, so no wake-up registration is needed. (Registering costs
        // about as much as the rest of `get`.)
        {
            // Not held across an await: `RestoreOnPending` is !Send. Dropped without
            // `made_progress` (nothing ready), it gives the budget unit back.
            let coop = std::future::poll_fn(tokio::task::coop::poll_proceed).await;
            let mut g = self.core.lock();
            let now = self.core.now_for(&g.state);
            match self.core.take(&mut g, now) {
                Ok(lease) => {
                    coop.made_progress();
                    return Some(lease);
                }
                Err(Get::Empty { .. }) => {}
                Err(_) => {
                    coop.made_progress();
                    return None;
                }
            }
        }
        let getters = &self.core.notifier().getters;
        loop {
            // Register for wake-ups before looking at the state again, so none is lost in between.
            let mut notified = pin!(getters.notified());
            notified.as_mut().enable();
            let mut idle = {
                let mut g = self.core.lock();
                let now = self.core.now_for(&g.state);
                match self.core.take(&mut g, now) {
                    Ok(lease) => return Some(lease),
                    Err(Get::Empty { next_deadline }) => {
                        g.idle_getters += 1;
                        IdleGetter {
                            core: &self.core,
                            timer: self.core.claim_timer(&mut g, next_deadline),
                            woke: false,
                        }
                    }
                    Err(_) => return None,
                }
            };
            match idle
                .timer
                .and_then(|deadline| self.clock.to_tokio(deadline))
            {
                Some(at) => {
                    tokio::select! {
                        biased;
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
            idle.woke = true;
        }
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
                let timed_out =
                    matches!(deadline, Some(Some(d)) if tokio::time::Instant::now() >= d);
                if let Some(outcome) = drain.outcome(&g, timed_out) {
                    return outcome;
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

    /// The current time on the queue's clock.
    pub fn now(&self) -> Instant {
        use workqueue_core::Clock;
        self.clock.now()
    }
}

/// A `get` waiting for a key: counted in `Locked::idle_getters` (so adds notify only while some
/// getter waits), perhaps holding the timer. When the `get` wakes it leaves the count and gives
/// the timer back (it looks at the state again itself); when it is cancelled it also wakes
/// another getter to take the timer over.
struct IdleGetter<'a, T, S>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    core: &'a QueueCore<T, S, Notifies>,
    timer: Option<Instant>,
    woke: bool,
}

impl<T, S> Drop for IdleGetter<'_, T, S>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    fn drop(&mut self) {
        let mut g = self.core.lock();
        g.idle_getters -= 1;
        if let Some(deadline) = self.timer {
            self.core.release_timer(&mut g, deadline);
            if !self.woke {
                self.core.hand_off_timer(&g);
            }
        }
    }
}

impl<T, S> fmt::Debug for WorkQueue<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WorkQueue").field(&self.core).finish()
    }
}
