//! What a reconcile or the error policy asks for next, how a reconcile can fail, and the one
//! mapping from a reconcile's result to the lease's [`Outcome`].

use std::fmt;
use std::time::Duration;

use workqueue_core::Outcome;

/// What happens to a key next: returned by a reconcile (`Ok(action)`) and by the error policy
/// (for a failed reconcile), as in kube-runtime.
///
/// | constructor | after a successful reconcile | from the error policy, after a failure |
/// |---|---|---|
/// | [`Action::await_change()`] | the limiter forgets the key; it runs again when it is added | give up: the limiter forgets the key; it runs again when it is added |
/// | [`Action::requeue(d)`](Action::requeue), `d > 0` | the limiter forgets the key; it runs again after `d` (polling) | retry after `d`, without asking the limiter |
/// | [`Action::backoff()`], or `requeue(Duration::ZERO)` | run again after the rate limiter's delay; the backoff is kept | retry after the rate limiter's delay (the default policy) |
///
/// A re-add is queued at the priority the key was handed out at
/// ([`Context::priority`](super::Context::priority); controller-runtime keeps it too) unless
/// [`with_priority`](Action::with_priority) names another (controller-runtime's
/// `Result.Priority`).
///
/// `requeue(Duration::ZERO)` differs from kube-runtime on purpose: kube-runtime runs the key again
/// at once, so a reconcile that always returns it loops on its key as fast as it can. Here it is
/// the rate-limited requeue, the same action as [`Action::backoff()`].
///
/// ```
/// use std::time::Duration;
/// use workqueue_tokio::LOW_PRIORITY;
/// use workqueue_tokio::runner::Action;
///
/// // Poll again in a minute, behind every key added at the default priority.
/// let poll = Action::requeue(Duration::from_secs(60)).with_priority(LOW_PRIORITY);
/// assert_ne!(poll, Action::requeue(Duration::from_secs(60)));
/// assert_eq!(Action::requeue(Duration::ZERO), Action::backoff());
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Action {
    next: Next,
    /// The re-add's priority; `None`: the lease's own. Always `None` for `AwaitChange`.
    priority: Option<i32>,
}

/// The re-add an [`Action`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    AwaitChange,
    /// A fixed delay, never zero.
    After(Duration),
    /// The rate limiter's delay.
    Backoff,
}

impl Action {
    /// Run the key again after `after`: polling after a success, a fixed retry delay from the
    /// error policy. `Duration::ZERO` is [`Action::backoff()`].
    #[must_use]
    pub const fn requeue(after: Duration) -> Self {
        let next = if after.is_zero() {
            Next::Backoff
        } else {
            Next::After(after)
        };
        Action {
            next,
            priority: None,
        }
    }

    /// Nothing to do until the key is added again (an event): the limiter forgets the key. From
    /// the error policy, this gives up on the failure.
    #[must_use]
    pub const fn await_change() -> Self {
        Action {
            next: Next::AwaitChange,
            priority: None,
        }
    }

    /// Run the key again after the rate limiter's delay (per-key exponential backoff with the
    /// default limiter). The default error policy's answer to every failure.
    #[must_use]
    pub const fn backoff() -> Self {
        Action {
            next: Next::Backoff,
            priority: None,
        }
    }

    /// This action with its re-add at `priority` instead of the priority the key was handed out
    /// at. [`Action::await_change()`] re-adds nothing and stays as it is.
    #[must_use]
    pub const fn with_priority(self, priority: i32) -> Self {
        match self.next {
            Next::AwaitChange => self,
            next => Action {
                next,
                priority: Some(priority),
            },
        }
    }

    /// Whether this action, from the error policy, gives up on the failure.
    const fn gives_up(&self) -> bool {
        matches!(self.next, Next::AwaitChange)
    }
}

/// As the constructors read: `await_change()`, `requeue(30s)`, `backoff().with_priority(-100)`.
impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.next {
            Next::AwaitChange => f.write_str("await_change()")?,
            Next::After(d) => write!(f, "requeue({d:?})")?,
            Next::Backoff => f.write_str("backoff()")?,
        }
        match self.priority {
            Some(p) => write!(f, ".with_priority({p})"),
            None => Ok(()),
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

/// What a runner's stream ([`Runner::results`](super::Runner::results)) yields besides
/// successful reconciles: a failed reconcile (after the error policy's action was applied), or
/// the end of a run whose store never became readable.
///
/// ```
/// use workqueue_tokio::runner::{Error, Failure};
///
/// let failed: Error<&str, std::io::Error> = Error::Failed("default/web", Failure::Timeout);
/// assert_eq!(failed.to_string(), "reconcile of default/web failed: reconcile timed out");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<T, E> {
    /// The reconcile of this key failed; the error policy's action was applied to it.
    Failed(T, Failure<E>),
    /// The readiness gate ([`Runner::readiness`](super::Runner::readiness)) was closed for good
    /// (its sender dropped) before it opened: no reconcile can ever start. The stream ends after
    /// it, once running reconciles finished.
    Readiness,
}

impl<T: fmt::Display, E: fmt::Display> fmt::Display for Error<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Failed(key, failure) => write!(f, "reconcile of {key} failed: {failure}"),
            Error::Readiness => {
                f.write_str("the readiness gate was dropped before it opened: nothing can run")
            }
        }
    }
}

/// The [`source`](std::error::Error::source) of a failure is the [`Failure`].
impl<T, E> std::error::Error for Error<T, E>
where
    T: fmt::Debug + fmt::Display,
    E: std::error::Error + 'static,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Failed(_, failure) => Some(failure),
            Error::Readiness => None,
        }
    }
}

/// The result of one reconcile, as the runner saw it: the runner's verdict on a lease.
#[derive(Debug)]
pub(super) enum Reconciled<E> {
    /// The reconcile succeeded with this action.
    Ok(Action),
    /// A failure, and the error policy's action for it.
    Failed(Failure<E>, Action),
    /// Dropped at shutdown after the grace periods: retried, so the key is not lost if the queue
    /// lives on.
    Interrupted,
}

impl<E> Reconciled<E> {
    /// The one place where a reconcile's result becomes queue operations (the table on
    /// [`Action`]): the lease's outcome, with the priority of the re-add it asks for. With
    /// `per_key_backoff`, a failure's `requeue(d)` waits the rate limiter's delay and at least
    /// `d`. What the outcome tells the outage detector is the engine's to add (it needs the failure
    /// counts and the user's classifier).
    pub(super) fn outcome(&self, per_key_backoff: bool) -> Outcome {
        let (outcome, priority) = match self {
            Reconciled::Ok(action) => {
                let outcome = match action.next {
                    Next::AwaitChange => Outcome::forget(),
                    Next::After(d) => Outcome::requeue_after(d),
                    // "Again, as soon as the limiter allows": never an unthrottled loop.
                    Next::Backoff => Outcome::retry(),
                };
                (outcome, action.priority)
            }
            Reconciled::Failed(_, action) => {
                let outcome = match action.next {
                    Next::AwaitChange => Outcome::forget(),
                    Next::After(d) if per_key_backoff => Outcome::retry_at_least(d),
                    Next::After(d) => Outcome::retry_after(d),
                    Next::Backoff => Outcome::retry(),
                };
                (outcome, action.priority)
            }
            Reconciled::Interrupted => (Outcome::retry(), None),
        };
        match priority {
            Some(p) => outcome.with_priority(p),
            None => outcome,
        }
    }

    /// Whether the outcome re-adds the key (everything but `await_change()`).
    pub(super) fn readds(&self) -> bool {
        match self {
            Reconciled::Ok(action) | Reconciled::Failed(_, action) => !action.gives_up(),
            Reconciled::Interrupted => true,
        }
    }

    /// controller-runtime's `result` label of this verdict (see the `metrics` module): a success
    /// by the re-add it asks for, whatever its priority; `None` for an interrupted reconcile.
    pub(super) fn result(&self) -> Option<&'static str> {
        match self {
            Reconciled::Ok(action) => Some(match action.next {
                Next::AwaitChange => "success",
                Next::After(_) => "requeue_after",
                Next::Backoff => "requeue",
            }),
            Reconciled::Failed(..) => Some("error"),
            Reconciled::Interrupted => None,
        }
    }

    /// Whether the error policy gave up on this failure.
    pub(super) fn given_up(&self) -> bool {
        matches!(self, Reconciled::Failed(_, action) if action.gives_up())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_map_to_outcomes() {
        let s = Duration::from_secs(1);
        let error = || Failure::Error(());
        let cases: [(Reconciled<()>, Outcome); 10] = [
            (Reconciled::Ok(Action::await_change()), Outcome::forget()),
            (
                Reconciled::Ok(Action::requeue(s)),
                Outcome::requeue_after(s),
            ),
            (
                Reconciled::Ok(Action::requeue(Duration::ZERO)),
                Outcome::retry(),
            ),
            (Reconciled::Ok(Action::backoff()), Outcome::retry()),
            (
                Reconciled::Ok(Action::requeue(Duration::from_nanos(1))),
                Outcome::requeue_after(Duration::from_nanos(1)),
            ),
            (
                Reconciled::Failed(Failure::Timeout, Action::backoff()),
                Outcome::retry(),
            ),
            (
                Reconciled::Failed(error(), Action::requeue(s)),
                Outcome::retry_after(s),
            ),
            (
                Reconciled::Failed(error(), Action::requeue(Duration::ZERO)),
                Outcome::retry(),
            ),
            (
                Reconciled::Failed(Failure::Panic("x".into()), Action::await_change()),
                Outcome::forget(),
            ),
            (Reconciled::Interrupted, Outcome::retry()),
        ];
        for (r, o) in cases {
            assert_eq!(r.outcome(false), o, "{r:?}: the lease's own priority");
        }
    }

    /// Per-key backoff changes only a failure's fixed delay: the limiter's delay, at least it.
    #[test]
    fn per_key_backoff_floors_a_failures_requeue_at_the_limiters_delay() {
        let s = Duration::from_secs(1);
        let failed = |a| Reconciled::Failed(Failure::Error(()), a);
        assert_eq!(
            failed(Action::requeue(s)).outcome(true),
            Outcome::retry_at_least(s)
        );
        assert_eq!(failed(Action::backoff()).outcome(true), Outcome::retry());
        assert_eq!(
            failed(Action::await_change()).outcome(true),
            Outcome::forget()
        );
        let ok = Reconciled::<()>::Ok(Action::requeue(s));
        assert_eq!(
            ok.outcome(true),
            Outcome::requeue_after(s),
            "a success polls at d"
        );
    }

    /// A priority changes the re-add's priority and nothing else: every case maps to the outcome
    /// its plain form maps to.
    #[test]
    fn a_chosen_priority_goes_with_the_same_outcome() {
        let s = Duration::from_secs(1);
        let cases: [(Reconciled<()>, Outcome); 7] = [
            (
                Reconciled::Ok(Action::requeue(s).with_priority(7)),
                Outcome::requeue_after(s).with_priority(7),
            ),
            (
                Reconciled::Ok(Action::backoff().with_priority(-100)),
                Outcome::retry().with_priority(-100),
            ),
            (
                Reconciled::Ok(Action::requeue(s).with_priority(1).with_priority(2)),
                Outcome::requeue_after(s).with_priority(2),
            ),
            // `await_change` re-adds nothing: no priority to carry.
            (
                Reconciled::Ok(Action::await_change().with_priority(7)),
                Outcome::forget(),
            ),
            (
                Reconciled::Failed(Failure::Error(()), Action::backoff().with_priority(3)),
                Outcome::retry().with_priority(3),
            ),
            (
                Reconciled::Failed(Failure::Timeout, Action::requeue(s).with_priority(i32::MIN)),
                Outcome::retry_after(s).with_priority(i32::MIN),
            ),
            (
                Reconciled::Failed(
                    Failure::Panic("x".into()),
                    Action::await_change().with_priority(9),
                ),
                Outcome::forget(),
            ),
        ];
        for (r, o) in cases {
            assert_eq!(r.outcome(false), o, "{r:?}");
        }
    }

    #[test]
    fn debug_reads_like_the_constructors() {
        assert_eq!(format!("{:?}", Action::await_change()), "await_change()");
        assert_eq!(
            format!("{:?}", Action::requeue(Duration::from_secs(30))),
            "requeue(30s)"
        );
        assert_eq!(
            format!("{:?}", Action::backoff().with_priority(-100)),
            "backoff().with_priority(-100)"
        );
    }

    #[test]
    fn only_await_change_from_the_policy_gives_up() {
        let failed = |a| Reconciled::Failed(Failure::Error(()), a);
        assert!(failed(Action::await_change()).given_up());
        assert!(!failed(Action::backoff()).given_up());
        assert!(!failed(Action::requeue(Duration::from_secs(1))).given_up());
        assert!(!Reconciled::<()>::Ok(Action::await_change()).given_up());
        assert!(!Reconciled::<()>::Interrupted.given_up());
    }
}
