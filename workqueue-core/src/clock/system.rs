use std::sync::OnceLock;

use super::{Clock, Instant};

/// Real monotonic time, on a timeline shared by the whole process.
///
/// Reads the CPU's timestamp counter through `quanta` where it is reliable (invariant and
/// synchronised across cores; `quanta` falls back to the OS monotonic clock otherwise), several
/// times cheaper than `std::time::Instant::now()`, which matters because the queue and the token
/// bucket read the clock on hot paths.
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

struct Timeline {
    clock: quanta::Clock,
    /// The raw counter at the epoch. Readings stay raw until one subtraction and one scaling turn
    /// them into nanoseconds, with no `Duration` in between: a round trip through `Duration`
    /// costs as much as the counter read itself.
    epoch: u64,
}

fn timeline() -> &'static Timeline {
    static TIMELINE: OnceLock<Timeline> = OnceLock::new();
    TIMELINE.get_or_init(|| {
        let clock = quanta::Clock::new();
        let epoch = clock.raw();
        Timeline { clock, epoch }
    })
}

/// [`SystemClock::now`] in nanoseconds, for the ticker of [`Clock::recent`].
fn now_nanos() -> u64 {
    let t = timeline();
    t.clock.delta_as_nanos(t.epoch, t.clock.raw())
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
