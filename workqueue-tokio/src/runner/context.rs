//! What a reconcile and the error policy receive besides the key.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

/// The context of one reconcile: the runner's shared data, its cancellation, its priority and
/// two counts of earlier failures. The error policy gets the same context for the failure it
/// decides on.
///
/// The shared data is the `Arc<C>` given once to [`Runner::with_context`](super::Runner::with_context)
/// (`()` without it): an API client, a cache, an event recorder. Every reconcile and every
/// policy decision sees the same `Arc`.
///
/// Two counts of the key's earlier failures, each named for what it counts:
///
/// - [`failures_in_a_row`](Context::failures_in_a_row): every failure (error, panic, timeout)
///   since the key's last success, whatever the error policy answered. Bound retries with it.
/// - [`rate_limited_retries`](Context::rate_limited_retries): how many times the rate limiter has
///   delayed the key since it last forgot it (its `num_requeues`); the limiter's backoff grows
///   with it. A policy that answers `Action::requeue(d)` never asks the limiter, so this count
///   stays where it was; a success or a give-up (`Action::await_change()`, `requeue(d > 0)` after
///   a success) resets it.
///
/// Both count what happened *before* this reconcile: 0 on a first try, and the policy deciding
/// on the `n`-th failure in a row sees `failures_in_a_row() == n - 1`.
///
/// ```
/// use std::time::Duration;
/// use workqueue_tokio::runner::{Action, Context, Failure};
///
/// struct State { /* a client, a recorder, ... */ }
///
/// // Retry every 30 s, at most 5 times, then give up until the object changes.
/// let policy = |_key: &String, _failure: &Failure<std::io::Error>, ctx: &Context<State>| {
///     if ctx.failures_in_a_row() < 5 { Action::requeue(Duration::from_secs(30)) } else { Action::await_change() }
/// };
/// # let _ = policy;
/// ```
///
/// Its [`token`](Context::token) is cancelled when the reconcile times out, or when the runner
/// shuts down and the grace period for in-flight work has passed. A reconcile should stop
/// promptly then; work it spawned is not stopped by the runner, so it must not outlive the
/// token. (An [aborted](super::Aborts) reconcile is dropped without being asked first.)
///
/// Why a key was queued (a source, a requeue, a retry) is not here on purpose: it is in the
/// reconcile's tracing span (`reasons`) and metrics. A reconcile that branched on it would be
/// edge-triggered, and miss work when adds are de-duplicated; kube-runtime hides its
/// `ReconcileReason` from reconcilers for the same reason.
pub struct Context<C = ()> {
    data: Arc<C>,
    cancel: Arc<Cancel>,
    rate_limited_retries: u32,
    failures_in_a_row: u32,
    priority: i32,
}

/// A reconcile's cancellation, shared by its context's clones and the runner: cancelled when the
/// run's contexts are (at shutdown, after the grace) or when this reconcile times out. Its token
/// is made only when the reconcile asks for it: most reconciles never do, and a token linked to
/// the run's costs two locks of the run's token (made and dropped).
///
/// Invariant: once `own` is set, the token (made before or after) is cancelled: `cancel_own` sets
/// `own` then cancels the token if it exists; `token` makes it, then cancels it if `own` is set
/// (both sides fence, so at least one of them sees the other's write).
pub(super) struct Cancel {
    run: Arc<CancellationToken>,
    own: AtomicBool,
    token: OnceLock<CancellationToken>,
}

impl Cancel {
    pub(super) fn new(run: Arc<CancellationToken>) -> Arc<Self> {
        Arc::new(Cancel {
            run,
            own: AtomicBool::new(false),
            token: OnceLock::new(),
        })
    }

    /// Cancels this reconcile alone (its timeout).
    pub(super) fn cancel_own(&self) {
        self.own.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if let Some(token) = self.token.get() {
            token.cancel();
        }
    }

    /// Whether cancelled, without making the token.
    fn is_cancelled(&self) -> bool {
        self.own.load(Ordering::SeqCst) || self.run.is_cancelled()
    }

    fn token(&self) -> &CancellationToken {
        let token = self.token.get_or_init(|| self.run.child_token());
        fence(Ordering::SeqCst);
        if self.own.load(Ordering::SeqCst) {
            token.cancel();
        }
        token
    }
}

impl<C> Context<C> {
    pub(super) fn new(
        data: Arc<C>,
        cancel: Arc<Cancel>,
        rate_limited_retries: u32,
        failures_in_a_row: u32,
        priority: i32,
    ) -> Self {
        Context {
            data,
            cancel,
            rate_limited_retries,
            failures_in_a_row,
            priority,
        }
    }

    /// The runner's shared data ([`Runner::with_context`](super::Runner::with_context)).
    pub fn data(&self) -> &Arc<C> {
        &self.data
    }

    /// How many times the rate limiter has delayed this key since it last forgot it (its
    /// `num_requeues`): what the limiter's backoff grows with. 0 on a first try.
    pub fn rate_limited_retries(&self) -> u32 {
        self.rate_limited_retries
    }

    /// How many times in a row this key has failed before this reconcile: every failure, whatever
    /// the error policy answered; reset by a success or a give-up.
    pub fn failures_in_a_row(&self) -> u32 {
        self.failures_in_a_row
    }

    /// The priority the key was handed out at (0 unless it was added with one, see
    /// [`AddOptions`](crate::AddOptions)). A requeue or retry is queued at this priority unless
    /// the [`Action`](super::Action) names another.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// The reconcile's cancellation: cancelled when the reconcile times out, or when the runner
    /// shuts down and the grace for in-flight work has passed. Await `token().cancelled()` to
    /// stop promptly, check `token().is_cancelled()`, or hand it (or a child) to work the
    /// reconcile spawns.
    ///
    /// ```
    /// use workqueue_tokio::runner::{Action, Context};
    ///
    /// async fn reconcile(_key: String, ctx: Context) -> Result<Action, std::io::Error> {
    ///     tokio::select! {
    ///         () = ctx.token().cancelled() => Err(std::io::Error::other("stopped")),
    ///         () = tokio::time::sleep(std::time::Duration::from_secs(1)) => Ok(Action::await_change()),
    ///     }
    /// }
    /// # let _ = reconcile;
    /// ```
    pub fn token(&self) -> &CancellationToken {
        self.cancel.token()
    }

    /// The shared cancellation (for the runner's timeout).
    pub(super) fn cancel(&self) -> &Cancel {
        &self.cancel
    }
}

// By hand: a context is cloneable and printable whatever `C` is.
impl<C> Clone for Context<C> {
    fn clone(&self) -> Self {
        Context {
            data: Arc::clone(&self.data),
            cancel: Arc::clone(&self.cancel),
            rate_limited_retries: self.rate_limited_retries,
            failures_in_a_row: self.failures_in_a_row,
            priority: self.priority,
        }
    }
}

impl<C> fmt::Debug for Context<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("rate_limited_retries", &self.rate_limited_retries)
            .field("failures_in_a_row", &self.failures_in_a_row)
            .field("priority", &self.priority)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}
