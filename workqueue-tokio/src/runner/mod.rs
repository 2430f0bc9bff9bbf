//! The controller runner: workers that lease keys, reconcile them and finish their leases.
//!
//! `N` workers loop: `get` → `reconcile(key, ctx)` → `lease.finish(outcome)`, where the outcome
//! comes from one mapping (DESIGN.md section 5):
//!
//! | reconcile returned | queue operation |
//! |---|---|
//! | `Ok(Action::Done)` | forget + done |
//! | `Ok(Action::RequeueAfter(d))` | forget + add_after(d) + done |
//! | `Err(e)`, a panic, or a timeout | the [`ErrorPolicy`] decides: `Retry` (rate-limited, the default), `RetryAfter(d)`, or `GiveUp` (forget + done) |
//!
//! Shutdown (the token given to [`Runner::run`]): intake stops at once; in-flight reconciles may
//! finish within the shutdown grace; then their contexts are cancelled; after the cancel grace
//! their futures are dropped and their keys retried. `run` then returns a [`Report`].
//!
//! ```
//! use std::time::Duration;
//! use tokio_util::sync::CancellationToken;
//! use workqueue_tokio::WorkQueue;
//! use workqueue_tokio::runner::{Action, Runner};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let queue: WorkQueue<String> = WorkQueue::new();
//! queue.add("default/web".to_string());
//! let runner = Runner::new(queue.clone(), |key: String, _ctx| async move {
//!     println!("reconciling {key}");
//!     Ok::<_, std::io::Error>(Action::Done)
//! })
//! .workers(4);
//! let stop = CancellationToken::new();
//! let run = tokio::spawn(runner.run(stop.clone()));
//! tokio::time::sleep(Duration::from_secs(1)).await;
//! queue.shut_down(); // or stop.cancel()
//! let report = run.await.unwrap();
//! assert_eq!(report.processed, 1);
//! # }
//! ```

mod action;
mod context;
pub mod metrics;
mod policy;
mod reconcile;
mod report;

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinSet;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use workqueue_core::state::DefaultHashBuilder;
use workqueue_core::{Lease, Outcome};

pub use action::{Action, Decision, Failure};
pub use context::Context;
pub use policy::{ErrorPolicy, MaxRetries, RetryAlways};
pub use reconcile::Reconcile;
pub use report::Report;

use crate::WorkQueue;
use action::Reconciled;
use metrics::{Ended, RunnerMetrics};
use report::Counters;

/// Runs a reconcile function over a queue's keys with `N` workers.
///
/// Built with [`Runner::new`] and configured with its builder methods; [`Runner::run`] runs it
/// until the queue shuts down (and is drained) or the shutdown token is cancelled.
#[must_use = "a runner does nothing until `run` is awaited"]
pub struct Runner<T, R, P = RetryAlways, S = DefaultHashBuilder> {
    queue: WorkQueue<T, S>,
    reconcile: R,
    policy: P,
    workers: usize,
    timeout: Option<Duration>,
    cancel_grace: Duration,
    shutdown_grace: Duration,
}

impl<T, R, S> Runner<T, R, RetryAlways, S> {
    /// A runner of `reconcile` over `queue`, with one worker, no timeout, the [`RetryAlways`]
    /// policy, a 30 s shutdown grace and a 5 s cancel grace.
    pub fn new(queue: WorkQueue<T, S>, reconcile: R) -> Self {
        Runner {
            queue,
            reconcile,
            policy: RetryAlways,
            workers: 1,
            timeout: None,
            cancel_grace: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

impl<T, R, P, S> Runner<T, R, P, S> {
    /// The number of workers (reconciles running at once). At least one: 0 is taken as 1.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// The policy that decides what happens to failed keys.
    pub fn error_policy<P2>(self, policy: P2) -> Runner<T, R, P2, S> {
        Runner {
            queue: self.queue,
            reconcile: self.reconcile,
            policy,
            workers: self.workers,
            timeout: self.timeout,
            cancel_grace: self.cancel_grace,
            shutdown_grace: self.shutdown_grace,
        }
    }

    /// A time limit per reconcile: past it the reconcile's context is cancelled, its future is
    /// dropped after the cancel grace, and it counts as [`Failure::Timeout`]. A limit too long to
    /// represent as an instant (`Duration::MAX`) is no limit.
    pub fn reconcile_timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// How long a reconcile whose context was cancelled may take to return before its future is
    /// dropped. Default 5 s. A grace too long to represent as an instant (`Duration::MAX`) is no
    /// limit: the runner waits until the reconcile returns.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// How long in-flight reconciles may run after shutdown before their contexts are cancelled.
    /// Default 30 s. A grace too long to represent as an instant (`Duration::MAX`) is no limit.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }
}

/// What the workers share.
struct Shared<T, R, P, S> {
    queue: WorkQueue<T, S>,
    reconcile: R,
    policy: P,
    timeout: Option<Duration>,
    cancel_grace: Duration,
    intake: CancellationToken,
    abort: CancellationToken,
    hard_stop: CancellationToken,
    counters: Counters,
    metrics: RunnerMetrics,
}

/// How one reconcile ended, before the policy is asked.
enum Ran<E> {
    Returned(Result<Action, E>),
    Panicked(String),
    TimedOut,
    Interrupted,
}

impl<T, R, P, S> Runner<T, R, P, S>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Debug + 'static,
    S: BuildHasher + Send + Sync + 'static,
    R: Reconcile<T>,
    P: ErrorPolicy<T, R::Error>,
{
    /// Runs the workers until the queue is shut down and drained, or `shutdown` is cancelled.
    ///
    /// Must run inside a tokio runtime (workers are tasks).
    pub async fn run(self, shutdown: CancellationToken) -> Report {
        let metrics = RunnerMetrics::new(self.queue.name());
        metrics.start(self.workers);
        let shared = Arc::new(Shared {
            queue: self.queue,
            reconcile: self.reconcile,
            policy: self.policy,
            timeout: self.timeout,
            cancel_grace: self.cancel_grace,
            intake: shutdown,
            abort: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            counters: Counters::default(),
            metrics,
        });
        let mut workers = JoinSet::new();
        for _ in 0..self.workers {
            workers.spawn(shared.clone().worker());
        }
        tokio::select! {
            biased;
            () = shared.intake.cancelled() => {
                if !join_within(&mut workers, self.shutdown_grace).await {
                    shared.abort.cancel();
                    if !join_within(&mut workers, self.cancel_grace).await {
                        shared.hard_stop.cancel();
                        join_all(&mut workers).await;
                    }
                }
            }
            () = join_all(&mut workers) => {}
        }
        shared.counters.report(shared.queue.len())
    }
}

/// Joins every worker unless `limit` passes first; whether they were all joined.
async fn join_within(workers: &mut JoinSet<()>, limit: Duration) -> bool {
    tokio::select! {
        biased;
        () = join_all(workers) => true,
        () = sleep_or_never(limit) => false,
    }
}

/// Completes `d` from now, or never when that instant cannot be represented: a limit that far
/// away is no limit. (tokio's `sleep` and `timeout` would end about 30 years from now instead;
/// `Instant + Duration` would panic.) Every runner deadline goes through here.
async fn sleep_or_never(d: Duration) {
    match tokio::time::Instant::now().checked_add(d) {
        Some(end) => sleep_until(end).await,
        None => std::future::pending().await,
    }
}

async fn join_all(workers: &mut JoinSet<()>) {
    while let Some(joined) = workers.join_next().await {
        if let Err(e) = joined {
            tracing::error!(error = %e, "a runner worker ended abnormally");
        }
    }
}

impl<T, R, P, S> Shared<T, R, P, S>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Debug + 'static,
    S: BuildHasher + Send + Sync + 'static,
    R: Reconcile<T>,
    P: ErrorPolicy<T, R::Error>,
{
    async fn worker(self: Arc<Self>) {
        loop {
            let lease = tokio::select! {
                biased;
                () = self.intake.cancelled() => return,
                lease = self.queue.get() => match lease {
                    Some(lease) => lease,
                    None => return,
                },
            };
            self.reconcile_one(lease).await;
        }
    }

    async fn reconcile_one(&self, lease: Lease<T>) {
        let key = lease.key().clone();
        let attempt = self.queue.num_requeues(&key);
        let span = tracing::info_span!("reconcile", key = ?key, attempt);
        let active = ActiveWorker::new(&self.metrics);
        let started = tokio::time::Instant::now();
        let ran = self
            .run_reconcile(key.clone(), attempt)
            .instrument(span.clone())
            .await;
        let elapsed = started.elapsed();
        drop(active);
        let _entered = span.enter();
        let counters = &self.counters;
        let failure = match ran {
            Ran::Returned(Ok(action)) => {
                Counters::bump(&counters.processed);
                let ended = match action {
                    Action::RequeueAfter(_) => Ended::RequeueAfter,
                    _ => Ended::Success,
                };
                self.metrics.reconciled(ended, elapsed);
                return finish(lease, Reconciled::<R::Error>::Ok(action).outcome());
            }
            Ran::Interrupted => {
                Counters::bump(&counters.interrupted);
                return finish(lease, Outcome::Retry);
            }
            Ran::Returned(Err(e)) => {
                Counters::bump(&counters.errors);
                tracing::warn!(error = ?e, "reconcile failed");
                Failure::Error(e)
            }
            Ran::Panicked(message) => {
                Counters::bump(&counters.panics);
                tracing::error!(panic = %message, "reconcile panicked");
                Failure::Panic(message)
            }
            Ran::TimedOut => {
                Counters::bump(&counters.timeouts);
                tracing::warn!("reconcile timed out");
                Failure::Timeout
            }
        };
        // The policy is user code too: a panicking policy retries rather than killing the worker.
        let decision = catch_unwind(AssertUnwindSafe(|| {
            self.policy.decide(&key, &failure, attempt)
        }))
        .unwrap_or(Decision::Retry);
        match decision {
            Decision::GiveUp => Counters::bump(&counters.given_up),
            _ => Counters::bump(&counters.retried),
        }
        let (timeout, panic) = (
            matches!(failure, Failure::Timeout),
            matches!(failure, Failure::Panic(_)),
        );
        let ended = match decision {
            Decision::GiveUp => Ended::GivenUp { timeout, panic },
            _ if panic => Ended::Panic,
            _ if timeout => Ended::Timeout,
            _ => Ended::Error,
        };
        self.metrics.reconciled(ended, elapsed);
        finish(lease, Reconciled::Failed(failure, decision).outcome());
    }

    async fn run_reconcile(&self, key: T, attempt: u32) -> Ran<R::Error> {
        let token = self.abort.child_token();
        let ctx = Context::new(token.clone(), attempt);
        let started = catch_unwind(AssertUnwindSafe(|| self.reconcile.reconcile(key, ctx)));
        let fut = match started {
            Ok(fut) => fut,
            Err(payload) => return Ran::Panicked(workqueue_core::panic_message(&*payload)),
        };
        let mut fut = pin!(AssertUnwindSafe(fut).catch_unwind());
        let returned = |r: std::thread::Result<Result<Action, R::Error>>| match r {
            Ok(r) => Ran::Returned(r),
            Err(payload) => Ran::Panicked(workqueue_core::panic_message(&*payload)),
        };
        let limit = async {
            match self.timeout {
                Some(t) => sleep_or_never(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            r = &mut fut => returned(r),
            () = self.hard_stop.cancelled() => Ran::Interrupted,
            () = limit => {
                token.cancel();
                tokio::select! {
                    biased;
                    _ = &mut fut => {}
                    () = sleep_or_never(self.cancel_grace) => {}
                    () = self.hard_stop.cancelled() => {}
                }
                Ran::TimedOut
            }
        }
    }
}

/// Counts a worker as active while it lives (also when its reconcile is dropped at shutdown).
struct ActiveWorker<'a>(&'a RunnerMetrics);

impl<'a> ActiveWorker<'a> {
    fn new(metrics: &'a RunnerMetrics) -> Self {
        metrics.active(1.0);
        ActiveWorker(metrics)
    }
}

impl Drop for ActiveWorker<'_> {
    fn drop(&mut self) {
        self.0.active(-1.0);
    }
}

/// Finishes a lease. The queue finishes the key even when the rate limiter panics, then re-raises
/// the panic; the worker catches it here so it survives, as it does a panicking reconcile.
fn finish<T>(lease: Lease<T>, outcome: Outcome) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| lease.finish(outcome))) {
        tracing::error!(
            panic = %workqueue_core::panic_message(&*payload),
            "the rate limiter panicked while finishing a key"
        );
    }
}

impl<T, R, P, S> fmt::Debug for Runner<T, R, P, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("workers", &self.workers)
            .field("timeout", &self.timeout)
            .field("cancel_grace", &self.cancel_grace)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish_non_exhaustive()
    }
}
