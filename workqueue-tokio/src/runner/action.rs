//! What a reconcile returns, how it can fail, what the error policy decides, and the one mapping
//! from all of that to a lease [`Outcome`] and the priority of the re-add it asks for.

use std::fmt;
use std::time::Duration;

use workqueue_core::Outcome;

/// What a successful reconcile asks for next.
///
/// A requeue is queued at the priority the key was handed out at ([`Context::priority`]) unless
/// it names another: `Action::RequeueAfter(d).with_priority(p)` is controller-runtime's
/// `Result{RequeueAfter: d, Priority: &p}`.
///
/// The priority is a builder on the existing variants rather than a field of every variant:
/// `RequeueAfter(d)` keeps its meaning and its shape, [`Done`](Action::Done) has no re-add to
/// give a priority to, and the one variant that carries a priority,
/// [`RequeueAfterAt`](Action::RequeueAfterAt), is what the builder returns, so a `match` still
/// sees every case.
///
/// ```
/// use std::time::Duration;
/// use workqueue_tokio::LOW_PRIORITY;
/// use workqueue_tokio::runner::Action;
///
/// // Poll again in a minute, behind every key added at the default priority.
/// let poll = Action::RequeueAfter(Duration::from_secs(60)).with_priority(LOW_PRIORITY);
/// assert_eq!(poll.priority(), Some(LOW_PRIORITY));
/// assert_eq!(Action::RequeueAfter(Duration::from_secs(60)).priority(), None);
/// ```
///
/// [`Context::priority`]: super::Context::priority
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
    /// [`RequeueAfter(after)`](Action::RequeueAfter), with the key queued at `priority` instead
    /// of the priority it was handed out at. Built by [`Action::with_priority`].
    RequeueAfterAt {
        /// The delay, with the meaning it has in `RequeueAfter` (zero: the limiter's delay).
        after: Duration,
        /// The priority of the requeue.
        priority: i32,
    },
}

impl Action {
    /// This action with its requeue at `priority` (controller-runtime's `Result.Priority`).
    /// [`Done`](Action::Done) requeues nothing and stays as it is.
    #[must_use]
    pub const fn with_priority(self, priority: i32) -> Self {
        match self {
            Action::RequeueAfter(after) | Action::RequeueAfterAt { after, .. } => {
                Action::RequeueAfterAt { after, priority }
            }
            Action::Done => Action::Done,
        }
    }

    /// The priority this action's requeue asks for; `None`: the priority the key was handed out
    /// at (or no requeue).
    pub const fn priority(&self) -> Option<i32> {
        match self {
            Action::RequeueAfterAt { priority, .. } => Some(*priority),
            Action::Done | Action::RequeueAfter(_) => None,
        }
    }
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

/// A failure is an error when the reconcile's error is; [`source`](std::error::Error::source) is
/// the reconcile's error for [`Failure::Error`], and `None` for a panic or a timeout.
///
/// ```
/// use std::error::Error;
/// use workqueue_tokio::runner::Failure;
///
/// let failure = Failure::Error(std::io::Error::other("connection reset"));
/// assert_eq!(failure.source().unwrap().to_string(), "connection reset");
/// assert!(Failure::<std::io::Error>::Timeout.source().is_none());
/// ```
impl<E: std::error::Error + 'static> std::error::Error for Failure<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Failure::Error(e) => Some(e),
            Failure::Panic(_) | Failure::Timeout => None,
        }
    }
}

/// What the error policy decides for a failed reconcile.
///
/// A retry is queued at the priority the key was handed out at, as controller-runtime keeps it
/// (its #3157), unless the policy names another with [`Decision::with_priority`]: for example,
/// to move a key that keeps failing behind fresh work. As for [`Action`], the priority is a
/// builder over the existing variants, and [`RetryAt`](Decision::RetryAt) is the one variant
/// that carries it.
///
/// ```
/// use std::time::Duration;
/// use workqueue_tokio::LOW_PRIORITY;
/// use workqueue_tokio::runner::{Context, Decision, Failure};
///
/// // Back off as usual; after five failures, behind every key added at the default priority.
/// let policy = |_key: &String, _failure: &Failure<std::io::Error>, ctx: &Context| {
///     if ctx.failures() < 5 {
///         Decision::Retry
///     } else {
///         Decision::Retry.with_priority(LOW_PRIORITY)
///     }
/// };
/// # let _ = policy;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Retry after the rate limiter's delay (the default).
    Retry,
    /// Retry after this fixed delay, without consulting the limiter.
    RetryAfter(Duration),
    /// Stop retrying: the limiter forgets the key; it runs again only when it is added.
    GiveUp,
    /// [`Retry`](Decision::Retry) (`after: None`) or [`RetryAfter(d)`](Decision::RetryAfter)
    /// (`after: Some(d)`), with the key queued at `priority` instead of the priority it was
    /// handed out at. Built by [`Decision::with_priority`].
    RetryAt {
        /// The fixed delay, or `None` for the rate limiter's.
        after: Option<Duration>,
        /// The priority of the retry.
        priority: i32,
    },
}

impl Decision {
    /// This decision with its retry at `priority`. [`GiveUp`](Decision::GiveUp) retries nothing
    /// and stays as it is.
    #[must_use]
    pub const fn with_priority(self, priority: i32) -> Self {
        match self {
            Decision::Retry => Decision::RetryAt {
                after: None,
                priority,
            },
            Decision::RetryAfter(d) => Decision::RetryAt {
                after: Some(d),
                priority,
            },
            Decision::RetryAt { after, .. } => Decision::RetryAt { after, priority },
            Decision::GiveUp => Decision::GiveUp,
        }
    }

    /// The priority this decision's retry asks for; `None`: the priority the key was handed out
    /// at (or no retry).
    pub const fn priority(&self) -> Option<i32> {
        match self {
            Decision::RetryAt { priority, .. } => Some(*priority),
            Decision::Retry | Decision::RetryAfter(_) | Decision::GiveUp => None,
        }
    }
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
    /// The one place where a reconcile result becomes queue operations (the module docs' table): the
    /// lease's outcome, and the priority of the re-add it asks for (`None`: the lease's own).
    pub(crate) fn outcome(&self) -> (Outcome, Option<i32>) {
        let outcome = match self {
            Reconciled::Ok(Action::Done) => Outcome::forget(),
            // "Again, as soon as the limiter allows": never an unthrottled loop on one key.
            Reconciled::Ok(
                Action::RequeueAfter(Duration::ZERO)
                | Action::RequeueAfterAt {
                    after: Duration::ZERO,
                    ..
                },
            ) => Outcome::retry(),
            Reconciled::Ok(Action::RequeueAfter(d) | Action::RequeueAfterAt { after: d, .. }) => {
                Outcome::requeue_after(*d)
            }
            Reconciled::Failed(_, Decision::Retry | Decision::RetryAt { after: None, .. }) => {
                Outcome::retry()
            }
            Reconciled::Failed(
                _,
                Decision::RetryAfter(d) | Decision::RetryAt { after: Some(d), .. },
            ) => Outcome::retry_after(*d),
            Reconciled::Failed(_, Decision::GiveUp) => Outcome::forget(),
            Reconciled::Interrupted => Outcome::retry(),
        };
        let priority = match self {
            Reconciled::Ok(action) => action.priority(),
            Reconciled::Failed(_, decision) => decision.priority(),
            Reconciled::Interrupted => None,
        };
        (outcome, priority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_map_to_outcomes() {
        let s = Duration::from_secs(1);
        let cases: [(Reconciled<()>, Outcome); 8] = [
            (Reconciled::Ok(Action::Done), Outcome::forget()),
            (
                Reconciled::Ok(Action::RequeueAfter(s)),
                Outcome::requeue_after(s),
            ),
            (
                Reconciled::Ok(Action::RequeueAfter(Duration::ZERO)),
                Outcome::retry(),
            ),
            (
                Reconciled::Ok(Action::RequeueAfter(Duration::from_nanos(1))),
                Outcome::requeue_after(Duration::from_nanos(1)),
            ),
            (
                Reconciled::Failed(Failure::Timeout, Decision::Retry),
                Outcome::retry(),
            ),
            (
                Reconciled::Failed(Failure::Error(()), Decision::RetryAfter(s)),
                Outcome::retry_after(s),
            ),
            (
                Reconciled::Failed(Failure::Panic("x".into()), Decision::GiveUp),
                Outcome::forget(),
            ),
            (Reconciled::Interrupted, Outcome::retry()),
        ];
        for (r, o) in cases {
            assert_eq!(r.outcome(), (o, None), "{r:?}: the lease's own priority");
        }
    }

    /// A priority changes the re-add's priority and nothing else: every case maps to the outcome
    /// its plain form maps to.
    #[test]
    fn a_chosen_priority_goes_with_the_same_outcome() {
        let s = Duration::from_secs(1);
        type Mapped = (Outcome, Option<i32>);
        let cases: [(Reconciled<()>, Mapped); 9] = [
            (
                Reconciled::Ok(Action::RequeueAfter(s).with_priority(7)),
                (Outcome::requeue_after(s), Some(7)),
            ),
            (
                Reconciled::Ok(Action::RequeueAfter(Duration::ZERO).with_priority(-100)),
                (Outcome::retry(), Some(-100)),
            ),
            (
                Reconciled::Ok(Action::RequeueAfter(s).with_priority(1).with_priority(2)),
                (Outcome::requeue_after(s), Some(2)),
            ),
            // `Done` requeues nothing: no priority to carry.
            (
                Reconciled::Ok(Action::Done.with_priority(7)),
                (Outcome::forget(), None),
            ),
            (
                Reconciled::Failed(Failure::Error(()), Decision::Retry.with_priority(3)),
                (Outcome::retry(), Some(3)),
            ),
            (
                Reconciled::Failed(Failure::Timeout, Decision::RetryAfter(s).with_priority(-5)),
                (Outcome::retry_after(s), Some(-5)),
            ),
            (
                Reconciled::Failed(
                    Failure::Timeout,
                    Decision::RetryAfter(s).with_priority(1).with_priority(0),
                ),
                (Outcome::retry_after(s), Some(0)),
            ),
            (
                Reconciled::Failed(
                    Failure::Panic("x".into()),
                    Decision::GiveUp.with_priority(9),
                ),
                (Outcome::forget(), None),
            ),
            (
                Reconciled::Failed(
                    Failure::Error(()),
                    Decision::RetryAt {
                        after: None,
                        priority: i32::MIN,
                    },
                ),
                (Outcome::retry(), Some(i32::MIN)),
            ),
        ];
        for (r, o) in cases {
            assert_eq!(r.outcome(), o, "{r:?}");
        }
    }
}
