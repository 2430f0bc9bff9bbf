//! Per-key two-speed retries.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use crate::failure_counts::FailureCounts;
use crate::{Instant, RateLimiter};

/// Per-key two-speed retries: the first `max_fast_attempts` failures of a key wait `fast`, later
/// ones `slow`.
///
/// client-go's `ItemFastSlowRateLimiter`. Failure counts are kept, bounded and hashed, and keys
/// borrowed, exactly as in [`ExponentialFailure`](crate::ExponentialFailure) (see its [bounded
/// state](crate::ExponentialFailure#bounded-state) and [keys](crate::ExponentialFailure#keys)); a
/// key that cannot be tracked gets the longer of the two delays.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{FastSlow, Instant, RateLimiter};
///
/// let limiter = FastSlow::new(Duration::from_millis(5), Duration::from_secs(10), 2);
/// let now = Instant::ZERO;
/// let delays: Vec<_> = (0..4).map(|_| limiter.when("pod-a", now)).collect();
/// let (fast, slow) = (Duration::from_millis(5), Duration::from_secs(10));
/// assert_eq!(delays, [fast, fast, slow, slow]);
/// ```
pub struct FastSlow<K, S = foldhash::fast::RandomState> {
    failures: FailureCounts<K, S>,
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
}

impl<K> FastSlow<K> {
    /// `fast` for the first `max_fast_attempts` failures of a key, `slow` afterwards.
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: u32) -> Self {
        Self::with_hasher(fast, slow, max_fast_attempts, Default::default())
    }
}

impl<K, S> FastSlow<K, S> {
    /// As [`new`](FastSlow::new), hashing keys with `hasher`.
    pub fn with_hasher(fast: Duration, slow: Duration, max_fast_attempts: u32, hasher: S) -> Self {
        FastSlow {
            failures: FailureCounts::with_hasher(hasher),
            fast,
            slow,
            max_fast_attempts,
        }
    }

    /// Tracks at most `max_keys` keys; once that many are tracked, other keys get the longer of
    /// the two delays and are not recorded. Tracked keys are never evicted.
    #[must_use]
    pub fn with_max_tracked_keys(mut self, max_keys: usize) -> Self {
        self.failures.set_limit(max_keys);
        self
    }

    /// The number of keys with recorded failures.
    pub fn tracked_keys(&self) -> usize {
        self.failures.len()
    }
}

impl<K, Q, S> RateLimiter<Q> for FastSlow<K, S>
where
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    K: Borrow<Q> + Send,
    S: BuildHasher + Send + Sync,
{
    #[inline]
    fn when(&self, key: &Q, _now: Instant) -> Duration {
        match self.failures.record(key) {
            Some(failures) if failures <= self.max_fast_attempts => self.fast,
            Some(_) => self.slow,
            None => self.fast.max(self.slow),
        }
    }

    fn forget(&self, key: &Q) {
        self.failures.remove(key);
    }

    fn num_requeues(&self, key: &Q) -> u32 {
        self.failures.get(key)
    }
}

impl<K, S> fmt::Debug for FastSlow<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastSlow")
            .field("fast", &self.fast)
            .field("slow", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("failures", &self.failures)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_millis(5);
    const SLOW: Duration = Duration::from_secs(10);

    #[test]
    fn zero_fast_attempts_is_always_slow() {
        let l: FastSlow<String> = FastSlow::new(FAST, SLOW, 0);
        assert_eq!(l.when("k", Instant::ZERO), SLOW);
    }

    #[test]
    fn untracked_key_gets_the_longer_delay() {
        let l: FastSlow<String> = FastSlow::new(SLOW, FAST, 3).with_max_tracked_keys(1);
        assert_eq!(l.when("a", Instant::ZERO), SLOW);
        assert_eq!(l.when("b", Instant::ZERO), SLOW);
        assert_eq!((l.num_requeues("b"), l.tracked_keys()), (0, 1));
    }
}
