//! The controller runner: leases due keys, reconciles them (at most `N` at once) and finishes
//! their leases.
//!
//! A [`Runner`] runs as a worker pool ([`Runner::run`], which returns a [`Report`]) or as a
//! stream of results ([`Runner::results`]: kube-runtime's `applier` shape, the layer
//! `workqueue-kube`'s `Controller` stands on). Both are the same machinery: for each due key,
//! `reconcile(key, ctx)` → run its future → finish the lease. What a reconcile returns
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
//!
//! A failed reconcile logs one event in that span, at the level [`Runner::failure_log`] sets
//! (`ERROR` by default, or none): `reconcile failed` (with the `error`), `reconcile panicked`
//! (with the `panic` message) or `reconcile timed out`, each with the policy's `action`. The
//! runner's own troubles (a panicking recorder or source, a worker that died) are `ERROR` events
//! outside it.
//!
//! Shutdown (the token given to [`Runner::run`] or [`Runner::results`]): intake stops at once
//! (no reconcile starts after it); in-flight reconciles may finish within the shutdown grace;
//! then their contexts are cancelled; after the cancel grace their futures are dropped and their
//! keys retried. `run` then returns a [`Report`] (the stream ends).
//!
//! # Where reconciles run
//!
//! The reconcile function and the error policy are called on the task that runs the runner (the
//! one that awaits `run` or polls `results`), so they need not be `Send` or `Sync`. Each
//! reconcile's future (`Send + 'static`) runs on one of the runner's worker tasks, as client-go's
//! reconciles run on its worker goroutines: a worker awaits one reconcile (and finishes its key),
//! then takes the next. The runner starts a worker whenever more reconciles are under way than
//! it has workers, so there are never more than [`Runner::workers`], nor more than ever ran at
//! once; they end with the run. Reconciles so run in parallel on the runtime's threads as any
//! tasks do, and one that computes before its first `.await` holds only its own worker (and, as
//! any task that does not yield, the runtime thread it is on: on a `current_thread` runtime,
//! everything).
//!
//! What this costs where other processes share the CPUs: a new reconcile needs both the task
//! that runs the runner (to call the reconcile function) and a worker (to run its future). On a
//! multi-thread runtime the two are often on different OS threads, so reconciles start in batches
//! of at most [`Runner::workers`], each a hand-over from one thread to the other and back. When
//! every CPU is busy, each hand-over may wait for the kernel to give the woken thread a CPU, so
//! the rate of reconciles that finish at once varies from run to run with how the kernel
//! schedules the threads. A `current_thread` runtime has no such hand-over, at the price above.
//!
//! Hooks for a caller that runs several replicas or waits for a cache:
//! [`Runner::readiness`] (hold reconciles until a gate opens), [`Runner::belongs`] (the one rule
//! for which keys this replica works on), [`Runner::poll_while`] (a running reconcile is polled
//! only while a rule holds), [`Runner::abort_handle`] (drop running reconciles by key from any
//! task), [`Runner::per_key_backoff`].
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

mod aborts;
mod action;
mod catch;
mod context;
mod dispatch;
mod engine;
mod failures;
mod feed;
pub mod metrics;
mod reasons;
mod reconcile;
mod report;
mod workers;

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, Stream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use workqueue_core::state::DefaultHashBuilder;

pub use aborts::Aborts;
pub use action::{Action, Error, Failure};
pub use context::Context;
pub use reconcile::Reconcile;
pub use report::Report;

use catch::catch;

use crate::WorkQueue;
use crate::source::SourceItem;
use aborts::Registry;
use dispatch::Dispatcher;
use feed::Source;

/// The default error policy: [`Action::backoff()`] for every failure.
type DefaultPolicy<T, E, C> = fn(&T, &Failure<E>, &Context<C>) -> Action;

fn back_off<T, E, C>(_: &T, _: &Failure<E>, _: &Context<C>) -> Action {
    Action::backoff()
}

/// Runs a reconcile function over a queue's keys, at most `N` at once.
///
/// Built with [`Runner::new`] (or [`Runner::with_context`], for data every reconcile shares) and
/// configured with its builder methods, it runs in one of two ways:
/// - [`Runner::run`]: until the queue shuts down (and is drained) or the shutdown token is
///   cancelled, and returns a [`Report`];
/// - [`Runner::results`]: as a stream with one item per reconcile (kube-runtime's `applier`
///   shape), for a caller that acts on each result.
///
/// `R` is the reconcile function, `C` the shared data every reconcile and the error policy reach
/// through their [`Context`] (`()` without it), `S` the queue's hasher, `P` the error policy.
#[must_use = "a runner does nothing until `run` is awaited or `results` is polled"]
pub struct Runner<
    T,
    R: Reconcile<T, C>,
    C = (),
    S = DefaultHashBuilder,
    P = DefaultPolicy<T, <R as Reconcile<T, C>>::Error, C>,
> {
    queue: WorkQueue<T, S>,
    reconcile: R,
    policy: P,
    context: Arc<C>,
    sources: Vec<Source<T>>,
    gate: Option<watch::Receiver<bool>>,
    settings: Settings,
    rules: Rules<T, R::Error>,
}

/// Whether a failure may be a shared outage (see `Runner::outage_classifier`).
type Classifier<E> = dyn Fn(&Failure<E>, &Action) -> bool + Send + Sync;

/// Whether a key belongs to this runner (see `Runner::belongs`).
type Belongs<T> = dyn Fn(&T) -> bool + Send + Sync;

/// A runner's settings, read by its parts (the engine and the dispatcher).
#[derive(Debug, Clone, Copy)]
struct Settings {
    /// How many reconciles may run at once (at least one).
    workers: usize,
    /// The time limit of one reconcile (`None`: none).
    timeout: Option<Duration>,
    /// How long a reconcile whose context was cancelled may take before its future is dropped.
    cancel_grace: Duration,
    /// How long reconciles running at shutdown may take before their contexts are cancelled.
    shutdown_grace: Duration,
    /// The level of the failure event (`None`: no event).
    failure_log: Option<tracing::Level>,
    /// Whether a failure's `Action::requeue(d)` waits the rate limiter's delay, at least `d`.
    per_key_backoff: bool,
}

/// A runner's rules about keys and failures (user code, called from its tasks), and the
/// registry its abort handles reach.
struct Rules<T, E> {
    /// Whether a failure may be a shared outage (see `Runner::outage_classifier`).
    classifier: Option<Box<Classifier<E>>>,
    /// Whether a key belongs to this runner (see `Runner::belongs`).
    belongs: Option<Arc<Belongs<T>>>,
    /// Whether a running reconcile of a key may be polled again (see `Runner::poll_while`).
    poll_while: Option<Arc<Belongs<T>>>,
    registry: Arc<Registry<T>>,
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
        R: FnMut(T, Context) -> Fut,
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
        R: FnMut(T, Context<C>) -> Fut,
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
            policy: back_off::<T, R::Error, C>,
            context: data,
            sources: Vec::new(),
            gate: None,
            settings: Settings {
                workers: 1,
                timeout: None,
                cancel_grace: Duration::from_secs(5),
                shutdown_grace: Duration::from_secs(30),
                failure_log: Some(tracing::Level::ERROR),
                per_key_backoff: false,
            },
            rules: Rules {
                classifier: None,
                belongs: None,
                poll_while: None,
                registry: Arc::new(Registry::new()),
            },
        }
    }
}

impl<T, R, C, S, P> Runner<T, R, C, S, P>
where
    R: Reconcile<T, C>,
{
    /// The number of workers: how many reconciles may run at once. At least one: 0 is taken as
    /// 1; `usize::MAX` is no limit.
    pub fn workers(mut self, n: usize) -> Self {
        self.settings.workers = n.max(1);
        self
    }

    /// What happens to a key whose reconcile failed: `policy(key, failure, ctx)` returns the
    /// [`Action`] (see its table for what each means after a failure). The closure's argument
    /// types are inferred from the reconcile. Default: [`Action::backoff()`] for every failure,
    /// as in controller-runtime. It is called on the task that runs the runner (it need not be
    /// `Send` or `Sync`).
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
    pub fn error_policy<F>(self, policy: F) -> Runner<T, R, C, S, F>
    where
        F: FnMut(&T, &Failure<R::Error>, &Context<C>) -> Action,
    {
        Runner {
            queue: self.queue,
            reconcile: self.reconcile,
            policy,
            context: self.context,
            sources: self.sources,
            gate: self.gate,
            settings: self.settings,
            rules: self.rules,
        }
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
        self.rules.classifier = Some(Box::new(classify));
        self
    }

    /// A time limit per reconcile: past it the reconcile's context is cancelled, its future is
    /// dropped after the cancel grace, and it counts as [`Failure::Timeout`]. A limit too long to
    /// represent as an instant (`Duration::MAX`) is no limit.
    pub fn reconcile_timeout(mut self, limit: Duration) -> Self {
        self.settings.timeout = Some(limit);
        self
    }

    /// How long a reconcile whose context was cancelled may take to return before its future is
    /// dropped. Default 5 s. A grace too long to represent as an instant (`Duration::MAX`) is no
    /// limit: the runner waits until the reconcile returns.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.settings.cancel_grace = grace;
        self
    }

    /// The level of the one event logged for each failed reconcile (`"reconcile failed"`,
    /// `"reconcile panicked"` or `"reconcile timed out"`, inside the reconcile's span, with the
    /// error or panic message and the policy's `action`); `None` logs nothing, for an error
    /// policy that logs failures its own way. Default: `ERROR`, as controller-runtime logs
    /// "Reconciler error".
    pub fn failure_log(mut self, level: Option<tracing::Level>) -> Self {
        self.settings.failure_log = level;
        self
    }

    /// How long in-flight reconciles may run after shutdown before their contexts are cancelled.
    /// Default 30 s. A grace too long to represent as an instant (`Duration::MAX`) is no limit.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.settings.shutdown_grace = grace;
        self
    }

    /// Per-key backoff for failures: when the error policy answers `Action::requeue(d)`, the key
    /// waits the rate limiter's delay for it, and at least `d` (without it, exactly `d`). Off by
    /// default. A success's `requeue(d)` is a poll and always waits exactly `d`.
    pub fn per_key_backoff(mut self, enabled: bool) -> Self {
        self.settings.per_key_backoff = enabled;
        self
    }

    /// Holds reconciles while `gate` reads `false`: no key is taken then (keys still queue up),
    /// and a key taken just as the gate closed is held until it opens again. A controller keeps
    /// it `false` until its cache holds a complete list of the objects, and while it relists.
    ///
    /// A gate whose sender is dropped while it reads `false` can never open: the stream yields
    /// [`Error::Readiness`] and ends once running reconciles finished (`run` logs it and
    /// returns). A gate dropped while `true` stays open.
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use tokio::sync::watch;
    /// use workqueue_tokio::{CancellationToken, WorkQueue};
    /// use workqueue_tokio::runner::{Action, Error, Runner};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// queue.add("default/web".to_string());
    /// let (ready, gate) = watch::channel(false);
    /// let reconcile = |_key: String, _ctx| async { Ok::<_, std::io::Error>(Action::await_change()) };
    /// let mut results = Box::pin(Runner::new(queue, reconcile).readiness(gate).results(CancellationToken::new()));
    /// drop(ready); // the cache's writer went away before it was ready
    /// assert!(matches!(results.next().await, Some(Err(Error::Readiness))));
    /// assert!(results.next().await.is_none());
    /// # }
    /// ```
    pub fn readiness(mut self, gate: watch::Receiver<bool>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The one rule for which keys this runner works on: a replica that owns part of the keys
    /// (the shards it holds a Lease for, say) says here whether a key is its own now. The rule
    /// is applied at every step:
    /// - at the sources: a key that does not belong is not queued;
    /// - when a key is leased: it is not reconciled; its lease is finished, its backoff
    ///   forgotten;
    /// - when a reconcile ends: a key that no longer belongs is finished without a re-add,
    ///   whatever the reconcile or the error policy asked (its new owner runs it).
    ///
    /// The rule is called on the runner's tasks (hence `Send + Sync`); it must be quick (it runs
    /// for every key). A rule that panics says no (the panic is logged).
    ///
    /// ```
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::runner::{Action, Runner};
    ///
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// let reconcile = |_key: String, _ctx| async { Ok::<_, std::io::Error>(Action::await_change()) };
    /// // This replica works on the keys of namespace "a".
    /// let runner = Runner::new(queue, reconcile).belongs(|key: &String| key.starts_with("a/"));
    /// # drop(runner);
    /// ```
    pub fn belongs(mut self, rule: impl Fn(&T) -> bool + Send + Sync + 'static) -> Self {
        self.rules.belongs = Some(Arc::new(rule));
        self
    }

    /// The rule for which running reconciles may go on: `rule(key)` is asked before every poll
    /// of a reconcile's future (its first included), and once it says no the future is dropped
    /// without that poll, as an [aborted](Aborts) reconcile's is (its key is finished as an
    /// interrupted reconcile's: without a re-add when it no longer
    /// [belongs](Runner::belongs), retried otherwise; the stream yields nothing for it).
    ///
    /// What it is for: work that must not go on past a deadline that a task cannot enforce in
    /// time. A replica that holds a shard until a deadline says here "the deadline has not
    /// passed"; a process frozen (a pause, a suspended machine) and thawed after the deadline
    /// then stops every reconcile at its next poll, where an abort from another task would come
    /// only once that task ran. A poll already under way is not interrupted: code that computes
    /// without awaiting is not stopped by anything here.
    ///
    /// The rule is called on the tasks that poll reconciles (hence `Send + Sync`) at every poll:
    /// it must be quick. A rule that panics says no (the panic is logged).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use workqueue_tokio::WorkQueue;
    /// use workqueue_tokio::runner::{Action, Runner};
    ///
    /// let queue: WorkQueue<String> = WorkQueue::new();
    /// let reconcile = |_key: String, _ctx| async { Ok::<_, std::io::Error>(Action::await_change()) };
    /// let held = Arc::new(AtomicBool::new(true));
    /// let runner = Runner::new(queue, reconcile)
    ///     .poll_while(move |_key: &String| held.load(Ordering::Acquire));
    /// # drop(runner);
    /// ```
    pub fn poll_while(mut self, rule: impl Fn(&T) -> bool + Send + Sync + 'static) -> Self {
        self.rules.poll_while = Some(Arc::new(rule));
        self
    }

    /// A handle to abort running reconciles by key, from any task (see [`Aborts`]). The runner
    /// keeps track of its running reconciles only once it has handed out a handle.
    pub fn abort_handle(&self) -> Aborts<T> {
        Aborts::new(self.rules.registry.clone())
    }
}

impl<T, R, C, S, P> Runner<T, R, C, S, P>
where
    T: Send + 'static,
    R: Reconcile<T, C>,
{
    /// Adds a source: while the runner runs, it reads `stream` and adds its keys to the queue.
    ///
    /// The items are keys, keys with [`AddOptions`](crate::AddOptions), or `Result`s of either
    /// ([`SourceItem`]). What is ready is read at once, up to 1,024 items, and added with one
    /// batch add per run of equal options; `name` names the source in logs, in the reconcile
    /// span's `reasons`, and in metrics. Any number of sources may be added: each read takes
    /// what every source has ready, so a key ready in several is queued once. They are read by
    /// the task that runs the runner (the one that awaits [`run`](Runner::run) or polls
    /// [`results`](Runner::results)), between its other steps, as kube-runtime's controller reads
    /// its watches: what a source allocates (a watch's decoded objects, a store it fills) is
    /// allocated there, and a source that blocks its thread in `poll_next` blocks the runner.
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

impl<T, R, C, S, P> Runner<T, R, C, S, P>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Reconcile<T, C>,
    P: FnMut(&T, &Failure<R::Error>, &Context<C>) -> Action,
{
    /// Runs until the queue is shut down and drained, or `shutdown` is cancelled, and returns
    /// what the run did.
    ///
    /// It returns:
    /// - after the queue was shut down, once it is empty (`get` returned `None`) and the
    ///   reconciles in flight finished, whatever its sources are doing;
    /// - after `shutdown` was cancelled, once the reconciles in flight finished: within the
    ///   shutdown grace, else within the cancel grace after their contexts were cancelled, else
    ///   when their futures were dropped ([`Report::interrupted`]);
    /// - after a [readiness gate](Runner::readiness) was dropped before it opened (logged), once
    ///   the reconciles in flight finished.
    ///
    /// It does not return for any other reason: a panic in the code the runner calls (the
    /// reconcile, the error policy, the rate limiter, the key's `Clone` or `Debug`, a metrics
    /// recorder) fails the key it was handling ([`Failure::Panic`]) or, inside the queue's `get`,
    /// is counted in [`Report::get_panics`]; the run goes on. A runner task that still ends with
    /// a panic is replaced unless the run is ending, and counted in [`Report::worker_panics`].
    ///
    /// A source that ends or fails never ends the run (see [`source`](Runner::source)).
    ///
    /// Must run inside a tokio runtime (the workers are tasks).
    /// Dropping the future drops the running reconciles at their next poll and the sources;
    /// leases finish as dropped or interrupted leases do.
    pub async fn run(self, shutdown: CancellationToken) -> Report {
        let mut dispatcher = Dispatcher::new(self, shutdown, false);
        while dispatcher.next().await.is_some() {}
        dispatcher.report()
    }

    /// Runs as a stream with one item per reconcile, kube-runtime's `applier` shape: the key and
    /// the [`Action`] of a success, or an [`Error`] (a failure, after the error policy's action
    /// was applied). Nothing runs until the stream is polled; the reconcile function and the
    /// error policy are called on the task that polls it.
    ///
    /// The stream ends:
    /// - once every [source](Runner::source) has ended (if there was one) and what was queued is
    ///   done: the keys due, and those waiting for a delayed add (a debounce), are reconciled;
    ///   requeues and retries are dropped, both those already waiting and those asked for after
    ///   (kube-runtime's applier drops everything not yet started when its input ends);
    /// - as [`run`](Runner::run) returns: the queue shut down and drained, `shutdown` cancelled,
    ///   or the [readiness gate](Runner::readiness) dropped before it opened (after its
    ///   [`Error::Readiness`] item).
    ///
    /// A reconcile dropped at shutdown or [aborted](Aborts) yields no item; one whose key no
    /// longer [belongs](Runner::belongs) yields its result (its key is not re-added). Items
    /// wait for the stream to be polled, but reconciles do not: they run and finish on their own
    /// tasks, so a slow consumer delays only the error policy's decisions (made as it polls)
    /// and the start of new reconciles.
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use futures_util::stream;
    /// use workqueue_tokio::{CancellationToken, WorkQueue};
    /// use workqueue_tokio::runner::{Action, Error, Runner};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let queue: WorkQueue<&'static str> = WorkQueue::new();
    /// let keys = stream::iter(["web", "db"]);
    /// // Not `Send`: called on this task only.
    /// let seen = std::rc::Rc::new(std::cell::Cell::new(0));
    /// let reconcile = {
    ///     let seen = seen.clone();
    ///     move |key: &'static str, _ctx| {
    ///         seen.set(seen.get() + 1);
    ///         async move { if key == "db" { Err("down") } else { Ok(Action::await_change()) } }
    ///     }
    /// };
    /// let results: Vec<_> = Runner::new(queue, reconcile)
    ///     .workers(4)
    ///     .error_policy(|_key, _failure, _ctx| Action::await_change())
    ///     .source("objects", keys)
    ///     .results(CancellationToken::new())
    ///     .collect()
    ///     .await;
    /// assert_eq!(seen.get(), 2);
    /// assert!(results.iter().any(|r| matches!(r, Ok(("web", _)))));
    /// assert!(results.iter().any(|r| matches!(r, Err(Error::Failed("db", _)))));
    /// # }
    /// ```
    pub fn results(
        self,
        shutdown: CancellationToken,
    ) -> impl Stream<Item = Result<(T, Action), Error<T, R::Error>>> {
        let dispatcher = Dispatcher::new(self, shutdown, true);
        stream::unfold(dispatcher, |mut dispatcher| async move {
            let item = dispatcher.next().await?;
            Some((item, dispatcher))
        })
    }
}

impl<T, R: Reconcile<T, C>, C, S, P> fmt::Debug for Runner<T, R, C, S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("sources", &self.sources)
            .field("settings", &self.settings)
            .field("readiness", &self.gate.is_some())
            .field("belongs", &self.rules.belongs.is_some())
            .field("poll_while", &self.rules.poll_while.is_some())
            .field("outage_classifier", &self.rules.classifier.is_some())
            .finish_non_exhaustive()
    }
}
