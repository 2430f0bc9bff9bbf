//! One token bucket for all keys, with reservation semantics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{Instant, InvalidLimiter, RateLimiter};

const NANOS_PER_SEC: f64 = 1e9;

/// Bucket capacities are kept below 2^62 ns (146 years of refill), so that the theoretical
/// arrival time, an absolute `u64` instant, has room for a full bucket and centuries of debt
/// before it saturates; once it does, delays stay near [`TokenBucket::FOREVER`].
const MAX_TOLERANCE: u64 = 1 << 62;

/// A token bucket shared by all keys, with reservation semantics: every call takes a token.
///
/// This is client-go's `BucketRateLimiter`, i.e. `rate.Limiter.Reserve().Delay()` from Go's
/// `x/time/rate`: the bucket holds up to `burst` tokens, refills at `qps` tokens per second and
/// starts full. Each [`when`](RateLimiter::when) takes one token, going into debt when the bucket
/// is empty, and returns how long until that token is available. So the first `burst` calls return
/// zero, and call `burst + k` within a short window returns about `k / qps` seconds: delays grow
/// linearly with the backlog. The key is ignored; [`forget`](RateLimiter::forget) does nothing and
/// [`num_requeues`](RateLimiter::num_requeues) is always 0.
///
/// A token is charged even when the queue then de-duplicates the add (the key was already waiting
/// with an earlier deadline), as in client-go (controller-runtime #1594).
///
/// # Special rates
///
/// - `qps = f64::INFINITY`: no limit, every delay is zero (any `burst`, including 0).
/// - `qps = 0`: the first `burst` calls return zero, every later one [`TokenBucket::FOREVER`].
/// - Rates above 2·10⁹/s round to an interval of 0 ns between tokens and are unlimited.
/// - Rates so low that one token takes 2^62 ns (146 years) or more never refill, as with 0, and a
///   bucket is at most 2^62 ns of refill deep: larger bursts are cut to that.
///
/// # Time
///
/// The state is one `AtomicU64`, the theoretical arrival time of GCRA (the instant the next token
/// is due, counting the debt), updated by a compare-and-swap: `when` is lock-free, one CAS when
/// uncontended. A `now` earlier than one already seen cannot refill the bucket (the arrival time
/// never moves back), and its delay is measured from that same `now`, so `now + delay` is exactly
/// when the token is due.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{Instant, RateLimiter, TokenBucket};
///
/// let bucket = TokenBucket::new(10.0, 2)?;
/// let t0 = Instant::ZERO;
/// let delays: Vec<_> = (0..4).map(|_| bucket.when("any key", t0).as_millis()).collect();
/// assert_eq!(delays, [0, 0, 100, 200]);
///
/// // By t0 + 500 ms the last token taken (due at t0 + 200 ms) is paid off and the bucket is
/// // full again.
/// let t1 = t0.saturating_add(Duration::from_millis(500));
/// assert_eq!(bucket.when("any key", t1), Duration::ZERO);
/// # Ok::<(), workqueue_ratelimit::InvalidLimiter>(())
/// ```
//
// Invariants: `schedule` never changes. For `Schedule::Gcra`, `state` is the theoretical arrival
// time in nanoseconds on the clock of the `now`s (0 initially: every instant finds the bucket
// full) and only grows. For `Schedule::Exhaustible`, it counts the calls so far; it stops growing
// shortly after passing `burst`, as each call checks before it increments.
#[derive(Debug)]
pub struct TokenBucket {
    schedule: Schedule,
    state: AtomicU64,
    qps: f64,
    burst: u32,
}

#[derive(Debug, Clone, Copy)]
enum Schedule {
    /// Every delay is zero.
    Unlimited,
    /// Each call reserves `interval` ns; reservations up to `tolerance` ns ahead are free.
    /// `0 < interval < MAX_TOLERANCE` and `interval <= tolerance <= MAX_TOLERANCE`.
    Gcra { interval: u64, tolerance: u64 },
    /// Never refills: `burst` free calls, then forever.
    Exhaustible { burst: u64 },
}

impl TokenBucket {
    /// The delay returned when the bucket will never have a token again (rate 0): `u64::MAX`
    /// nanoseconds, about 584 years. Added to any instant it saturates to [`Instant::NEVER`],
    /// which the queue treats as never.
    pub const FOREVER: Duration = Duration::from_nanos(u64::MAX);

    /// A bucket of `burst` tokens that refills at `qps` tokens per second, starting full.
    ///
    /// # Errors
    ///
    /// [`InvalidLimiter::Rate`] when `qps` is NaN or negative, and [`InvalidLimiter::ZeroBurst`]
    /// when `burst` is 0 with a finite `qps` (the bucket could never hand out a token).
    pub fn new(qps: f64, burst: u32) -> Result<Self, InvalidLimiter> {
        if qps.is_nan() || qps < 0.0 {
            return Err(InvalidLimiter::Rate(qps));
        }
        if burst == 0 && qps.is_finite() {
            return Err(InvalidLimiter::ZeroBurst { qps });
        }
        Ok(Self::new_valid(qps, burst))
    }

    /// [`new`](Self::new) for parameters known to be valid.
    pub(crate) fn new_valid(qps: f64, burst: u32) -> Self {
        // Past `qps == 0.0`, `qps` is in (0, inf] and `interval` in [0, inf): the cast below only
        // sees [1, 2^62).
        let interval = (NANOS_PER_SEC / qps).round();
        let schedule = if qps == 0.0 || interval >= MAX_TOLERANCE as f64 {
            Schedule::Exhaustible {
                burst: burst.into(),
            }
        } else if interval < 1.0 {
            Schedule::Unlimited
        } else {
            let interval = interval as u64;
            Schedule::Gcra {
                interval,
                tolerance: interval.saturating_mul(burst.into()).min(MAX_TOLERANCE),
            }
        };
        TokenBucket {
            schedule,
            state: AtomicU64::new(0),
            qps,
            burst,
        }
    }

    /// The refill rate, in tokens per second, as given.
    pub fn qps(&self) -> f64 {
        self.qps
    }

    /// The capacity, in tokens, as given.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Takes one token at `now` and returns how long until it is due.
    #[inline]
    fn reserve(&self, now: Instant) -> Duration {
        match self.schedule {
            Schedule::Unlimited => Duration::ZERO,
            Schedule::Gcra {
                interval,
                tolerance,
            } => {
                let now = now.as_nanos();
                // Relaxed is enough: the arrival time is the only shared datum, and a CAS
                // always acts on its latest value.
                let mut tat = self.state.load(Ordering::Relaxed);
                loop {
                    let next = tat.max(now).saturating_add(interval);
                    match self.state.compare_exchange_weak(
                        tat,
                        next,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        // `max(0, next - tolerance - now)`: all terms are non-negative, so
                        // saturating at 0 twice is the same as once at the end.
                        Ok(_) => {
                            return Duration::from_nanos(
                                next.saturating_sub(tolerance).saturating_sub(now),
                            );
                        }
                        Err(current) => tat = current,
                    }
                }
            }
            Schedule::Exhaustible { burst } => {
                let taken = &self.state;
                if taken.load(Ordering::Relaxed) >= burst
                    || taken.fetch_add(1, Ordering::Relaxed) >= burst
                {
                    Self::FOREVER
                } else {
                    Duration::ZERO
                }
            }
        }
    }
}

impl<K: ?Sized> RateLimiter<K> for TokenBucket {
    #[inline]
    fn when(&self, _key: &K, now: Instant) -> Duration {
        self.reserve(now)
    }

    #[inline]
    fn forget(&self, _key: &K) {}

    #[inline]
    fn num_requeues(&self, _key: &K) -> u32 {
        0
    }

    /// One token, as `when` takes: the bucket records no failures, so both are the same.
    #[inline]
    fn pace(&self, _key: &K, now: Instant) -> Duration {
        self.reserve(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    fn when(b: &TokenBucket, now: Instant) -> Duration {
        RateLimiter::<str>::when(b, "k", now)
    }

    #[test]
    fn rejects_what_has_no_meaning() {
        for qps in [f64::NAN, -1.0, f64::NEG_INFINITY, -f64::MIN_POSITIVE] {
            assert!(matches!(
                TokenBucket::new(qps, 1),
                Err(InvalidLimiter::Rate(_))
            ));
        }
        for qps in [0.0, 1.0, 1e12] {
            assert_eq!(
                TokenBucket::new(qps, 0).err(),
                Some(InvalidLimiter::ZeroBurst { qps })
            );
        }
        assert!(TokenBucket::new(f64::INFINITY, 0).is_ok());
        assert!(TokenBucket::new(-0.0, 1).is_ok());
        let msg = TokenBucket::new(10.0, 0).unwrap_err().to_string();
        assert!(
            msg.contains("at least 1") && msg.contains("INFINITY"),
            "{msg}"
        );
    }

    #[test]
    fn reservations_follow_x_time_rate() {
        let b = TokenBucket::new(10.0, 100).unwrap();
        for _ in 0..100 {
            assert_eq!(when(&b, at(0)), Duration::ZERO);
        }
        for k in 1..=50 {
            assert_eq!(when(&b, at(0)), Duration::from_millis(100 * k));
        }
        // Debt until 5 s; at 6 s ten tokens are back.
        for _ in 0..10 {
            assert_eq!(when(&b, at(6_000)), Duration::ZERO);
        }
        assert_eq!(when(&b, at(6_000)), Duration::from_millis(100));
    }

    #[test]
    fn refill_never_exceeds_burst() {
        let b = TokenBucket::new(1.0, 3).unwrap();
        when(&b, at(0));
        let later = at(3_600_000);
        for _ in 0..3 {
            assert_eq!(when(&b, later), Duration::ZERO);
        }
        assert_eq!(when(&b, later), Duration::from_secs(1));
    }

    #[test]
    fn earlier_now_does_not_refill() {
        let b = TokenBucket::new(1.0, 1).unwrap();
        assert_eq!(when(&b, at(10_000)), Duration::ZERO);
        // Due at 11 s, measured from the caller's own (stale) instant.
        assert_eq!(when(&b, at(4_000)), Duration::from_secs(7));
        assert_eq!(when(&b, at(12_000)), Duration::ZERO);
        assert_eq!(when(&b, at(0)), Duration::from_secs(13));
    }

    #[test]
    fn burst_one_spaces_every_call() {
        let b = TokenBucket::new(2.0, 1).unwrap();
        let delays: Vec<_> = (0..4).map(|_| when(&b, at(0)).as_millis()).collect();
        assert_eq!(delays, [0, 500, 1000, 1500]);
    }

    #[test]
    fn unlimited_rates() {
        for (qps, burst) in [(f64::INFINITY, 0), (f64::INFINITY, 5), (3e9, 1)] {
            let b = TokenBucket::new(qps, burst).unwrap();
            for _ in 0..1000 {
                assert_eq!(when(&b, at(0)), Duration::ZERO);
            }
        }
        // 1e9 qps: one token per nanosecond.
        let b = TokenBucket::new(1e9, 1).unwrap();
        assert_eq!(when(&b, at(0)), Duration::ZERO);
        assert_eq!(when(&b, at(0)), Duration::from_nanos(1));
    }

    #[test]
    fn zero_rate_is_forever_after_burst() {
        let b = TokenBucket::new(0.0, 2).unwrap();
        assert_eq!(when(&b, at(0)), Duration::ZERO);
        assert_eq!(when(&b, at(1)), Duration::ZERO);
        for t in [2, 1_000_000_000] {
            assert_eq!(when(&b, at(t)), TokenBucket::FOREVER);
        }
        assert_eq!(at(5).saturating_add(TokenBucket::FOREVER), Instant::NEVER);
    }

    #[test]
    fn tiny_rates_and_huge_bursts_keep_the_rate() {
        // One token per ~317 years: burst tokens free, then (near) forever.
        let b = TokenBucket::new(1e-10, 3).unwrap();
        for _ in 0..3 {
            assert_eq!(when(&b, at(0)), Duration::ZERO);
        }
        assert_eq!(when(&b, at(0)), TokenBucket::FOREVER);

        // One token per 10^15 ns: a burst of u32::MAX tokens is clamped to 2^62 ns of refill,
        // i.e. 4611 tokens, and the rate still holds after them.
        let b = TokenBucket::new(1e-6, u32::MAX).unwrap();
        for _ in 0..4611 {
            assert_eq!(when(&b, at(0)), Duration::ZERO);
        }
        let first_debt = when(&b, at(0));
        assert!(first_debt > Duration::ZERO);
        assert_eq!(
            when(&b, at(0)),
            first_debt + Duration::from_nanos(1_000_000_000_000_000)
        );
    }

    #[test]
    fn saturated_debt_stays_near_forever() {
        let b = TokenBucket::new(1e-8, 1).unwrap(); // one token per 3.2 years
        let mut last = Duration::ZERO;
        for _ in 0..1_000 {
            last = when(&b, at(0));
        }
        assert!(last > Duration::from_secs(400 * 365 * 86_400), "{last:?}");
        assert!(when(&b, Instant::NEVER) <= TokenBucket::FOREVER);
    }

    #[test]
    fn concurrent_calls_take_distinct_tokens() {
        let b = TokenBucket::new(1e3, 1).unwrap(); // 1 ms per token
        let mut delays: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..250).map(|_| when(&b, at(0))).collect::<Vec<_>>()))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        delays.sort();
        let expected: Vec<_> = (0..1000).map(Duration::from_millis).collect();
        assert_eq!(delays, expected);
    }
}
