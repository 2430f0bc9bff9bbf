//! What a finished lease asks of the queue, and the limiter half of that request.

use std::time::Duration;

use workqueue_ratelimit::{Instant, RateLimiter};

/// How a leased key's processing ended, and what the queue does about it.
///
/// Consumed by [`Lease::finish`](crate::Lease::finish). The mapping to queue operations lives in
/// one place, the state machine ([`QueueState::finish`](crate::state::QueueState::finish)), with
/// its limiter half in [`Outcome::consult_limiter`]; both queue drivers use them.
///
/// | outcome | limiter | queue |
/// |---|---|---|
/// | `Done` | nothing | done |
/// | `Forget` | `forget` | done |
/// | `Retry` | `when` | `add_after(when)`, done |
/// | `RetryAfter(d)` | nothing | `add_after(d)`, done |
/// | `RequeueAfter(d)` | `forget` | `add_after(d)`, done |
///
/// After shutdown the re-adds are dropped; the lease still finishes, and a key that was re-added
/// while it was processing is still re-queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Processing finished; the limiter's memory of the key is kept (client-go's `Done`).
    Done,
    /// Processing succeeded, or was given up: the limiter forgets the key, then done.
    Forget,
    /// Processing failed: re-add after the rate limiter's delay, then done.
    Retry,
    /// Processing failed: re-add after a fixed delay; the limiter is not consulted.
    RetryAfter(Duration),
    /// Processing succeeded and the key should run again later (polling): the limiter forgets the
    /// key, and it is re-added after the delay.
    RequeueAfter(Duration),
}

impl Outcome {
    /// Performs the limiter half of this outcome for `key`: `forget` for `Forget` and
    /// `RequeueAfter`, and `when` for `Retry`, whose delay it returns.
    ///
    /// Drivers call this outside the queue's lock, then pass the delay to
    /// [`QueueState::finish`](crate::state::QueueState::finish). With `shutting_down`, `when` is not
    /// consulted (the re-add would be dropped anyway, and a failure must not be counted for it).
    pub fn consult_limiter<K: ?Sized, L: RateLimiter<K> + ?Sized>(
        self,
        limiter: &L,
        key: &K,
        now: Instant,
        shutting_down: bool,
    ) -> Option<Duration> {
        match self {
            Outcome::Done | Outcome::RetryAfter(_) => None,
            Outcome::Forget | Outcome::RequeueAfter(_) => {
                limiter.forget(key);
                None
            }
            Outcome::Retry if shutting_down => None,
            Outcome::Retry => Some(limiter.when(key, now)),
        }
    }
}
