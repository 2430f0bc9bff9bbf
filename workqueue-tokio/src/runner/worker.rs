//! One worker's loop: lease a key, reconcile it, let the error policy judge a failure, and
//! finish the lease by the one mapping ([`Reconciled::outcome`]).

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use workqueue_core::ratelimit::Signal;
use workqueue_core::{Lease, Outcome};

use super::action::{Finish, Reconciled};
use super::catch::catch;
use super::failures::FailureCounts;
use super::metrics::RunnerMetrics;
use super::reasons::{self, Reasons};
use super::report::Counters;
use super::workers::sleep_or_never;
use super::{Action, Classifier, Context, Failure, Policy, Reconcile};
use crate::WorkQueue;

/// How long a worker pauses after the queue's `get` panicked before it asks for a key again (a key
/// whose `Clone` always panics would otherwise make it spin). The pause ends early when the
/// shutdown token is cancelled.
const GET_PANIC_PAUSE: Duration = Duration::from_millis(100);

/// What the workers share.
pub(super) struct Shared<T, R: Reconcile<T, C>, C, S> {
    pub(super) queue: WorkQueue<T, S>,
    pub(super) reconcile: R,
    pub(super) policy: Box<Policy<T, R::Error, C>>,
    pub(super) context: Arc<C>,
    pub(super) timeout: Option<Duration>,
    pub(super) cancel_grace: Duration,
    pub(super) intake: CancellationToken,
    pub(super) abort: CancellationToken,
    pub(super) hard_stop: CancellationToken,
    pub(super) counters: Arc<Counters>,
    pub(super) failures: FailureCounts<T>,
    pub(super) reasons: Arc<Reasons<T>>,
    pub(super) metrics: RunnerMetrics,
    /// The controller's name in the reconcile span (the queue's, or `"unnamed"`).
    pub(super) controller: Arc<str>,
    pub(super) failure_log: Option<tracing::Level>,
    /// Whether outage detection is on (signals are computed only then).
    pub(super) outage: bool,
    /// The user's classifier ([`Runner::outage_classifier`](super::Runner::outage_classifier)).
    pub(super) classifier: Option<Box<Classifier<R::Error>>>,
}

/// How one reconcile ended, before the policy is asked.
pub(super) enum Ran<E> {
    Returned(Result<Action, E>),
    Panicked(String),
    TimedOut,
    Interrupted,
}

impl<T, R, C, S> Shared<T, R, C, S>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Reconcile<T, C>,
{
    pub(super) async fn worker(self: Arc<Self>) {
        loop {
            let got = tokio::select! {
                biased;
                () = self.intake.cancelled() => return,
                got = AssertUnwindSafe(self.queue.get()).catch_unwind() => got,
            };
            match got {
                Ok(Some(lease)) => self.process(lease).await,
                Ok(None) => return,
                Err(payload) => {
                    // No key was leased (the queue is as it was before the call). If `get` panics
                    // on every call, this pause keeps the worker from spinning.
                    Counters::bump(&self.counters.get_panics);
                    tracing::error!(
                        panic = %workqueue_core::panic_message(&*payload),
                        "the queue's get panicked (a key's Clone or a metrics recorder); \
                         the worker pauses, then goes on"
                    );
                    tokio::select! {
                        biased;
                        () = self.intake.cancelled() => return,
                        () = tokio::time::sleep(GET_PANIC_PAUSE) => {}
                    }
                }
            }
        }
    }

    /// Handles one lease: every panic in the code it calls fails this key, the error policy
    /// decides, and the lease is finished by that decision.
    async fn process(&self, lease: Lease<T>) {
        let key = lease.key();
        let started = tokio::time::Instant::now();
        // The counts, the reasons and the span are caught one by one: a panic in one still leaves
        // the others (the policy needs the counts, the logs want the span).
        let mut early = None;
        let mut caught = |message| {
            early.get_or_insert(message);
        };
        let rate_limited_retries = catch(|| self.queue.num_requeues(key)).unwrap_or_else(|m| {
            caught(m);
            0
        });
        let failures_in_a_row = catch(|| self.failures.get(key)).unwrap_or_else(|m| {
            caught(m);
            0
        });
        let reasons = catch(|| self.reasons.take(key)).unwrap_or_else(|m| {
            caught(m);
            self.reasons.unknown()
        });
        if let Err(message) = catch(|| self.metrics.queued_for(&reasons)) {
            caught(message);
        }
        let priority = lease.priority();
        let span = catch(|| {
            tracing::info_span!(
                "reconcile",
                controller = %self.controller,
                key = %key,
                reconcile_id = %ReconcileId::next(),
                rate_limited_retries,
                failures_in_a_row,
                priority,
                reasons = %reasons,
            )
        })
        .unwrap_or_else(|message| {
            caught(message);
            tracing::Span::none()
        });
        let ctx = Context::new(
            self.context.clone(),
            self.abort.child_token(),
            rate_limited_retries,
            failures_in_a_row,
            priority,
        );
        let judged = AssertUnwindSafe(self.judge(key, &ctx, early).instrument(span.clone()))
            .catch_unwind()
            .await;
        let verdict = match judged {
            Ok(verdict) => verdict,
            Err(payload) => {
                let message = workqueue_core::panic_message(&*payload);
                self.after_panic(&span, key, message, &ctx, started.elapsed())
            }
        };
        self.counters.count(&verdict);
        let signal = self
            .outage
            .then(|| self.signal(&verdict, failures_in_a_row));
        let finish = verdict.outcome().with_signal(signal);
        self.record(key, &verdict, finish.outcome);
        finish_lease(lease, finish);
    }

    /// What a verdict tells the outage detector: a success, a first failure (the key had no
    /// failure in a row), a failure, or nothing (a per-object failure by the user's
    /// classification, an interrupted reconcile). Never panics: a classifier that panics counts
    /// the failure.
    fn signal(&self, verdict: &Reconciled<R::Error>, failures: u32) -> Signal {
        let (failure, action) = match verdict {
            Reconciled::Ok(_) => return Signal::Success,
            Reconciled::Interrupted => return Signal::Ignored,
            Reconciled::Failed(failure, action) => (failure, action),
        };
        let shared = match &self.classifier {
            None => true,
            Some(classify) => catch(|| classify(failure, action)).unwrap_or_else(|message| {
                let _ = catch(|| tracing::error!(panic = %message, "the outage classifier panicked; the failure counts"));
                true
            }),
        };
        match (shared, failures) {
            (false, _) => Signal::Ignored,
            (true, 0) => Signal::FirstFailure,
            (true, _) => Signal::Failure,
        }
    }

    /// Records a verdict in the runner's failure counts, and the reason of the re-add the
    /// outcome asks for. Never panics (a key's `Hash`, `Eq` or `Clone` may: logged).
    fn record(&self, key: &T, verdict: &Reconciled<R::Error>, outcome: Outcome) {
        if let Err(message) = catch(|| self.failures.record(key, verdict)) {
            let _ = catch(|| tracing::error!(panic = %message, "counting a failure panicked"));
        }
        let reason = match (verdict, outcome) {
            (_, Outcome::Done | Outcome::Forget) => return,
            (Reconciled::Ok(_), _) => reasons::REQUEUE,
            _ => reasons::RETRY,
        };
        if let Err(message) = catch(|| self.reasons.mark([key], reason)) {
            let _ = catch(|| tracing::error!(panic = %message, "recording a reason panicked"));
        }
    }

    /// Reconciles `key` (unless `early` says what panicked before the reconcile), asks the policy
    /// about a failure, and emits the metrics. A panic anywhere here is the caller's to catch.
    async fn judge(
        &self,
        key: &T,
        ctx: &Context<C>,
        early: Option<String>,
    ) -> Reconciled<R::Error> {
        let started = tokio::time::Instant::now();
        let ran = match early {
            Some(message) => Ran::Panicked(message),
            None => {
                let owned = key.clone();
                let active = ActiveWorker::new(&self.metrics);
                let ran = self.run_reconcile(owned, ctx).await;
                active.end();
                ran
            }
        };
        let failure = match ran {
            Ran::Returned(Ok(action)) => Ok(Reconciled::Ok(action)),
            Ran::Interrupted => Ok(Reconciled::Interrupted),
            Ran::Returned(Err(e)) => Err(Failure::Error(e)),
            Ran::Panicked(message) => Err(Failure::Panic(message)),
            Ran::TimedOut => Err(Failure::Timeout),
        };
        let verdict = failure.unwrap_or_else(|failure| self.decide(key, failure, ctx));
        log_failure(self.failure_log, &verdict);
        self.metrics.reconciled(&verdict, started.elapsed());
        verdict
    }

    /// The verdict on a key whose handling panicked outside the reconcile's own catches. Nothing
    /// here may panic out: it is what finishes the lease. (A metrics recorder that panics after
    /// the policy decided makes this ask the policy again, about that panic; the later decision
    /// counts.)
    fn after_panic(
        &self,
        span: &tracing::Span,
        key: &T,
        message: String,
        ctx: &Context<C>,
        elapsed: Duration,
    ) -> Reconciled<R::Error> {
        let verdict = self.decide(key, Failure::Panic(message), ctx);
        let _ = catch(|| span.in_scope(|| log_failure(self.failure_log, &verdict)));
        if let Err(message) = catch(|| self.metrics.reconciled(&verdict, elapsed)) {
            let _ = catch(|| tracing::error!(panic = %message, "the metrics recorder panicked"));
        }
        verdict
    }

    /// The policy's action for `failure`. The policy is user code too: its panic becomes the
    /// key's failure, about which it is asked once more; a second panic backs off. Never panics.
    fn decide(
        &self,
        key: &T,
        failure: Failure<R::Error>,
        ctx: &Context<C>,
    ) -> Reconciled<R::Error> {
        let message = match catch(|| (self.policy)(key, &failure, ctx)) {
            Ok(action) => return Reconciled::Failed(failure, action),
            Err(message) => message,
        };
        let _ = catch(|| tracing::error!(panic = %message, "the error policy panicked"));
        let failure = Failure::Panic(message);
        let action = catch(|| (self.policy)(key, &failure, ctx)).unwrap_or(Action::backoff());
        Reconciled::Failed(failure, action)
    }

    async fn run_reconcile(&self, key: T, ctx: &Context<C>) -> Ran<R::Error> {
        let token = ctx.token();
        let fut = match catch(|| self.reconcile.reconcile(key, ctx.clone())) {
            Ok(fut) => fut,
            Err(message) => return Ran::Panicked(message),
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

/// Counts a worker as active from `new` to `end`, or to its drop (a reconcile dropped at shutdown,
/// or a panic on the way).
struct ActiveWorker<'a>(Option<&'a RunnerMetrics>);

impl<'a> ActiveWorker<'a> {
    fn new(metrics: &'a RunnerMetrics) -> Self {
        metrics.active(1.0);
        ActiveWorker(Some(metrics))
    }

    /// The reconcile is over. A recorder that panics here panics to the caller (who fails the
    /// key); the drop then tries once more, so the gauge stays right.
    fn end(mut self) {
        if let Some(metrics) = self.0 {
            metrics.active(-1.0);
            self.0 = None;
        }
    }
}

impl Drop for ActiveWorker<'_> {
    fn drop(&mut self) {
        if let Some(metrics) = self.0.take()
            && let Err(message) = catch(|| metrics.active(-1.0))
        {
            let _ = catch(|| tracing::error!(panic = %message, "the metrics recorder panicked"));
        }
    }
}

/// Finishes a lease as `finish` says. The queue finishes the key even when the rate limiter
/// panics, then re-raises the panic; the worker catches it here so it survives, as it does a
/// panicking reconcile.
fn finish_lease<T>(lease: Lease<T>, finish: Finish) {
    let lease = match finish.priority {
        Some(p) => lease.with_priority(p),
        None => lease,
    };
    let finished = catch(|| match finish.signal {
        Some(signal) => lease.finish_signalled(finish.outcome, signal),
        None => lease.finish(finish.outcome),
    });
    if let Err(message) = finished {
        tracing::error!(
            panic = %message,
            "the rate limiter panicked while finishing a key"
        );
    }
}

/// The one event of a failed reconcile, at `level` (see [`Runner::failure_log`](super::Runner::failure_log)).
fn log_failure<E: fmt::Debug>(level: Option<tracing::Level>, verdict: &Reconciled<E>) {
    let (Some(level), Reconciled::Failed(failure, action)) = (level, verdict) else {
        return;
    };
    // `tracing` wants a constant level per call site: one per level.
    macro_rules! event {
        ($level:expr) => {
            match failure {
                Failure::Error(e) => {
                    tracing::event!($level, error = ?e, ?action, "reconcile failed")
                }
                Failure::Panic(m) => {
                    tracing::event!($level, panic = %m, ?action, "reconcile panicked")
                }
                Failure::Timeout => tracing::event!($level, ?action, "reconcile timed out"),
            }
        };
    }
    match level {
        tracing::Level::ERROR => event!(tracing::Level::ERROR),
        tracing::Level::WARN => event!(tracing::Level::WARN),
        tracing::Level::INFO => event!(tracing::Level::INFO),
        tracing::Level::DEBUG => event!(tracing::Level::DEBUG),
        _ => event!(tracing::Level::TRACE),
    }
}

/// A reconcile's id in its span (controller-runtime's `reconcileID`): unique in the process, and
/// across restarts with high probability (a random prefix per process).
struct ReconcileId(u64);

impl ReconcileId {
    fn next() -> Self {
        use std::hash::BuildHasher;
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicU32, Ordering};
        static PREFIX: OnceLock<u32> = OnceLock::new();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let prefix = *PREFIX.get_or_init(|| std::hash::RandomState::new().hash_one(0u8) as u32);
        ReconcileId(u64::from(prefix) << 32 | u64::from(NEXT.fetch_add(1, Ordering::Relaxed)))
    }
}

impl fmt::Display for ReconcileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}
