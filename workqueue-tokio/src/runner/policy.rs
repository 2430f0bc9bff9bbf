//! Error policies: what to do when a reconcile fails.

use super::action::{Decision, Failure};

/// Decides what happens to a key whose reconcile failed.
///
/// Sees the failure, the key and how many failures the rate limiter has recorded for it (before
/// this one). A retry keeps the priority the key was handed out at unless the decision names
/// another ([`Decision::with_priority`]). Any `Fn(&T, &Failure<E>, u32) -> Decision` is a
/// policy:
///
/// ```
/// use workqueue_tokio::runner::{Decision, Failure};
///
/// // Terminal errors are given up at once; everything else retries with backoff, ten times.
/// let policy = |_key: &String, failure: &Failure<std::io::Error>, requeues: u32| match failure {
///     Failure::Error(e) if e.kind() == std::io::ErrorKind::InvalidInput => Decision::GiveUp,
///     _ if requeues >= 10 => Decision::GiveUp,
///     _ => Decision::Retry,
/// };
/// # let _ = policy;
/// ```
pub trait ErrorPolicy<T, E>: Send + Sync + 'static {
    /// The decision for `key`'s `failure`, after `num_requeues` earlier failures.
    fn decide(&self, key: &T, failure: &Failure<E>, num_requeues: u32) -> Decision;
}

impl<T, E, F> ErrorPolicy<T, E> for F
where
    F: Fn(&T, &Failure<E>, u32) -> Decision + Send + Sync + 'static,
{
    fn decide(&self, key: &T, failure: &Failure<E>, num_requeues: u32) -> Decision {
        self(key, failure, num_requeues)
    }
}

/// Always retry with the rate limiter's backoff: the default, as in controller-runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryAlways;

impl<T, E> ErrorPolicy<T, E> for RetryAlways {
    fn decide(&self, _: &T, _: &Failure<E>, _: u32) -> Decision {
        Decision::Retry
    }
}

/// Retry with backoff until a key has failed `max` times in a row, then give up on it.
#[derive(Debug, Clone, Copy)]
pub struct MaxRetries(pub u32);

impl<T, E> ErrorPolicy<T, E> for MaxRetries {
    fn decide(&self, _: &T, _: &Failure<E>, num_requeues: u32) -> Decision {
        if num_requeues >= self.0 {
            Decision::GiveUp
        } else {
            Decision::Retry
        }
    }
}
