//! The controller runner: workers that lease keys, reconcile them and finish their leases.
//!
//! `N` workers loop: `get` → `reconcile(key, ctx)` → `lease.finish(outcome)`, where the outcome
//! comes from one mapping:
//!
//! | reconcile returned | queue operation |
//! |---|---|
//! | `Ok(Action::Done)` | forget + done |
//! | `Ok(Action::RequeueAfter(d))`, `d > 0` | forget + add_after(d) + done |
//! | `Ok(Action::RequeueAfter(Duration::ZERO))` | add_rate_limited (no forget) + done: controller-runtime's `Requeue: true`, never an unthrottled loop |
//! | `Err(e)`, a panic, or a timeout | the [`ErrorPolicy`] decides: `Retry` (rate-limited, the default), `RetryAfter(d)`, or `GiveUp` (forget + done) |
//!
//! A requeue or retry is queued at the priority the key was handed out at ([`Context::priority`];
//! controller-runtime keeps it too), unless the reconcile asks for another,
//! `Action::RequeueAfter(d).with_priority(p)` (controller-runtime's `Result.Priority`), or the
//! policy does, `Decision::Retry.with_priority(p)`. A key interrupted at shutdown keeps its
//! priority.
//!
//! A panic is a [`Failure::Panic`] wherever it happens while a key is leased: in the reconcile, or
//! in anything the runner calls for the key (its `Clone` and `Debug`, the rate limiter, a metrics
//! recorder, the error policy itself, which is then asked about its own panic; a second panic
//! retries). A worker never dies of a panic (see [`Runner::run`]).
//!
//! Keys come from the queue (added by anyone holding a clone) and from the runner's sources
//! ([`Runner::source`]: streams of keys, read while the runner runs). Every reconcile and the
//! error policy get a [`Context`]: the shared data given once ([`Runner::with_context`]), the
//! cancellation, the priority, and two counts of earlier failures ([`Context::failures`], the
//! runner's, and [`Context::attempt`], the rate limiter's). Why a key was queued is in the
//! reconcile's span and metrics, not in the context (see [`Context`]).
//!
//! # Tracing
//!
//! Each reconcile runs in an `INFO` span named `reconcile`, with these fields:
//!
//! | field | what |
//! |---|---|
//! | `controller` | the queue's name, or `unnamed` |
//! | `key` | the key, with its `Display` (so keys must implement it) |
//! | `reconcile_id` | 16 hex digits, unique to this reconcile (controller-runtime's `reconcileID`) |
//! | `attempt` | the rate limiter's failure count ([`Context::attempt`]) |
//! | `failures` | the runner's failure count ([`Context::failures`]) |
//! | `priority` | the priority the key was handed out at |
//! | `reasons` | why the key was queued, merged across de-duplicated adds: `source:NAME`, `requeue`, `retry`, `direct` |
//!
//! A failed reconcile logs one event in that span, at the level [`Runner::failure_log`] sets
//! (`ERROR` by default, or none): `reconcile failed` (with the `error`), `reconcile panicked`
//! (with the `panic` message) or `reconcile timed out`, each with the policy's `decision`. The
//! runner's own troubles (a panicking recorder or source, a worker that died) are `ERROR` events
//! outside it.
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
mod failures;
mod feed;
pub mod metrics;
mod policy;
mod reasons;
mod reconcile;
mod report;

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::stream::Stream;
use tokio::task::JoinSet;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use workqueue_core::ratelimit::{OutageConfig, Signal};
use workqueue_core::state::DefaultHashBuilder;
use workqueue_core::state::OutageEvent;
use workqueue_core::{Lease, Outcome};

pub use action::{Action, Decision, Failure};
pub use context::Context;
pub use policy::{ErrorPolicy, MaxRetries, RetryAlways};
pub use reconcile::Reconcile;
pub use report::Report;

use crate::WorkQueue;
use crate::source::SourceItem;
use action::Reconciled;
use failures::FailureCounts;
use feed::{Feeder, Source};
use metrics::RunnerMetrics;
use reasons::Reasons;
use report::Counters;

/// How long a worker pauses after the queue's `get` panicked before it asks for a key again (a key
/// whose `Clone` always panics would otherwise make it spin). The pause ends early when the
/// shutdown token is cancelled.
pub const GET_PANIC_PAUSE: Duration = Duration::from_millis(100);

/// Runs a reconcile function over a queue's keys with `N` workers.
///
/// Built with [`Runner::new`] and configured with its builder methods; [`Runner::run`] runs it
/// until the queue shuts down (and is drained) or the shutdown token is cancelled.
///
/// `C` is the shared data every reconcile and the error policy reach through their
/// [`Context`] ([`Runner::with_context`]); `()` without it.
#[must_use = "a runner does nothing until `run` is awaited"]
pub struct Runner<T, R, P = RetryAlways, S = DefaultHashBuilder, C = ()> {
    queue: WorkQueue<T, S>,
    reconcile: R,
    policy: P,
    context: Arc<C>,
    sources: Vec<Source<T>>,
    workers: usize,
    timeout: Option<Duration>,
    cancel_grace: Duration,
    shutdown_grace: Duration,
    failure_log: Option<tracing::Level>,
    outage: Option<OutageConfig>,
    /// The user's classifier, an `Arc<Classifier<E>>` (typed when `run` knows `E`).
    classifier: Option<Arc<dyn Any + Send + Sync>>,
}

/// Whether a failure may be a shared outage (see [`Runner::outage_classifier`]).
type Classifier<E> = dyn Fn(&Failure<E>, &Decision) -> bool + Send + Sync;

impl<T, R, S> Runner<T, R, RetryAlways, S, ()> {
    /// A runner of `reconcile` over `queue`, with one worker, no sources, no shared data, no
    /// timeout, the [`RetryAlways`] policy, a 30 s shutdown grace and a 5 s cancel grace.
    ///
    /// `reconcile` is a closure or an `async fn` taking the key and its [`Context`]; the bound
    /// is written out here so that a closure's argument types are inferred, and a reconcile of
    /// the wrong shape is reported at this call. For shared data use [`Runner::with_context`];
    /// for a [`Reconcile`] implemented by hand, [`Runner::from_reconcile`].
    pub fn new<Fut, E>(queue: WorkQueue<T, S>, reconcile: R) -> Self
    where
        R: Fn(T, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: fmt::Debug + Send + 'static,
    {
        Runner::from_reconcile(queue, Arc::new(()), reconcile)
    }
}

impl<T, R, S, C> Runner<T, R, RetryAlways, S, C> {
    /// A runner whose reconciles and error policy share `data`, reached with [`Context::data`]
    /// (an API client, a cache, an event recorder). Given once; the runner only clones the
    /// `Arc`. Otherwise as [`Runner::new`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use workqueue_tokio::{CancellationToken, WorkQueue};
    /// use workqueue_tokio::runner::{Action, Context, Decision, Failure, Runner};
    ///
    /// #[derive(Default)]
    /// struct State { reconciled: AtomicU32, warnings: AtomicU32 }
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let queue: WorkQueue<&'static str> = WorkQueue::new();
    /// queue.add_batch(["ok", "bad"]);
    /// let state = Arc::new(State::default());
    /// let runner = Runner::with_context(queue.clone(), state.clone(), |key, ctx: Context<State>| async move {
    ///     ctx.data().reconciled.fetch_add(1, Ordering::Relaxed);
    ///     if key == "bad" { Err("invalid") } else { Ok(Action::Done) }
    /// })
    /// .on_error(|_key, _failure, ctx| {
    ///     ctx.data().warnings.fetch_add(1, Ordering::Relaxed); // record an event, say
    ///     Decision::GiveUp
    /// });
    /// let run = tokio::spawn(runner.run(CancellationToken::new()));
    /// tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    /// queue.shut_down();
    /// run.await.unwrap();
    /// assert_eq!(state.reconciled.load(Ordering::Relaxed), 2);
    /// assert_eq!(state.warnings.load(Ordering::Relaxed), 1);
    /// # }
    /// ```
    pub fn with_context<Fut, E>(queue: WorkQueue<T, S>, data: Arc<C>, reconcile: R) -> Self
    where
        R: Fn(T, Context<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: fmt::Debug + Send + 'static,
    {
        Runner::from_reconcile(queue, data, reconcile)
    }

    /// A runner of any [`Reconcile`]: one implemented by hand (to name its future type, or to
    /// keep state in a struct) as well as a closure. Otherwise as [`Runner::with_context`].
    pub fn from_reconcile(queue: WorkQueue<T, S>, data: Arc<C>, reconcile: R) -> Self
    where
        R: Reconcile<T, C>,
    {
        // controller-runtime labels a controller's queue metrics with `controller` too.
        queue.core.label_controller();
        Runner {
            queue,
            reconcile,
            policy: RetryAlways,
            context: data,
            sources: Vec::new(),
            workers: 1,
            timeout: None,
            cancel_grace: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            failure_log: Some(tracing::Level::ERROR),
            outage: None,
            classifier: None,
        }
    }
}

impl<T, R, P, S, C> Runner<T, R, P, S, C> {
    /// The number of workers (reconciles running at once). At least one: 0 is taken as 1.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// The policy that decides what happens to failed keys: an [`ErrorPolicy`] such as
    /// [`MaxRetries`], or a closure whose argument types are written out (for a closure without
    /// them, [`Runner::on_error`]). A policy of the wrong shape is reported at this call.
    pub fn error_policy<P2>(self, policy: P2) -> Runner<T, R, P2, S, C>
    where
        R: Reconcile<T, C>,
        P2: ErrorPolicy<T, R::Error, C>,
    {
        self.with_policy(policy)
    }

    /// The error policy as a closure, `|key, failure, ctx| -> Decision`, whose argument types
    /// are inferred from the reconcile: what [`Runner::error_policy`] does, for closures.
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::runner::{Action, Decision, Runner};
    ///
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// let runner = Runner::new(queue, |_key, _ctx| async { Err::<Action, _>("api down") })
    ///     // Retry every 30 s, at most 5 times (the runner's count sees every failure).
    ///     .on_error(|_key, _failure, ctx| match ctx.failures() {
    ///         0..5 => Decision::RetryAfter(Duration::from_secs(30)),
    ///         _ => Decision::GiveUp,
    ///     });
    /// # drop(runner);
    /// ```
    pub fn on_error<F>(self, policy: F) -> Runner<T, R, F, S, C>
    where
        R: Reconcile<T, C>,
        F: Fn(&T, &Failure<R::Error>, &Context<C>) -> Decision + Send + Sync + 'static,
    {
        self.with_policy(policy)
    }

    fn with_policy<P2>(self, policy: P2) -> Runner<T, R, P2, S, C> {
        Runner {
            queue: self.queue,
            reconcile: self.reconcile,
            policy,
            context: self.context,
            sources: self.sources,
            workers: self.workers,
            timeout: self.timeout,
            cancel_grace: self.cancel_grace,
            shutdown_grace: self.shutdown_grace,
            failure_log: self.failure_log,
            outage: self.outage,
            classifier: self.classifier,
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

    /// The level of the one event logged for each failed reconcile (`"reconcile failed"`,
    /// `"reconcile panicked"` or `"reconcile timed out"`, inside the reconcile's span, with the
    /// error or panic message and the policy's `decision`); `None` logs nothing, for an error
    /// policy that logs failures its own way. Default: `ERROR`, as controller-runtime logs
    /// "Reconciler error".
    pub fn failure_log(mut self, level: Option<tracing::Level>) -> Self {
        self.failure_log = level;
        self
    }

    /// How long in-flight reconciles may run after shutdown before their contexts are cancelled.
    /// Default 30 s. A grace too long to represent as an instant (`Duration::MAX`) is no limit.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Outage-aware retries (off by default): when failures are widespread (an API server that
    /// is down), failing keys are **parked** instead of retried on their own backoff, one
    /// **probe** (a real reconcile of a parked key, round-robin) runs at a time at an interval
    /// that backs off to a cap, and the first probe that succeeds **releases** every parked key,
    /// in the order they failed, paced by the rate limiter's bucket after their backoff is
    /// forgotten. See [`OutageConfig`] for the parameters and their defaults, and the queue
    /// builder's `outage_detection` for the rules; the storm example shows what it buys.
    ///
    /// The detector counts the runner's first failures (a key whose [`Context::failures`] was 0)
    /// against successes. Every error counts unless [`Runner::outage_classifier`] says it is the
    /// object's own. It is set on the queue when `run` starts, and stays after it.
    ///
    /// - An event for a parked key (an add) runs it at once, as an extra probe.
    /// - A give-up ([`Decision::GiveUp`], [`MaxRetries`]) is honoured while open: the key is not
    ///   parked. A parked key's failure count grows only when it runs (as a probe). Once every
    ///   parked key was given up, the next key to finish is the probe.
    /// - [`Context::attempt`] (the limiter's count) is 0 at a released key's first run: the
    ///   release forgot its backoff. [`Context::failures`] counts failures in a row until the
    ///   next success.
    /// - A probe that panics is a failure like any other.
    /// - At shutdown, parked keys are waiting keys: the queue's shutdown drops them and drains
    ///   do not wait for them; [`Report::parked`] and [`Report::parked_dropped`] count them.
    ///
    /// Tracing: a `warn` event when the detector opens, a `debug` one for each failed probe, and
    /// an `info` one when it closes, with how long the outage lasted (`outage_lasted`) and how
    /// many keys were released (`released`). Metrics (named queues): `workqueue_parked_keys` and
    /// `workqueue_outage_openings_total`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::time::Duration;
    /// use tokio_util::sync::CancellationToken;
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::ratelimit::OutageConfig;
    /// use workqueue_tokio::runner::{Action, Runner};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let api_up = Arc::new(AtomicBool::new(false));
    /// let queue: WorkQueue<u32> = WorkQueue::new();
    /// queue.add_batch(0..50);
    /// let up = api_up.clone();
    /// let runner = Runner::new(queue.clone(), move |_key: u32, _ctx| {
    ///     let up = up.load(Ordering::Relaxed);
    ///     async move { if up { Ok(Action::Done) } else { Err("unavailable") } }
    /// })
    /// .workers(10)
    /// .outage_detection(OutageConfig::default());
    /// let stop = CancellationToken::new();
    /// let run = tokio::spawn(runner.run(stop.clone()));
    /// tokio::time::sleep(Duration::from_secs(60)).await;
    /// assert!(queue.is_outage_open());
    /// api_up.store(true, Ordering::Relaxed);
    /// tokio::time::sleep(Duration::from_secs(10)).await;
    /// assert!(!queue.is_outage_open());
    /// stop.cancel();
    /// let report = run.await.unwrap();
    /// assert_eq!((report.outage_openings, report.parked), (1, 0));
    /// # }
    /// ```
    pub fn outage_detection(mut self, config: OutageConfig) -> Self {
        self.outage = Some(config);
        self
    }

    /// Classifies failures for the outage detector: `classify(failure, decision)` says whether
    /// a failure may be a shared outage. Return `false` for an error that is clearly the
    /// object's own (an invalid spec, a 4xx that is not 429), or for the decisions that mark
    /// them (say, [`Decision::GiveUp`]): such failures never open the detector, and are never
    /// parked. Default: every failure counts.
    ///
    /// User code: a classifier that panics counts the failure (as the default does), and the
    /// panic is logged.
    ///
    /// ```
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::ratelimit::OutageConfig;
    /// use workqueue_tokio::runner::{Action, Context, Decision, Failure, Runner};
    ///
    /// #[derive(Debug)]
    /// enum ApiError { Status(u16), Unreachable }
    ///
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// let reconcile = |_key: String, _ctx: Context| async { Ok::<_, ApiError>(Action::Done) };
    /// let runner = Runner::new(queue, reconcile)
    ///     .outage_detection(OutageConfig::default())
    ///     .outage_classifier(|failure: &Failure<ApiError>, _decision: &Decision| match failure {
    ///         Failure::Error(ApiError::Status(s)) => *s == 429 || *s >= 500,
    ///         _ => true,
    ///     });
    /// # let _ = runner;
    /// ```
    pub fn outage_classifier<E: 'static>(
        mut self,
        classify: impl Fn(&Failure<E>, &Decision) -> bool + Send + Sync + 'static,
    ) -> Self {
        let classify: Arc<Classifier<E>> = Arc::new(classify);
        self.classifier = Some(Arc::new(classify));
        self
    }
}

impl<T, R, P, S, C> Runner<T, R, P, S, C>
where
    T: Send + 'static,
{
    /// Adds a source: while the runner runs, it reads `stream` and adds its keys to the queue.
    ///
    /// The items are keys, keys with [`AddOptions`](crate::AddOptions), or `Result`s of either
    /// ([`SourceItem`]). What is ready is read at once, up to
    /// [`source::BATCH`](crate::source::BATCH) items, and added with one batch add per run of
    /// equal options; `name` names the source in logs, in the reconcile span's `reasons`, and
    /// in metrics. Any number of sources may be added; each is read by its own task.
    ///
    /// - At shutdown (the token given to [`run`](Runner::run)), and when the run ends, the
    ///   runner stops reading its sources and drops them.
    /// - A stream that ends is counted in [`Report::sources_ended`] and logged (`info`); the
    ///   runner goes on with its other sources and its queue.
    /// - An `Err` item is logged (`warn`), counted in [`Report::source_errors`] and skipped. No
    ///   error is fatal to the runner. A controller that must stop on some error says so with
    ///   its shutdown token, as below.
    /// - A stream that panics when polled is ended there (counted in [`Report::source_panics`]
    ///   and `sources_ended`, logged as an error): the items it yielded before are added, and
    ///   the runner goes on.
    ///
    /// Backpressure: none is needed (see the [`source`](crate::source) module): the queue holds
    /// one entry per distinct key, however fast a source yields.
    ///
    /// ```
    /// use futures_util::stream::{self, StreamExt};
    /// use tokio_util::sync::CancellationToken;
    /// use workqueue_tokio::runner::{Action, Runner};
    /// use workqueue_tokio::{AddOptions, LOW_PRIORITY, WorkQueue};
    ///
    /// #[derive(Debug, thiserror::Error)]
    /// enum WatchError {
    ///     #[error("watch interrupted")]
    ///     Interrupted,
    ///     #[error("forbidden")]
    ///     Forbidden,
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// let stop = CancellationToken::new();
    /// // An initial list, at low priority.
    /// let list = stream::iter(["a", "b"]).map(|k| (k.to_string(), AddOptions::new().priority(LOW_PRIORITY)));
    /// // A watch: a recoverable error is skipped; `Forbidden` stops the controller.
    /// let watch = stream::iter([Ok("a"), Err(WatchError::Interrupted), Ok("c"), Err(WatchError::Forbidden)])
    ///     .inspect({
    ///         let stop = stop.clone();
    ///         move |item| if let Err(WatchError::Forbidden) = item { stop.cancel() }
    ///     })
    ///     .map(|item| item.map(str::to_string));
    /// let report = Runner::new(queue.clone(), |_key: String, _ctx| async { Ok::<_, WatchError>(Action::Done) })
    ///     .source("list", list)
    ///     .source("watch", watch)
    ///     .run(stop)
    ///     .await;
    /// assert_eq!(report.source_errors, 2);
    /// # }
    /// ```
    pub fn source<St>(mut self, name: &str, stream: St) -> Self
    where
        St: Stream + Send + 'static,
        St::Item: SourceItem<T>,
    {
        self.sources.push(Source::new(name, stream));
        self
    }
}

/// What the workers share.
struct Shared<T, R, P, S, C> {
    queue: WorkQueue<T, S>,
    reconcile: R,
    policy: P,
    context: Arc<C>,
    timeout: Option<Duration>,
    cancel_grace: Duration,
    intake: CancellationToken,
    abort: CancellationToken,
    hard_stop: CancellationToken,
    counters: Arc<Counters>,
    failures: FailureCounts<T>,
    reasons: Arc<Reasons<T>>,
    metrics: RunnerMetrics,
    /// The controller's name in the reconcile span (the queue's, or `"unnamed"`).
    controller: Arc<str>,
    failure_log: Option<tracing::Level>,
    /// Whether outage detection is on (signals are computed only then).
    outage: bool,
    /// The user's classifier, an `Arc<Classifier<R::Error>>` (checked when the run starts).
    classifier: Option<Arc<dyn Any + Send + Sync>>,
}

/// How one reconcile ended, before the policy is asked.
enum Ran<E> {
    Returned(Result<Action, E>),
    Panicked(String),
    TimedOut,
    Interrupted,
}

impl<T, R, P, S, C> Runner<T, R, P, S, C>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Reconcile<T, C>,
    P: ErrorPolicy<T, R::Error, C>,
{
    /// Runs the workers until the queue is shut down and drained, or `shutdown` is cancelled, and
    /// returns what they did.
    ///
    /// It returns:
    /// - after the queue was shut down, once every worker found it empty (`get` returned `None`),
    ///   whatever its sources are doing;
    /// - after `shutdown` was cancelled, once the reconciles in flight finished: within the
    ///   shutdown grace, else within the cancel grace after their contexts were cancelled, else
    ///   when their futures were dropped ([`Report::interrupted`]).
    ///
    /// It does not return for any other reason: a panic in the code the runner calls (the
    /// reconcile, the error policy, the rate limiter, the key's `Clone` or `Debug`, a metrics
    /// recorder) fails the key it was handling ([`Failure::Panic`]) or, inside the queue's `get`,
    /// is counted in [`Report::get_panics`]; the worker goes on. A worker that still ends with a
    /// panic is replaced unless intake has stopped, and counted in [`Report::worker_panics`].
    ///
    /// A source that ends or fails never ends the run (see [`source`](Runner::source)).
    ///
    /// Must run inside a tokio runtime (workers and source readers are tasks). Dropping the
    /// future aborts the workers and the source readers; leases finish as dropped leases do.
    pub async fn run(self, shutdown: CancellationToken) -> Report {
        let names: Arc<[Arc<str>]> = self.sources.iter().map(|s| s.name.clone()).collect();
        let metrics = RunnerMetrics::new(self.queue.name(), &names);
        let controller = self.queue.name().unwrap_or(metrics::UNNAMED).to_owned();
        if let Err(message) = catch(|| metrics.start(self.workers)) {
            tracing::error!(panic = %message, "the metrics recorder panicked; the runner goes on");
        }
        let counters = Arc::new(Counters::default());
        let reasons = Arc::new(Reasons::new(names));
        let feeder = Arc::new(Feeder {
            queue: self.queue.clone(),
            reasons: reasons.clone(),
            counters: counters.clone(),
            intake: shutdown.clone(),
            stop: CancellationToken::new(),
        });
        // Dropping the set (with the run's future) aborts the readers.
        let mut feeders = JoinSet::new();
        for (index, source) in self.sources.into_iter().enumerate() {
            feeders.spawn(feeder.clone().feed(index, source));
        }
        let classifier = self.classifier.filter(|c| {
            let fits = c.is::<Arc<Classifier<R::Error>>>();
            if !fits {
                tracing::error!(
                    "the outage classifier's error type is not the reconcile's; it is ignored \
                     and every failure counts"
                );
            }
            fits
        });
        // One tracing hook for every runner: a queue run again is not told twice.
        static LOG: std::sync::OnceLock<workqueue_core::__private::OutageHook> =
            std::sync::OnceLock::new();
        let log = || LOG.get_or_init(|| Arc::new(log_outage_event)).clone();
        if let Some(config) = self.outage {
            self.queue.core.set_outage_detection(config, Some(log()));
        } else if self.queue.core.has_outage_detection() {
            self.queue.core.add_outage_hook(log());
        }
        let shared = Arc::new(Shared {
            // Also when the queue's builder turned it on: the runner's signals are finer than
            // the outcome's (a `RequeueAfter(0)` is a success; the runner's failure counts).
            outage: self.queue.core.has_outage_detection(),
            classifier,
            queue: self.queue,
            reconcile: self.reconcile,
            policy: self.policy,
            context: self.context,
            timeout: self.timeout,
            cancel_grace: self.cancel_grace,
            intake: shutdown,
            abort: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            counters,
            failures: FailureCounts::new(),
            reasons,
            metrics,
            controller: Arc::from(controller.as_str()),
            failure_log: self.failure_log,
        });
        let mut workers = Workers::start(self.workers, shared.intake.clone(), {
            let shared = shared.clone();
            move || shared.clone().worker()
        });
        tokio::select! {
            biased;
            () = shared.intake.cancelled() => {
                if !workers.join_within(self.shutdown_grace).await {
                    shared.abort.cancel();
                    if !workers.join_within(self.cancel_grace).await {
                        shared.hard_stop.cancel();
                        workers.join_all().await;
                    }
                }
            }
            () = workers.join_all() => {}
        }
        feeder.stop.cancel();
        while let Some(joined) = feeders.join_next().await {
            if let Err(e) = joined {
                // The readers catch their sources' panics; this is defence in depth.
                tracing::error!(error = %e, "a source reader failed");
            }
        }
        let outage = (
            shared.queue.parked_len(),
            shared.queue.parked_dropped_at_shutdown(),
            shared.queue.core.outage_openings(),
        );
        shared
            .counters
            .report(shared.queue.len(), workers.panics, outage)
    }
}

/// The worker tasks. A worker that ends with a panic is replaced unless intake has stopped:
/// defence in depth, since the runner catches the panics of everything it calls.
struct Workers<F> {
    tasks: JoinSet<()>,
    new_worker: F,
    intake: CancellationToken,
    /// Workers that ended with a panic.
    panics: u64,
}

impl<F, W> Workers<F>
where
    F: Fn() -> W,
    W: Future<Output = ()> + Send + 'static,
{
    fn start(n: usize, intake: CancellationToken, new_worker: F) -> Self {
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
    async fn join_all(&mut self) {
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
    async fn join_within(&mut self, limit: Duration) -> bool {
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
async fn sleep_or_never(d: Duration) {
    match tokio::time::Instant::now().checked_add(d) {
        Some(end) => sleep_until(end).await,
        None => std::future::pending().await,
    }
}

/// Runs `f`; a panic becomes its message.
fn catch<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(f))
        .map_err(|payload| workqueue_core::__private::panic_message(&*payload))
}

impl<T, R, P, S, C> Shared<T, R, P, S, C>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Reconcile<T, C>,
    P: ErrorPolicy<T, R::Error, C>,
{
    async fn worker(self: Arc<Self>) {
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
                        panic = %workqueue_core::__private::panic_message(&*payload),
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
        let attempt = catch(|| self.queue.num_requeues(key)).unwrap_or_else(|m| {
            caught(m);
            0
        });
        let failures = catch(|| self.failures.get(key)).unwrap_or_else(|m| {
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
                attempt,
                failures,
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
            attempt,
            failures,
            priority,
        );
        let judged = AssertUnwindSafe(self.judge(key, &ctx, early).instrument(span.clone()))
            .catch_unwind()
            .await;
        let verdict = match judged {
            Ok(verdict) => verdict,
            Err(payload) => {
                let message = workqueue_core::__private::panic_message(&*payload);
                self.after_panic(&span, key, message, &ctx, started.elapsed())
            }
        };
        self.counters.count(&verdict);
        let (outcome, priority) = verdict.outcome();
        let signal = self.outage.then(|| self.signal(&verdict, failures));
        self.record(key, &verdict, outcome);
        finish(lease, outcome, priority, signal);
    }

    /// What a verdict tells the outage detector: a success, a first failure (the key had no
    /// failure in a row), a failure, or nothing (a per-object failure by the user's
    /// classification, an interrupted reconcile). Never panics: a classifier that panics counts
    /// the failure.
    fn signal(&self, verdict: &Reconciled<R::Error>, failures: u32) -> Signal {
        let (failure, decision) = match verdict {
            Reconciled::Ok(_) => return Signal::Success,
            Reconciled::Interrupted => return Signal::Ignored,
            Reconciled::Failed(failure, decision) => (failure, decision),
        };
        let classifier = self
            .classifier
            .as_deref()
            .and_then(|c| c.downcast_ref::<Arc<Classifier<R::Error>>>());
        let shared = match classifier {
            None => true,
            Some(classify) => catch(|| classify(failure, decision)).unwrap_or_else(|message| {
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
        if outcome == Outcome::done() || outcome == Outcome::forget() {
            return;
        }
        let reason = match verdict {
            Reconciled::Ok(_) => reasons::REQUEUE,
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

    /// The policy's decision on `failure`. The policy is user code too: its panic becomes the
    /// key's failure, about which it is asked once more; a second panic retries. Never panics.
    fn decide(
        &self,
        key: &T,
        failure: Failure<R::Error>,
        ctx: &Context<C>,
    ) -> Reconciled<R::Error> {
        let message = match catch(|| self.policy.decide(key, &failure, ctx)) {
            Ok(decision) => return Reconciled::Failed(failure, decision),
            Err(message) => message,
        };
        let _ = catch(|| tracing::error!(panic = %message, "the error policy panicked"));
        let failure = Failure::Panic(message);
        let decision = catch(|| self.policy.decide(key, &failure, ctx)).unwrap_or(Decision::Retry);
        Reconciled::Failed(failure, decision)
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
            Err(payload) => Ran::Panicked(workqueue_core::__private::panic_message(&*payload)),
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

/// Finishes a lease as `outcome` says, with its re-add at `priority` when one was chosen (else at
/// the lease's own). The queue finishes the key even when the rate limiter panics, then re-raises
/// the panic; the worker catches it here so it survives, as it does a panicking reconcile.
fn finish<T>(lease: Lease<T>, outcome: Outcome, priority: Option<i32>, signal: Option<Signal>) {
    let outcome = match priority {
        Some(p) => outcome.with_priority(p),
        None => outcome,
    };
    let outcome = match signal {
        Some(signal) => outcome.with_signal(signal),
        None => outcome,
    };
    let finished = catch(|| lease.finish(outcome));
    if let Err(message) = finished {
        tracing::error!(
            panic = %message,
            "the rate limiter panicked while finishing a key"
        );
    }
}

/// The one event of a failed reconcile, at `level` (see [`Runner::failure_log`]).
fn log_failure<E: fmt::Debug>(level: Option<tracing::Level>, verdict: &Reconciled<E>) {
    let (Some(level), Reconciled::Failed(failure, decision)) = (level, verdict) else {
        return;
    };
    // `tracing` wants a constant level per call site: one per level.
    macro_rules! event {
        ($level:expr) => {
            match failure {
                Failure::Error(e) => {
                    tracing::event!($level, error = ?e, ?decision, "reconcile failed")
                }
                Failure::Panic(m) => {
                    tracing::event!($level, panic = %m, ?decision, "reconcile panicked")
                }
                Failure::Timeout => tracing::event!($level, ?decision, "reconcile timed out"),
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

impl<T, R, P, S, C> fmt::Debug for Runner<T, R, P, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("sources", &self.sources)
            .field("workers", &self.workers)
            .field("timeout", &self.timeout)
            .field("cancel_grace", &self.cancel_grace)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("outage", &self.outage)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
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
