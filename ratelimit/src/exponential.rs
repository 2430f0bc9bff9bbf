//! Per-key exponential backoff.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use crate::failure_counts::FailureCounts;
use crate::{Instant, RateLimiter};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Per-key exponential backoff: the `n`-th failure of a key waits `min(base * 2^(n-1), max)`.
///
/// client-go's `ItemExponentialFailureRateLimiter`, computed with saturating integer arithmetic:
/// no parameters or failure count make it overflow or panic. `base > max` is allowed (every delay
/// is then `max`), and a zero `base` makes every delay zero.
///
/// Failure counts live in a sharded map: a call hashes the key once and takes one shard's lock.
/// Counts saturate at `u32::MAX`.
///
/// # Bounded state
///
/// Every distinct failing key is tracked until it is [forgotten](RateLimiter::forget), so
/// without `forget` the state grows by one entry per key. [`with_max_tracked_keys`] bounds it:
/// once the bound is reached, a key that is not tracked gets `max` and is not recorded, while
/// tracked keys keep counting. A tracked key is never evicted to make room: restarting it at
/// `base` is exactly the retry storm backoff exists to prevent.
///
/// # Keys
///
/// The limiter stores owned keys `K` and serves any borrowed form `Q` of them (as `HashMap::get`
/// does), cloning a key only the first time it fails: `ExponentialFailure<String>` is both a
/// `RateLimiter<String>` and a `RateLimiter<str>`.
///
/// # Hashing
///
/// `S` hashes the keys; the default is foldhash, fast and randomly seeded per limiter. For keys
/// chosen by untrusted tenants, [`std::hash::RandomState`] (SipHash) is the hardened choice, see
/// [`with_hasher`](Self::with_hasher).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{ExponentialFailure, Instant, RateLimiter};
///
/// let limiter = ExponentialFailure::new(Duration::from_millis(1), Duration::from_secs(1));
/// let now = Instant::ZERO;
/// let delays: Vec<_> = (0..12).map(|_| limiter.when("pod-a", now).as_millis()).collect();
/// assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000]);
/// assert_eq!(limiter.num_requeues("pod-a"), 12);
///
/// limiter.forget("pod-a");
/// assert_eq!(limiter.when("pod-a", now), Duration::from_millis(1));
/// ```
///
/// [`with_max_tracked_keys`]: Self::with_max_tracked_keys
//
// Invariants: `base_nanos << e < max.as_nanos()` for every `e < doublings`, so a delay below the
// cap is a shift that cannot overflow. `doublings <= 95` as `max` is below 2^95 ns. A zero `base`
// stores a zero `max`: every delay is then zero, including an untracked key's.
pub struct ExponentialFailure<K, S = foldhash::fast::RandomState> {
    failures: FailureCounts<K, S>,
    base_nanos: u128,
    doublings: u32,
    max: Duration,
}

impl<K> ExponentialFailure<K> {
    /// Backoff from `base` doubling up to `max`, with the default hasher.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self::with_hasher(base, max, Default::default())
    }
}

impl<K, S> ExponentialFailure<K, S> {
    /// Backoff from `base` doubling up to `max`, hashing keys with `hasher`.
    ///
    /// ```
    /// use std::hash::RandomState;
    /// use std::time::Duration;
    /// use workqueue_ratelimit::ExponentialFailure;
    ///
    /// // SipHash: slower, resistant to keys crafted to collide.
    /// let limiter: ExponentialFailure<String, _> = ExponentialFailure::with_hasher(
    ///     Duration::from_millis(5),
    ///     Duration::from_secs(1000),
    ///     RandomState::new(),
    /// );
    /// # drop(limiter);
    /// ```
    pub fn with_hasher(base: Duration, max: Duration, hasher: S) -> Self {
        let max = if base.is_zero() { base } else { max };
        let base_nanos = base.as_nanos();
        let max_nanos = max.as_nanos();
        let doublings = if base_nanos >= max_nanos {
            0
        } else {
            // Shifting by the difference in bit length aligns the top bits without overflow; one
            // more doubling is needed when the aligned base is still below `max`.
            let e = base_nanos.leading_zeros() - max_nanos.leading_zeros();
            e + u32::from(base_nanos << e < max_nanos)
        };
        ExponentialFailure {
            failures: FailureCounts::with_hasher(hasher),
            base_nanos,
            doublings,
            max,
        }
    }

    /// Tracks at most `max_keys` keys; untracked keys get the maximum delay once it is reached.
    ///
    /// See [bounded state](Self#bounded-state).
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_ratelimit::{ExponentialFailure, Instant, RateLimiter};
    ///
    /// let limiter = ExponentialFailure::new(Duration::from_millis(1), Duration::from_secs(1))
    ///     .with_max_tracked_keys(1);
    /// let now = Instant::ZERO;
    /// assert_eq!(limiter.when("a", now), Duration::from_millis(1));
    /// assert_eq!(limiter.when("b", now), Duration::from_secs(1)); // not tracked
    /// assert_eq!(limiter.when("a", now), Duration::from_millis(2)); // still tracked
    /// assert_eq!(limiter.tracked_keys(), 1);
    /// ```
    #[must_use]
    pub fn with_max_tracked_keys(mut self, max_keys: usize) -> Self {
        self.failures.set_limit(max_keys);
        self
    }

    /// The number of keys with recorded failures.
    pub fn tracked_keys(&self) -> usize {
        self.failures.len()
    }

    /// The delay of the first failure.
    pub fn base(&self) -> Duration {
        nanos_to_duration(self.base_nanos)
    }

    /// The longest delay: `max`, or zero when `base` is zero.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay of the `failures`-th failure (1-indexed; 0 is treated as 1).
    fn delay(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1);
        if exponent >= self.doublings {
            self.max
        } else {
            // Cannot overflow: below `doublings` the shifted base is below `max` (invariant).
            nanos_to_duration(self.base_nanos << exponent)
        }
    }
}

/// Converts nanoseconds known to fit a `Duration` without dividing a `u128` on the common path.
fn nanos_to_duration(nanos: u128) -> Duration {
    match u64::try_from(nanos) {
        Ok(nanos) => Duration::from_nanos(nanos),
        Err(_) => Duration::new(
            u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX),
            (nanos % NANOS_PER_SEC) as u32, // below 10^9
        ),
    }
}

impl<K, Q, S> RateLimiter<Q> for ExponentialFailure<K, S>
where
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    K: Borrow<Q> + Send,
    S: BuildHasher + Send + Sync,
{
    #[inline]
    fn when(&self, key: &Q, _now: Instant) -> Duration {
        match self.failures.record(key) {
            Some(failures) => self.delay(failures),
            None => self.max,
        }
    }

    fn forget(&self, key: &Q) {
        self.failures.remove(key);
    }

    fn num_requeues(&self, key: &Q) -> u32 {
        self.failures.get(key)
    }
}

impl<K, S> fmt::Debug for ExponentialFailure<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExponentialFailure")
            .field("base", &self.base())
            .field("max", &self.max)
            .field("failures", &self.failures)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Instant = Instant::ZERO;

    fn exp(base: Duration, max: Duration) -> ExponentialFailure<String> {
        ExponentialFailure::new(base, max)
    }

    #[test]
    fn doubles_up_to_max() {
        let l = exp(Duration::from_millis(5), Duration::from_secs(1000));
        let delays: Vec<_> = (0..20).map(|_| l.when("k", NOW)).collect();
        assert_eq!(delays[0], Duration::from_millis(5));
        assert_eq!(delays[17], Duration::from_millis(655_360));
        assert_eq!(delays[18], Duration::from_secs(1000));
        assert_eq!(delays[19], Duration::from_secs(1000));
    }

    #[test]
    fn extreme_parameters_never_panic() {
        let cases = [
            (Duration::ZERO, Duration::ZERO, Duration::ZERO),
            (Duration::ZERO, Duration::MAX, Duration::ZERO),
            (Duration::MAX, Duration::MAX, Duration::MAX),
            (
                Duration::MAX,
                Duration::from_secs(1),
                Duration::from_secs(1),
            ),
            (
                Duration::from_secs(2),
                Duration::from_secs(1),
                Duration::from_secs(1),
            ),
            (Duration::from_nanos(1), Duration::MAX, Duration::MAX),
        ];
        for (base, max, last) in cases {
            let l = exp(base, max);
            let mut prev = Duration::ZERO;
            for _ in 0..200 {
                let d = l.when("k", NOW);
                assert!(
                    prev <= d && d <= max,
                    "{base:?} {max:?}: {prev:?} then {d:?}"
                );
                prev = d;
            }
            assert_eq!(prev, last, "{base:?} {max:?}");
        }
    }

    #[test]
    fn large_delays_beyond_u64_nanos_are_exact() {
        let l = exp(Duration::from_secs(1 << 40), Duration::MAX);
        assert_eq!(l.when("k", NOW), Duration::from_secs(1 << 40));
        assert_eq!(l.when("k", NOW), Duration::from_secs(1 << 41));
        assert_eq!(l.base(), Duration::from_secs(1 << 40));
        let odd = Duration::new(u64::MAX / 4, 999_999_999);
        let l = exp(odd, Duration::MAX);
        assert_eq!(l.when("k", NOW), odd);
        assert_eq!(l.when("k", NOW), odd * 2);
    }

    #[test]
    fn bounded_state_gives_untracked_keys_max() {
        let l = exp(Duration::from_millis(1), Duration::from_secs(1)).with_max_tracked_keys(0);
        assert_eq!(l.when("k", NOW), Duration::from_secs(1));
        assert_eq!((l.num_requeues("k"), l.tracked_keys()), (0, 0));
    }

    #[test]
    fn debug_shows_parameters_not_keys() {
        let l = exp(Duration::from_millis(1), Duration::from_secs(1));
        l.when("secret", NOW);
        let s = format!("{l:?}");
        assert!(s.contains("1ms") && s.contains("tracked_keys: 1") && !s.contains("secret"));
    }
}
