//! A cap on another limiter's delay.

use std::time::Duration;

use crate::{Instant, RateLimiter};

/// Caps the delays of `inner` at `max`.
///
/// client-go's `WithMaxWaitRateLimiter`. [`forget`](RateLimiter::forget) and
/// [`num_requeues`](RateLimiter::num_requeues) go to `inner`. Capping a
/// [`TokenBucket`](crate::TokenBucket) lets retries exceed its rate: its tokens are still taken,
/// only the wait is cut short.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{ExponentialFailure, Instant, MaxWait, RateLimiter};
///
/// let limiter = MaxWait::new(
///     ExponentialFailure::new(Duration::from_secs(1), Duration::from_secs(1000)),
///     Duration::from_secs(3),
/// );
/// let now = Instant::ZERO;
/// let delays: Vec<_> = (0..4).map(|_| limiter.when("pod-a", now).as_secs()).collect();
/// assert_eq!(delays, [1, 2, 3, 3]);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MaxWait<L> {
    inner: L,
    max: Duration,
}

impl<L> MaxWait<L> {
    /// `inner`'s delays, at most `max`.
    pub const fn new(inner: L, max: Duration) -> Self {
        MaxWait { inner, max }
    }

    /// The cap.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The wrapped limiter.
    pub const fn inner(&self) -> &L {
        &self.inner
    }

    /// Unwraps the wrapped limiter.
    pub fn into_inner(self) -> L {
        self.inner
    }
}

impl<K: ?Sized, L: RateLimiter<K>> RateLimiter<K> for MaxWait<L> {
    #[inline]
    fn when(&self, key: &K, now: Instant) -> Duration {
        self.inner.when(key, now).min(self.max)
    }

    fn forget(&self, key: &K) {
        self.inner.forget(key);
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.inner.num_requeues(key)
    }

    fn pace(&self, key: &K, now: Instant) -> Duration {
        self.inner.pace(key, now).min(self.max)
    }
}
