//! The longest delay of several limiters.

use std::fmt;
use std::time::Duration;

use crate::{Instant, RateLimiter};

/// The longest delay of any number of limiters, chosen at run time.
///
/// client-go's `MaxOfRateLimiter`. [`when`](RateLimiter::when) calls **every** child, so all of
/// them record the failure (a bucket takes a token even when a per-key backoff wins), and returns
/// the longest delay, or zero without children. [`num_requeues`](RateLimiter::num_requeues) is
/// the largest count of any child; [`forget`](RateLimiter::forget) forgets in all of them.
///
/// For two limiters known at compile time, [`MaxPair`] does the same without dynamic dispatch.
///
/// Combined with a [`TokenBucket`](crate::TokenBucket), the queue can appear to exceed the
/// bucket's burst: the per-key delays are what keeps retries apart, not the bucket alone.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{ExponentialFailure, FastSlow, Instant, MaxOf, RateLimiter};
///
/// let ms = Duration::from_millis;
/// let limiter = MaxOf::new()
///     .with(FastSlow::new(ms(5), Duration::from_secs(3), 3))
///     .with(ExponentialFailure::new(ms(1), Duration::from_secs(1)));
/// let now = Instant::ZERO;
/// let delays: Vec<_> = (0..5).map(|_| limiter.when("pod-a", now)).collect();
/// assert_eq!(delays[..3], [ms(5); 3]);
/// assert_eq!(delays[3..], [Duration::from_secs(3); 2]);
/// assert_eq!(limiter.num_requeues("pod-a"), 5);
/// ```
pub struct MaxOf<K: ?Sized> {
    children: Vec<Box<dyn RateLimiter<K>>>,
}

impl<K: ?Sized> MaxOf<K> {
    /// No children yet: every delay is zero.
    pub const fn new() -> Self {
        MaxOf {
            children: Vec::new(),
        }
    }

    /// Adds `limiter` as a child.
    #[must_use]
    pub fn with(mut self, limiter: impl RateLimiter<K> + 'static) -> Self {
        self.push(limiter);
        self
    }

    /// Adds `limiter` as a child.
    pub fn push(&mut self, limiter: impl RateLimiter<K> + 'static) {
        self.children.push(Box::new(limiter));
    }

    /// The number of children.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether there are no children.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }
}

impl<K: ?Sized> Default for MaxOf<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: ?Sized> From<Vec<Box<dyn RateLimiter<K>>>> for MaxOf<K> {
    fn from(children: Vec<Box<dyn RateLimiter<K>>>) -> Self {
        MaxOf { children }
    }
}

impl<K: ?Sized> FromIterator<Box<dyn RateLimiter<K>>> for MaxOf<K> {
    fn from_iter<I: IntoIterator<Item = Box<dyn RateLimiter<K>>>>(iter: I) -> Self {
        MaxOf {
            children: iter.into_iter().collect(),
        }
    }
}

impl<K: ?Sized> RateLimiter<K> for MaxOf<K> {
    fn when(&self, key: &K, now: Instant) -> Duration {
        self.children
            .iter()
            .fold(Duration::ZERO, |max, child| max.max(child.when(key, now)))
    }

    fn forget(&self, key: &K) {
        self.children.iter().for_each(|child| child.forget(key));
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.children
            .iter()
            .map(|child| child.num_requeues(key))
            .max()
            .unwrap_or(0)
    }

    fn pace(&self, key: &K, now: Instant) -> Duration {
        self.children
            .iter()
            .fold(Duration::ZERO, |max, child| max.max(child.pace(key, now)))
    }
}

impl<K: ?Sized> fmt::Debug for MaxOf<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaxOf")
            .field("children", &self.children.len())
            .finish()
    }
}

/// The longer delay of two limiters, without dynamic dispatch.
///
/// Behaves as a [`MaxOf`] of `first` and `second`: both are always called. Pairs nest for more
/// children; [`DefaultControllerRateLimiter`](crate::DefaultControllerRateLimiter) is one.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{ExponentialFailure, Instant, MaxPair, RateLimiter, TokenBucket};
///
/// let limiter = MaxPair::new(
///     ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(1000)),
///     TokenBucket::new(10.0, 1)?,
/// );
/// let now = Instant::ZERO;
/// assert_eq!(limiter.when("a", now), Duration::from_millis(5)); // backoff wins
/// assert_eq!(limiter.when("b", now), Duration::from_millis(100)); // bucket wins
/// # Ok::<(), workqueue_ratelimit::InvalidLimiter>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MaxPair<A, B> {
    /// The first limiter; called first.
    pub first: A,
    /// The second limiter.
    pub second: B,
}

impl<A, B> MaxPair<A, B> {
    /// The longer delay of `first` and `second`.
    pub const fn new(first: A, second: B) -> Self {
        MaxPair { first, second }
    }
}

impl<K, A, B> RateLimiter<K> for MaxPair<A, B>
where
    K: ?Sized,
    A: RateLimiter<K>,
    B: RateLimiter<K>,
{
    #[inline]
    fn when(&self, key: &K, now: Instant) -> Duration {
        let first = self.first.when(key, now);
        first.max(self.second.when(key, now))
    }

    fn forget(&self, key: &K) {
        self.first.forget(key);
        self.second.forget(key);
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.first
            .num_requeues(key)
            .max(self.second.num_requeues(key))
    }

    fn pace(&self, key: &K, now: Instant) -> Duration {
        let first = self.first.pace(key, now);
        first.max(self.second.pace(key, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ExponentialFailure, TokenBucket};

    #[test]
    fn no_children_is_zero() {
        let l = MaxOf::<str>::new();
        assert_eq!(l.when("k", Instant::ZERO), Duration::ZERO);
        assert_eq!(l.num_requeues("k"), 0);
        l.forget("k");
        assert!(l.is_empty());
    }

    #[test]
    fn every_child_is_called() {
        let bucket = std::sync::Arc::new(TokenBucket::new(1.0, 1).unwrap());
        let l: MaxOf<str> = [
            Box::new(ExponentialFailure::<String>::new(
                Duration::from_secs(10),
                Duration::from_secs(10),
            )) as Box<dyn RateLimiter<str>>,
            Box::new(bucket.clone()),
        ]
        .into_iter()
        .collect();
        assert_eq!(l.len(), 2);
        assert_eq!(l.when("a", Instant::ZERO), Duration::from_secs(10));
        assert_eq!(l.when("b", Instant::ZERO), Duration::from_secs(10));
        // Both calls took a token although the backoff won.
        assert_eq!(bucket.when("c", Instant::ZERO), Duration::from_secs(2));
    }

    #[test]
    fn pair_forgets_both() {
        let p = MaxPair::new(
            ExponentialFailure::<String>::new(Duration::from_millis(1), Duration::from_secs(1)),
            ExponentialFailure::<String>::new(Duration::from_millis(2), Duration::from_secs(1)),
        );
        p.when("k", Instant::ZERO);
        assert_eq!(p.when("k", Instant::ZERO), Duration::from_millis(4));
        assert_eq!(p.num_requeues("k"), 2);
        p.forget("k");
        assert_eq!(
            (p.first.num_requeues("k"), p.second.num_requeues("k")),
            (0, 0)
        );
    }
}
