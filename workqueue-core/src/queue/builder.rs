use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use workqueue_ratelimit::{OutageConfig, RateLimiter};

use super::WorkQueue;
use crate::clock::{Clock, SystemClock};
use crate::driver::CoreConfig;
use crate::state::{DefaultHashBuilder, OutageEvent};

/// Configures a [`WorkQueue`]: name, rate limiter, clock, hasher and drain behaviour.
///
/// ```
/// use std::time::Duration;
/// use workqueue_core::{ManualClock, WorkQueue};
/// use workqueue_ratelimit::ExponentialFailure;
///
/// let clock = ManualClock::new();
/// let queue: WorkQueue<String> = WorkQueue::builder()
///     .name("deployments")
///     .rate_limiter(ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(60)))
///     .clock(clock)
///     .build();
/// assert_eq!(queue.name(), Some("deployments"));
/// ```
///
/// The same builder configures other drivers' queues (the tokio queue's `builder()` returns a
/// `Builder<T, S, D>` whose `D` builds that queue; the default `D` builds this crate's queue);
/// options that only make sense for one driver, such as [`clock`](Builder::clock), exist only
/// for it.
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder<T, S = DefaultHashBuilder, D = Blocking> {
    pub(super) config: CoreConfig<T, S>,
    driver: PhantomData<fn() -> D>,
}

/// What a [`Builder`] builds: `Blocking` builds the blocking [`WorkQueue`], and
/// `workqueue_tokio::Tokio` the async one.
///
/// Part of the unstable seam (`__private`), not of the public API: only the queue crates of this
/// family implement it (a queue for another runtime builds on
/// [`QueueState`](crate::state::QueueState)).
pub trait BuildQueue<T, S> {
    /// The queue this driver builds.
    type Queue;
    /// Builds the queue.
    fn build(config: CoreConfig<T, S>) -> Self::Queue;
}

/// Marks a [`Builder`] for the blocking [`WorkQueue`]: the default third parameter of
/// [`Builder`] (part of the unstable seam, `__private`).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Blocking;

impl<T, S> BuildQueue<T, S> for Blocking
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    type Queue = WorkQueue<T, S>;

    fn build(config: CoreConfig<T, S>) -> WorkQueue<T, S> {
        WorkQueue::from_config(config)
    }
}

impl<T, D> Default for Builder<T, DefaultHashBuilder, D> {
    /// A builder with the defaults: unnamed, default controller rate limiter, system clock,
    /// randomly seeded fast hasher (what the queues' `builder()` returns).
    fn default() -> Self {
        Builder {
            driver: PhantomData,
            config: CoreConfig {
                name: None,
                limiter: None,
                clock: Arc::new(SystemClock),
                hasher: DefaultHashBuilder::default(),
                capacity: 0,
                drain_includes_queued: false,
                skip_limiter_when_pending: false,
                keep_backoff: false,
                max_ready_wait: None,
                group: None,
                refresh_thread: true,
                outage: None,
                outage_hook: None,
                shrink: true,
            },
        }
    }
}

impl<T, S> Builder<T, S, Blocking> {
    /// The clock the queue reads. Default: [`SystemClock`]. Tests use
    /// [`ManualClock`](crate::ManualClock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Arc::new(clock);
        self
    }
}

impl<T, S, D> Builder<T, S, D> {
    /// Names the queue (metrics and diagnostics use the name; an unnamed queue emits no metrics).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// The rate limiter behind `add_rate_limited`, `retry`, `forget` and `num_requeues`.
    /// Default: [`workqueue_ratelimit::default_controller_rate_limiter`]. A limiter shared with
    /// other queues, or chosen at run time, is an `Arc<dyn RateLimiter<T>>`, itself a limiter.
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<T> + 'static) -> Self {
        self.config.limiter = Some(Arc::new(limiter));
        self
    }

    /// Room for `capacity` keys before the queue reallocates.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.config.capacity = capacity;
        self
    }

    /// Whether a drain also waits until the ready FIFO is empty, not only until no lease is
    /// outstanding (client-go waits only for leases; see kubernetes#141079). Default: `false`.
    pub fn drain_includes_queued(mut self, enabled: bool) -> Self {
        self.config.drain_includes_queued = enabled;
        self
    }

    /// Whether `add_rate_limited` leaves a key that is already queued or waiting alone, without
    /// consulting the rate limiter. Default: `false`, as client-go.
    ///
    /// Every `when` of a token bucket takes a token, even for an add that is then de-duplicated,
    /// so a flood of rate-limited adds of the same pending keys drains the bucket and pushes
    /// every later retry out (controller-runtime #1594), and per-key backoff counts failures that
    /// were never retried. With this option such an add is a no-op: the retry it asks for is
    /// already pending. A key being processed is still rate-limited as usual.
    pub fn skip_limiter_when_pending(mut self, enabled: bool) -> Self {
        self.config.skip_limiter_when_pending = enabled;
        self
    }

    /// Whether an add leaves a key that waits on a rate-limited retry waiting until its backoff
    /// ends, so that events for a failing object do not defeat its backoff. Default: `false`,
    /// client-go's rule: an add makes a waiting key ready at once (delayed adds are reminders).
    ///
    /// A rate-limited retry is a wait chosen by the rate limiter: a lease finished with `Outcome::retry()` (and a
    /// lease dropped while panicking), `add_rate_limited`, an add with
    /// [`AddOptions::rate_limited`](crate::AddOptions::rate_limited), and the pacing of keys
    /// released after an outage; not a delay given by the caller (`retry_after(d)`,
    /// `add_after`). With this on:
    /// - an add of such a key, with or without delay (debounced too), changes nothing but its
    ///   priority (`AddStatus::AlreadyWaiting`, or `Waiting` when its priority was raised); a
    ///   rate-limited add keeps the earlier deadline as always;
    /// - a key re-added while it is processed, whose lease then ends in a rate-limited retry,
    ///   is not queued again at once: the retry carries the re-add;
    /// - a key that is also queued or processing is added as usual.
    ///
    /// With [outage detection](Builder::outage_detection) as well, parked keys are held by the
    /// detector; this option then covers the keys in backoff outside it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_core::{AddStatus, ManualClock, Outcome, WorkQueue};
    ///
    /// let clock = ManualClock::new();
    /// let queue: WorkQueue<&str> = WorkQueue::builder()
    ///     .clock(clock.clone())
    ///     .keep_backoff(true)
    ///     .build();
    /// queue.add("flaky");
    /// queue.try_get().unwrap().finish(Outcome::retry()); // waits 5 ms (the default limiter's first delay)
    /// assert_eq!(queue.add("flaky"), AddStatus::AlreadyWaiting); // an event: still waiting
    /// assert!(queue.try_get().is_none());
    /// clock.advance(Duration::from_millis(5));
    /// assert!(queue.try_get().is_some());
    /// ```
    pub fn keep_backoff(mut self, enabled: bool) -> Self {
        self.config.keep_backoff = enabled;
        self
    }

    /// Aging: a key that has been ready for strictly longer than `max_wait` is served before every
    /// key that has not, oldest first, whatever its priority. Default: off.
    ///
    /// With priorities, a steady stream of normal-priority work can keep low-priority keys (an
    /// initial list at [`LOW_PRIORITY`](crate::LOW_PRIORITY)) waiting forever
    /// (controller-runtime #3496, which has no aging). With aging, every key is served within
    /// `max_wait` plus the time to serve the overdue keys ahead of it. At full load the queue
    /// serves overdue keys oldest first, so priorities stop mattering until it catches up.
    ///
    /// It is off by default because it is a choice about order, not a fix: it makes every add
    /// and every get read the time and keeps about 20 bytes per ready key (up to twice that
    /// between prunes of its age order), and without priorities it changes nothing (FIFO order
    /// is age order). Turn it on whenever you use priorities and every key must eventually run;
    /// a `max_wait` of a few times your normal queue latency is a good start.
    ///
    /// Aging reads the clock's [`recent`](crate::Clock::recent) time, not `now`: on the
    /// [`SystemClock`](crate::SystemClock) an atomic load at most about 4 ms old,
    /// refreshed by one thread per process while queues read it (it parks when they stop), where
    /// reading the CPU's counter at each add and get would cost aging most of its price. So
    /// "longer than `max_wait`" holds to about 4 ms. Virtual clocks are exact. A named
    /// queue, which times every operation for its metrics, reads `now` anyway.
    pub fn max_ready_wait(mut self, max_wait: Duration) -> Self {
        self.config.max_ready_wait = Some(max_wait);
        self
    }

    /// Fairness: within a priority, keys are served round-robin across the groups `group`
    /// returns (the namespace of `"ns/name"`, say), FIFO within a group; a group that gains its
    /// first ready key joins the round at its end, and a group with no ready key costs nothing.
    /// One busy tenant then cannot starve the others: with 10,000 keys of one namespace queued,
    /// a key of another namespace is handed out within two gets. Default: off (one FIFO per
    /// priority, as client-go).
    ///
    /// With [aging](Builder::max_ready_wait), overdue keys are served round-robin across groups
    /// too (oldest first within a group), so overload does not turn fairness back into one FIFO.
    ///
    /// `group` is user code: it runs on every add, outside the queue's lock, and a panic there
    /// leaves the queue as it was. Groups are told apart by a 64-bit hash of what it returns.
    ///
    /// ```
    /// use workqueue_core::{ManualClock, WorkQueue};
    ///
    /// let queue: WorkQueue<String> = WorkQueue::builder()
    ///     .clock(ManualClock::new())
    ///     .fairness(|key: &String| key.split('/').next().unwrap_or("").to_owned())
    ///     .build();
    /// for i in 0..100 {
    ///     queue.add(format!("noisy/{i}"));
    /// }
    /// queue.add("quiet/a".to_string());
    /// let first: Vec<String> = (0..2).map(|_| queue.try_get().unwrap().clone()).collect();
    /// assert_eq!(first, ["noisy/0", "quiet/a"]);
    /// ```
    pub fn fairness<G: Hash>(mut self, group: impl Fn(&T) -> G + Send + Sync + 'static) -> Self {
        // Randomly seeded, as the key index: tenants choose their names.
        let hasher = foldhash::fast::RandomState::default();
        self.config.group = Some(Arc::new(move |key: &T| {
            std::hash::BuildHasher::hash_one(&hasher, group(key))
        }));
        self
    }

    /// Whether a named queue joins the process-wide thread that refreshes the "unfinished work"
    /// gauges and sends batched metrics every 500 ms (see [`metrics`](crate::metrics)). Default:
    /// `true`. With `false`, no thread is started for this queue: call the queue's
    /// `refresh_metrics()` yourself (from your own timer), or its gauges go stale and its
    /// metrics lag up to 64 operations.
    pub fn metrics_refresh_thread(mut self, enabled: bool) -> Self {
        self.config.refresh_thread = enabled;
        self
    }

    /// Outage-aware retries: an outage detector sees every finished key and, when failures are
    /// widespread (an API server that is down), **parks** the failing keys instead of retrying
    /// each on its own backoff, lets one **probe** through at a time, and once a probe succeeds
    /// **releases** every parked key, in the order they failed, paced by the rate limiter's
    /// bucket ([`RateLimiter::pace`]) after forgetting their backoff. Off by default.
    ///
    /// What the detector sees, by the [`Outcome`](crate::Outcome) a lease finishes with:
    /// `forget()` and `requeue_after(d)` are successes; `retry()` and `retry_after(d)` (and a
    /// lease dropped while panicking) are failures; `done()` says nothing; an outcome with a signal
    /// ([`Outcome::with_signal`](crate::Outcome::with_signal)) says what it is given (a per-object
    /// error: `Signal::Ignored`). The parameters and their
    /// defaults are [`OutageConfig`]'s; the rules are in `workqueue_ratelimit`'s `outage`
    /// module and the state's (parked keys are waiting entries at a deadline never reached).
    ///
    /// Semantics pinned by tests:
    /// - an add of a parked key (with or without delay, rate-limited, debounced) leaves it
    ///   parked: no run, no failure counted, no backoff moved (the release runs every parked
    ///   key); it returns `AddStatus::Parked`, and a higher priority is kept for the release.
    ///   The probe is the only way a parked key runs before the release, so recovery waits for
    ///   the next probe (at most the probe interval's cap). An add with
    ///   [`AddOptions::bypass_parking`](crate::AddOptions::bypass_parking) runs a parked key at
    ///   once, as an extra probe;
    /// - a run that fails while the detector is open is parked if anything would run the key
    ///   again: its outcome's re-add, a re-add made during the run (its own write, say: the key
    ///   is not queued again at once), or a waiting entry (its backoff, a reminder, a
    ///   debounce), all carried by the parked entry;
    /// - a failure with nothing else pending whose outcome re-adds nothing (a give-up:
    ///   `forget`, `done`) is not parked;
    /// - `shut_down` drops parked keys as it drops every waiting key, and drains do not wait for
    ///   them;
    /// - a probe that panics is a failure (a lease dropped while panicking retries).
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_core::ratelimit::OutageConfig;
    /// use workqueue_core::{ManualClock, Outcome, WorkQueue};
    ///
    /// let clock = ManualClock::new();
    /// let queue: WorkQueue<u32> = WorkQueue::builder()
    ///     .clock(clock.clone())
    ///     .outage_detection(OutageConfig::default())
    ///     .build();
    /// queue.add_batch(0..10);
    /// // The API is down: every key fails; after five first failures the detector opens and
    /// // the failing keys are parked.
    /// while let Some(lease) = queue.try_get() {
    ///     lease.finish(Outcome::retry());
    /// }
    /// clock.advance(Duration::from_millis(100)); // the first five retry on their backoff ...
    /// while let Some(lease) = queue.try_get() {
    ///     lease.finish(Outcome::retry()); // ... and fail again: parked
    /// }
    /// assert!(queue.is_outage_open());
    /// assert_eq!(queue.parked_len(), 9); // and one waits to be the first probe
    /// // One probe after a second; the API is back: it succeeds, and every key is released.
    /// clock.advance(Duration::from_secs(1));
    /// queue.try_get().expect("the probe").finish(Outcome::forget());
    /// assert!(!queue.is_outage_open());
    /// assert_eq!(queue.parked_len(), 0);
    /// assert_eq!(queue.len(), 9); // released within the bucket's burst
    /// ```
    pub fn outage_detection(mut self, config: OutageConfig) -> Self {
        self.config.outage = Some(config);
        self
    }

    /// Calls `hook` after each change of the outage detector (opened, a probe failed, closed
    /// with how long it lasted and how many keys were released), outside the queue's lock. A
    /// panic in it propagates from the lease's finish after the key is finished, as a rate
    /// limiter's does.
    pub fn on_outage_event(mut self, hook: impl Fn(&OutageEvent) + Send + Sync + 'static) -> Self {
        self.config.outage_hook = Some(Arc::new(hook));
        self
    }

    /// Whether the queue gives memory back after a burst. Default: `true`.
    ///
    /// An initial list, or an outage in which every key fails, grows the queue's buffers to the
    /// peak. With this on, once the live keys fall below half of what the buffers were last
    /// sized for and stay near that size for about half as many `get`s as there are keys, a
    /// `get` compacts the queue to the live size (at most once per halving; a key being
    /// processed never moves; a drain to empty never compacts, since the empty queue frees its
    /// buffers anyway). Off keeps the peak until the queue is empty, for those who expect the
    /// next burst soon and prefer not to rebuild.
    pub fn shrink_memory(mut self, enabled: bool) -> Self {
        self.config.shrink = enabled;
        self
    }

    /// The hasher for keys. The default is fast and randomly seeded; use
    /// `std::hash::RandomState` (SipHash) for queues fed with keys chosen by untrusted tenants.
    pub fn hasher<S2>(self, hasher: S2) -> Builder<T, S2, D> {
        let c = self.config;
        Builder {
            driver: PhantomData,
            config: CoreConfig {
                name: c.name,
                limiter: c.limiter,
                clock: c.clock,
                hasher,
                capacity: c.capacity,
                drain_includes_queued: c.drain_includes_queued,
                skip_limiter_when_pending: c.skip_limiter_when_pending,
                keep_backoff: c.keep_backoff,
                max_ready_wait: c.max_ready_wait,
                group: c.group,
                refresh_thread: c.refresh_thread,
                outage: c.outage,
                outage_hook: c.outage_hook,
                shrink: c.shrink,
            },
        }
    }
}

impl<T, S, D: BuildQueue<T, S>> Builder<T, S, D> {
    /// Builds the queue: the blocking [`WorkQueue`] from this crate's `WorkQueue::builder()`, the
    /// async one from `workqueue_tokio::WorkQueue::builder()`.
    pub fn build(self) -> D::Queue {
        D::build(self.config)
    }
}

impl<T, S, D> fmt::Debug for Builder<T, S, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Builder").field(&self.config).finish()
    }
}
