//! The part of a queue driver that does not depend on how it waits.
//!
//! A driver puts [`QueueState`] behind a lock, reads a clock, calls the rate limiter outside the
//! lock, and wakes waiters. Only the waiting differs between the blocking queue (condition
//! variables) and the tokio queue (`Notify` and timers), so everything else lives here, once:
//! [`QueueCore`] implements every non-waiting operation and `LeaseOwner`, and a driver supplies
//! a [`Notifier`] and its own `get`/drain loops around [`QueueCore::lock`].

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use workqueue_ratelimit::{Instant, RateLimiter};

use crate::clock::Clock;
use crate::lease::Lease;
use crate::options::AddOptions;
use crate::state::{AddStatus, Counts, Get, OutageEvent, QueueState};
use crate::sync::{AtomicBool, Mutex, MutexGuard};
use workqueue_ratelimit::OutageConfig;

mod finish;
mod handle_methods;
mod wake;

pub use wake::Drain;
use wake::WakeOnChange;

/// How a driver wakes the tasks or threads that wait on its queue.
///
/// Every method is called with the queue's lock held (`locked` is the locked data), so a
/// notification cannot slip between a waiter's check and its wait, provided the waiter
/// registers for wake-ups before it releases the lock (a condition variable does; a tokio
/// `Notified` must be enabled before the lock is taken).
pub trait Notifier<T, S>: Send + Sync + 'static {
    /// A key became ready or the earliest deadline moved earlier: wake one getter so it takes the
    /// key or re-computes its sleep. (It passes the wake-up on if more keys are ready.) Called only
    /// while `locked.idle_getters` is not zero: a getter that has not counted itself idle looks at
    /// the state again before it waits.
    fn wake_getter(&self, locked: &Locked<T, S>);
    /// The queue shut down: wake every getter and every drain.
    fn wake_all(&self, locked: &Locked<T, S>);
    /// A drain may be complete: wake every drain.
    fn wake_drainers(&self, locked: &Locked<T, S>);
}

/// The data under a queue's lock.
#[derive(Debug)]
pub struct Locked<T, S> {
    /// The queue's semantics.
    pub state: QueueState<T, S>,
    /// Getters waiting for a key. A driver counts a getter here, under the lock, once it has
    /// registered for wake-ups and found nothing; no getter is notified while it is zero.
    pub idle_getters: usize,
    /// The deadline the one getter that times the queue sleeps until, if one does. Other idle
    /// getters wait only for notifications, so a deadline wakes one getter, not all of them.
    pub timer: Option<Instant>,
    /// Drains waiting for the queue to drain.
    pub drains: usize,
    /// How many times `shut_down()` released the drains waiting at the time. A drain remembers
    /// the count when it starts and stops waiting once it changes; a later drain cannot re-arm it.
    pub releases: u64,
}

/// Configuration shared by the drivers' builders (built with [`Builder`](crate::Builder)).
#[non_exhaustive]
pub struct CoreConfig<T, S> {
    /// The queue's name (metrics and diagnostics).
    pub name: Option<Arc<str>>,
    /// The rate limiter; `None` for the default controller limiter.
    pub limiter: Option<Arc<dyn RateLimiter<T>>>,
    /// The clock the queue reads.
    pub clock: Arc<dyn Clock>,
    /// The hasher for keys.
    pub hasher: S,
    /// Initial capacity in keys.
    pub capacity: usize,
    /// Whether drains also wait for the ready FIFO to empty.
    pub drain_includes_queued: bool,
    /// Whether `add_rate_limited` skips the limiter for a key already queued or waiting.
    pub skip_limiter_when_pending: bool,
    /// Whether an add leaves a key waiting on a rate-limited retry waiting (see
    /// `Builder::keep_backoff`).
    pub keep_backoff: bool,
    /// Aging: how long a key may be ready before it is served ahead of every other.
    pub max_ready_wait: Option<Duration>,
    /// Fairness: each key's group, as a hash of what the user's function returned.
    pub group: Option<GroupFn<T>>,
    /// Whether a named queue joins the process-wide metrics refresher thread.
    pub refresh_thread: bool,
    /// Outage detection (off when `None`), see `Builder::outage_detection`.
    pub outage: Option<OutageConfig>,
    /// Called after each change of the outage detector (see `Builder::on_outage_event`).
    pub outage_hook: Option<OutageHook>,
    /// Whether the state gives memory back after a burst (`QueueState::set_shrink_memory`).
    pub shrink: bool,
}

/// A function told of each change of the outage detector (see `Builder::on_outage_event`).
pub type OutageHook = Arc<dyn Fn(&OutageEvent) + Send + Sync>;

/// A key's fairness group (see `Builder::fairness`).
pub type GroupFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

impl<T, S> fmt::Debug for CoreConfig<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoreConfig")
            .field("name", &self.name)
            .field("clock", &self.clock)
            .field("capacity", &self.capacity)
            .field("drain_includes_queued", &self.drain_includes_queued)
            .field("skip_limiter_when_pending", &self.skip_limiter_when_pending)
            .field("keep_backoff", &self.keep_backoff)
            .field("max_ready_wait", &self.max_ready_wait)
            .field("fair", &self.group.is_some())
            .field("refresh_thread", &self.refresh_thread)
            .field("outage", &self.outage)
            .field("shrink", &self.shrink)
            .finish_non_exhaustive()
    }
}

/// A queue minus its waiting: the state under a lock, the clock, the limiter and a [`Notifier`].
///
/// Invariants: `shutting_down` mirrors `state.is_shutting_down()` (stored under the lock, read
/// without it only where a stale `false` is harmless); whoever changes the state so that a key
/// becomes ready, or the earliest deadline moves earlier, calls `wake_getter` before unlocking.
pub struct QueueCore<T, S, N> {
    /// On its own cache line: leases clone and drop the `Arc` around the core, and its reference
    /// count must not share a line with the lock every thread contends on.
    locked: CachePadded<Mutex<Locked<T, S>>>,
    limiter: Arc<dyn RateLimiter<T>>,
    clock: Arc<dyn Clock>,
    shutting_down: AtomicBool,
    drain_includes_queued: bool,
    skip_limiter_when_pending: bool,
    group: Option<GroupFn<T>>,
    /// Whether a named queue joins the process-wide metrics refresher.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    refresh_thread: bool,
    /// Every operation reads the time (aging or metrics need that of each), not only when a
    /// waiting key could be due. Fixed at construction: one load on the hot path.
    always_now: bool,
    /// Where `always_now` is only for aging: the clock's `recent` reading will do (see
    /// [`QueueCore::now_for`]).
    recent: bool,
    name: Option<Arc<str>>,
    notifier: N,
    /// Whether outage detection is on: read before each finish, the one branch it costs when
    /// off. Set under the lock, with the state's detector.
    outage_on: AtomicBool,
    /// Told of the detector's changes, in order, after the lock is released.
    outage_hooks: std::sync::Mutex<Vec<OutageHook>>,
    /// Openings of the outage detector, and parked keys as of the latest finish.
    outage_openings: std::sync::atomic::AtomicU64,
    parked: std::sync::atomic::AtomicUsize,
    /// Parked keys the shutdown dropped.
    parked_dropped: std::sync::atomic::AtomicUsize,
    /// Metrics of a named queue; `None` (and no per-key timing) for an unnamed one.
    #[cfg(feature = "metrics")]
    metrics: Option<Box<crate::metrics::QueueMetrics>>,
}

impl<T, S, N> QueueCore<T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    /// A core configured by `config`, waking waiters through `notifier`.
    pub fn new(config: CoreConfig<T, S>, notifier: N) -> Self {
        let limiter = config
            .limiter
            .unwrap_or_else(|| Arc::new(workqueue_ratelimit::default_controller_rate_limiter()));
        let mut state = QueueState::with_capacity_and_hasher(config.capacity, config.hasher);
        if let Some(max_wait) = config.max_ready_wait {
            state.enable_aging(max_wait);
        }
        if config.group.is_some() {
            state.enable_fairness();
        }
        if let Some(outage) = config.outage {
            state.enable_outage_detection(outage);
        }
        state.set_shrink_memory(config.shrink);
        state.set_keep_backoff(config.keep_backoff);
        #[cfg(feature = "metrics")]
        let metrics = config.name.clone().map(|name| {
            state.enable_timing();
            Box::new(crate::metrics::QueueMetrics::new(name))
        });
        #[cfg(feature = "metrics")]
        let timed = metrics.is_some();
        #[cfg(not(feature = "metrics"))]
        let timed = false;
        let always_now = timed || state.has_aging();
        let recent = !timed && state.has_aging();
        if recent {
            // Starts what keeps `recent` cheap (the system clock's ticker) here, not under the
            // lock at the first operation.
            config.clock.recent();
        }
        QueueCore {
            locked: CachePadded::new(Mutex::new(Locked {
                state,
                idle_getters: 0,
                timer: None,
                drains: 0,
                releases: 0,
            })),
            limiter,
            clock: config.clock,
            shutting_down: AtomicBool::new(false),
            drain_includes_queued: config.drain_includes_queued,
            skip_limiter_when_pending: config.skip_limiter_when_pending,
            group: config.group,
            refresh_thread: config.refresh_thread,
            always_now,
            recent,
            name: config.name,
            notifier,
            outage_on: AtomicBool::new(config.outage.is_some()),
            outage_hooks: std::sync::Mutex::new(config.outage_hook.into_iter().collect()),
            outage_openings: Default::default(),
            parked: Default::default(),
            parked_dropped: Default::default(),
            #[cfg(feature = "metrics")]
            metrics,
        }
    }

    /// The driver's notifier.
    pub fn notifier(&self) -> &N {
        &self.notifier
    }

    /// The queue's clock.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The queue's name.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The queue's rate limiter.
    pub fn limiter(&self) -> &dyn RateLimiter<T> {
        &*self.limiter
    }

    /// Turns outage detection on (a closed detector restarts with `config`; an open one is kept
    /// until a probe closes it), also telling `hook` of its changes when it is `Some` (after
    /// the hooks given before; one `Arc` given again is not added twice).
    pub fn set_outage_detection(&self, config: OutageConfig, hook: Option<OutageHook>) {
        if let Some(hook) = hook {
            self.add_outage_hook(hook);
        }
        let mut g = self.lock();
        g.state.enable_outage_detection(config);
        self.outage_on.store(true, Ordering::Relaxed);
    }

    /// Also tells `hook` of the outage detector's changes (after the hooks given before; one
    /// `Arc` given again is not added twice).
    pub fn add_outage_hook(&self, hook: OutageHook) {
        let mut hooks = self
            .outage_hooks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !hooks.iter().any(|h| Arc::ptr_eq(h, &hook)) {
            hooks.push(hook);
        }
    }

    /// Whether outage detection is on.
    pub fn has_outage_detection(&self) -> bool {
        self.outage_on.load(Ordering::Relaxed)
    }

    /// Whether the outage detector is open (`false` when detection is off).
    pub fn is_outage_open(&self) -> bool {
        self.has_outage_detection()
            && self
                .lock()
                .state
                .outage_detector()
                .is_some_and(|d| d.is_open())
    }

    /// Whether `key` is parked (`false` when detection is off).
    pub fn is_parked(&self, key: &T) -> bool {
        self.has_outage_detection() && self.lock().state.is_parked(key)
    }

    /// How many keys are parked (0 when detection is off).
    pub fn parked_len(&self) -> usize {
        match self.has_outage_detection() {
            true => self.lock().state.parked_len(),
            false => 0,
        }
    }

    /// How many parked keys the queue's shutdown dropped (parked keys are waiting keys).
    pub fn parked_dropped_at_shutdown(&self) -> usize {
        self.parked_dropped.load(Ordering::Relaxed)
    }

    /// How many times the outage detector opened.
    pub fn outage_openings(&self) -> u64 {
        self.outage_openings.load(Ordering::Relaxed)
    }

    /// Locks the queue's data. Drivers hold it only to check the state and start waiting.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, Locked<T, S>> {
        self.locked.lock()
    }

    /// `now` for an operation under the lock.
    ///
    /// The clock is read when a waiting key could be due (deadlines are exact), and at every
    /// operation when aging or metrics need the time of each; otherwise the state's latest time
    /// does. Aging alone takes the clock's [`recent`](Clock::recent) reading: enough for it (a
    /// key may count as ready up to that reading's age early or late), and an atomic load on the
    /// system clock where `now` is a read of the CPU's counter. Metrics time every operation
    /// exactly, so a named queue reads `now`.
    #[inline]
    pub fn now_for(&self, state: &QueueState<T, S>) -> Instant {
        if self.always_now || state.has_waiting() {
            if self.recent && !state.has_waiting() {
                self.clock.recent()
            } else {
                self.clock.now()
            }
        } else {
            state.now()
        }
    }

    /// Whether the queue is shutting down.
    #[inline]
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Whether a drain is complete (see `QueueState::is_drained`).
    pub fn is_drained(&self, locked: &Locked<T, S>) -> bool {
        locked.state.is_drained(self.drain_includes_queued)
    }

    /// Runs `op` on the locked data, then wakes a getter if it made a key ready or moved the
    /// earliest deadline earlier, and emits metrics.
    ///
    /// `op` may call user code (a key's `Hash` or `Eq`, a batch's iterator) and panic part-way,
    /// after some of its changes: the wake-ups are sent from a guard's `Drop`, so they follow
    /// whatever `op` did, panic or not. Metrics (a recorder is user code too) are emitted last,
    /// once the state is consistent and everyone who must be woken was.
    #[inline]
    fn mutate<R>(&self, op: impl FnOnce(&mut Locked<T, S>) -> R) -> R {
        let mut g = self.lock();
        let r = {
            let wake = WakeOnChange::new(self, &mut g);
            op(wake.locked)
        };
        self.emit(&mut g.state);
        r
    }

    /// See `WorkQueue::add`.
    pub fn add(&self, key: T) -> AddStatus {
        if self.group.is_some() {
            return self.add_with(key, AddOptions::new());
        }
        let (status, unused) = self.mutate(|g| {
            let now = self.now_for(&g.state);
            g.state.add_plain_or_return(key, now)
        });
        drop(unused);
        status
    }

    /// The fairness group of `key` (`None` without fairness). The group function is user code:
    /// it runs before the lock.
    #[inline]
    fn group_of(&self, key: &T) -> Option<u64> {
        self.group.as_ref().map(|f| f(key))
    }

    /// See `WorkQueue::add_ref`.
    pub fn add_ref<Q>(&self, key: &Q) -> AddStatus
    where
        T: Borrow<Q> + for<'a> From<&'a Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.group.is_some() {
            // The group function takes the owned key type.
            return self.add(T::from(key));
        }
        self.mutate(|g| {
            let now = self.now_for(&g.state);
            g.state.add_ref(key, AddOptions::new(), now)
        })
    }

    /// See `WorkQueue::add_batch`.
    pub fn add_batch(&self, keys: impl IntoIterator<Item = T>) {
        if self.group.is_some() {
            return self.add_batch_with(keys, AddOptions::new());
        }
        let unused: Vec<T> = self.mutate(|g| {
            let now = self.now_for(&g.state);
            keys.into_iter()
                .filter_map(|k| g.state.add_plain_or_return(k, now).1)
                .collect()
        });
        drop(unused);
    }

    /// With outage detection on: whether a rate-limited add of `key` is held because the key is
    /// parked (applied under the lock: its priority raised), so that the limiter is not asked.
    fn held_parked(&self, key: &T, opts: AddOptions) -> bool {
        if opts.bypass_parking || !self.has_outage_detection() {
            return false;
        }
        self.mutate(|g| {
            let now = self.now_for(&g.state);
            g.state.hold_if_parked(key, opts.priority, now)
        })
    }

    /// See `WorkQueue::add_with`.
    pub fn add_with(&self, key: T, opts: AddOptions) -> AddStatus {
        if opts.rate_limited && self.is_shutting_down() {
            return AddStatus::ShutDown;
        }
        if opts.rate_limited && self.held_parked(&key, opts) {
            return AddStatus::Parked;
        }
        let now = (opts.rate_limited || !opts.after.is_zero()).then(|| self.clock.now());
        let after = opts.delay(self.limiter_delay(&key, opts, now));
        let group = self.group_of(&key);
        let opts = AddOptions { after, ..opts };
        let (status, unused) = self.mutate(|g| {
            let now = now.unwrap_or_else(|| self.now_for(&g.state));
            g.state.add_or_return(key, opts, group, now)
        });
        drop(unused);
        self.count_retry(now.is_some() && status != AddStatus::ShutDown);
        status
    }

    /// See `WorkQueue::add_batch_with`.
    pub fn add_batch_with(&self, keys: impl IntoIterator<Item = T>, opts: AddOptions) {
        if opts.rate_limited && self.is_shutting_down() {
            return;
        }
        let now = (opts.rate_limited || !opts.after.is_zero()).then(|| self.clock.now());
        let mut held = Vec::new();
        // The limiter and the group function are asked outside the lock, key by key.
        let keys: Vec<(T, Duration, Option<u64>)> = keys
            .into_iter()
            .filter_map(|key| {
                if opts.rate_limited && self.held_parked(&key, opts) {
                    held.push(key);
                    return None;
                }
                Some(key)
            })
            .map(|key| {
                let delay = opts.delay(self.limiter_delay(&key, opts, now));
                let group = self.group_of(&key);
                (key, delay, group)
            })
            .collect();
        let (unused, added): (Vec<T>, usize) = self.mutate(|g| {
            let now = now.unwrap_or_else(|| self.now_for(&g.state));
            let mut added = 0;
            let unused = keys
                .into_iter()
                .filter_map(|(key, after, group)| {
                    let opts = AddOptions { after, ..opts };
                    let (status, unused) = g.state.add_or_return(key, opts, group, now);
                    added += usize::from(status != AddStatus::ShutDown);
                    unused
                })
                .collect();
            (unused, added)
        });
        drop(unused);
        drop(held);
        if now.is_some() {
            (0..added).for_each(|_| self.count_retry(true));
        }
    }

    /// The limiter's delay for an add with `opts` (`None` unless it is rate-limited).
    fn limiter_delay(&self, key: &T, opts: AddOptions, now: Option<Instant>) -> Option<Duration> {
        let delay = opts
            .rate_limited
            .then(|| self.limiter.when(key, now.unwrap_or_default()));
        self.observe_limiter_delay(delay);
        delay
    }

    /// See `WorkQueue::add_after`.
    pub fn add_after(&self, key: T, delay: Duration) -> AddStatus {
        let now = self.clock.now();
        let status = self.add_after_at(key, AddOptions::new().after(delay), now);
        self.count_retry(status != AddStatus::ShutDown);
        status
    }

    /// See `WorkQueue::add_rate_limited`.
    pub fn add_rate_limited(&self, key: T) -> AddStatus {
        if self.is_shutting_down() {
            return AddStatus::ShutDown;
        }
        let opts = AddOptions::new().rate_limited(true);
        if self.held_parked(&key, opts) {
            return AddStatus::Parked;
        }
        if self.skip_limiter_when_pending {
            let g = self.lock();
            if g.state.is_queued(&key) {
                return AddStatus::AlreadyQueued;
            }
            if g.state.waiting_deadline(&key).is_some() {
                return AddStatus::AlreadyWaiting;
            }
        }
        let now = self.clock.now();
        let delay = self.limiter.when(&key, now);
        self.observe_limiter_delay(Some(delay));
        let status = self.add_after_at(key, opts.after(delay), now);
        self.count_retry(status != AddStatus::ShutDown);
        status
    }

    fn add_after_at(&self, key: T, opts: AddOptions, now: Instant) -> AddStatus {
        let group = self.group_of(&key);
        let (status, unused) = self.mutate(|g| g.state.add_or_return(key, opts, group, now));
        drop(unused);
        status
    }

    /// See `WorkQueue::retain`. `keep` runs under the lock (the state asks it about every key
    /// before changing anything); the removed keys are forgotten in the limiter, each caught,
    /// and dropped outside it; the first panic of those propagates afterwards.
    pub fn retain(&self, keep: impl FnMut(&T) -> bool) -> usize {
        let (removed, parked) = self.mutate(|g| {
            let removed = g.state.retain(keep);
            let parked = self.has_outage_detection().then(|| g.state.parked_len());
            (removed, parked)
        });
        if let Some(parked) = parked {
            self.parked.store(parked, Ordering::Relaxed);
        }
        let mut first_panic = None;
        for key in &removed {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.limiter.forget(key))) {
                first_panic.get_or_insert(panic);
            }
        }
        let n = removed.len();
        drop(removed);
        if let Some(panic) = first_panic {
            resume_unwind(panic);
        }
        n
    }

    /// See `WorkQueue::forget`.
    pub fn forget(&self, key: &T) {
        self.limiter.forget(key)
    }

    /// See `WorkQueue::num_requeues`.
    pub fn num_requeues(&self, key: &T) -> u32 {
        self.limiter.num_requeues(key)
    }

    /// See `WorkQueue::len`.
    pub fn len(&self) -> usize {
        self.mutate(|g| {
            let now = self.now_for(&g.state);
            g.state.len(now)
        })
    }

    /// See `WorkQueue::is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters of the queue's state, after promoting the keys due now.
    pub fn counts(&self) -> Counts {
        self.mutate(|g| {
            let now = self.now_for(&g.state);
            g.state.len(now);
            g.state.counts()
        })
    }

    /// See `WorkQueue::compactions`.
    pub fn compactions(&self) -> u64 {
        self.lock().state.compactions()
    }

    /// Heap bytes held by the queue's own structures.
    pub fn allocated_bytes(&self) -> usize {
        self.lock().state.allocated_bytes()
    }

    /// Takes a ready key under the lock, as a lease. `Err` carries why none was taken.
    ///
    /// Passes the wake-up on when more keys are ready, so one notification per ready key suffices.
    ///
    /// Panic safety: the key is cloned before it is marked processing (in the state), and a
    /// metrics recorder that panics after the get undoes it, so a panic leaves the key queued at
    /// the head, exactly as before; it then propagates to the caller.
    pub fn take(self: &Arc<Self>, g: &mut Locked<T, S>, now: Instant) -> Result<Lease<T>, Get<T>> {
        match g.state.get(now) {
            Get::Ready(ticket, key) => {
                if g.state.ready_len() > 0 {
                    self.wake_getter(g);
                } else {
                    self.hand_off_timer(g);
                }
                let lease = Lease::new(key, ticket, self.clone());
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.emit(&mut g.state))) {
                    let (key, ticket) = lease.into_parts();
                    g.state.unget(ticket);
                    drop(key);
                    resume_unwind(panic);
                }
                Ok(lease)
            }
            other => {
                self.emit(&mut g.state);
                Err(other)
            }
        }
    }

    /// A named queue joins the process-wide refresher (which also sends what its operations
    /// recorded, see `metrics::FLUSH_EVERY`); drivers call it once the core is in its `Arc`.
    /// A no-op for an unnamed queue, one built with `metrics_refresh_thread(false)`, after shutdown, or
    /// without the `metrics` feature.
    pub fn join_refresher(self: &Arc<Self>) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics
            && self.refresh_thread
        {
            m.register(|| {
                let weak: std::sync::Weak<Self> = Arc::downgrade(self);
                weak as std::sync::Weak<dyn crate::metrics::RefreshMetrics>
            });
        }
    }

    /// Wakes one idle getter, if any getter is idle (the one place that rule is written).
    #[inline]
    fn wake_getter(&self, g: &Locked<T, S>) {
        if g.idle_getters > 0 {
            self.notifier.wake_getter(g);
        }
    }

    /// For a getter about to wait while keys wait for `next_deadline`: whether it should sleep until
    /// that deadline. Only one getter times the queue (the one with the earliest deadline); the
    /// others wait for a notification. A getter that claims the timer must call
    /// [`QueueCore::release_timer`] when it wakes or gives up.
    pub fn claim_timer(
        &self,
        g: &mut Locked<T, S>,
        next_deadline: Option<Instant>,
    ) -> Option<Instant> {
        let deadline = next_deadline?;
        match g.timer {
            Some(t) if t <= deadline => None,
            _ => {
                g.timer = Some(deadline);
                Some(deadline)
            }
        }
    }

    /// Gives up the timer claimed for `deadline` (a getter that woke, and will look at the state
    /// again before it waits or leaves).
    pub fn release_timer(&self, g: &mut Locked<T, S>, deadline: Instant) {
        if g.timer == Some(deadline) {
            g.timer = None;
        }
    }

    /// For a getter that leaves (with a key, empty-handed, or cancelled): if keys wait and no
    /// getter times them, wake one to take the timer over.
    pub fn hand_off_timer(&self, g: &Locked<T, S>) {
        if g.timer.is_none() && g.state.has_waiting() {
            self.wake_getter(g);
        }
    }

    /// Takes up to `max` ready keys without waiting.
    ///
    /// If a take panics (see [`QueueCore::take`]), the keys taken before it go back to the head
    /// in their order, so the batch takes all or nothing; the panic then propagates.
    pub fn take_batch(self: &Arc<Self>, max: usize) -> Vec<Lease<T>> {
        let mut out = Vec::new();
        let mut g = self.lock();
        let now = self.now_for(&g.state);
        while out.len() < max {
            match catch_unwind(AssertUnwindSafe(|| self.take(&mut g, now))) {
                Ok(Ok(lease)) => out.push(lease),
                Ok(Err(_)) => break,
                Err(panic) => {
                    // Dropping these leases would finish them, re-locking the queue.
                    let keys: Vec<T> = out
                        .into_iter()
                        .rev()
                        .map(|lease| {
                            let (key, ticket) = lease.into_parts();
                            g.state.unget(ticket);
                            key
                        })
                        .collect();
                    drop(g);
                    drop(keys);
                    resume_unwind(panic);
                }
            }
        }
        out
    }

    /// Stops intake and wakes everyone (see `WorkQueue::shut_down`); releases the drains waiting.
    pub fn shut_down(&self) {
        let released = {
            let mut g = self.lock();
            g.releases += 1;
            self.shut_down_locked(&mut g)
        };
        drop(released);
    }

    fn shut_down_locked(&self, g: &mut Locked<T, S>) -> Vec<T> {
        if self.outage_on.load(Ordering::Relaxed) && !g.state.is_shutting_down() {
            // Parked keys are waiting keys: shutdown drops them. Counted once.
            self.parked_dropped
                .store(g.state.parked_len(), Ordering::Relaxed);
            self.parked.store(0, Ordering::Relaxed);
        }
        let released = g.state.shut_down();
        self.shutting_down.store(true, Ordering::Release);
        self.notifier.wake_all(g);
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.deregister();
        }
        // Last: a recorder that panics finds the queue shut down and everyone woken.
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.flush(&mut g.state);
        }
        released
    }

    /// Shuts down and registers a drain, in one lock hold (so a concurrent `shut_down()` either
    /// precedes the drain or releases it). The drain is deregistered when the guard drops.
    pub fn begin_drain(&self) -> Drain<'_, T, S, N> {
        let (released, releases) = {
            let mut g = self.lock();
            g.drains += 1;
            (self.shut_down_locked(&mut g), g.releases)
        };
        drop(released);
        Drain {
            core: self,
            releases,
        }
    }

    // ---- metrics (see the `metrics` module) ------------------------------------------------------

    /// Whether this queue emits metrics (it is named, and the `metrics` feature is on).
    #[inline]
    pub fn has_metrics(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.metrics.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// Sends what operations recorded since the last flush (see `metrics::FLUSH_EVERY`), and sets
    /// `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds` from
    /// the keys in flight and `workqueue_oldest_ready_seconds` from the queued keys, at the queue
    /// clock's `now`. The process-wide refresher calls it every 500 ms; a no-op for an unnamed
    /// queue or without the `metrics` feature.
    pub fn refresh_metrics(&self) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.in_context(&|| {
                // The clock is read before the lock: a manual clock wakes queues (taking their
                // locks) while it holds its own.
                let now = self.clock.now();
                let mut g = self.lock();
                m.flush(&mut g.state);
                if let Some(t) = g.state.timing() {
                    let (total, longest) = t.unfinished_work(now);
                    let oldest = g.state.oldest_ready(now).unwrap_or_default();
                    drop(g);
                    m.refresh(total, longest, oldest);
                }
            });
        }
    }

    /// Runs every [`refresh_metrics`](QueueCore::refresh_metrics) inside `context` (which calls the
    /// function it is given): the tokio driver enters its runtime there, so that the refresher
    /// thread reads the runtime's clock. Only the first call takes effect.
    pub fn set_refresh_context(&self, context: impl Fn(&dyn Fn()) + Send + Sync + 'static) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.set_context(Box::new(context));
        }
        #[cfg(not(feature = "metrics"))]
        drop(context);
    }

    /// Records one operation for the metrics, which are sent in batches
    /// (`metrics::FLUSH_EVERY`), under the queue's lock.
    ///
    /// Under the lock on purpose: what is sent lives in the state's timing, and copying it out to
    /// send after the lock costs more than sending it (ARCHITECTURE.md). A `metrics` recorder's
    /// handles are atomics, and a flush comes once every 64 operations; a recorder that blocks
    /// would block the queue, which the crate docs say.
    #[inline]
    fn emit(&self, state: &mut QueueState<T, S>) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.emit(state);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = state;
    }

    #[inline]
    fn count_retry(&self, counted: bool) {
        #[cfg(feature = "metrics")]
        if counted && let Some(m) = &self.metrics {
            m.retry();
        }
        #[cfg(not(feature = "metrics"))]
        let _ = counted;
    }

    #[inline]
    fn observe_limiter_delay(&self, delay: Option<Duration>) {
        #[cfg(feature = "metrics")]
        if let (Some(m), Some(d)) = (&self.metrics, delay) {
            m.limiter_delay(d);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = delay;
    }
}

#[cfg(feature = "metrics")]
impl<T, S, N> crate::metrics::RefreshMetrics for QueueCore<T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    fn refresh_metrics(&self) {
        QueueCore::refresh_metrics(self)
    }
}

impl<T, S, N> QueueCore<T, S, N> {
    /// From now on, the queue's metrics also carry the `controller` label, with the queue's name
    /// (controller-runtime's labels for a controller's queue). The tokio runner calls it.
    pub fn label_controller(&self) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.label_controller();
        }
    }
}

impl<T, S, N> fmt::Debug for QueueCore<T, S, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueCore")
            .field("name", &self.name)
            .field("shutting_down", &self.shutting_down.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
