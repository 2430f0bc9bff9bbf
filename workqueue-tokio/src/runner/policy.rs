//! Error policies: what to do when a reconcile fails.

use super::Context;
use super::action::{Decision, Failure};

/// Decides what happens to a key whose reconcile failed.
///
/// Sees the key, the failure and the reconcile's [`Context`]: the runner's shared data, the
/// priority, and the two counts of earlier failures ([`Context::failures`], the runner's, which
/// every failure advances; [`Context::attempt`], the rate limiter's). A retry keeps the priority
/// the key was handed out at unless the decision names another ([`Decision::with_priority`]).
/// Any `Fn(&T, &Failure<E>, &Context<C>) -> Decision` is a policy:
///
/// ```
/// use workqueue_tokio::runner::{Context, Decision, Failure};
///
/// // Terminal errors are given up at once; everything else retries with backoff, ten times.
/// let policy = |_key: &String, failure: &Failure<std::io::Error>, ctx: &Context| match failure {
///     Failure::Error(e) if e.kind() == std::io::ErrorKind::InvalidInput => Decision::GiveUp,
///     _ if ctx.failures() >= 10 => Decision::GiveUp,
///     _ => Decision::Retry,
/// };
/// # let _ = policy;
/// ```
///
/// (Before the context existed, the third argument was the limiter's `num_requeues: u32`; it is
/// `ctx.attempt()` now.)
pub trait ErrorPolicy<T, E, C = ()>: Send + Sync + 'static {
    /// The decision for `key`'s `failure`; `ctx` is the failed reconcile's context.
    fn decide(&self, key: &T, failure: &Failure<E>, ctx: &Context<C>) -> Decision;
}

impl<T, E, C, F> ErrorPolicy<T, E, C> for F
where
    F: Fn(&T, &Failure<E>, &Context<C>) -> Decision + Send + Sync + 'static,
{
    fn decide(&self, key: &T, failure: &Failure<E>, ctx: &Context<C>) -> Decision {
        self(key, failure, ctx)
    }
}

/// Always retry with the rate limiter's backoff: the default, as in controller-runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryAlways;

impl<T, E, C> ErrorPolicy<T, E, C> for RetryAlways {
    fn decide(&self, _: &T, _: &Failure<E>, _: &Context<C>) -> Decision {
        Decision::Retry
    }
}

/// Retry with backoff until a key has failed `max + 1` times in a row, then give up on it: `max`
/// retries. Counts with the runner's [`Context::failures`].
#[derive(Debug, Clone, Copy)]
pub struct MaxRetries(pub u32);

impl<T, E, C> ErrorPolicy<T, E, C> for MaxRetries {
    fn decide(&self, _: &T, _: &Failure<E>, ctx: &Context<C>) -> Decision {
        if ctx.failures() >= self.0 {
            Decision::GiveUp
        } else {
            Decision::Retry
        }
    }
}
