use std::sync::OnceLock;

use super::{Clock, Instant};

/// Real monotonic time (`std::time::Instant`), on a timeline shared by the whole process.
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

fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl SystemClock {
    /// Converts a `std::time::Instant` to this clock's timeline (saturating at the epoch).
    pub fn instant_from_std(t: std::time::Instant) -> Instant {
        Instant::from_duration(t.saturating_duration_since(epoch()))
    }

    /// Converts an instant on this clock's timeline back to a `std::time::Instant`, or `None` for
    /// an instant beyond what `std::time::Instant` can represent.
    pub fn instant_to_std(t: Instant) -> Option<std::time::Instant> {
        epoch().checked_add(t.as_duration())
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Instant {
        Self::instant_from_std(std::time::Instant::now())
    }
}
