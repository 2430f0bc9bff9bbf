//! What the runner does for one lease, step by step, whoever calls the reconcile: the runner's
//! workers, or a front end that calls user code on a task of its own (`workqueue-kube`'s
//! `Controller`, through this crate's unstable seam).
//!
//! A lease goes through [`Engine::begin`] (the counts, the reasons, the span and the context),
//! [`Engine::drive`] (the reconcile's future under the runner's limits: timeout, cancel grace,
//! hard stop, panics caught), [`Engine::judge`] (the error policy on a failure, the failure
//! event, the metrics) and [`Engine::finish`] (the report's counters, the outage signal, the
//! failure counts and reasons, and the lease's outcome by the one mapping,
//! [`Reconciled::outcome`]). None of the four lets a panic of user code out.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use workqueue_core::ratelimit::Signal;
use workqueue_core::state::OutageEvent;
use workqueue_core::{Lease, Outcome};

use super::action::Reconciled;
use super::catch::catch;
use super::failures::FailureCounts;
use super::feed::{Feeder, Source};
use super::metrics::{self, RunnerMetrics};
use super::reasons::{self, Reasons};
use super::report::{Counters, Report};
use super::workers::sleep_or_never;
use super::{Action, Context, Failure};
use crate::WorkQueue;

/// Whether a failure may be a shared outage (see `Runner::outage_classifier`).
pub(crate) type Classifier<E> = dyn Fn(&Failure<E>, &Action) -> bool + Send + Sync;

/// How an engine runs reconciles: the runner's settings that apply to every lease.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The time limit of one reconcile (`None`: none).
    pub timeout: Option<Duration>,
    /// How long a reconcile whose context was cancelled may take before its future is dropped.
    pub cancel_grace: Duration,
    /// The level of the failure event (`None`: no event).
    pub failure_log: Option<tracing::Level>,
    /// Whether a failure's `Action::requeue(d)` waits the rate limiter's delay, at least `d`.
    pub per_key_backoff: bool,
    /// Whether the front end stops reconciles by aborting their tasks, and its reconciles see
    /// no [`Context`]: then a context is not linked to [`Engine::abort`] (a linked token costs a
    /// lock on the runner's token at each reconcile's start and end), and [`Engine::drive`] does
    /// not watch [`Engine::hard_stop`].
    pub stopped_by_abort: bool,
}

/// Everything the per-lease steps share. Built by [`Engine::start`], which also starts the
/// source readers; shared by every task that handles leases.
pub struct Engine<T, E, C, S> {
    queue: WorkQueue<T, S>,
    context: Arc<C>,
    limits: Limits,
    /// Cancelled when intake stops (the shutdown token).
    intake: CancellationToken,
    /// Cancelled to ask running reconciles to stop (their contexts are its children).
    abort: CancellationToken,
    /// Cancelled to drop running reconciles.
    hard_stop: CancellationToken,
    counters: Arc<Counters>,
    failures: FailureCounts<T>,
    reasons: Arc<Reasons<T>>,
    metrics: RunnerMetrics,
    /// The controller's name in the reconcile span (the queue's, or `"unnamed"`).
    controller: Arc<str>,
    /// Whether outage detection is on (signals are computed only then).
    outage: bool,
    classifier: Option<Box<Classifier<E>>>,
    feeder: Arc<Feeder<T, S>>,
}

/// A lease's state between [`Engine::begin`] and [`Engine::finish`].
#[derive(Debug)]
pub struct Begun<C> {
    /// The reconcile's context (and the error policy's).
    pub ctx: Context<C>,
    /// The reconcile's span: instrument the reconcile's future with it.
    pub span: tracing::Span,
    /// A panic of user code before the reconcile (the key's `Clone` or `Display`, the limiter, a
    /// recorder): the reconcile must not run, and the lease fails with it.
    pub early: Option<String>,
    started: tokio::time::Instant,
}

/// How one reconcile ended, before the policy is asked.
#[derive(Debug)]
pub enum Ran<E> {
    /// The reconcile returned.
    Returned(Result<Action, E>),
    /// The reconcile (or the code that started it) panicked with this message.
    Panicked(String),
    /// The reconcile outlived the timeout.
    TimedOut,
    /// The reconcile was dropped at shutdown.
    Interrupted,
}

impl<T, E, C, S> Engine<T, E, C, S>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    E: fmt::Debug + Send + 'static,
    C: Send + Sync + 'static,
{
    /// An engine over `queue` that starts reading `sources` at once; `workers` is what the
    /// metrics report as the concurrency. Intake stops when `shutdown` is cancelled.
    pub fn start(
        queue: WorkQueue<T, S>,
        context: Arc<C>,
        limits: Limits,
        classifier: Option<Box<Classifier<E>>>,
        sources: Vec<Source<T>>,
        workers: usize,
        shutdown: CancellationToken,
    ) -> (Arc<Self>, JoinSet<()>) {
        let names: Arc<[Arc<str>]> = sources.iter().map(|s| s.name.clone()).collect();
        let metrics = RunnerMetrics::new(queue.name(), &names);
        let controller = Arc::from(queue.name().unwrap_or(metrics::UNNAMED));
        if let Err(message) = catch(|| metrics.start(workers)) {
            tracing::error!(panic = %message, "the metrics recorder panicked; the runner goes on");
        }
        let counters = Arc::new(Counters::default());
        let reasons = Arc::new(Reasons::new(names));
        let feeder = Arc::new(Feeder {
            queue: queue.clone(),
            reasons: reasons.clone(),
            counters: counters.clone(),
            intake: shutdown.clone(),
            stop: CancellationToken::new(),
        });
        // Dropping the set (with the run's future) aborts the readers.
        let mut feeders = JoinSet::new();
        for (index, source) in sources.into_iter().enumerate() {
            feeders.spawn(feeder.clone().feed(index, source));
        }
        // One tracing hook for every runner: a queue run again is not told twice.
        static LOG: std::sync::OnceLock<workqueue_core::__private::OutageHook> =
            std::sync::OnceLock::new();
        let outage = queue.core.has_outage_detection();
        if outage {
            let log = LOG.get_or_init(|| Arc::new(log_outage_event)).clone();
            queue.core.add_outage_hook(log);
        }
        let engine = Engine {
            queue,
            context,
            limits,
            intake: shutdown,
            abort: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            counters,
            failures: FailureCounts::new(),
            reasons,
            metrics,
            controller,
            // The runner's signals are finer than the outcome's (a rate-limited requeue after a
            // success is a success; the runner counts failures in a row).
            outage,
            classifier,
            feeder,
        };
        (Arc::new(engine), feeders)
    }

    /// The queue.
    pub fn queue(&self) -> &WorkQueue<T, S> {
        &self.queue
    }

    /// Cancelled when intake stops: take no new lease then.
    pub fn intake(&self) -> &CancellationToken {
        &self.intake
    }

    /// Asks running reconciles to stop (cancels their contexts).
    pub fn abort(&self) {
        self.abort.cancel();
    }

    /// Drops running reconciles ([`Engine::drive`] returns [`Ran::Interrupted`]).
    pub fn hard_stop(&self) {
        self.hard_stop.cancel();
    }

    /// Counts a panic of the queue's `get` (no lease was taken).
    pub fn get_panicked(&self, message: &str) {
        Counters::bump(&self.counters.get_panics);
        tracing::error!(
            panic = %message,
            "the queue's get panicked (a key's Clone or a metrics recorder); \
             the worker pauses, then goes on"
        );
    }

    /// Stops the source readers and waits for them, then reports. `worker_panics`: the tasks
    /// that died of a panic the engine did not catch.
    pub async fn end(&self, mut feeders: JoinSet<()>, worker_panics: u64) -> Report {
        self.feeder.stop.cancel();
        while let Some(joined) = feeders.join_next().await {
            if let Err(e) = joined {
                // The readers catch their sources' panics; this is defence in depth.
                tracing::error!(error = %e, "a source reader failed");
            }
        }
        let outage = (
            self.queue.parked_len(),
            self.queue.parked_dropped_at_shutdown(),
            self.queue.core.outage_openings(),
        );
        self.counters
            .report(self.queue.len(), worker_panics, outage)
    }

    /// Finishes a lease that is not reconciled at all (its object is gone): the limiter and
    /// the runner forget the key, and its pending reasons are dropped. Counted nowhere.
    pub fn discard(&self, lease: Lease<T>) {
        let key = lease.key();
        let _ = catch(|| self.reasons.take(key));
        let _ = catch(|| {
            self.failures
                .record(key, &Reconciled::<E>::Ok(Action::await_change()))
        });
        finish_lease(lease, Outcome::forget());
    }

    /// The first step of a lease: its counts, reasons, span and context. A panic of user code
    /// here (the key's `Hash`, `Eq`, `Display`, the limiter, a recorder) is kept in
    /// [`Begun::early`]; the rest is still filled in (the policy needs the counts, the logs want
    /// the span).
    pub fn begin(&self, lease: &Lease<T>) -> Begun<C> {
        let key = lease.key();
        let started = tokio::time::Instant::now();
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
                shard = tracing::field::Empty,
            )
        })
        .unwrap_or_else(|message| {
            caught(message);
            tracing::Span::none()
        });
        let token = if self.limits.stopped_by_abort {
            CancellationToken::new()
        } else {
            self.abort.child_token()
        };
        let ctx = Context::new(
            self.context.clone(),
            token,
            rate_limited_retries,
            failures_in_a_row,
            priority,
        );
        Begun {
            ctx,
            span,
            early,
            started,
        }
    }

    /// Starts a reconcile (`start` returns its future; a panic there is [`Ran::Panicked`]) and
    /// runs it under the runner's limits: a panic is [`Ran::Panicked`]; past the timeout its
    /// context is cancelled and, after the cancel grace, it is dropped ([`Ran::TimedOut`]); a hard
    /// stop drops it ([`Ran::Interrupted`]). The reconcile counts as active in the metrics while
    /// it runs; a recorder that panics there fails it (before it starts, it does not start).
    pub async fn drive<F>(&self, start: impl FnOnce() -> F, ctx: &Context<C>) -> Ran<E>
    where
        F: Future<Output = Result<Action, E>>,
    {
        let active = match catch(|| ActiveWorker::new(&self.metrics)) {
            Ok(active) => active,
            Err(message) => return Ran::Panicked(message),
        };
        let ran = match catch(start) {
            Ok(fut) => self.run_reconcile(fut, ctx).await,
            Err(message) => Ran::Panicked(message),
        };
        match catch(|| active.end()) {
            Ok(()) => ran,
            Err(message) => Ran::Panicked(message),
        }
    }

    async fn run_reconcile<F>(&self, fut: F, ctx: &Context<C>) -> Ran<E>
    where
        F: Future<Output = Result<Action, E>>,
    {
        let token = ctx.token();
        let mut fut = pin!(AssertUnwindSafe(fut).catch_unwind());
        let returned = |r: std::thread::Result<Result<Action, E>>| match r {
            Ok(r) => Ran::Returned(r),
            Err(payload) => Ran::Panicked(workqueue_core::__private::panic_message(&*payload)),
        };
        let limit = async {
            match self.limits.timeout {
                Some(t) => sleep_or_never(t).await,
                None => std::future::pending().await,
            }
        };
        let hard_stop = async {
            if self.limits.stopped_by_abort {
                std::future::pending().await
            } else {
                self.hard_stop.cancelled().await
            }
        };
        tokio::select! {
            biased;
            r = &mut fut => returned(r),
            () = hard_stop => Ran::Interrupted,
            () = limit => {
                token.cancel();
                tokio::select! {
                    biased;
                    _ = &mut fut => {}
                    () = sleep_or_never(self.limits.cancel_grace) => {}
                    () = self.hard_stop.cancelled() => {}
                }
                Ran::TimedOut
            }
        }
    }

    /// The verdict on a lease: a failure goes to `policy` (user code: its panic becomes the
    /// key's failure, about which it is asked once more; a second panic backs off), then the
    /// failure event and the metrics. Never panics: a recorder or a logger that panics after the
    /// policy answered makes this ask the policy about that panic, and the later answer counts.
    pub fn judge(
        &self,
        key: &T,
        begun: &Begun<C>,
        ran: Ran<E>,
        mut policy: impl FnMut(&T, &Failure<E>, &Context<C>) -> Action,
    ) -> Reconciled<E> {
        let ctx = &begun.ctx;
        let mut decide = |failure: Failure<E>| {
            let message = match catch(|| policy(key, &failure, ctx)) {
                Ok(action) => return Reconciled::Failed(failure, action),
                Err(message) => message,
            };
            let _ = catch(|| tracing::error!(panic = %message, "the error policy panicked"));
            let failure = Failure::Panic(message);
            let action = catch(|| policy(key, &failure, ctx)).unwrap_or(Action::backoff());
            Reconciled::Failed(failure, action)
        };
        let verdict = match ran {
            Ran::Returned(Ok(action)) => Reconciled::Ok(action),
            Ran::Interrupted => Reconciled::Interrupted,
            Ran::Returned(Err(e)) => decide(Failure::Error(e)),
            Ran::Panicked(message) => decide(Failure::Panic(message)),
            Ran::TimedOut => decide(Failure::Timeout),
        };
        let elapsed = begun.started.elapsed();
        let observed = catch(|| {
            begun
                .span
                .in_scope(|| log_failure(self.limits.failure_log, &verdict));
            self.metrics.reconciled(&verdict, elapsed);
        });
        let Err(message) = observed else {
            return verdict;
        };
        let verdict = decide(Failure::Panic(message));
        let _ = catch(|| {
            begun
                .span
                .in_scope(|| log_failure(self.limits.failure_log, &verdict))
        });
        if let Err(message) = catch(|| self.metrics.reconciled(&verdict, elapsed)) {
            let _ = catch(|| tracing::error!(panic = %message, "the metrics recorder panicked"));
        }
        verdict
    }

    /// The last step of a lease: counts the verdict in the report, tells the outage detector,
    /// records the failure counts and the reason of the re-add, and finishes the lease by the
    /// one mapping ([`Reconciled::outcome`]). Never panics.
    pub fn finish(&self, lease: Lease<T>, begun: &Begun<C>, verdict: &Reconciled<E>) {
        self.counters.count(verdict);
        let signal = self
            .outage
            .then(|| self.signal(verdict, begun.ctx.failures_in_a_row()));
        let outcome = verdict.outcome(self.limits.per_key_backoff);
        self.record(lease.key(), verdict);
        let outcome = match signal {
            Some(signal) => outcome.with_signal(signal),
            None => outcome,
        };
        finish_lease(lease, outcome);
    }

    /// [`Engine::finish`] for a lease whose key this replica no longer owns (its shard went to
    /// another replica): counted and recorded, but finished without any re-add, whatever the
    /// verdict asks (the new owner runs the key).
    pub fn finish_elsewhere(&self, lease: Lease<T>, verdict: &Reconciled<E>) {
        self.counters.count(verdict);
        let key = lease.key();
        let _ = catch(|| {
            self.failures
                .record(key, &Reconciled::<E>::Ok(Action::await_change()))
        });
        finish_lease(lease, Outcome::forget());
    }

    /// What a verdict tells the outage detector: a success, a first failure (the key had no
    /// failure in a row), a failure, or nothing (a per-object failure by the user's
    /// classification, an interrupted reconcile). Never panics: a classifier that panics counts
    /// the failure.
    fn signal(&self, verdict: &Reconciled<E>, failures: u32) -> Signal {
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
    fn record(&self, key: &T, verdict: &Reconciled<E>) {
        if let Err(message) = catch(|| self.failures.record(key, verdict)) {
            let _ = catch(|| tracing::error!(panic = %message, "counting a failure panicked"));
        }
        let reason = match verdict {
            _ if !verdict.readds() => return,
            Reconciled::Ok(_) => reasons::REQUEUE,
            _ => reasons::RETRY,
        };
        if let Err(message) = catch(|| self.reasons.mark([key], reason)) {
            let _ = catch(|| tracing::error!(panic = %message, "recording a reason panicked"));
        }
    }
}

/// Counts a reconcile as active from `new` to `end`, or to its drop (a reconcile dropped at
/// shutdown, or a panic on the way).
struct ActiveWorker<'a>(Option<&'a RunnerMetrics>);

impl<'a> ActiveWorker<'a> {
    fn new(metrics: &'a RunnerMetrics) -> Self {
        metrics.active(1.0);
        ActiveWorker(Some(metrics))
    }

    /// The reconcile is over. A recorder that panics here panics to the caller (who fails the
    /// key); the drop then tries once more, so the gauge stays right. A recorder that panics in
    /// `new` counted nothing, and nothing is undone.
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

/// Finishes a lease with `outcome`. The queue finishes the key even when the rate limiter
/// panics, then re-raises the panic; it is caught here so that the caller survives, as it does a
/// panicking reconcile.
fn finish_lease<T>(lease: Lease<T>, outcome: Outcome) {
    if let Err(message) = catch(|| lease.finish(outcome)) {
        tracing::error!(
            panic = %message,
            "the rate limiter panicked while finishing a key"
        );
    }
}

/// The one event of a failed reconcile, at `level` (see `Runner::failure_log`).
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

/// The tracing events of the outage detector's changes (its hook on the queue).
fn log_outage_event(event: &OutageEvent) {
    match event {
        OutageEvent::Opened => tracing::warn!(
            "outage detector opened: failures are widespread; failing keys are parked and \
             probed one at a time"
        ),
        OutageEvent::ProbeFailed { next } => {
            tracing::debug!(next_probe_in = ?next, "outage probe failed")
        }
        OutageEvent::Closed { lasted, released } => tracing::info!(
            outage_lasted = ?lasted,
            released,
            "outage detector closed: a probe succeeded; parked keys released, paced by the \
             rate limiter"
        ),
        _ => {}
    }
}

impl<T, E, C, S> fmt::Debug for Engine<T, E, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("controller", &self.controller)
            .field("limits", &self.limits)
            .field("outage", &self.outage)
            .finish_non_exhaustive()
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
