//! What the runner does for one lease, step by step: [`Engine::start`] (on the dispatcher: the
//! counts, the reasons, the span and the context, and the call of the reconcile function),
//! [`Engine::job`] (the reconcile's future under the runner's limits: timeout, cancel grace,
//! hard stop, an abort; then the verdict and the finish of a success, on a worker task),
//! [`Engine::judge`] (on the dispatcher: the error policy on a failure, the failure event, the
//! metrics) and [`Engine::finish`] (the report's counters, the outage signal, the failure counts
//! and reasons, and the lease's outcome by the one mapping, [`Reconciled::outcome`]). None of
//! them lets a panic of user code out.

use std::fmt;
use std::future::{Future, poll_fn};
use std::hash::{BuildHasher, Hash};
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::CatchUnwind;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use workqueue_core::ratelimit::Signal;
use workqueue_core::state::OutageEvent;
use workqueue_core::{AddOptions, Lease, Outcome};

use super::aborts::Registered;
use super::action::Reconciled;
use super::catch::catch;
use super::context::Cancel;
use super::dispatch::Item;
use super::failures::FailureCounts;
use super::metrics::{self, RunnerMetrics};
use super::reasons::{self, Reasons};
use super::report::Counters;
use super::workers::{Ends, Job};
use super::{Action, Belongs, Context, Error, Failure, Rules, Settings};
use crate::WorkQueue;

/// How a job ended, for the dispatcher.
pub(super) enum End<T, E, C> {
    /// The lease was finished in the job (a success, an interrupted reconcile); what the stream
    /// yields for it, if anything.
    Finished(Option<(T, Action)>),
    /// A failure, for the error policy (user code: on the dispatcher).
    Failed(Box<Failed<T, E, C>>),
}

/// A failed reconcile on its way to the error policy.
pub(super) struct Failed<T, E, C> {
    lease: Lease<T>,
    begun: Begun<C>,
    failure: Failure<E>,
}

/// Everything the per-lease steps share.
pub(super) struct Engine<T, E, C, S> {
    queue: WorkQueue<T, S>,
    data: Arc<C>,
    settings: Settings,
    /// Cancelled when intake stops (the shutdown token): no reconcile starts after it.
    intake: CancellationToken,
    /// Set as soon as `intake` is cancelled (by a task that waits for it), so that the hot path
    /// reads an atomic instead of locking the token.
    intake_closed: Arc<AtomicBool>,
    /// Cancelled to ask running reconciles to stop (every context's token is its child).
    abort: Arc<CancellationToken>,
    /// Cancelled to drop running reconciles.
    hard_stop: CancellationToken,
    counters: Counters,
    failures: FailureCounts<T>,
    reasons: Reasons<T>,
    metrics: RunnerMetrics,
    /// The controller's name in the reconcile span (the queue's, or `"unnamed"`).
    controller: Arc<str>,
    /// Whether outage detection is on (signals are computed only then).
    outage: bool,
    rules: Rules<T, E>,
    /// Set once the stream's sources have ended: re-adds are dropped.
    draining: AtomicBool,
    /// Whether the stream yields items (a `Runner::results` stream; `run` yields none).
    items: bool,
    /// Where the jobs send their ends, to the dispatcher.
    ends: Arc<Ends<End<T, E, C>>>,
}

/// A lease's state between [`Engine::begin`] and [`Engine::finish`].
#[derive(Debug)]
struct Begun<C> {
    /// The reconcile's context (and the error policy's).
    ctx: Context<C>,
    /// The reconcile's span.
    span: tracing::Span,
    /// A panic of user code before the reconcile (the key's `Clone` or `Display`, the limiter, a
    /// recorder): the reconcile must not run, and the lease fails with it.
    early: Option<String>,
    started: tokio::time::Instant,
}

/// How one reconcile ended, before the policy is asked.
#[derive(Debug)]
enum Ran<E> {
    /// The reconcile returned.
    Returned(Result<Action, E>),
    /// The reconcile (or the code that started it) panicked with this message.
    Panicked(String),
    /// The reconcile outlived the timeout.
    TimedOut,
    /// The reconcile was dropped (a hard stop at shutdown, an abort, or the `poll_while` rule).
    Interrupted,
}

impl<T, E, C, S> Engine<T, E, C, S> {
    /// The queue.
    pub(super) fn queue(&self) -> &WorkQueue<T, S> {
        &self.queue
    }

    /// Cancelled when intake stops.
    pub(super) fn intake(&self) -> &CancellationToken {
        &self.intake
    }

    /// Asks running reconciles to stop (cancels their contexts).
    pub(super) fn abort(&self) {
        self.abort.cancel();
    }

    /// Drops running reconciles (their jobs end as interrupted).
    pub(super) fn hard_stop(&self) {
        self.hard_stop.cancel();
    }

    /// Whether intake stopped (the shutdown token was cancelled).
    pub(super) fn intake_closed(&self) -> bool {
        self.intake_closed.load(Ordering::Acquire)
    }

    /// Marks intake stopped (the dispatcher saw the shutdown).
    pub(super) fn close_intake(&self) {
        self.intake_closed.store(true, Ordering::Release);
    }

    /// Marks intake stopped once the shutdown token is cancelled.
    pub(super) fn intake_watcher(&self) -> impl Future<Output = ()> + Send + 'static {
        let (token, closed) = (self.intake.clone(), self.intake_closed.clone());
        async move {
            token.cancelled().await;
            closed.store(true, Ordering::Release);
        }
    }

    /// Whether the run yields items (a `Runner::results` stream, which ends with its sources).
    pub(super) fn yields_items(&self) -> bool {
        self.items
    }

    /// The report's counters.
    pub(super) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Why keys were queued.
    pub(super) fn reasons(&self) -> &Reasons<T> {
        &self.reasons
    }

    /// The runner's metrics.
    pub(super) fn metrics(&self) -> &RunnerMetrics {
        &self.metrics
    }

    /// Where the jobs send their ends.
    pub(super) fn ends(&self) -> &Arc<Ends<End<T, E, C>>> {
        &self.ends
    }
}

impl<T, E, C, S> Engine<T, E, C, S>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    E: fmt::Debug + Send + 'static,
    C: Send + Sync + 'static,
{
    /// The engine of a run: `intake` is the shutdown token; `items`, whether the run yields
    /// them (a `Runner::results` stream).
    pub(super) fn new(
        queue: WorkQueue<T, S>,
        data: Arc<C>,
        settings: Settings,
        rules: Rules<T, E>,
        intake: CancellationToken,
        items: bool,
        source_names: Arc<[Arc<str>]>,
    ) -> Self {
        let metrics = RunnerMetrics::new(queue.name(), &source_names);
        let controller = Arc::from(queue.name().unwrap_or(metrics::UNNAMED));
        // One tracing hook for every runner: a queue run again is not told twice.
        static LOG: std::sync::OnceLock<workqueue_core::__private::OutageHook> =
            std::sync::OnceLock::new();
        let outage = queue.core.has_outage_detection();
        if outage {
            let log = LOG.get_or_init(|| Arc::new(log_outage_event)).clone();
            queue.core.add_outage_hook(log);
        }
        Engine {
            queue,
            data,
            settings,
            intake_closed: Arc::new(AtomicBool::new(intake.is_cancelled())),
            intake,
            abort: Arc::new(CancellationToken::new()),
            hard_stop: CancellationToken::new(),
            counters: Counters::default(),
            failures: FailureCounts::new(),
            reasons: Reasons::new(source_names),
            metrics,
            controller,
            outage,
            rules,
            draining: AtomicBool::new(false),
            items,
            ends: Arc::new(Ends::new()),
        }
    }

    /// The stream's sources ended: from now on re-adds are dropped, and so are the keys that
    /// wait only for one (a requeue, a retry); what the sources (or direct adds) queued stays.
    pub(super) fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        let dropped = catch(|| self.queue.retain(|key| !self.reasons.readds_only(key)));
        if let Err(message) = dropped {
            tracing::error!(panic = %message, "dropping the requeues of a drained run panicked");
        }
    }

    /// Whether `key` belongs to this runner (always, without a rule). A rule that panics says
    /// no (the panic is logged): a key this replica may not own is not run.
    pub(super) fn belongs(&self, key: &T) -> bool {
        self.rules
            .belongs
            .as_ref()
            .is_none_or(|rule| belongs(&**rule, key))
    }

    /// Counts a panic of the queue's `get` (no lease was taken).
    pub(super) fn get_panicked(&self, message: &str) {
        self.counters.get_panicked();
        tracing::error!(
            panic = %message,
            "the queue's get panicked (a key's Clone or a metrics recorder); \
             the runner pauses its intake, then goes on"
        );
    }

    /// Finishes a lease that is not reconciled at all (its key does not belong here): the
    /// limiter and the runner forget the key, and its pending reasons are dropped. Counted
    /// nowhere.
    pub(super) fn discard(&self, lease: Lease<T>) {
        let key = lease.key();
        let _ = catch(|| self.reasons.take(key));
        let _ = catch(|| {
            self.failures
                .record(key, &Reconciled::<E>::Ok(Action::await_change()))
        });
        finish_lease(lease, Outcome::forget());
    }

    /// Gives a lease that was never reconciled back to the queue as it was (held while the
    /// store could not be read, or not started because intake stopped): re-added at its
    /// priority, its backoff untouched. Its reasons stay for its next lease.
    pub(super) fn put_back(&self, lease: Lease<T>) {
        let priority = lease.priority();
        let readd = catch(|| {
            // Added while leased: the queue runs it again once this lease is done.
            self.queue
                .add_with(lease.key().clone(), AddOptions::new().priority(priority))
        });
        if let Err(message) = readd {
            tracing::error!(panic = %message, "putting a key back panicked; it is retried");
            finish_lease(lease, Outcome::retry());
            return;
        }
        finish_lease(lease, Outcome::done());
    }

    /// The first step of a lease: its counts, reasons, span and context. A panic of user code
    /// here (the key's `Hash`, `Eq`, `Display`, the limiter, a recorder) is kept in
    /// [`Begun::early`]; the rest is still filled in (the policy needs the counts, the logs want
    /// the span).
    fn begin(&self, lease: &Lease<T>) -> Begun<C> {
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
            )
        })
        .unwrap_or_else(|message| {
            caught(message);
            tracing::Span::none()
        });
        let ctx = Context::new(
            self.data.clone(),
            Cancel::new(self.abort.clone()),
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

    /// Begins `lease` and calls the reconcile function for it (`call`, in its span): the job
    /// that runs the rest, or the failure of user code before the reconcile could start (for
    /// the error policy). The reconcile counts as active from before the call.
    pub(super) fn start<F>(
        self: &Arc<Self>,
        lease: Lease<T>,
        call: impl FnOnce(T, Context<C>) -> F,
    ) -> Result<Job, Box<Failed<T, E, C>>>
    where
        F: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let mut begun = self.begin(&lease);
        let called = match begun.early.take() {
            Some(message) => Err(message),
            None => catch(|| self.metrics.active(1.0)).and_then(|()| {
                let (key, ctx) = (lease.key(), &begun.ctx);
                // The span's enter is a subscriber's code: inside the catch too.
                let called = catch(|| begun.span.in_scope(|| call(key.clone(), ctx.clone())));
                if called.is_err()
                    && let Err(message) = catch(|| self.metrics.active(-1.0))
                {
                    let _ = catch(
                        || tracing::error!(panic = %message, "the metrics recorder panicked"),
                    );
                }
                called
            }),
        };
        match called {
            Ok(fut) => {
                // Registered with the `Aborts`, if any, before it starts.
                let ticket = self.rules.registry.register(|| lease.key().clone());
                Ok(self.job(lease, begun, fut, ticket))
            }
            Err(message) => Err(Box::new(Failed {
                lease,
                begun,
                failure: Failure::Panic(message),
            })),
        }
    }

    /// The rest of a lease whose reconcile's future is `fut` (counted active), as one job: unless intake stopped before its first poll (then the
    /// lease is put back), the reconcile under the runner's limits, the verdict of a success or
    /// an interruption and its finish; a failure goes back to the dispatcher for the error
    /// policy. Sends exactly one [`End`], and ends the reconcile's activity, even if dropped.
    fn job<F>(
        self: &Arc<Self>,
        lease: Lease<T>,
        begun: Begun<C>,
        fut: F,
        ticket: Option<Registered<T>>,
    ) -> Job
    where
        F: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let guard = JobGuard {
            engine: self.clone(),
            active: AtomicBool::new(true),
            sent: AtomicBool::new(false),
        };
        Box::pin(async move {
            let engine = &*guard.engine;
            if engine.intake_closed() {
                drop((fut, ticket));
                engine.put_back(lease);
                return;
            }
            // Pinned here and lent to `run_reconcile`, so that the job stores the future once
            // more, not twice (an async fn keeps its arguments apart from its locals); dropped
            // at the end of this block.
            let ran = {
                let caught = pin!(AssertUnwindSafe(fut).catch_unwind());
                engine
                    .run_reconcile(caught, lease.key(), &begun.ctx, ticket.as_ref())
                    .instrument(begun.span.clone())
                    .await
            };
            // The reconcile's future is gone: `Aborts::stopped` may see it ended.
            drop(ticket);
            let ran = match guard.end_active() {
                Ok(()) => ran,
                Err(message) => Ran::Panicked(message),
            };
            let verdict = match ran {
                Ran::Returned(Ok(action)) => Reconciled::Ok(action),
                Ran::Interrupted => Reconciled::Interrupted,
                Ran::Returned(Err(e)) => return guard.failed(lease, begun, Failure::Error(e)),
                Ran::Panicked(message) => {
                    return guard.failed(lease, begun, Failure::Panic(message));
                }
                Ran::TimedOut => return guard.failed(lease, begun, Failure::Timeout),
            };
            if let Err(message) = engine.observe(&begun, &verdict) {
                return guard.failed(lease, begun, Failure::Panic(message));
            }
            let key = engine.finish(lease, &begun, &verdict);
            let item = match (key, verdict) {
                (Some(key), Reconciled::Ok(action)) => Some((key, action)),
                _ => None,
            };
            guard.send(End::Finished(item));
        })
    }

    /// Runs a reconcile's future under the runner's limits: a panic is [`Ran::Panicked`]; past
    /// the timeout its context is cancelled and, after the cancel grace, it is dropped
    /// ([`Ran::TimedOut`]); a hard stop, an abort or the `poll_while` rule drops it
    /// ([`Ran::Interrupted`]). The rule is asked before each poll of `fut`, so that no poll
    /// happens once it says no, whatever task would have stopped the reconcile otherwise.
    async fn run_reconcile<F>(
        &self,
        mut caught: Pin<&mut CatchUnwind<AssertUnwindSafe<F>>>,
        key: &T,
        ctx: &Context<C>,
        ticket: Option<&Registered<T>>,
    ) -> Ran<E>
    where
        F: Future<Output = Result<Action, E>>,
    {
        if ticket.is_some_and(Registered::is_aborted) {
            return Ran::Interrupted;
        }
        // `None`: the rule said no before a poll; the future is dropped unpolled.
        let mut fut = pin!(poll_fn(|cx| {
            if let Some(rule) = &self.rules.poll_while
                && !belongs(&**rule, key)
            {
                return Poll::Ready(None);
            }
            caught.as_mut().poll(cx).map(Some)
        }));
        let returned = |r: Option<std::thread::Result<Result<Action, E>>>| match r {
            Some(Ok(r)) => Ran::Returned(r),
            Some(Err(payload)) => Ran::Panicked(workqueue_core::panic_message(&*payload)),
            None => Ran::Interrupted,
        };
        let limit = async {
            match self.settings.timeout {
                Some(t) => sleep_or_never(t).await,
                None => std::future::pending().await,
            }
        };
        let aborted = async {
            match ticket {
                Some(ticket) => ticket.aborted().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = aborted => Ran::Interrupted,
            r = &mut fut => returned(r),
            () = self.hard_stop.cancelled() => Ran::Interrupted,
            () = limit => {
                ctx.cancel().cancel_own();
                // Polled once more only while the rule allows, as above.
                tokio::select! {
                    biased;
                    _ = &mut fut => {}
                    () = sleep_or_never(self.settings.cancel_grace) => {}
                    () = self.hard_stop.cancelled() => {}
                }
                Ran::TimedOut
            }
        }
    }

    /// The verdict on a failure, on the dispatcher: `policy` (user code: its panic becomes the
    /// key's failure, about which it is asked once more; a second panic backs off), then the
    /// failure event and the metrics. Never panics: a recorder or a logger that panics after the
    /// policy answered makes this ask the policy about that panic, and the later answer counts.
    pub(super) fn judge(
        &self,
        failed: Failed<T, E, C>,
        mut policy: impl FnMut(&T, &Failure<E>, &Context<C>) -> Action,
    ) -> Option<Item<T, E>> {
        let Failed {
            lease,
            begun,
            failure,
        } = failed;
        let key = lease.key();
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
        let mut verdict = decide(failure);
        if let Err(message) = self.observe(&begun, &verdict) {
            verdict = decide(Failure::Panic(message));
            if let Err(message) = self.observe(&begun, &verdict) {
                let _ =
                    catch(|| tracing::error!(panic = %message, "the metrics recorder panicked"));
            }
        }
        let key = self.finish(lease, &begun, &verdict)?;
        match verdict {
            Reconciled::Ok(action) => Some(Ok((key, action))),
            Reconciled::Failed(failure, _) => Some(Err(Error::Failed(key, failure))),
            Reconciled::Interrupted => None,
        }
    }

    /// The failure event and the metrics of a verdict; a recorder or logger that panics is
    /// `Err` (the caller fails the key with it).
    fn observe(&self, begun: &Begun<C>, verdict: &Reconciled<E>) -> Result<(), String> {
        let elapsed = begun.started.elapsed();
        catch(|| {
            if self.settings.failure_log.is_some() && matches!(verdict, Reconciled::Failed(..)) {
                begun
                    .span
                    .in_scope(|| log_failure(self.settings.failure_log, verdict));
            }
            self.metrics.reconciled(verdict, elapsed);
        })
    }

    /// The last step of a lease: counts the verdict in the report, tells the outage detector,
    /// records the failure counts and the reason of the re-add, and finishes the lease by the
    /// one mapping ([`Reconciled::outcome`]). A key that no longer belongs here is finished
    /// without a re-add, whatever the verdict asks (its new owner runs it), and so is every key
    /// once the stream's sources ended. Returns the key (a clone) when the stream yields items.
    /// Never panics.
    fn finish(&self, lease: Lease<T>, begun: &Begun<C>, verdict: &Reconciled<E>) -> Option<T> {
        self.counters.count(verdict);
        let key = lease.key();
        let item = if self.items {
            catch(|| key.clone()).ok()
        } else {
            None
        };
        if !self.belongs(key) {
            let _ = catch(|| {
                self.failures
                    .record(key, &Reconciled::<E>::Ok(Action::await_change()))
            });
            finish_lease(lease, Outcome::forget());
            return item;
        }
        let signal = self
            .outage
            .then(|| self.signal(verdict, begun.ctx.failures_in_a_row()));
        let outcome = if self.draining.load(Ordering::Relaxed) {
            Outcome::done()
        } else {
            self.record(key, verdict);
            verdict.outcome(self.settings.per_key_backoff)
        };
        let outcome = match signal {
            Some(signal) => outcome.with_signal(signal),
            None => outcome,
        };
        finish_lease(lease, outcome);
        item
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
        let shared = match &self.rules.classifier {
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

/// Whether `key` belongs here by `rule`. A rule that panics says no (the panic is logged): a key
/// this replica may not own is not run.
fn belongs<T>(rule: &Belongs<T>, key: &T) -> bool {
    catch(|| rule(key)).unwrap_or_else(|message| {
        let _ = catch(
            || tracing::error!(panic = %message, "the belongs rule panicked; the key is not taken"),
        );
        false
    })
}

/// What a job owes even if it is dropped (never polled, or dropped at a hard stop): its
/// reconcile stops counting as active (from [`Engine::start`]), and the dispatcher gets
/// exactly one [`End`] (`Finished(None)` from the drop), so that its count of running reconciles
/// is always right.
///
/// Its flags are atomics only so that the job can borrow it across its awaits (it is `Sync`);
/// one task uses it.
struct JobGuard<T, E, C, S> {
    engine: Arc<Engine<T, E, C, S>>,
    /// Whether the reconcile still counts as active.
    active: AtomicBool,
    sent: AtomicBool,
}

impl<T, E, C, S> JobGuard<T, E, C, S> {
    /// The reconcile is over. A recorder that panics here is `Err` (the caller fails the key);
    /// the drop then tries once more, so the gauge stays right.
    fn end_active(&self) -> Result<(), String> {
        if self.active.load(Ordering::Relaxed) {
            catch(|| self.engine.metrics.active(-1.0))?;
            self.active.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    fn send(&self, end: End<T, E, C>) {
        self.sent.store(true, Ordering::Relaxed);
        self.engine.ends.push(end);
    }

    fn failed(&self, lease: Lease<T>, begun: Begun<C>, failure: Failure<E>) {
        self.send(End::Failed(Box::new(Failed {
            lease,
            begun,
            failure,
        })));
    }
}

impl<T, E, C, S> Drop for JobGuard<T, E, C, S> {
    fn drop(&mut self) {
        if *self.active.get_mut()
            && let Err(message) = catch(|| self.engine.metrics.active(-1.0))
        {
            let _ = catch(|| tracing::error!(panic = %message, "the metrics recorder panicked"));
        }
        if !*self.sent.get_mut() {
            self.engine.ends.push(End::Finished(None));
            self.engine.ends.wake();
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

/// Completes `d` from now, or never when that instant cannot be represented: a limit that far
/// away is no limit. (tokio's `sleep` and `timeout` would end about 30 years from now instead;
/// `Instant + Duration` would panic.) Every configurable runner limit goes through here.
async fn sleep_or_never(d: Duration) {
    match tokio::time::Instant::now().checked_add(d) {
        Some(end) => tokio::time::sleep_until(end).await,
        None => std::future::pending().await,
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
            .field("settings", &self.settings)
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
        use std::sync::atomic::AtomicU32;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::Runner;

    /// A job holds its reconcile's future once more at most, whatever its size: a job is a
    /// reconcile's only allocation, copied into place as the reconcile starts.
    #[tokio::test]
    async fn a_job_stores_its_future_at_most_twice() {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let runner = Runner::new(queue.clone(), |_key: u32, _ctx| async {
            Ok::<_, ()>(Action::await_change())
        });
        let engine = Arc::new(Engine::new(
            queue.clone(),
            Arc::new(()),
            runner.settings,
            runner.rules,
            CancellationToken::new(),
            false,
            Arc::from([]),
        ));
        queue.add(1);
        let lease = queue.try_get().expect("1 is due");
        let fut = async {
            let buffer = [0u8; 16 * 1024];
            tokio::task::yield_now().await;
            Ok::<_, ()>(Action::await_change()).map(|a| (a, buffer.len()).0)
        };
        let size = std::mem::size_of_val(&fut);
        let Ok(job) = engine.start(lease, |_, _| fut) else {
            panic!("the job did not start");
        };
        let job_size = std::mem::size_of_val(&*job);
        assert!(
            job_size < 2 * size + 4096,
            "a job of {job_size} bytes for a future of {size}"
        );
    }
}
