//! The `RateLimiter` trait.

use std::sync::Arc;
use std::time::Duration;

use crate::Instant;

/// Decides how long a key must wait before it is retried.
///
/// A limiter is a pure function of its own state and the `now` it is given: it never reads a clock.
/// The queue that owns the one clock passes `now` in, so tests on virtual time are exact.
///
/// `K: ?Sized` lets a limiter that ignores the key (such as [`TokenBucket`](crate::TokenBucket))
/// serve any key type; limiters that keep per-key state need owned, hashable keys.
///
/// Implemented for `Box<L>`, `Arc<L>` and `&L` (with `L` possibly `dyn RateLimiter<K>`), so limiters
/// compose and can be chosen at run time.
///
/// # Contract
/// - `when` records one failure of `key` and returns a delay in `[0, max]` for the limiter's own
///   maximum. It never panics and never returns an absurd delay.
/// - `forget` clears what the limiter knows about `key` (after a success, or when giving up).
/// - `num_requeues` is how many failures of `key` are recorded since the last `forget`.
pub trait RateLimiter<K: ?Sized>: Send + Sync {
    /// How long `key` must wait before it is retried; records one failure of `key`.
    fn when(&self, key: &K, now: Instant) -> Duration;

    /// Forgets the failures recorded for `key`.
    fn forget(&self, key: &K);

    /// How many failures of `key` are recorded since it was last forgotten.
    fn num_requeues(&self, key: &K) -> u32;

    /// How long `key` must wait to be paced with the other keys, without recording a failure:
    /// one reservation of the limiter's shared buckets (a [`TokenBucket`](crate::TokenBucket)
    /// takes one token), nothing of its per-key backoff. A queue paces the keys it releases
    /// after an outage with it. The default, for limiters without a shared bucket, is zero.
    fn pace(&self, key: &K, now: Instant) -> Duration {
        let _ = (key, now);
        Duration::ZERO
    }
}

macro_rules! forward_rate_limiter {
    ($($ty:ty),*) => {$(
        impl<K: ?Sized, L: RateLimiter<K> + ?Sized> RateLimiter<K> for $ty {
            #[inline]
            fn when(&self, key: &K, now: Instant) -> Duration {
                (**self).when(key, now)
            }
            #[inline]
            fn forget(&self, key: &K) {
                (**self).forget(key)
            }
            #[inline]
            fn num_requeues(&self, key: &K) -> u32 {
                (**self).num_requeues(key)
            }
            #[inline]
            fn pace(&self, key: &K, now: Instant) -> Duration {
                (**self).pace(key, now)
            }
        }
    )*};
}

forward_rate_limiter!(Box<L>, Arc<L>, &L);
