//! Each replica's own clock: what the protocol reads to judge expiry and its own validity.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;

/// A reading of one replica's clock: the time since that clock's own origin.
///
/// Only differences between readings of one clock mean anything; two replicas' readings are never
/// compared (that is the point of judging expiry by the observer's clock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalInstant(Duration);

impl LocalInstant {
    /// The reading `since_origin` after the clock's origin.
    pub const fn from_duration(since_origin: Duration) -> Self {
        LocalInstant(since_origin)
    }

    /// The time since the clock's origin.
    pub const fn as_duration(self) -> Duration {
        self.0
    }

    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: LocalInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for LocalInstant {
    type Output = LocalInstant;

    fn add(self, rhs: Duration) -> LocalInstant {
        LocalInstant(self.0 + rhs)
    }
}

impl Sub<LocalInstant> for LocalInstant {
    type Output = Duration;

    /// Saturating: zero if `rhs` is later.
    fn sub(self, rhs: LocalInstant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

/// The clock one replica judges Leases by.
///
/// The protocol reads [`now`](LeaseClock::now) when it sends a renewal (the start its validity
/// counts from) and as each watch event or list arrives (the time it observed each record), and
/// converts the instants it must act at to tokio's clock with
/// [`tokio_instant`](LeaseClock::tokio_instant), on which it sleeps and on which it reports
/// validity to the controller.
///
/// Safety needs only that the clocks of any two replicas run at nearly the same rate (see the
/// [module documentation](crate::lease)); their offsets do not matter.
pub trait LeaseClock: fmt::Debug + Send + Sync + 'static {
    /// This clock's reading now. Monotonic: never earlier than a previous reading.
    fn now(&self) -> LocalInstant;

    /// The tokio instant at which this clock reads `at` (now or earlier for a past reading).
    /// It must not be later than that instant: the protocol reports validity that ends at it.
    fn tokio_instant(&self, at: LocalInstant) -> Instant;

    /// The wall time to write into a Lease's `renewTime` and `acquireTime`. Informational:
    /// no replica reads these fields to judge expiry.
    fn wall(&self) -> Timestamp {
        system_wall()
    }
}

impl<C: LeaseClock + ?Sized> LeaseClock for Arc<C> {
    fn now(&self) -> LocalInstant {
        (**self).now()
    }

    fn tokio_instant(&self, at: LocalInstant) -> Instant {
        (**self).tokio_instant(at)
    }

    fn wall(&self) -> Timestamp {
        (**self).wall()
    }
}

fn system_wall() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let since = SignedDuration::try_from(since).unwrap_or(SignedDuration::ZERO);
    Timestamp::from_duration(since).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Tokio's clock (monotonic; paused in tests with tokio's `test-util`), with the system's wall
/// clock for the records. The default.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock whose origin is now, on tokio's clock.
    pub fn new() -> Self {
        TokioClock {
            origin: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseClock for TokioClock {
    fn now(&self) -> LocalInstant {
        LocalInstant(Instant::now().saturating_duration_since(self.origin))
    }

    fn tokio_instant(&self, at: LocalInstant) -> Instant {
        self.origin + at.0
    }
}

/// A clock that is off from tokio's by an offset and runs at its own rate: one replica's clock
/// in a test where every replica shares tokio's (paused) timeline.
///
/// It reads `2025-01-01T00:00:00Z + offset` when made and then advances `rate` seconds for each
/// second of tokio's clock; [`wall`](LeaseClock::wall) is that same reading, so the `renewTime`s
/// a skewed replica writes are off by its offset.
#[derive(Clone, Copy, Debug)]
pub struct SkewedClock {
    origin: Instant,
    start: Duration,
    rate: f64,
}

/// 2025-01-01T00:00:00Z in seconds since the Unix epoch.
const SKEWED_BASE_SECS: u64 = 1_735_689_600;

impl SkewedClock {
    /// A clock `offset` away from 2025-01-01 now (tokio's clock) that runs at `rate` (for example
    /// `1.01`: one percent fast).
    ///
    /// # Panics
    ///
    /// If `rate` is not positive and finite, or `offset` is more than 2025 years back.
    pub fn new(offset: SignedDuration, rate: f64) -> Self {
        assert!(
            rate.is_finite() && rate > 0.0,
            "a clock rate must be positive and finite, not {rate}"
        );
        let base = SignedDuration::from_secs(SKEWED_BASE_SECS as i64);
        let start = Duration::try_from(base + offset).expect("the offset reaches before 1970");
        SkewedClock {
            origin: Instant::now(),
            start,
            rate,
        }
    }

    /// Its rate relative to tokio's clock.
    pub fn rate(&self) -> f64 {
        self.rate
    }
}

impl LeaseClock for SkewedClock {
    fn now(&self) -> LocalInstant {
        let real = Instant::now().saturating_duration_since(self.origin);
        // Nanoseconds in an f64 are exact to about 100 days of elapsed time.
        let local = (real.as_nanos() as f64 * self.rate).floor() as u64;
        LocalInstant(self.start + Duration::from_nanos(local))
    }

    fn tokio_instant(&self, at: LocalInstant) -> Instant {
        let local = at.0.saturating_sub(self.start);
        // Rounded down: the tokio instant is never after the one at which this clock reads `at`.
        let real = (local.as_nanos() as f64 / self.rate).floor() as u64;
        self.origin + Duration::from_nanos(real)
    }

    fn wall(&self) -> Timestamp {
        let now = SignedDuration::try_from(self.now().0).unwrap_or(SignedDuration::ZERO);
        Timestamp::from_duration(now).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_skewed_clock_runs_at_its_rate_and_converts_back_no_later() {
        let fast = SkewedClock::new(SignedDuration::from_secs(-300), 1.01);
        let t0 = fast.now();
        let wall0 = fast.wall();
        assert_eq!(wall0.as_second(), SKEWED_BASE_SECS as i64 - 300);
        tokio::time::advance(Duration::from_secs(100)).await;
        assert_eq!(fast.now() - t0, Duration::from_secs(101));
        let at = t0 + Duration::from_secs(202);
        let when = fast.tokio_instant(at);
        assert!(fast.now() < at);
        tokio::time::sleep_until(when).await;
        assert!(fast.now() <= at);
        assert!(at - fast.now() < Duration::from_micros(1));
        // A past reading converts to a past instant.
        assert!(fast.tokio_instant(t0) <= Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn tokios_clock_is_tokio_time() {
        let clock = TokioClock::new();
        let t0 = clock.now();
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now() - t0, Duration::from_millis(1500));
        assert_eq!(clock.tokio_instant(clock.now()), Instant::now());
    }
}
