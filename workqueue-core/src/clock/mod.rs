//! Clocks: where a queue reads `now`, and how its waiters learn that time moved.
//!
//! The state machine never reads a clock; the blocking queue reads the one it is given.
//! [`SystemClock`] is real monotonic time. [`ManualClock`] is virtual time that moves only when a
//! test advances it; advancing it wakes the queues that wait on it, so tests of delays never sleep.

mod manual;
mod recent;
mod system;

use std::fmt;
use std::sync::Weak;

pub use manual::{ManualClock, registered_wakers};
pub use system::SystemClock;
pub use workqueue_ratelimit::Instant;

/// A source of [`Instant`]s for a queue.
///
/// A real clock moves on its own: the queue waits for a deadline with a timed wait. A virtual
/// clock ([`Clock::is_virtual`]) moves only when told to: the queue waits without a timeout and
/// relies on the clock to call every [`ClockWaker`] registered with it after each move.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time on this clock's timeline. Never goes backwards.
    fn now(&self) -> Instant;

    /// The time as of a moment ago, where reading [`now`](Clock::now) would cost more than the
    /// precision is worth. Queues read it for [aging](crate::Builder::max_ready_wait), which
    /// otherwise costs a clock read at every add and every get.
    ///
    /// Never ahead of `now`; two readings may step back by up to their age. [`SystemClock`]'s
    /// is at most about 4 ms old (one thread per process refreshes it while it is
    /// read). The default is `now()`: exact, which is what virtual clocks want.
    ///
    /// ```
    /// use workqueue_core::{Clock, SystemClock};
    ///
    /// let clock = SystemClock;
    /// let recent = clock.recent();
    /// assert!(recent <= clock.now());
    /// ```
    fn recent(&self) -> Instant {
        self.now()
    }

    /// Whether time moves only when told to, and so must wake waiters itself.
    fn is_virtual(&self) -> bool {
        false
    }

    /// Registers a waiter to wake after each move of a virtual clock. Real clocks ignore it.
    ///
    /// Clocks hold wakers weakly: a dropped queue is forgotten at the next move.
    fn register(&self, waker: Weak<dyn ClockWaker>) {
        let _ = waker;
    }
}

/// Something that waits on a [`Clock`] and must re-check its deadlines when virtual time moves.
pub trait ClockWaker: Send + Sync {
    /// Time moved: re-check deadlines. Called after the clock's new time is visible.
    fn wake(&self);
}
