//! The controller runner: workers that lease keys, reconcile them and finish their leases.
//!
//! `N` workers loop: `get` → `reconcile(key, ctx)` → finish the lease. What a reconcile returns
//! ([`Action`]), or what the error policy answers for a failure (an [`Action`] too), becomes the
//! lease's outcome by one mapping:
//!
//! | reconcile returned | queue operation |
//! |---|---|
//! | `Ok(Action::await_change())` | forget + done |
//! | `Ok(Action::requeue(d))`, `d > 0` | forget + add_after(d) + done |
//! | `Ok(Action::backoff())`, or `Ok(Action::requeue(Duration::ZERO))` | add_rate_limited (no forget) + done: never an unthrottled loop |
//! | `Err(e)`, a panic, or a timeout | the error policy answers ([`Runner::error_policy`]): `backoff()` (rate-limited, the default), `requeue(d)` (retry after `d`), or `await_change()` (give up: forget + done) |
//!
//! A requeue or retry is queued at the priority the key was handed out at ([`Context::priority`];
//! controller-runtime keeps it too), unless the action names another,
//! `Action::requeue(d).with_priority(p)` (controller-runtime's `Result.Priority`). A key
//! interrupted at shutdown keeps its priority.
//!
//! A panic is a [`Failure::Panic`] wherever it happens while a key is leased: in the reconcile, or
//! in anything the runner calls for the key (its `Clone` and `Debug`, the rate limiter, a metrics
//! recorder, the error policy itself, which is then asked about its own panic; a second panic
//! backs off). A worker never dies of a panic (see [`Runner::run`]).
//!
//! Keys come from the queue (added by anyone holding a clone) and from the runner's sources
//! ([`Runner::source`]: streams of keys, read while the runner runs). Every reconcile and the
//! error policy get a [`Context`]: the shared data given once ([`Runner::with_context`]), the
//! cancellation, the priority, and two counts of earlier failures
//! ([`Context::failures_in_a_row`] and [`Context::rate_limited_retries`]). Why a key was queued is
//! in the reconcile's span and metrics, not in the context (see [`Context`]).
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
//! | `rate_limited_retries` | [`Context::rate_limited_retries`] |
//! | `failures_in_a_row` | [`Context::failures_in_a_row`] |
//! | `priority` | the priority the key was handed out at |
//! | `reasons` | why the key was queued, merged across de-duplicated adds: `source:NAME`, `requeue`, `retry`, `direct` |
//! | `shard` | the key's shard, for a `workqueue-kube` `Controller` on Leases (empty otherwise) |
//!
//! A failed reconcile logs one event in that span, at the level [`Runner::failure_log`] sets
//! (`ERROR` by default, or none): `reconcile failed` (with the `error`), `reconcile panicked`
//! (with the `panic` message) or `reconcile timed out`, each with the policy's `action`. The
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
//!     Ok::<_, std::io::Error>(Action::await_change())
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
mod catch;
mod context;
pub(crate) mod engine;
mod failures;
mod feed;
pub mod metrics;
mod reasons;
mod reconcile;
mod report;
mod worker;
mod workers;

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::Stream;
use tokio_util::sync::CancellationToken;
use workqueue_core::state::DefaultHashBuilder;

pub use action::{Action, Failure};
pub use context::Context;
pub use reconcile::Reconcile;
pub use report::Report;

pub(crate) use catch::catch;

/// See the crate's `__private`.
pub(crate) mod __private {
    pub use super::action::Reconciled;
    pub use super::catch::catch;
    pub use super::engine::{Begun, Engine, Limits, Ran};
    pub use super::feed::Source;
}

use crate::WorkQueue;
use crate::source::SourceItem;
use engine::{Classifier, Engine, Limits};
use feed::Source;
use worker::Worker;
use workers::Workers;

/// The error policy: what to do with a key whose reconcile failed.
type Policy<T, E, C> = dyn Fn(&T, &Failure<E>, &Context<C>) -> Action + Send + Sync;

/// Runs a reconcile function over a queue's keys with `N` workers.
///
/// Built with [`Runner::new`] (or [`Runner::with_context`], for data every reconcile shares) and
/// configured with its builder methods; [`Runner::run`] runs it until the queue shuts down (and
/// is drained) or the shutdown token is cancelled.
///
/// `R` is the reconcile function, `C` the shared data every reconcile and the error policy reach
/// through their [`Context`] (`()` without it), `S` the queue's hasher.
#[must_use = "a runner does nothing until `run` is awaited"]
pub struct Runner<T, R: Reconcile<T, C>, C = (), S = DefaultHashBuilder> {
    queue: WorkQueue<T, S>,
    reconcile: R,
    policy: Box<Policy<T, R::Error, C>>,
    context: Arc<C>,
    sources: Vec<Source<T>>,
    workers: usize,
    timeout: Option<Duration>,
    cancel_grace: Duration,
    shutdown_grace: Duration,
    failure_log: Option<tracing::Level>,
    classifier: Option<Box<Classifier<R::Error>>>,
}

impl<T, R, S> Runner<T, R, (), S>
where
    R: Reconcile<T, ()>,
{
    /// A runner of `reconcile` over `queue`, with one worker, no sources, no shared data, no
    /// timeout, the default error policy (every failure backs off: [`Action::backoff()`]), a 30 s
    /// shutdown grace and a 5 s cancel grace.
    ///
    /// `reconcile` is a closure or an `async fn` taking the key and its [`Context`]; the bound
    /// is written out here so that a closure's argument types are inferred, and a reconcile of
    /// the wrong shape is reported at this call. For shared data use [`Runner::with_context`].
    ///
    /// ```compile_fail
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::runner::{Action, Runner};
    ///
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// // The queue's keys are `String`s, not `u32`s.
    /// let runner = Runner::new(queue, |_key: u32, _ctx| async { Ok::<_, std::fmt::Error>(Action::await_change()) });
    /// ```
    pub fn new<Fut, E>(queue: WorkQueue<T, S>, reconcile: R) -> Self
    where
        R: Fn(T, Context) -> Fut,
        Fut: Future<Output = Result<Action, E>>,
    {
        Runner::build(queue, Arc::new(()), reconcile)
    }
}

impl<T, R, C, S> Runner<T, R, C, S>
where
    R: Reconcile<T, C>,
{
    /// A runner whose reconciles and error policy share `data`, reached with [`Context::data`]
    /// (an API client, a cache, an event recorder). Given once; the runner only clones the
    /// `Arc`. Otherwise as [`Runner::new`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use workqueue_tokio::{CancellationToken, WorkQueue};
    /// use workqueue_tokio::runner::{Action, Context, Runner};
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
    ///     if key == "bad" { Err("invalid") } else { Ok(Action::await_change()) }
    /// })
    /// .error_policy(|_key, _failure, ctx| {
    ///     ctx.data().warnings.fetch_add(1, Ordering::Relaxed); // record an event, say
    ///     Action::await_change() // give up until the object changes
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
        R: Fn(T, Context<C>) -> Fut,
        Fut: Future<Output = Result<Action, E>>,
    {
        Runner::build(queue, data, reconcile)
    }

    fn build(queue: WorkQueue<T, S>, data: Arc<C>, reconcile: R) -> Self {
        // controller-runtime labels a controller's queue metrics with `controller` too.
        queue.core.label_controller();
        Runner {
            queue,
            reconcile,
            policy: Box::new(|_: &T, _: &Failure<R::Error>, _: &Context<C>| Action::backoff()),
            context: data,
            sources: Vec::new(),
            workers: 1,
            timeout: None,
            cancel_grace: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            failure_log: Some(tracing::Level::ERROR),
            classifier: None,
        }
    }

    /// The number of workers (reconciles running at once). At least one: 0 is taken as 1.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// What happens to a key whose reconcile failed: `policy(key, failure, ctx)` returns the
    /// [`Action`] (see its table for what each means after a failure). The closure's argument
    /// types are inferred from the reconcile. Default: [`Action::backoff()`] for every failure,
    /// as in controller-runtime.
    ///
    /// The [`Context`] carries the counts to bound retries with: [`Context::failures_in_a_row`]
    /// sees every failure, whatever the policy answered.
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::runner::{Action, Failure, Runner};
    ///
    /// #[derive(Debug)]
    /// enum ApiError { Invalid, Unavailable }
    ///
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// let runner = Runner::new(queue, |_key, _ctx| async { Err::<Action, _>(ApiError::Unavailable) })
    ///     .error_policy(|_key, failure, ctx| match failure {
    ///         // An invalid spec will not fix itself: wait for the object to change.
    ///         Failure::Error(ApiError::Invalid) => Action::await_change(),
    ///         // Retry every 30 s, at most 5 times.
    ///         _ if ctx.failures_in_a_row() < 5 => Action::requeue(Duration::from_secs(30)),
    ///         _ => Action::await_change(),
    ///     });
    /// # drop(runner);
    /// ```
    ///
    /// A policy of the wrong shape fails to compile here, at this call:
    ///
    /// ```compile_fail
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::runner::{Action, Failure, Runner};
    ///
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// let runner = Runner::new(queue, |_key, _ctx| async { Err::<Action, _>(std::fmt::Error) })
    ///     // The reconcile's error is `std::fmt::Error`, not `std::io::Error`.
    ///     .error_policy(|_key, _failure: &Failure<std::io::Error>, _ctx| Action::backoff());
    /// ```
    pub fn error_policy<F>(mut self, policy: F) -> Self
    where
        F: Fn(&T, &Failure<R::Error>, &Context<C>) -> Action + Send + Sync + 'static,
    {
        self.policy = Box::new(policy);
        self
    }

    /// Classifies failures for the outage detector of the queue
    /// ([`Builder::outage_detection`](crate::Builder::outage_detection), where outage-aware
    /// retries are switched on): `classify(failure, action)` says whether a failure may be a
    /// shared outage. Return `false` for an error that is clearly the object's own (an invalid
    /// spec, a 4xx that is not 429), or for the actions that mark them (a give-up, say): such
    /// failures never open the detector, and are never parked. Without it, every failure
    /// counts. Typed by the reconcile's error, so a classifier of another error type does not
    /// compile. Without outage detection on the queue it is not called.
    ///
    /// User code: a classifier that panics counts the failure (as the default does), and the
    /// panic is logged.
    ///
    /// ```
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::ratelimit::OutageConfig;
    /// use workqueue_tokio::runner::{Action, Context, Failure, Runner};
    ///
    /// #[derive(Debug)]
    /// enum ApiError { Status(u16), Unreachable }
    ///
    /// let queue: WorkQueue<String> =
    ///     WorkQueue::builder().outage_detection(OutageConfig::default()).build();
    /// let reconcile = |_key: String, _ctx: Context| async { Ok::<_, ApiError>(Action::await_change()) };
    /// let runner = Runner::new(queue, reconcile).outage_classifier(|failure, _action| match failure {
    ///     Failure::Error(ApiError::Status(s)) => *s == 429 || *s >= 500,
    ///     _ => true,
    /// });
    /// # let _ = runner;
    /// ```
    ///
    /// A classifier of another error type fails to compile:
    ///
    /// ```compile_fail
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::runner::{Action, Context, Failure, Runner};
    ///
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// let reconcile = |_key: String, _ctx: Context| async { Ok::<_, std::fmt::Error>(Action::await_change()) };
    /// let runner = Runner::new(queue, reconcile)
    ///     .outage_classifier(|_failure: &Failure<std::io::Error>, _action| true);
    /// ```
    pub fn outage_classifier<F>(mut self, classify: F) -> Self
    where
        F: Fn(&Failure<R::Error>, &Action) -> bool + Send + Sync + 'static,
    {
        self.classifier = Some(Box::new(classify));
        self
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
    /// error or panic message and the policy's `action`); `None` logs nothing, for an error
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
}

impl<T, R, C, S> Runner<T, R, C, S>
where
    T: Send + 'static,
    R: Reconcile<T, C>,
{
    /// Adds a source: while the runner runs, it reads `stream` and adds its keys to the queue.
    ///
    /// The items are keys, keys with [`AddOptions`](crate::AddOptions), or `Result`s of either
    /// ([`SourceItem`]). What is ready is read at once, up to 1,024
    /// items, and added with one batch add per run of
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
    /// let report = Runner::new(queue.clone(), |_key: String, _ctx| async { Ok::<_, WatchError>(Action::await_change()) })
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

impl<T, R, C, S> Runner<T, R, C, S>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Reconcile<T, C>,
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
        let limits = Limits {
            timeout: self.timeout,
            cancel_grace: self.cancel_grace,
            failure_log: self.failure_log,
            per_key_backoff: false,
            stopped_by_abort: false,
        };
        let (engine, feeders) = Engine::start(
            self.queue,
            self.context,
            limits,
            self.classifier,
            self.sources,
            self.workers,
            shutdown,
        );
        let worker = Arc::new(Worker {
            engine: engine.clone(),
            reconcile: self.reconcile,
            policy: self.policy,
        });
        let intake = engine.intake().clone();
        let mut workers =
            Workers::start(self.workers, intake.clone(), move || worker.clone().run());
        tokio::select! {
            biased;
            () = intake.cancelled() => {
                if !workers.join_within(self.shutdown_grace).await {
                    engine.abort();
                    if !workers.join_within(self.cancel_grace).await {
                        engine.hard_stop();
                        workers.join_all().await;
                    }
                }
            }
            () = workers.join_all() => {}
        }
        engine.end(feeders, workers.panics).await
    }
}

impl<T, R: Reconcile<T, C>, C, S> fmt::Debug for Runner<T, R, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("sources", &self.sources)
            .field("workers", &self.workers)
            .field("timeout", &self.timeout)
            .field("cancel_grace", &self.cancel_grace)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("outage_classifier", &self.classifier.is_some())
            .finish_non_exhaustive()
    }
}
