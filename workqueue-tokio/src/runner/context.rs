//! What a reconcile and the error policy receive besides the key.

use std::fmt;
use std::sync::Arc;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// The context of one reconcile: the runner's shared data, its cancellation, its priority and
/// two counts of earlier failures. The error policy gets the same context for the failure it
/// decides on.
///
/// The shared data is the `Arc<C>` given once to [`Runner::with_context`](super::Runner::with_context)
/// (`()` without it): an API client, a cache, an event recorder. Every reconcile and every
/// policy decision sees the same `Arc`.
///
/// Two counts, kept by different parts, for different questions:
///
/// | count | kept by | advanced by | reset by |
/// |---|---|---|---|
/// | [`attempt`](Context::attempt) | the queue's rate limiter (its `num_requeues`) | every rate-limited retry (`Decision::Retry`, `Action::RequeueAfter(ZERO)`, `add_rate_limited`) | the limiter's forget: `Action::Done`, `Action::RequeueAfter(d > 0)`, `Decision::GiveUp`, `queue.forget` |
/// | [`failures`](Context::failures) | the runner | every failure (error, panic, timeout), whatever the policy decided, `Decision::RetryAfter(d)` included | any successful reconcile, and `Decision::GiveUp` |
///
/// `attempt` is the backoff's input: it says how long the limiter will make the key wait.
/// `failures` is the one to bound retries with: a policy that answers `RetryAfter(d)` never
/// charges the limiter, so `attempt` stays 0 there. Both count failures *before* this
/// reconcile: 0 on a first try, and the policy deciding on the `n`-th failure in a row sees
/// `n - 1`.
///
/// ```
/// use std::time::Duration;
/// use workqueue_tokio::runner::{Context, Decision, Failure};
///
/// struct State { /* a client, a recorder, ... */ }
///
/// // Retry every 30 s, at most 5 times, then give up.
/// let policy = |_key: &String, _failure: &Failure<std::io::Error>, ctx: &Context<State>| {
///     if ctx.failures() < 5 { Decision::RetryAfter(Duration::from_secs(30)) } else { Decision::GiveUp }
/// };
/// # let _ = policy;
/// ```
///
/// The context is cancelled when the reconcile times out, or when the runner shuts down and the
/// grace period for in-flight work has passed. A reconcile should stop promptly then; work it
/// spawned is not stopped by the runner, so it must not outlive the context.
///
/// Why a key was queued (a source, a requeue, a retry) is not here on purpose: it is in the
/// reconcile's tracing span (`reasons`) and metrics. A reconcile that branched on it would be
/// edge-triggered, and miss work when adds are de-duplicated; kube-runtime hides its
/// `ReconcileReason` from reconcilers for the same reason.
pub struct Context<C = ()> {
    data: Arc<C>,
    cancel: CancellationToken,
    attempt: u32,
    failures: u32,
    priority: i32,
}

impl<C> Context<C> {
    pub(crate) fn new(
        data: Arc<C>,
        cancel: CancellationToken,
        attempt: u32,
        failures: u32,
        priority: i32,
    ) -> Self {
        Context {
            data,
            cancel,
            attempt,
            failures,
            priority,
        }
    }

    /// The runner's shared data ([`Runner::with_context`](super::Runner::with_context)).
    pub fn data(&self) -> &Arc<C> {
        &self.data
    }

    /// How many failures the rate limiter has recorded for this key (its `num_requeues`; 0 on a
    /// first attempt). See the table above for how it differs from [`failures`](Context::failures).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How many times in a row this key has failed before this reconcile, as the runner counts
    /// it: every failure, whatever the policy decided; reset by a success or a give-up.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The priority the key was handed out at (0 unless it was added with one, see
    /// [`AddOptions`](crate::AddOptions)). A requeue or retry is queued at this priority unless
    /// the [`Action`](super::Action) or the [`Decision`](super::Decision) names another.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Whether the reconcile has been asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when the reconcile is asked to stop.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// The cancellation token, to hand to work the reconcile spawns.
    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }
}

// By hand: a context is cloneable and printable whatever `C` is.
impl<C> Clone for Context<C> {
    fn clone(&self) -> Self {
        Context {
            data: Arc::clone(&self.data),
            cancel: self.cancel.clone(),
            attempt: self.attempt,
            failures: self.failures,
            priority: self.priority,
        }
    }
}

impl<C> fmt::Debug for Context<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("attempt", &self.attempt)
            .field("failures", &self.failures)
            .field("priority", &self.priority)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}
