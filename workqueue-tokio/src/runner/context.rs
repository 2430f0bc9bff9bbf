//! What a reconcile receives besides its key.

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// The context of one reconcile: its attempt number, its priority and its cancellation.
///
/// The context is cancelled when the reconcile times out, or when the runner shuts down and the
/// grace period for in-flight work has passed. A reconcile should stop promptly then; work it
/// spawned is not stopped by the runner, so it must not outlive the context.
#[derive(Debug, Clone)]
pub struct Context {
    cancel: CancellationToken,
    attempt: u32,
    priority: i32,
}

impl Context {
    pub(crate) fn new(cancel: CancellationToken, attempt: u32, priority: i32) -> Self {
        Context {
            cancel,
            attempt,
            priority,
        }
    }

    /// How many failures the rate limiter has recorded for this key (0 on a first attempt).
    pub fn attempt(&self) -> u32 {
        self.attempt
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
