//! kube-runtime's `applier`, and the one path every controller runs through: the layer between
//! [`Controller`](super::Controller)'s builder and `workqueue-tokio`'s runner.
//!
//! [`applier`] and `Controller::run` both build [`Parts`] and call [`run`]: it makes the queue
//! from the [`Config`], turns the triggers into the runner's sources (their errors go to the
//! stream, their keys are debounced), holds reconciles on the store's readiness gate, and maps
//! the runner's results onto kube-runtime's items, merged in one place with the one path of
//! everything else the stream reports (`super::reports`). The user's reconciler and error
//! policy, and the context given to them, stay on the task that polls the stream.

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::{self, BoxFuture, Either, FutureExt, TryFuture, TryFutureExt};
use futures_util::stream::{self, BoxStream, Stream, StreamExt, TryStream, TryStreamExt};
use kube::Resource;
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use workqueue_tokio::AddOptions;
use workqueue_tokio::runner::{self, Failure, Runner};

use super::config::Config;
use super::error::{Error, RunnerError};
use super::reports::{self, Inbox};
use super::{Action, Parts};

/// A stream of keys and how to add them, or an error of the stream they come from.
pub(super) type Keys<K, QE> = BoxStream<'static, Result<(ObjectRef<K>, AddOptions), QE>>;

/// Apply a reconciler to a stream of objects to reconcile: kube-runtime's `applier`, on the work
/// queue. `store` holds the objects (usually filled by a reflector), `queue` names the ones to
/// reconcile ([`ReconcileRequest`]s, or `ObjectRef`s), and the stream yields one item per
/// reconcile, as [`Controller::run`](super::Controller::run)'s does (that is built on this).
///
/// No reconcile starts before `store` is ready; if its writer is dropped before, the stream
/// yields [`RunnerError::Readiness`] and ends. The stream ends once `queue` has ended and the
/// objects due were reconciled (requeues asked for after that are dropped, as in kube-runtime).
/// An error of `queue` is yielded as [`Error::QueueError`]; the applier goes on.
///
/// The reconciler and the error policy are called on the task that polls the stream, so they
/// need not be `Send`; the reconciler's futures run in parallel on the runtime's threads
/// (kube-runtime's `Controller::run` spawns them too), hence `Send + 'static`.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use futures_util::{StreamExt, TryStreamExt};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{Api, Client};
/// use kube::runtime::{WatchStreamExt, reflector, watcher};
/// use workqueue_kube::controller::{Action, Config, applier};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("reconcile failed")]
/// struct Error;
///
/// # async fn run(client: Client) {
/// let (store, writer) = reflector::store::<ConfigMap>();
/// let objects = reflector(writer, watcher(Api::<ConfigMap>::all(client), watcher::Config::default()))
///     .default_backoff()
///     .applied_objects()
///     .map_ok(|cm| reflector::ObjectRef::from_obj(&cm));
/// applier(
///     |_cm: Arc<ConfigMap>, _ctx: Arc<()>| async { Ok::<_, Error>(Action::requeue(Duration::from_secs(300))) },
///     |_cm, _error, _ctx| Action::requeue(Duration::from_secs(5)),
///     Arc::new(()),
///     store,
///     objects,
///     Config::default(),
/// )
/// .for_each(|result| async move { println!("{result:?}") })
/// .await;
/// # }
/// ```
// kube-runtime's signature, written out as it is there.
#[allow(clippy::type_complexity)]
pub fn applier<K, QueueStream, ReconcilerFut, Ctx>(
    reconciler: impl FnMut(Arc<K>, Arc<Ctx>) -> ReconcilerFut,
    error_policy: impl Fn(Arc<K>, &ReconcilerFut::Error, Arc<Ctx>) -> Action,
    context: Arc<Ctx>,
    store: Store<K>,
    queue: QueueStream,
    config: Config,
) -> impl Stream<Item = Result<(ObjectRef<K>, Action), Error<ReconcilerFut::Error, QueueStream::Error>>>
where
    K: Clone + Resource + Send + Sync + 'static,
    K::DynamicType: fmt::Debug + Eq + Hash + Clone + Unpin + Send + Sync + 'static,
    ReconcilerFut: TryFuture<Ok = Action> + Send + 'static,
    ReconcilerFut::Error: std::error::Error + Send + 'static,
    QueueStream: TryStream + Send + 'static,
    QueueStream::Ok: Into<ReconcileRequest<K>>,
    QueueStream::Error: std::error::Error + Send + 'static,
{
    let (ready, gate) = watch::channel(false);
    let readiness = {
        let store = store.clone();
        async move {
            // A dropped writer drops `ready` unopened: the runner reports it.
            if store.wait_until_ready().await.is_ok() {
                ready.send_replace(true);
            }
        }
    };
    let keys = queue
        .map_ok(|request| (request.into().obj_ref, AddOptions::new()))
        .boxed();
    let parts = Parts {
        name: "applier".into(),
        triggers: vec![("queue".into(), keys)],
        store,
        gate,
        tasks: vec![readiness.boxed()],
        config,
        leases: Ok(None),
        graceful: Vec::new(),
        forceful: Vec::new(),
        dyntype: None,
        reports: reports::channel(),
    };
    run(parts, reconciler, error_policy, context)
}

/// A reconcile's error, with the object it failed on and the span the reconcile ran in (for the
/// error policy, which runs in that span, as kube-runtime's does inside its `reconciling object`
/// span: what it logs carries the object's key).
struct Failed<E, K>(E, Arc<K>, tracing::Span);

impl<E: fmt::Debug, K> fmt::Debug for Failed<E, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The keys whose reconcile found no object in the store, until the stream reports them: the
/// runner saw a successful no-op (so that the key is forgotten and counted as controller-runtime
/// counts a reconcile of a deleted object), the stream yields `ObjectNotFound`.
///
/// A mark beside the runner's result, not in it: a success carries only its `Action`, and a
/// failure would count as one (metrics, the outage detector). A key is marked when its no-op
/// runs, and the mark is taken at that reconcile's item: a key runs once at a time, so a mark
/// found at a key's item is that reconcile's. A no-op dropped unpolled (an abort, a shard's
/// deadline, a shutdown) yields no item and leaves no mark.
struct Missing<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash,
{
    /// Whether `keys` holds any, read without the lock: a mark is set (on a worker) before its
    /// no-op's result goes back to the task that polls the stream, so that result's item sees it.
    any: AtomicBool,
    keys: Mutex<HashSet<ObjectRef<K>>>,
}

impl<K: Resource> Missing<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn insert(&self, key: ObjectRef<K>) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.insert(key);
        self.any.store(true, Ordering::Relaxed);
    }

    /// Whether `key` was missing (and forgets it).
    fn take(&self, key: &ObjectRef<K>) -> bool {
        if !self.any.load(Ordering::Relaxed) {
            return false;
        }
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let found = keys.remove(key);
        self.any.store(!keys.is_empty(), Ordering::Relaxed);
        found
    }
}

/// One item of a controller's stream.
type Item<K, E, QE> = Result<(ObjectRef<K>, Action), Error<E, QE>>;

/// One item of the runner's stream under a controller.
type RunnerItem<K, E> = Result<(ObjectRef<K>, Action), runner::Error<ObjectRef<K>, Failed<E, K>>>;

/// Runs a controller: the queue, the runner over it, the Lease watchdog, and the stream of items.
pub(super) fn run<K, QE, ReconcilerFut, Ctx>(
    parts: Parts<K, QE>,
    mut reconciler: impl FnMut(Arc<K>, Arc<Ctx>) -> ReconcilerFut,
    error_policy: impl Fn(Arc<K>, &ReconcilerFut::Error, Arc<Ctx>) -> Action,
    context: Arc<Ctx>,
) -> impl Stream<Item = Item<K, ReconcilerFut::Error, QE>>
where
    K: Clone + Resource + Send + Sync + 'static,
    K::DynamicType: fmt::Debug + Eq + Hash + Clone + Send + Sync + 'static,
    ReconcilerFut: TryFuture<Ok = Action> + Send + 'static,
    ReconcilerFut::Error: std::error::Error + Send + 'static,
    QE: Send + 'static,
{
    let Parts {
        name,
        triggers,
        store,
        gate,
        tasks,
        config,
        leases,
        graceful,
        forceful,
        dyntype,
        reports: (reports, inbox),
    } = parts;
    let leases = match leases {
        Ok(leases) => leases,
        Err(error) => {
            return stream::iter([Err(Error::RunnerError(error))]).left_stream();
        }
    };
    let queue = config.queue::<K>(&name);
    let missing = Arc::new(Missing {
        any: AtomicBool::new(false),
        keys: Mutex::new(HashSet::new()),
    });
    // The user's reconciler, called on the task that polls the stream, for the object in the
    // store; a key without one is a no-op, reported as `ObjectNotFound`.
    // On Leases, it runs in the scope that `lease::deadline` reads, its polls counted for the
    // lease guard.
    let scope = leases.as_ref().map(|leases| leases.scope::<K>());
    let reconcile = {
        let (store, missing, context) = (store.clone(), missing.clone(), context.clone());
        move |key: ObjectRef<K>, _: runner::Context| match store.get(&key) {
            Some(object) => {
                let on_error = object.clone();
                // The runner polls the reconcile inside its `reconcile` span, so the span
                // current when the reconcile returns is that one.
                let fut = TryFutureExt::into_future(reconciler(object, context.clone())).map(
                    move |result| result.map_err(|e| Failed(e, on_error, tracing::Span::current())),
                );
                Either::Left(match &scope {
                    Some(scope) => Either::Left(scope.wrap(&key, fut)),
                    None => Either::Right(fut),
                })
            }
            None => {
                let missing = missing.clone();
                Either::Right(future::lazy(move |_| {
                    missing.insert(key);
                    Ok(Action::await_change())
                }))
            }
        }
    };
    let policy = {
        let context = context.clone();
        move |_: &ObjectRef<K>,
              failure: &Failure<Failed<ReconcilerFut::Error, K>>,
              _: &runner::Context| {
            match failure {
                Failure::Error(Failed(error, object, span)) => {
                    span.in_scope(|| error_policy(object.clone(), error, context.clone()))
                }
                // A panic: retried after the rate limiter's delay.
                _ => Action::backoff(),
            }
        }
    };
    let runner = config
        .runner(Runner::new(queue.clone(), reconcile))
        .readiness(gate.clone());
    // The one rule for which keys this replica takes: its shards'; and no poll of a reconcile
    // past its shard's deadline.
    let mut runner = match &leases {
        Some(leases) => runner.belongs(leases.owns()).poll_while(leases.may_run()),
        None => runner,
    }
    .error_policy(policy);
    for (name, trigger) in triggers {
        let (reports, config) = (reports.clone(), config.clone());
        let keys = trigger.filter_map(move |item| {
            future::ready(match item {
                Ok((key, opts)) => Some((key, config.trigger(opts))),
                Err(error) => {
                    reports.queue_error(error);
                    None
                }
            })
        });
        runner = runner.source(&name, keys);
    }
    drop(reports);
    let shutdown = CancellationToken::new();
    let watchdog = leases.map(|leases| {
        let dyntype = dyntype.expect("a controller on Leases has its dynamic type");
        let aborts = runner.abort_handle();
        leases.watchdog(
            aborts,
            queue.clone(),
            store.clone(),
            gate,
            dyntype,
            shutdown.clone(),
        )
    });
    let results = runner.results(shutdown.clone());
    let state = State {
        results: Box::pin(results.fuse()),
        reports: inbox,
        missing,
        store,
        start: Some(Start {
            tasks,
            graceful,
            watchdog,
        }),
        background: JoinSet::new(),
        watchdog: None,
        shutdown,
    };
    let forced = if forceful.is_empty() {
        future::pending().left_future()
    } else {
        future::select_all(forceful).map(|_| ()).right_future()
    };
    stream::unfold(state, |mut state| async move {
        let item = state.next().await?;
        Some((item, state))
    })
    .take_until(forced)
    .right_stream()
}

/// What starts at the first poll.
struct Start<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash,
{
    tasks: Vec<BoxFuture<'static, ()>>,
    graceful: Vec<BoxFuture<'static, ()>>,
    watchdog: Option<super::shards::Watchdog<K>>,
}

/// A controller's stream, between polls.
struct State<K: Resource + 'static, R, QE>
where
    K::DynamicType: Eq + Hash,
{
    /// The runner's results (fused: reports may follow their end).
    results: Pin<Box<stream::Fuse<R>>>,
    reports: Inbox<QE>,
    missing: Arc<Missing<K>>,
    store: Store<K>,
    start: Option<Start<K>>,
    /// The tasks that keep the gate, and the one that waits for a graceful shutdown.
    background: JoinSet<()>,
    /// The Lease watchdog's task, and how to tell it the run is over (`None` once told).
    watchdog: Option<(Option<oneshot::Sender<()>>, AbortOnDropHandle<()>)>,
    shutdown: CancellationToken,
}

impl<K, R, E, QE> State<K, R, QE>
where
    K: Clone + Resource + Send + Sync + 'static,
    K::DynamicType: fmt::Debug + Eq + Hash + Clone + Send + Sync + 'static,
    R: Stream<Item = RunnerItem<K, E>>,
    E: std::error::Error + Send + 'static,
    QE: 'static,
{
    /// The next item; `None` once the controller stopped.
    async fn next(&mut self) -> Option<Item<K, E, QE>> {
        self.start();
        loop {
            // The reports first: one already sent never waits behind a busy runner.
            let result = tokio::select! {
                biased;
                Some(report) = self.reports.recv() => return Some(Err(report)),
                result = self.results.next() => result,
            };
            let Some(result) = result else {
                // The run is over (not forced): the reports made until the Lease watchdog
                // finished (its last hand-overs and releases may report), then the end.
                self.background.abort_all();
                tokio::select! {
                    biased;
                    Some(report) = self.reports.recv() => return Some(Err(report)),
                    () = finish(&mut self.watchdog) => return None,
                }
            };
            if let Some(item) = self.item(result) {
                return Some(item);
            }
        }
    }

    /// Starts the gate's tasks, the wait for a graceful shutdown, and the Lease watchdog.
    fn start(&mut self) {
        let Some(start) = self.start.take() else {
            return;
        };
        for task in start.tasks {
            self.background.spawn(task);
        }
        if !start.graceful.is_empty() {
            let (graceful, shutdown) = (start.graceful, self.shutdown.clone());
            self.background.spawn(async move {
                future::select_all(graceful).await;
                shutdown.cancel();
            });
        }
        if let Some(watchdog) = start.watchdog {
            let (finish, finished) = oneshot::channel();
            let task = tokio::spawn(watchdog.run(finished));
            self.watchdog = Some((Some(finish), AbortOnDropHandle::new(task)));
        }
    }

    /// kube-runtime's item for a runner's result.
    fn item(&self, result: RunnerItem<K, E>) -> Option<Item<K, E, QE>> {
        let object = |key: ObjectRef<K>| Box::new(key.erase());
        Some(match result {
            Ok((key, _)) if self.missing.take(&key) => Err(Error::ObjectNotFound(object(key))),
            Ok((key, action)) => Ok((key, action)),
            Err(runner::Error::Failed(key, Failure::Error(Failed(error, ..)))) => {
                Err(Error::ReconcilerFailed(error, object(key)))
            }
            Err(runner::Error::Failed(key, Failure::Panic(message))) => {
                // A no-op whose finish panicked (a metrics recorder) leaves no mark either.
                self.missing.take(&key);
                Err(Error::RunnerError(RunnerError::ReconcilerPanicked {
                    object: object(key),
                    message,
                }))
            }
            Err(runner::Error::Readiness) => {
                // The gate closes unopened only when the store's writer was dropped.
                let dropped = self.store.wait_until_ready().now_or_never()?.err()?;
                Err(Error::RunnerError(RunnerError::Readiness(dropped)))
            }
            // A controller sets no reconcile timeout.
            Err(_) => return None,
        })
    }
}

/// The Lease watchdog, told the run is over, acknowledges what is left so that the protocol
/// releases the Leases; this completes when it is done. Cancel-safe: the stream reads reports
/// meanwhile, and calls it again.
async fn finish(watchdog: &mut Option<(Option<oneshot::Sender<()>>, AbortOnDropHandle<()>)>) {
    let Some((finish, task)) = watchdog.as_mut() else {
        return;
    };
    if let Some(finish) = finish.take() {
        let _ = finish.send(());
    }
    let _ = task.await;
    *watchdog = None;
}
