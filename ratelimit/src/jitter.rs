//! Deterministic random lengthening of another limiter's delays.

use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use foldhash::quality::FixedState;

use crate::{Instant, InvalidLimiter, RateLimiter};

/// Bits of the fixed-point fraction. With 32 bits of randomness and a fraction of at most 10
/// (under 2^32 as fixed point), `random * fraction` fits a `u64` and `nanos * that` a `u128`.
const FRACTION_BITS: u32 = 28;

/// Lengthens the delays of `inner` by a random fraction: `d` becomes `d * (1 + fraction * u)`,
/// `u` uniform in `[0, 1)`.
///
/// Jitter spreads retries that would otherwise fire together, such as every key that failed when
/// a dependency went down. `u` is derived from a hash of (seed, key, attempt), where the attempt is
/// `inner`'s [`num_requeues`](RateLimiter::num_requeues) after its `when`: the same key and
/// attempt always get the same delay for one seed, so tests are reproducible with
/// [`with_seed`](Self::with_seed), and no state or lock is needed. The default seed is random per
/// limiter.
///
/// # Only longer
///
/// Jitter only ever lengthens a delay, into `[d, d * (1 + fraction)]`. Shortening would let a
/// key retry sooner than its backoff allows, and wrapped around a
/// [`TokenBucket`](crate::TokenBucket) it would break the bucket's rate. To keep a cap exact, put
/// [`MaxWait`](crate::MaxWait) *outside*: `MaxWait::new(Jitter::new(..)?, max)` caps the jittered
/// delay, while a cap inside is exceeded by up to `fraction`. Combine with a bucket as
/// `MaxPair::new(Jitter::new(backoff, p)?, bucket)` (see
/// [`jittered_controller_rate_limiter`](crate::jittered_controller_rate_limiter)), so the bucket's
/// delays are kept as they are.
///
/// Delays of [`TokenBucket::FOREVER`](crate::TokenBucket::FOREVER) or more are returned
/// unchanged; longer ones saturate at it. Around a limiter whose `num_requeues` is always 0
/// (a bucket) every call of a key gets the same fraction.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{ExponentialFailure, Instant, Jitter, RateLimiter};
///
/// let backoff = ExponentialFailure::new(Duration::from_secs(1), Duration::from_secs(60));
/// let limiter = Jitter::new(backoff, 0.5)?.with_seed(42);
/// let now = Instant::ZERO;
/// for base in [1, 2, 4, 8] {
///     let d = limiter.when("pod-a", now);
///     assert!(Duration::from_secs(base) <= d && d <= Duration::from_secs(base) * 3 / 2);
/// }
/// # Ok::<(), workqueue_ratelimit::InvalidLimiter>(())
/// ```
//
// Invariants: `scale == floor(fraction * 2^FRACTION_BITS) < 2^32`, so the added time never
// exceeds `d * fraction`; `hasher` is seeded with `seed`.
#[derive(Debug, Clone)]
pub struct Jitter<L> {
    inner: L,
    fraction: f64,
    scale: u64,
    seed: u64,
    hasher: FixedState,
}

// On `Jitter<()>` so that it is simply `Jitter::MAX_FRACTION`, with no type to infer.
impl Jitter<()> {
    /// The largest fraction accepted: a delay can at most grow elevenfold.
    pub const MAX_FRACTION: f64 = 10.0;
}

impl<L> Jitter<L> {
    /// Lengthens `inner`'s delays by up to `fraction` of themselves (0.1 = up to 10% longer),
    /// with a random seed.
    ///
    /// # Errors
    ///
    /// [`InvalidLimiter::JitterFraction`] unless `0 <= fraction <= Jitter::MAX_FRACTION`.
    pub fn new(inner: L, fraction: f64) -> Result<Self, InvalidLimiter> {
        if !(0.0..=Jitter::MAX_FRACTION).contains(&fraction) {
            return Err(InvalidLimiter::JitterFraction(fraction));
        }
        // std's `RandomState` is keyed from the operating system's randomness.
        let seed = std::hash::RandomState::new().hash_one(0u8);
        Ok(Jitter {
            inner,
            fraction,
            // In [0, 10 * 2^28]: the float-to-integer `as` truncates, which is the floor here.
            scale: (fraction * f64::from(1u32 << FRACTION_BITS)) as u64,
            seed,
            hasher: FixedState::with_seed(seed),
        })
    }

    /// Uses `seed`, making the delays reproducible.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self.hasher = FixedState::with_seed(seed);
        self
    }

    /// The largest fraction by which a delay is lengthened.
    pub fn fraction(&self) -> f64 {
        self.fraction
    }

    /// The seed of the random fractions.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The wrapped limiter.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// Unwraps the wrapped limiter.
    pub fn into_inner(self) -> L {
        self.inner
    }
}

impl<K, L> RateLimiter<K> for Jitter<L>
where
    K: ?Sized + Hash,
    L: RateLimiter<K>,
{
    fn when(&self, key: &K, now: Instant) -> Duration {
        let delay = self.inner.when(key, now);
        // A delay past `u64` nanoseconds is already "never".
        let Ok(nanos) = u64::try_from(delay.as_nanos()) else {
            return delay;
        };
        if nanos == 0 || self.scale == 0 {
            return delay;
        }
        let attempt = self.inner.num_requeues(key);
        let random = self.hasher.hash_one((key, attempt)) >> 32;
        // `nanos * random / 2^32 * scale / 2^28`: below `nanos * fraction`, computed exactly.
        let extra = (u128::from(nanos) * u128::from(random * self.scale)) >> (32 + FRACTION_BITS);
        let extra = u64::try_from(extra).unwrap_or(u64::MAX);
        Duration::from_nanos(nanos.saturating_add(extra))
    }

    fn forget(&self, key: &K) {
        self.inner.forget(key);
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.inner.num_requeues(key)
    }

    /// The inner limiter's pacing, without jitter (jitter spreads backoffs, not a bucket).
    fn pace(&self, key: &K, now: Instant) -> Duration {
        self.inner.pace(key, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ExponentialFailure, MaxWait};

    /// Always `d`, counting calls per limiter (not per key) as its attempt number.
    struct Fixed(Duration, std::sync::atomic::AtomicU32);

    impl RateLimiter<str> for Fixed {
        fn when(&self, _: &str, _: Instant) -> Duration {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0
        }
        fn forget(&self, _: &str) {}
        fn num_requeues(&self, _: &str) -> u32 {
            self.1.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    fn fixed(d: Duration) -> Fixed {
        Fixed(d, 0.into())
    }

    #[test]
    fn rejects_bad_fractions() {
        for f in [f64::NAN, -0.1, 10.01, f64::INFINITY, f64::NEG_INFINITY] {
            let err = Jitter::new((), f).unwrap_err();
            assert!(matches!(err, InvalidLimiter::JitterFraction(_)));
        }
        for f in [0.0, -0.0, 1e-300, 1.0, 10.0] {
            assert!(Jitter::new((), f).is_ok());
        }
    }

    #[test]
    fn spreads_within_bounds_and_is_deterministic() {
        let d = Duration::from_secs(100);
        let run = |seed| {
            let l = Jitter::new(fixed(d), 1.0).unwrap().with_seed(seed);
            (0..10_000)
                .map(|_| l.when("k", Instant::ZERO))
                .collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        assert!(a.iter().all(|&x| d <= x && x < 2 * d));
        let mean = a.iter().sum::<Duration>() / 10_000;
        assert!(mean > d * 29 / 20 && mean < d * 31 / 20, "{mean:?}");
    }

    #[test]
    fn depends_on_key_and_attempt() {
        let l = Jitter::new(
            ExponentialFailure::<String>::new(Duration::from_secs(1), Duration::from_secs(1)),
            1.0,
        )
        .unwrap()
        .with_seed(1);
        let a: Vec<_> = (0..3).map(|_| l.when("a", Instant::ZERO)).collect();
        let b: Vec<_> = (0..3).map(|_| l.when("b", Instant::ZERO)).collect();
        assert_ne!(a, b);
        assert!(a[0] != a[1] && a[1] != a[2]);
        l.forget("a");
        assert_eq!(l.when("a", Instant::ZERO), a[0]);
        assert_eq!(l.num_requeues("a"), 1);
    }

    #[test]
    fn extremes_never_shorten_or_panic() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(u64::MAX - 1),
            Duration::from_nanos(u64::MAX),
            Duration::MAX,
        ] {
            let l = Jitter::new(fixed(d), Jitter::MAX_FRACTION).unwrap();
            for _ in 0..100 {
                let x = l.when("k", Instant::ZERO);
                assert!(x >= d && x <= d.max(Duration::from_nanos(u64::MAX)));
            }
        }
        let none = Jitter::new(fixed(Duration::from_secs(3)), 0.0).unwrap();
        assert_eq!(none.when("k", Instant::ZERO), Duration::from_secs(3));
    }

    #[test]
    fn cap_outside_caps_the_jittered_delay() {
        let l = MaxWait::new(
            Jitter::new(fixed(Duration::from_secs(10)), 1.0).unwrap(),
            Duration::from_secs(11),
        );
        for _ in 0..100 {
            assert!(l.when("k", Instant::ZERO) <= Duration::from_secs(11));
        }
    }
}
