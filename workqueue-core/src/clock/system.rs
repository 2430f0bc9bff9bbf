use std::sync::OnceLock;

use super::{Clock, Instant};

/// Real monotonic time, on a timeline shared by the whole process.
///
/// Reads the CPU's timestamp counter through `quanta` where it is reliable (invariant and
/// synchronised across cores; `quanta` falls back to the OS monotonic clock otherwise): a few
/// nanoseconds instead of the ~20 ns of `std::time::Instant::now()`, which matters because the
/// queue and the token bucket read the clock on hot paths.
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
    epoch: quanta::Instant,
}

fn timeline() -> &'static Timeline {
    static TIMELINE: OnceLock<Timeline> = OnceLock::new();
    TIMELINE.get_or_init(|| {
        let clock = quanta::Clock::new();
        let epoch = clock.now();
        Timeline { clock, epoch }
    })
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Instant {
        let t = timeline();
        Instant::from_duration(t.clock.now().saturating_duration_since(t.epoch))
    }
}
