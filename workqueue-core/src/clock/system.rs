use std::sync::OnceLock;

use super::{Clock, Instant};

/// Real monotonic time, on a timeline shared by the whole process.
///
/// Reads [`std::time::Instant`], the clock that `std`, tokio and their users measure time on, so
/// a key added with a delay `d` is never handed out before `d` has passed on that clock (a clock
/// of its own, however cheaper to read, would disagree with it on the length of a delay by its
/// calibration error and by the operating system's rate corrections, and hand keys out early).
///
/// The epoch is the first time any `SystemClock` is read, so instants from different
/// `SystemClock`s compare, and a limiter can be shared between queues.
///
/// ```
/// use workqueue_core::{Clock, SystemClock};
///
/// let clock = SystemClock;
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// The process's epoch. Invariant: `now_nanos()` is the whole nanoseconds of `std` time since
/// it, so an instant read after a `std::time::Instant` `t` is at least `t`'s time since the
/// epoch (the truncation loses nothing where `std`'s instants are whole nanoseconds apart, as on
/// Linux).
fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// [`SystemClock::now`] in nanoseconds, for the ticker of [`Clock::recent`].
fn now_nanos() -> u64 {
    // 2^64 ns is 584 years of uptime.
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::from_nanos(now_nanos())
    }

    /// One atomic load while the process's ticker runs (it stores the time every 4 ms);
    /// where it is parked, not started or cannot start, a read of [`now`](Clock::now) that
    /// starts or wakes it.
    #[inline]
    fn recent(&self) -> Instant {
        #[cfg(not(all(test, workqueue_loom)))]
        if let Some(nanos) = super::recent::RECENT.get() {
            return Instant::from_nanos(nanos);
        }
        let now = self.now();
        #[cfg(not(all(test, workqueue_loom)))]
        super::recent::wake(now_nanos);
        now
    }
}
