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
}

impl AddOptions {
    /// The options of a plain `add`: priority 0, no delay, no rate limiter.
    pub const fn new() -> Self {
        AddOptions {
            priority: 0,
            after: Duration::ZERO,
            rate_limited: false,
        }
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
    pub const fn rate_limited(mut self, enabled: bool) -> Self {
        self.rate_limited = enabled;
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
