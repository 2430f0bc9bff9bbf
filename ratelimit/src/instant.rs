//! The family's instant type: nanoseconds on one clock's timeline.

use std::fmt;
use std::time::Duration;

/// A point in time, in nanoseconds since the epoch of the clock that produced it.
///
/// Every crate of the family uses this one type: limiters receive it, the queue state machine keys
/// its deadlines on it, and clocks produce it. It is a plain `u64`, so it is `Copy`, eight bytes
/// wide, and all arithmetic on it saturates: nothing here can panic or wrap.
///
/// [`Instant::NEVER`] (`u64::MAX` nanoseconds, about 584 years after the epoch) stands for "never":
/// a deadline that is never reached.
///
/// Instants are only comparable when they come from the same clock (or from clocks that share an
/// epoch, as every `SystemClock` of a process does).
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::Instant;
///
/// let t = Instant::from_nanos(1_000);
/// assert_eq!(t.saturating_add(Duration::from_nanos(500)).as_nanos(), 1_500);
/// assert_eq!(t.saturating_add(Duration::MAX), Instant::NEVER);
/// assert_eq!(t.saturating_duration_since(Instant::from_nanos(2_000)), Duration::ZERO);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch of the clock: zero nanoseconds.
    pub const ZERO: Instant = Instant(0);

    /// The instant that is never reached.
    pub const NEVER: Instant = Instant(u64::MAX);

    /// The instant `nanos` nanoseconds after the epoch.
    #[inline]
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// The instant `since_epoch` after the epoch, saturating at [`Instant::NEVER`].
    #[inline]
    pub const fn from_duration(since_epoch: Duration) -> Instant {
        Instant(duration_to_nanos(since_epoch))
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time since the epoch.
    #[inline]
    pub const fn as_duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// Whether this is [`Instant::NEVER`].
    #[inline]
    pub const fn is_never(self) -> bool {
        self.0 == u64::MAX
    }

    /// `self + d`, saturating at [`Instant::NEVER`].
    #[inline]
    pub const fn saturating_add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_to_nanos(d)))
    }

    /// `self - d`, saturating at [`Instant::ZERO`].
    #[inline]
    pub const fn saturating_sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(duration_to_nanos(d)))
    }

    /// `self - earlier`, or zero when `earlier` is later than `self`.
    #[inline]
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (about 584 years).
#[inline]
pub(crate) const fn duration_to_nanos(d: Duration) -> u64 {
    let n = d.as_nanos();
    if n > u64::MAX as u128 {
        u64::MAX
    } else {
        n as u64
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_never() {
            f.write_str("Instant(never)")
        } else {
            write!(f, "Instant({:?})", self.as_duration())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(
            Instant::NEVER.saturating_add(Duration::from_nanos(1)),
            Instant::NEVER
        );
        assert_eq!(
            Instant::ZERO.saturating_sub(Duration::from_secs(1)),
            Instant::ZERO
        );
        assert_eq!(duration_to_nanos(Duration::MAX), u64::MAX);
        assert_eq!(
            Instant::from_duration(Duration::from_millis(3)).as_nanos(),
            3_000_000
        );
    }
}
