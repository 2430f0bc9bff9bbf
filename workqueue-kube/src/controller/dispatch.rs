//! The task that polls a controller's stream: it takes due keys from the queue while the store
//! may be read, calls the user's reconcile and error policy (on this task: they need not be
//! `Send` or `Sync`), runs each reconcile's future as a task of its own, and reports each
//! result as an item of the stream.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::{self, BoxFuture, FutureExt, TryFuture, TryFutureExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use workqueue_tokio::__private::{Begun, Engine, Limits, Ran, Reconciled, Source, catch};
use workqueue_tokio::runner::{Action, Context, Failure};
use workqueue_tokio::{Lease, WorkQueue};

use super::error::{Error, RunnerError};
use super::shards::{Owner, ShardEvent, ShardMetrics, Shards};
use super::triggers::Readiness;
use crate::lease::{Ended, ShardEvents, ShardLeases};

/// The engine over a controller's keys.
type Keys<K, E, C> = Engine<ObjectRef<K>, E, C, workqueue_tokio::DefaultHashBuilder>;

/// One item of a controller's stream.
pub(crate) type Item<K, E> = Result<(ObjectRef<K>, Action), Error<E, watcher::Error>>;

/// A reconcile that ran as a task, with what its lease needs to be finished.
struct Finished<K: Resource, E, C> {
    lease: Lease<ObjectRef<K>>,
    begun: Begun<C>,
    object: Arc<K>,
    ran: Ran<E>,
}

/// What the first poll starts.
pub(crate) struct Setup<K: Resource> {
    pub(crate) queue: WorkQueue<ObjectRef<K>>,
    pub(crate) sources: Vec<Source<ObjectRef<K>>>,
    pub(crate) concurrency: u16,
    pub(crate) per_key_backoff: bool,
    pub(crate) shutdown_grace: Duration,
    /// Set to `Ready` once the store may be read; kept by the main watch's stage, or by a task
    /// that waits for the store (`for_stream`).
    pub(crate) gate: watch::Receiver<Readiness>,
    /// Work to spawn at the start (waiting for a store made elsewhere to be ready).
    pub(crate) tasks: Vec<BoxFuture<'static, ()>>,
    pub(crate) errors: mpsc::UnboundedReceiver<watcher::Error>,
    pub(crate) graceful: Vec<BoxFuture<'static, ()>>,
    pub(crate) forceful: Vec<BoxFuture<'static, ()>>,
    /// The Lease protocol this replica takes part in, if any.
    pub(crate) leases: Option<Leases>,
}

/// A controller's Lease protocol, started with it.
pub(crate) struct Leases {
    pub(crate) protocol: ShardLeases,
    pub(crate) events: ShardEvents,
    /// How long a lost shard's reconciles may run after its `valid_until`.
    pub(crate) margin: Duration,
}

/// Where the dispatcher is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Taking keys as they come due.
    Running,
    /// Every trigger ended: the queue was shut down; its due keys are still taken.
    Draining,
    /// No key is taken any more; running reconciles finish (graceful shutdown), then are asked
    /// to stop, then dropped.
    Stopping,
}

pub(crate) struct Dispatch<K, C, E, R, P>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    E: 'static,
{
    setup: Option<Setup<K>>,
    engine: Option<Arc<Keys<K, E, C>>>,
    feeders: JoinSet<()>,
    feeding: bool,
    background: JoinSet<()>,
    intake: CancellationToken,
    store: Store<K>,
    dyntype: K::DynamicType,
    gate: Option<watch::Receiver<Readiness>>,
    /// The gate's sender is gone: its value no longer changes.
    gate_final: bool,
    reconciler: R,
    error_policy: P,
    context: Arc<C>,
    running: JoinSet<TaskEnd<K, E, C>>,
    /// Leases taken while the store could not be read: dispatched once it can.
    held: Vec<Lease<ObjectRef<K>>>,
    limit: usize,
    errors: Option<mpsc::UnboundedReceiver<watcher::Error>>,
    graceful: Pin<Box<dyn Future<Output = ()> + Send>>,
    forceful: Pin<Box<dyn Future<Output = ()> + Send>>,
    phase: Phase,
    forced: bool,
    shutdown_grace: Duration,
    /// When the reconciles still running after a graceful shutdown began are dropped.
    abort_at: Option<tokio::time::Instant>,
    /// With Leases: the shards this replica holds, and the protocol's task.
    shards: Option<Shards>,
    protocol: Option<tokio::task::JoinHandle<Ended>>,
    shard_metrics: Option<ShardMetrics>,
}

impl<K, C, E, R, P, Fut> Dispatch<K, C, E, R, P>
where
    K: Clone + Resource + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + Debug + Send + Sync + 'static,
    C: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
    R: FnMut(Arc<K>, Arc<C>) -> Fut,
    Fut: TryFuture<Ok = Action, Error = E> + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<C>) -> Action,
{
    pub(crate) fn new(
        setup: Setup<K>,
        store: Store<K>,
        dyntype: K::DynamicType,
        reconciler: R,
        error_policy: P,
        context: Arc<C>,
    ) -> Self {
        Dispatch {
            setup: Some(setup),
            engine: None,
            feeders: JoinSet::new(),
            feeding: false,
            background: JoinSet::new(),
            intake: CancellationToken::new(),
            store,
            dyntype,
            gate: None,
            gate_final: false,
            reconciler,
            error_policy,
            context,
            running: JoinSet::new(),
            held: Vec::new(),
            limit: usize::MAX,
            errors: None,
            graceful: Box::pin(future::pending()),
            forceful: Box::pin(future::pending()),
            phase: Phase::Running,
            forced: false,
            shutdown_grace: Duration::ZERO,
            abort_at: None,
            shards: None,
            protocol: None,
            shard_metrics: None,
        }
    }

    /// Starts the sources and the engine (at the first poll: nothing runs before).
    fn start(&mut self) -> Arc<Keys<K, E, C>> {
        if let Some(engine) = &self.engine {
            return engine.clone();
        }
        let setup = self
            .setup
            .take()
            .expect("a dispatcher without an engine has its setup");
        let limits = Limits {
            timeout: None,
            // Unused: a reconcile here has no timeout, and is stopped by aborting its task.
            cancel_grace: Duration::ZERO,
            // The stream reports every failure; the caller logs them (as kube-runtime's do).
            failure_log: None,
            per_key_backoff: setup.per_key_backoff,
            // kube-runtime's reconciles get no context to watch: stopping one is dropping it.
            stopped_by_abort: true,
        };
        let (engine, feeders) = Engine::start(
            setup.queue,
            self.context.clone(),
            limits,
            None,
            setup.sources,
            usize::from(setup.concurrency),
            self.intake.clone(),
        );
        self.feeders = feeders;
        self.feeding = !self.feeders.is_empty();
        for task in setup.tasks {
            self.background.spawn(task);
        }
        self.gate = Some(setup.gate);
        self.errors = Some(setup.errors);
        self.limit = match setup.concurrency {
            0 => usize::MAX,
            n => usize::from(n),
        };
        self.shutdown_grace = setup.shutdown_grace;
        if !setup.graceful.is_empty() {
            self.graceful = Box::pin(future::select_all(setup.graceful).map(|_| ()));
        }
        if !setup.forceful.is_empty() {
            self.forceful = Box::pin(future::select_all(setup.forceful).map(|_| ()));
        }
        if let Some(leases) = setup.leases {
            let shutdown = self.intake.clone().cancelled_owned();
            self.protocol = Some(tokio::spawn(leases.protocol.run(shutdown)));
            let shards = Shards::new(
                leases.events.assignment,
                leases.events.hand_overs,
                leases.margin,
            );
            let metrics = ShardMetrics::new(engine.queue().name().unwrap_or("unnamed"));
            metrics.emit(&shards.assignment());
            self.shards = Some(shards);
            self.shard_metrics = Some(metrics);
        }
        self.engine = Some(engine.clone());
        engine
    }

    /// The next item of the stream; `None` once the controller has stopped.
    pub(crate) async fn next(&mut self) -> Option<Item<K, E>> {
        let engine = self.start();
        loop {
            if self.readiness() == Readiness::Ready
                && let Some(lease) = self.held.pop()
            {
                if let Some(item) = self.dispatch(&engine, lease) {
                    return Some(item);
                }
                continue;
            }
            if self.phase != Phase::Running && self.running.is_empty() {
                let draining = self.phase == Phase::Draining;
                let unreadable = self.readiness() != Readiness::Ready && self.gate_final;
                // Draining ends when the queue is empty, or when the store can never be read.
                if !draining || unreadable || self.forced {
                    self.stop(&engine).await;
                    return None;
                }
            }
            let readable = self.readiness() == Readiness::Ready;
            let take = self.phase != Phase::Stopping
                && !self.forced
                && readable
                && self.running.len() + self.held.len() < self.limit;
            let gate_open = self.gate.is_some() && !self.gate_final;
            let deadline = self.next_deadline();
            let shard_deadline = self.shards.as_ref().and_then(Shards::next_deadline);
            tokio::select! {
                biased;
                () = &mut self.forceful, if !self.forced => {
                    self.forced = true;
                    self.intake.cancel();
                    self.phase = Phase::Stopping;
                    self.running.abort_all();
                }
                Some(error) = recv(&mut self.errors) => {
                    return Some(Err(Error::QueueError(error)));
                }
                Some(joined) = self.running.join_next_with_id() => {
                    let id = match &joined {
                        Ok((id, _)) => *id,
                        Err(error) => error.id(),
                    };
                    let item = match joined {
                        Ok((_, TaskEnd::Judged(item))) => item,
                        Ok((_, TaskEnd::Failed(done))) => self.verdict(&engine, done),
                        Err(error) if error.is_cancelled() => {
                            // Aborted: its shard was lost or handed over; its lease finished
                            // without a re-add when the task dropped it.
                            tracing::warn!("a reconcile of a shard given up was aborted");
                            None
                        }
                        Err(error) => {
                            // `drive` catches the reconcile's panics; this is defence in depth.
                            tracing::error!(%error, "a reconcile task failed");
                            None
                        }
                    };
                    if let Some(shards) = &mut self.shards {
                        shards.ended(id);
                    }
                    if let Some(item) = item {
                        return Some(item);
                    }
                }
                () = &mut self.graceful, if self.phase != Phase::Stopping => {
                    self.intake.cancel();
                    self.begin_stopping();
                }
                joined = self.feeders.join_next(), if self.feeding => {
                    if joined.is_none() {
                        // Every trigger ended: serve what is due, then stop (as kube-runtime
                        // does when its trigger stream ends).
                        self.feeding = false;
                        if self.phase == Phase::Running {
                            engine.queue().shut_down();
                            self.phase = Phase::Draining;
                        }
                    }
                }
                // Any change of readiness (a relist starting, too) stops or resumes the taking of
                // keys before the next one is taken.
                changed = changed(&mut self.gate), if gate_open => {
                    if changed.is_err() {
                        // The main watch ended: readiness stays as it last was.
                        self.gate_final = true;
                    }
                }
                got = engine.queue().get(), if take => {
                    match got {
                        // The store may have stopped being readable since `take` was decided
                        // (the gate's change is seen only at the next turn): hold the lease.
                        Some(lease) if self.readiness() != Readiness::Ready => self.held.push(lease),
                        Some(lease) => {
                            if let Some(item) = self.dispatch(&engine, lease) {
                                return Some(item);
                            }
                        }
                        None => self.begin_stopping(),
                    }
                }
                () = sleep_until(deadline), if deadline.is_some() => self.on_deadline(),
                event = shard_event(&mut self.shards) => match event {
                    ShardEvent::Changed => self.on_assignment(&engine),
                    ShardEvent::HandOver(hand_over) => {
                        if let Some(shards) = &mut self.shards {
                            shards.hand_over(hand_over);
                        }
                    }
                    ShardEvent::HandOversClosed => {
                        if let Some(shards) = &mut self.shards {
                            shards.hand_overs_closed();
                        }
                    }
                },
                () = sleep_until(shard_deadline), if shard_deadline.is_some() => {
                    if let Some(shards) = &mut self.shards {
                        shards.on_time();
                    }
                }
                ended = protocol_ended(&mut self.protocol) => {
                    // With `OnLoss::Stop`, a lost shard ends the protocol: the controller
                    // stops too, so that the process can exit.
                    if let Ok(Ended::Lost { shard }) = ended {
                        tracing::warn!(shard, "a Lease was lost: the controller shuts down");
                        self.intake.cancel();
                        self.begin_stopping();
                    }
                }
            }
            self.drop_stopped_shards(&engine);
        }
    }

    fn readiness(&self) -> Readiness {
        self.gate
            .as_ref()
            .map_or(Readiness::NotReady, |gate| *gate.borrow())
    }

    fn begin_stopping(&mut self) {
        if self.phase == Phase::Stopping {
            return;
        }
        self.phase = Phase::Stopping;
        // A grace too long to be an instant (`Duration::MAX`) is no limit.
        self.abort_at = tokio::time::Instant::now().checked_add(self.shutdown_grace);
    }

    fn next_deadline(&self) -> Option<tokio::time::Instant> {
        if self.phase != Phase::Stopping || self.running.is_empty() {
            return None;
        }
        self.abort_at
    }

    /// The shutdown grace is over: the reconciles still running are dropped.
    fn on_deadline(&mut self) {
        self.running.abort_all();
        self.abort_at = None;
    }

    /// Ends the run: stops the sources and background tasks.
    async fn stop(&mut self, engine: &Keys<K, E, C>) {
        self.intake.cancel();
        self.background.abort_all();
        if let Some(shards) = &mut self.shards {
            // Nothing runs any more: every hand-over can be acknowledged, so that the protocol
            // releases the Leases for a fast failover (a forced stop drops it: they lapse).
            shards.acknowledge_everything();
            let hand_overs = shards.take_hand_overs();
            if let (Some(protocol), Some(hand_overs), false) =
                (self.protocol.take(), hand_overs, self.forced)
            {
                let acknowledge = crate::lease::acknowledge_all(hand_overs);
                tokio::select! {
                    _ = protocol => {}
                    () = acknowledge => {}
                }
            }
        }
        if let Some(protocol) = self.protocol.take() {
            protocol.abort();
        }
        let feeders = std::mem::take(&mut self.feeders);
        let _report = engine.end(feeders, 0).await;
    }

    /// Starts the reconcile of `lease`'s object, or reports that it is not in the store.
    fn dispatch(
        &mut self,
        engine: &Arc<Keys<K, E, C>>,
        lease: Lease<ObjectRef<K>>,
    ) -> Option<Item<K, E>> {
        let shard = self.shards.as_ref().map(|shards| shards.shard(lease.key()));
        if let (Some(shards), Some(shard)) = (&self.shards, shard)
            && !shards.accepts(shard)
        {
            // Queued while its shard was held: another replica runs it now.
            engine.discard(lease);
            return None;
        }
        let Some(object) = self.store.get(lease.key()) else {
            let missing = lease.key().clone().erase();
            engine.discard(lease);
            return Some(Err(Error::ObjectNotFound(Box::new(missing))));
        };
        // The user's reconcile is called here, on the task that polls the stream (it need not be
        // `Send`). The rest of the lease is one future: the counts and the span, the reconcile's
        // future under the runner's limits, and the finish of a success. It is polled here once:
        // a reconcile with nothing to wait for (the usual no-op of a level-triggered controller,
        // which finds the object as it should be) ends there, without a task; one that waits
        // goes on as a task of its own, so that the runtime's threads share the reconciles. A
        // failure comes back here for the error policy (user code, here again).
        let started = catch(|| (self.reconciler)(object.clone(), self.context.clone()));
        let owner = self.shards.as_ref().map(Shards::owner);
        let job_engine = engine.clone();
        let mut job = Box::pin(async move {
            let engine = job_engine;
            let mut begun = engine.begin(&lease);
            if let Some(shard) = shard {
                begun.span.record("shard", shard);
            }
            let ran = match (begun.early.take(), started) {
                (Some(message), _) | (None, Err(message)) => Ran::Panicked(message),
                (None, Ok(fut)) => {
                    let fut = TryFutureExt::into_future(fut);
                    let span = begun.span.clone();
                    engine.drive(move || fut, &begun.ctx).instrument(span).await
                }
            };
            let done = Finished {
                lease,
                begun,
                object,
                ran,
            };
            match done.ran {
                Ran::Returned(Ok(_)) | Ran::Interrupted => {
                    TaskEnd::Judged(finish(&engine, done, owner.as_ref(), never_fails))
                }
                _ => TaskEnd::Failed(done),
            }
        });
        // The job catches every panic of user code (`drive` and the engine's steps do); a waker
        // that does nothing is enough: a future that is not ready registers its wake-ups again
        // when the task polls it.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match catch(|| job.as_mut().poll(&mut cx)) {
            Ok(Poll::Ready(TaskEnd::Judged(item))) => return item,
            Ok(Poll::Ready(TaskEnd::Failed(done))) => return self.verdict(engine, done),
            Ok(Poll::Pending) => {}
            Err(message) => {
                // Defence in depth, as for a task's panic: the lease ends with the job.
                tracing::error!(panic = %message, "a reconcile's job panicked");
                return None;
            }
        }
        let task = self.running.spawn(job);
        if let (Some(shards), Some(shard)) = (&mut self.shards, shard) {
            shards.started(task.id(), shard, task);
        }
        None
    }

    /// Drops from the queue the keys of the shards that stopped (lost or handed over): another
    /// replica runs them now; their backoff is forgotten with them.
    fn drop_stopped_shards(&mut self, engine: &Keys<K, E, C>) {
        let Some(shards) = &mut self.shards else {
            return;
        };
        let stopped = shards.take_dropped();
        if stopped.is_empty() {
            return;
        }
        let shards = &*shards;
        let dropped = engine
            .queue()
            .retain(|key| !stopped.contains(&shards.shard(key)));
        tracing::info!(shards = ?stopped, keys = dropped, "keys of shards given up dropped");
    }

    /// Handles a change of the shards held: enqueues the objects of each shard taken (behind
    /// real changes: another replica may have dropped their events), and updates the metrics.
    fn on_assignment(&mut self, engine: &Keys<K, E, C>) {
        let Some(shards) = &mut self.shards else {
            return;
        };
        let changes = shards.on_change();
        if !changes.acquired.is_empty() {
            let keys: Vec<ObjectRef<K>> = self
                .store
                .state()
                .iter()
                .map(|object| ObjectRef::from_obj_with(&**object, self.dyntype.clone()))
                .filter(|key| changes.acquired.contains(&shards.shard(key)))
                .collect();
            tracing::info!(shards = ?changes.acquired, objects = keys.len(), "shards taken");
            let opts = workqueue_tokio::AddOptions::new().priority(workqueue_tokio::LOW_PRIORITY);
            engine.queue().add_batch_with(keys, opts);
        }
        if let Some(metrics) = &self.shard_metrics {
            metrics.emit(&shards.assignment());
        }
    }

    /// Judges a failed reconcile (the error policy sees the reconcile's error), finishes its
    /// lease, and says what the stream reports.
    fn verdict(&self, engine: &Keys<K, E, C>, done: Finished<K, E, C>) -> Option<Item<K, E>> {
        let owner = self.shards.as_ref().map(Shards::owner);
        let object = done.object.clone();
        let policy = |_: &ObjectRef<K>, failure: &Failure<E>, _: &Context<C>| match failure {
            Failure::Error(error) => {
                (self.error_policy)(object.clone(), error, self.context.clone())
            }
            _ => Action::backoff(),
        };
        finish(engine, done, owner.as_ref(), policy)
    }
}

/// What a reconcile's task ends with.
enum TaskEnd<K: Resource, E: 'static, C> {
    /// Judged and finished in the task (no error policy needed): what the stream reports.
    Judged(Option<Item<K, E>>),
    /// A failure: the error policy, on the dispatcher, judges it.
    Failed(Finished<K, E, C>),
}

/// The policy of a reconcile that did not fail (never asked).
fn never_fails<K: Resource, E, C>(_: &ObjectRef<K>, _: &Failure<E>, _: &Context<C>) -> Action {
    Action::backoff()
}

/// Judges a reconcile with `policy`, finishes its lease (without a re-add when its shard is no
/// longer this replica's, by `owner`), and says what the stream reports.
fn finish<K, E, C>(
    engine: &Keys<K, E, C>,
    done: Finished<K, E, C>,
    owner: Option<&Owner>,
    policy: impl FnMut(&ObjectRef<K>, &Failure<E>, &Context<C>) -> Action,
) -> Option<Item<K, E>>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + Debug + Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
    C: Send + Sync + 'static,
{
    let Finished {
        lease, begun, ran, ..
    } = done;
    let key = lease.key().clone();
    let verdict = engine.judge(&key, &begun, ran, policy);
    if owner.is_none_or(|o| o.owns(&key)) {
        engine.finish(lease, &begun, &verdict);
    } else {
        engine.finish_elsewhere(lease, &verdict);
    }
    let object = || Box::new(key.clone().erase());
    match verdict {
        Reconciled::Ok(action) => Some(Ok((key, action))),
        Reconciled::Failed(Failure::Error(error), _) => {
            Some(Err(Error::ReconcilerFailed(error, object())))
        }
        Reconciled::Failed(Failure::Panic(message), _) => {
            Some(Err(Error::RunnerError(RunnerError::ReconcilerPanicked {
                object: object(),
                message,
            })))
        }
        Reconciled::Failed(Failure::Timeout, _) => {
            Some(Err(Error::RunnerError(RunnerError::ReconcilerTimedOut {
                object: object(),
            })))
        }
        Reconciled::Failed(..) | Reconciled::Interrupted => None,
    }
}

/// A dropped controller stream is a dead replica: its Lease protocol stops too (its Leases
/// lapse; nothing is released), as its reconciles and sources do with their task sets.
impl<K, C, E, R, P> Drop for Dispatch<K, C, E, R, P>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    E: 'static,
{
    fn drop(&mut self) {
        if let Some(protocol) = self.protocol.take() {
            protocol.abort();
        }
    }
}

/// The next watch error, or never once there are none left to come.
async fn recv(
    errors: &mut Option<mpsc::UnboundedReceiver<watcher::Error>>,
) -> Option<watcher::Error> {
    match errors {
        Some(rx) => match rx.recv().await {
            Some(error) => Some(error),
            None => {
                *errors = None;
                future::pending().await
            }
        },
        None => future::pending().await,
    }
}

async fn changed(
    gate: &mut Option<watch::Receiver<Readiness>>,
) -> Result<(), watch::error::RecvError> {
    match gate {
        Some(rx) => rx.changed().await,
        None => future::pending().await,
    }
}

async fn shard_event(shards: &mut Option<Shards>) -> ShardEvent {
    match shards {
        Some(shards) => shards.next_event().await,
        None => future::pending().await,
    }
}

async fn protocol_ended(
    protocol: &mut Option<tokio::task::JoinHandle<Ended>>,
) -> Result<Ended, tokio::task::JoinError> {
    match protocol {
        Some(handle) => {
            let ended = handle.await;
            *protocol = None;
            ended
        }
        None => future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => future::pending().await,
    }
}
