//! How an add asks for a key: its priority, a delay, and whether the rate limiter decides.

use std::time::Duration;

/// The conventional priority of keys from an initial list or a resync: they are served after
/// every key added at the default priority 0 (controller-runtime's `handler.LowPriority`).
pub const LOW_PRIORITY: i32 = -100;

/// Options of one add (controller-runtime's `AddOpts`): see `add_with` on the queues.
///
/// Built from [`AddOptions::new`] (a plain `add`: priority 0, no delay, no rate limiter) with
/// chained setters; every one is `const`, so options can be constants.
///
/// ```
/// use std::time::Duration;
/// use workqueue_core::{AddOptions, LOW_PRIORITY, ManualClock, WorkQueue};
///
/// const INITIAL_LIST: AddOptions = AddOptions::new().priority(LOW_PRIORITY);
///
/// let queue: WorkQueue<&str> = WorkQueue::builder().clock(ManualClock::new()).build();
/// queue.add_with("initial-list/a", INITIAL_LIST);
/// queue.add_with("later/c", AddOptions::new().after(Duration::from_secs(5)));
/// queue.add("changed/b");
/// let lease = queue.try_get().unwrap();
/// assert_eq!((*lease, lease.priority()), ("changed/b", 0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AddOptions {
    pub(crate) priority: i32,
    pub(crate) after: Duration,
    pub(crate) rate_limited: bool,
    pub(crate) debounced: bool,
    pub(crate) bypass_parking: bool,
    /// What a wait after `after` is, as the state marks its entry (derived from `rate_limited`
    /// and `debounced`, kept here so that a delayed add reads one byte): [`WAIT_REMINDER`],
    /// [`WAIT_RETRY`] or [`WAIT_DEBOUNCE`].
    pub(crate) wait: u8,
}

/// [`AddOptions::wait`]: a plain delay, a reminder.
pub(crate) const WAIT_REMINDER: u8 = 0;
/// [`AddOptions::wait`]: the rate limiter's delay (`rate_limited`, whatever `debounced` says).
pub(crate) const WAIT_RETRY: u8 = 1;
/// [`AddOptions::wait`]: a debounce.
pub(crate) const WAIT_DEBOUNCE: u8 = 2;

impl AddOptions {
    /// The options of a plain `add`: priority 0, no delay, no rate limiter.
    pub const fn new() -> Self {
        AddOptions {
            priority: 0,
            after: Duration::ZERO,
            rate_limited: false,
            debounced: false,
            bypass_parking: false,
            wait: WAIT_REMINDER,
        }
    }

    /// [`AddOptions::wait`] for the flags as they are now.
    const fn with_wait(mut self) -> Self {
        self.wait = match (self.rate_limited, self.debounced) {
            (true, _) => WAIT_RETRY,
            (false, true) => WAIT_DEBOUNCE,
            (false, false) => WAIT_REMINDER,
        };
        self
    }

    /// Higher priorities are served first; 0 is the default and [`LOW_PRIORITY`] the convention
    /// for initial lists and resyncs.
    pub const fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// How long the key waits before it is ready; zero (the default) means now.
    pub const fn after(mut self, delay: Duration) -> Self {
        self.after = delay;
        self
    }

    /// Whether the rate limiter is asked (recording a failure): the key then waits the limiter's
    /// delay, or the shorter of it and [`after`](AddOptions::after) when that is not zero
    /// (controller-runtime's rule). Default: `false`.
    ///
    /// The wait is a rate-limited retry: with
    /// [`Builder::keep_backoff`](crate::Builder::keep_backoff), other adds leave it waiting
    /// until it ends.
    pub const fn rate_limited(mut self, enabled: bool) -> Self {
        self.rate_limited = enabled;
        self.with_wait()
    }

    /// Whether [`after`](AddOptions::after) is a debounce (a trailing edge) rather than a delay:
    /// a debounced add of a key that already waits moves it to this add's time plus `after`,
    /// later or earlier, so a burst of debounced adds, each less than `after` apart, runs the
    /// key once, `after` the last (kube-runtime's scheduler). Default: `false`.
    ///
    /// In detail, for a debounced add with a delay `d` (with no delay, or with
    /// [`rate_limited`](AddOptions::rate_limited), it is an ordinary add):
    /// - a key that is queued stays queued: nothing changes but its priority, raised if `d`'s
    ///   add asks for a higher one;
    /// - a key that is neither queued nor waiting waits `d` (a key being processed too: the
    ///   wait is a reminder that runs it again, as a delayed add's);
    /// - a key that waits, for whatever reason (a delayed add, a retry, a debounce), waits until
    ///   now + `d` instead. The debounced add asks for the key to run now, so it is the earlier
    ///   of the two requests and wins, as a new trigger replaces a pending entry in
    ///   kube-runtime's scheduler: a wait that would have ended sooner is pushed to now + `d`
    ///   too. (With [`Builder::keep_backoff`](crate::Builder::keep_backoff), a rate-limited
    ///   retry is kept instead; a parked key stays parked.)
    ///
    /// The highest priority asked for is kept, as for every add.
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_core::{AddOptions, ManualClock, WorkQueue};
    ///
    /// let clock = ManualClock::new();
    /// let queue: WorkQueue<&str> = WorkQueue::builder().clock(clock.clone()).build();
    /// let debounce = AddOptions::new().after(Duration::from_secs(3)).debounced(true);
    /// for _ in 0..4 {
    ///     queue.add_with("cm/a", debounce); // a change every second
    ///     clock.advance(Duration::from_secs(1));
    /// }
    /// clock.advance(Duration::from_secs(1)); // 2 s after the last change: still waiting
    /// assert!(queue.try_get().is_none());
    /// clock.advance(Duration::from_secs(1)); // 3 s after it: once
    /// assert!(queue.try_get().is_some());
    /// ```
    pub const fn debounced(mut self, enabled: bool) -> Self {
        self.debounced = enabled;
        self.with_wait()
    }

    /// Whether this add ignores the outage detector's parking (see
    /// [`Builder::outage_detection`](crate::Builder::outage_detection)): a parked key is then
    /// added as without detection. Without a delay it is queued now and its parked entry stays,
    /// so its run counts as a probe (a success closes the detector and releases every parked
    /// key; a failure parks it again); with a delay, the earlier deadline wins as for any
    /// waiting key, and the key is no longer parked once its entry is moved. For a key that
    /// must run during an outage (an object just fixed by hand); every other add of a parked key
    /// leaves it parked until the release. Default: `false`.
    pub const fn bypass_parking(mut self, enabled: bool) -> Self {
        self.bypass_parking = enabled;
        self
    }

    /// The delay to use given the rate limiter's answer (`None` when it was not asked): the
    /// limiter's delay, or the shorter of it and `after` when `after` is not zero.
    #[inline]
    pub(crate) fn delay(&self, limiter: Option<Duration>) -> Duration {
        match limiter {
            Some(d) if self.after.is_zero() => d,
            Some(d) => d.min(self.after),
            None => self.after,
        }
    }
}
