//! What a reconcile returns, how it can fail, what the error policy decides, and the one mapping
//! from all of that to a lease [`Outcome`].

use std::fmt;
use std::time::Duration;

use workqueue_core::Outcome;

/// What a successful reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Nothing: the key's backoff is reset (forget) and it runs again only when it is added.
    Done,
    /// Run again after this delay (polling an external state). The backoff is reset: a fixed delay
    /// is for polling, never for errors (return the error and let the limiter back off).
    ///
    /// `RequeueAfter(Duration::ZERO)` is different: it asks to run again "soon", which the rate
    /// limiter paces. The key is requeued after the limiter's delay and its backoff is *not* reset
    /// (controller-runtime's deprecated `Requeue: true`), so a reconcile that always returns it
    /// backs off instead of looping on its key. It still counts as a success (`processed`; metric
    /// result `requeue`).
    RequeueAfter(Duration),
}

/// How a reconcile failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure<E> {
    /// The reconcile returned this error.
    Error(E),
    /// The reconcile panicked with this message; the worker survived.
    Panic(String),
    /// The reconcile did not finish within the runner's timeout; its context was cancelled and its
    /// future dropped.
    Timeout,
}

impl<E: fmt::Display> fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(e) => write!(f, "reconcile failed: {e}"),
            Failure::Panic(m) => write!(f, "reconcile panicked: {m}"),
            Failure::Timeout => f.write_str("reconcile timed out"),
        }
    }
}

/// What the error policy decides for a failed reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Retry after the rate limiter's delay (the default).
    Retry,
    /// Retry after this fixed delay, without consulting the limiter.
    RetryAfter(Duration),
    /// Stop retrying: the limiter forgets the key; it runs again only when it is added.
    GiveUp,
}

/// The result of one reconcile, as the runner saw it: the runner's verdict on a lease.
#[derive(Debug)]
pub(crate) enum Reconciled<E> {
    Ok(Action),
    Failed(Failure<E>, Decision),
    /// Dropped at shutdown after the grace periods: retried, so the key is not lost if the queue
    /// lives on.
    Interrupted,
}

impl<E> Reconciled<E> {
    /// The one place where a reconcile result becomes queue operations (DESIGN.md section 5).
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Reconciled::Ok(Action::Done) => Outcome::Forget,
            // "Again, as soon as the limiter allows": never an unthrottled loop on one key.
            Reconciled::Ok(Action::RequeueAfter(Duration::ZERO)) => Outcome::Retry,
            Reconciled::Ok(Action::RequeueAfter(d)) => Outcome::RequeueAfter(*d),
            Reconciled::Failed(_, Decision::Retry) => Outcome::Retry,
            Reconciled::Failed(_, Decision::RetryAfter(d)) => Outcome::RetryAfter(*d),
            Reconciled::Failed(_, Decision::GiveUp) => Outcome::Forget,
            Reconciled::Interrupted => Outcome::Retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_map_to_outcomes() {
        let s = Duration::from_secs(1);
        let cases: [(Reconciled<()>, Outcome); 8] = [
            (Reconciled::Ok(Action::Done), Outcome::Forget),
            (
                Reconciled::Ok(Action::RequeueAfter(s)),
                Outcome::RequeueAfter(s),
            ),
            (
                Reconciled::Ok(Action::RequeueAfter(Duration::ZERO)),
                Outcome::Retry,
            ),
            (
                Reconciled::Ok(Action::RequeueAfter(Duration::from_nanos(1))),
                Outcome::RequeueAfter(Duration::from_nanos(1)),
            ),
            (
                Reconciled::Failed(Failure::Timeout, Decision::Retry),
                Outcome::Retry,
            ),
            (
                Reconciled::Failed(Failure::Error(()), Decision::RetryAfter(s)),
                Outcome::RetryAfter(s),
            ),
            (
                Reconciled::Failed(Failure::Panic("x".into()), Decision::GiveUp),
                Outcome::Forget,
            ),
            (Reconciled::Interrupted, Outcome::Retry),
        ];
        for (r, o) in cases {
            assert_eq!(r.outcome(), o, "{r:?}");
        }
    }
}
