//! client-go's default limiters.

use std::time::Duration;

use crate::{ExponentialFailure, InvalidLimiter, Jitter, MaxPair, TokenBucket};

/// client-go's default controller limiter: the longer of a per-key backoff and a shared bucket.
///
/// A concrete pair, without dynamic dispatch; see [`default_controller_rate_limiter`].
pub type DefaultControllerRateLimiter<K, S = foldhash::fast::RandomState> =
    MaxPair<ExponentialFailure<K, S>, TokenBucket>;

/// [`DefaultControllerRateLimiter`] with jitter on its per-key backoff; see
/// [`jittered_controller_rate_limiter`].
pub type JitteredControllerRateLimiter<K, S = foldhash::fast::RandomState> =
    MaxPair<Jitter<ExponentialFailure<K, S>>, TokenBucket>;

const CONTROLLER_BASE: Duration = Duration::from_millis(5);
const ITEM_BASE: Duration = Duration::from_millis(1);
const MAX: Duration = Duration::from_secs(1000);
const QPS: f64 = 10.0;
const BURST: u32 = 100;

/// client-go's `DefaultControllerRateLimiter`: per-key exponential backoff from 5 ms to 1000 s,
/// and at most 10 retries per second overall with bursts of 100 (a [`TokenBucket`] shared by
/// all keys).
///
/// Early on, the bucket is full and the backoff decides; in a storm of more than 100 failures
/// the bucket adds `(n - 100) / 10` seconds. Build a [`MaxPair`] directly for other parameters.
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{default_controller_rate_limiter, Instant, RateLimiter};
///
/// let limiter = default_controller_rate_limiter::<String>();
/// let now = Instant::ZERO;
/// assert_eq!(limiter.when("ns/pod-a", now), Duration::from_millis(5));
/// assert_eq!(limiter.when("ns/pod-a", now), Duration::from_millis(10));
/// // Keys 3 to 100 are still in the burst; key 101 waits for the bucket.
/// for i in 3..=100 {
///     limiter.when(&format!("ns/pod-{i}"), now);
/// }
/// assert_eq!(limiter.when("ns/pod-101", now), Duration::from_millis(100));
/// ```
pub fn default_controller_rate_limiter<K>() -> DefaultControllerRateLimiter<K> {
    MaxPair::new(
        ExponentialFailure::new(CONTROLLER_BASE, MAX),
        TokenBucket::new_valid(QPS, BURST),
    )
}

/// client-go's `DefaultItemBasedRateLimiter`: per-key exponential backoff from 1 ms to 1000 s.
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{default_item_based_rate_limiter, Instant, RateLimiter};
///
/// let limiter = default_item_based_rate_limiter::<String>();
/// assert_eq!(limiter.when("ns/pod-a", Instant::ZERO), Duration::from_millis(1));
/// ```
pub fn default_item_based_rate_limiter<K>() -> ExponentialFailure<K> {
    ExponentialFailure::new(ITEM_BASE, MAX)
}

/// [`default_controller_rate_limiter`] with its per-key backoff lengthened by up to `fraction`
/// (see [`Jitter`]); the bucket's delays are kept exact.
///
/// `seed` makes the jitter reproducible; `None` draws a random seed.
///
/// # Errors
///
/// [`InvalidLimiter::JitterFraction`] unless `0 <= fraction <= Jitter::MAX_FRACTION`.
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{jittered_controller_rate_limiter, Instant, RateLimiter};
///
/// let limiter = jittered_controller_rate_limiter::<String>(0.2, None)?;
/// let d = limiter.when("ns/pod-a", Instant::ZERO);
/// assert!(Duration::from_millis(5) <= d && d <= Duration::from_millis(6));
/// # Ok::<(), workqueue_ratelimit::InvalidLimiter>(())
/// ```
pub fn jittered_controller_rate_limiter<K>(
    fraction: f64,
    seed: Option<u64>,
) -> Result<JitteredControllerRateLimiter<K>, InvalidLimiter> {
    let jitter = Jitter::new(ExponentialFailure::new(CONTROLLER_BASE, MAX), fraction)?;
    let jitter = match seed {
        Some(seed) => jitter.with_seed(seed),
        None => jitter,
    };
    Ok(MaxPair::new(jitter, TokenBucket::new_valid(QPS, BURST)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Instant, RateLimiter};

    #[test]
    fn default_backoff_reaches_1000_s_at_the_19th_failure() {
        let l = default_controller_rate_limiter::<String>();
        let delays: Vec<_> = (0..19).map(|_| l.when("k", Instant::ZERO)).collect();
        assert_eq!(delays[17], Duration::from_millis(655_360));
        assert_eq!(delays[18], MAX);
        assert_eq!(l.num_requeues("k"), 19);
        l.forget("k");
        assert_eq!(l.num_requeues("k"), 0);
    }

    #[test]
    fn bucket_dominates_in_a_storm() {
        let l = default_controller_rate_limiter::<u32>();
        let delays: Vec<_> = (0..200).map(|i| l.when(&i, Instant::ZERO)).collect();
        assert!(delays[..100].iter().all(|&d| d == CONTROLLER_BASE));
        assert_eq!(delays[199], Duration::from_secs(10));
    }

    #[test]
    fn jittered_is_reproducible_and_keeps_the_bucket() {
        let run = || {
            let l = jittered_controller_rate_limiter::<u32>(1.0, Some(3)).unwrap();
            (0..200)
                .map(|i| l.when(&i, Instant::ZERO))
                .collect::<Vec<_>>()
        };
        let delays = run();
        assert_eq!(delays, run());
        assert!(
            delays[..100]
                .iter()
                .all(|&d| (CONTROLLER_BASE..2 * CONTROLLER_BASE).contains(&d))
        );
        assert_eq!(delays[199], Duration::from_secs(10));
        assert!(jittered_controller_rate_limiter::<u32>(f64::NAN, None).is_err());
    }
}
