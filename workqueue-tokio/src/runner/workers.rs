//! The runner's worker tasks, and the one way its configurable limits become timers.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

/// The worker tasks. A worker that ends with a panic is replaced unless intake has stopped:
/// defence in depth, since the runner catches the panics of everything it calls.
pub(super) struct Workers<F> {
    tasks: JoinSet<()>,
    new_worker: F,
    intake: CancellationToken,
    /// Workers that ended with a panic.
    pub(super) panics: u64,
}

impl<F, W> Workers<F>
where
    F: Fn() -> W,
    W: Future<Output = ()> + Send + 'static,
{
    pub(super) fn start(n: usize, intake: CancellationToken, new_worker: F) -> Self {
        let mut tasks = JoinSet::new();
        for _ in 0..n {
            tasks.spawn(new_worker());
        }
        Workers {
            tasks,
            new_worker,
            intake,
            panics: 0,
        }
    }

    /// Joins every worker (cancel-safe: a worker started here is in the set at once).
    pub(super) async fn join_all(&mut self) {
        while let Some(joined) = self.tasks.join_next().await {
            let Err(e) = joined else { continue };
            if !e.is_panic() {
                tracing::error!(error = %e, "a runner worker was cancelled");
                continue;
            }
            self.panics += 1;
            if self.intake.is_cancelled() {
                tracing::error!(error = %e, "a runner worker panicked during shutdown");
            } else {
                tracing::error!(error = %e, "a runner worker panicked; starting another");
                self.tasks.spawn((self.new_worker)());
            }
        }
    }

    /// Joins every worker unless `limit` passes first; whether they were all joined.
    pub(super) async fn join_within(&mut self, limit: Duration) -> bool {
        tokio::select! {
            biased;
            () = self.join_all() => true,
            () = sleep_or_never(limit) => false,
        }
    }
}

/// Completes `d` from now, or never when that instant cannot be represented: a limit that far
/// away is no limit. (tokio's `sleep` and `timeout` would end about 30 years from now instead;
/// `Instant + Duration` would panic.) Every configurable runner limit goes through here.
pub(super) async fn sleep_or_never(d: Duration) {
    match tokio::time::Instant::now().checked_add(d) {
        Some(end) => sleep_until(end).await,
        None => std::future::pending().await,
    }
}
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

    use super::*;

    /// Workers whose first incarnation panics (the runner's own catches are bypassed here).
    fn panicking_first(
        started: &Arc<AtomicU32>,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + use<> {
        let started = started.clone();
        move || {
            let first = started.fetch_add(1, SeqCst) == 0;
            Box::pin(async move {
                tokio::task::yield_now().await;
                assert!(!first, "worker panicked (expected by this test)");
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_panics_is_replaced_and_counted() {
        let started = Arc::new(AtomicU32::new(0));
        let mut workers = Workers::start(1, CancellationToken::new(), panicking_first(&started));
        workers.join_all().await;
        assert_eq!((workers.panics, started.load(SeqCst)), (1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_panics_after_intake_stopped_is_counted_not_replaced() {
        let started = Arc::new(AtomicU32::new(0));
        let intake = CancellationToken::new();
        let mut workers = Workers::start(1, intake.clone(), panicking_first(&started));
        intake.cancel();
        workers.join_all().await;
        assert_eq!((workers.panics, started.load(SeqCst)), (1, 1));
    }
}
