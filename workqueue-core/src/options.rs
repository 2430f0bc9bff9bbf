//! How an add asks for a key: its priority, a delay, and whether the rate limiter decides.

use std::time::Duration;

/// The conventional priority of keys from an initial list or a resync: they are served after
/// every key added at the default priority 0 (controller-runtime's `handler.LowPriority`).
pub const LOW_PRIORITY: i32 = -100;

/// Options of one add (controller-runtime's `AddOpts`): see `add_with` on the queues.
///
/// The default is a plain `add`: priority 0, no delay, no rate limiter.
///
/// ```
/// use std::time::Duration;
/// use workqueue_core::{AddOptions, LOW_PRIORITY, ManualClock, WorkQueue};
///
/// let queue: WorkQueue<&str> = WorkQueue::builder().clock(ManualClock::new()).build();
/// queue.add_with("initial-list/a", AddOptions { priority: LOW_PRIORITY, ..Default::default() });
/// queue.add("changed/b");
/// let lease = queue.try_get().unwrap();
/// assert_eq!((*lease, lease.priority()), ("changed/b", 0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddOptions {
    /// Higher priorities are served first; 0 is the default and [`LOW_PRIORITY`] the convention
    /// for initial lists and resyncs.
    pub priority: i32,
    /// How long the key waits before it is ready; zero means now.
    pub after: Duration,
    /// Ask the rate limiter (recording a failure): the key waits the limiter's delay, or the
    /// shorter of it and `after` when `after` is not zero.
    pub rate_limited: bool,
}

impl AddOptions {
    /// Options with this priority, no delay and no rate limiter.
    pub const fn priority(priority: i32) -> Self {
        AddOptions {
            priority,
            after: Duration::ZERO,
            rate_limited: false,
        }
    }

    /// The delay to use given the rate limiter's answer (`None` when it was not asked): the
    /// limiter's delay, or the shorter of it and `after` when `after` is not zero
    /// (controller-runtime's rule).
    pub fn delay(&self, limiter: Option<Duration>) -> Duration {
        match limiter {
            Some(d) if self.after.is_zero() => d,
            Some(d) => d.min(self.after),
            None => self.after,
        }
    }
}
