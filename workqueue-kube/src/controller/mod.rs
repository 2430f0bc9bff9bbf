//! kube-runtime's `Controller`, on a work queue: the same builder and signatures, so a
//! kube-runtime program moves over by changing its `use` lines, with the queue's per-key
//! backoff, priorities, aging, fairness, outage-aware retries and metrics.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{Api, Client, ResourceExt};
//! use kube::runtime::watcher;
//! use workqueue_kube::controller::{Action, Config, Controller};
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("reconcile failed")]
//! struct Error;
//!
//! async fn reconcile(cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, Error> {
//!     println!("reconciling {}", cm.name_any());
//!     Ok(Action::requeue(Duration::from_secs(300)))
//! }
//!
//! fn error_policy(_cm: Arc<ConfigMap>, _error: &Error, _ctx: Arc<()>) -> Action {
//!     Action::requeue(Duration::from_secs(5))
//! }
//!
//! # async fn run() -> Result<(), kube::Error> {
//! let client = Client::try_default().await?;
//! Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
//!     // The one line that makes failures back off per object (5 ms doubling to 1000 s).
//!     .with_config(Config::default().concurrency(8).per_key_backoff(true))
//!     .shutdown_on_signal()
//!     .run(reconcile, error_policy, Arc::new(()))
//!     .for_each(|result| async move {
//!         if let Err(error) = result {
//!             eprintln!("{error}");
//!         }
//!     })
//!     .await;
//! # Ok(())
//! # }
//! ```
//!
//! # From kube-runtime
//!
//! As in kube-runtime, [`Controller::run`] is built on [`applier`], itself built on a runner
//! (here `workqueue-tokio`'s public `Runner::results`). A kube-runtime 5 program moves over by
//! changing its `use` lines: `Controller`, `Config`, `Action`, `Error` and the `finalizer`
//! helper come from this crate, everything else (the `Api`s, `watcher`, reflectors,
//! predicates) stays kube's. What then stays the same, and what is deliberately different, each
//! checked against kube-runtime 5.0's source:
//!
//! | the same | kube-runtime 5 and here |
//! |---|---|
//! | builder | `new`, `new_with`, `owns`, `owns_with`, `watches`, `watches_with`, `reconcile_all_on`, `graceful_shutdown_on`, `shutdown_on_signal`, `with_config`, `trigger_backoff`, `store`, with kube's signatures |
//! | stream builders | `for_stream`, `for_shared_stream`, `owns_stream`, `owns_shared_stream`, `watches_stream`, `watches_shared_stream` (each with its `_with`), `reconcile_on`, with kube's signatures; stable here, behind kube's `unstable-runtime-*` features there |
//! | `run(reconciler, error_policy, context)` | a stream of `Result<(ObjectRef<K>, Action), Error<E, watcher::Error>>`, idle until polled; `reconciler`, `error_policy` and the context need not be `Send` or `Sync` (kube's bounds: none on the context); the reconcile's future is `Send + 'static` |
//! | [`applier`]`(reconciler, error_policy, context, store, queue, config)` | kube's signature: the layer beneath `Controller::run` (built on it here too), its queue a stream of [`ReconcileRequest`]s or `ObjectRef`s |
//! | a store whose writer is dropped before it is ready | [`RunnerError::Readiness`], then the stream ends |
//! | [`Error`] | `ObjectNotFound`, `ReconcilerFailed`, `QueueError`, `RunnerError`, with kube's messages |
//! | `Action::requeue(d)` (`d` > 0), `Action::await_change()` | after a success: reconcile again after `d`, or on the next change |
//! | error policy `requeue(d)`, `await_change()` | retry after `d`; no retry |
//! | `Config::default().concurrency(n).debounce(d)` | `n` = 0 is unbounded |
//! | guarantees | no reconcile before the store is ready; none of an object absent from it ([`Error::ObjectNotFound`]); one at a time per object, and a key due while its object runs runs once after it |
//! | a watch's failed request | an [`Error::QueueError`] item; the watch retries after a backoff shared by all watches (kube's `DefaultBackoff` unless [`Controller::trigger_backoff`]) |
//! | `shutdown_on_signal` | SIGINT or SIGTERM: graceful shutdown; a second one: forced |
//! | [`finalizer()`](crate::finalizer::finalizer()) | kube's signature, `Event`, `Error` and finalizer protocol |
//! | [`ReconcileRequest`], [`ReconcileReason`], [`trigger_owners`], [`trigger_self`], [`trigger_with`] | kube's own, re-exported |
//!
//! | deliberately different | kube-runtime 5 | here |
//! |---|---|---|
//! | `Action::requeue(Duration::ZERO)` | runs again at once: a reconcile that always returns it loops | a retry after the rate limiter's delay, as [`Action::backoff()`] |
//! | `Action`'s `Debug` (log lines) | `Action { requeue_after: Some(300s) }` | `requeue(300s)`, `await_change()`, `backoff()` |
//! | a reconcile that panics | the panic reaches the task polling the stream | [`RunnerError::ReconcilerPanicked`]; the key is retried with backoff, the controller goes on |
//! | a `watches` mapper that panics | the panic reaches the task polling the stream | [`RunnerError::MapperPanicked`]; that object's keys are not queued, the watch goes on |
//! | [`RunnerError`] | `runner::Error<WriterDropped>` (`Readiness`) | this crate's variants (`Readiness` among them): a `match` on kube's does not compile |
//! | `applier`'s reconciler future | any (`Unpin`): the applier polls it on its own task | `Send + 'static`: it runs on the runtime's threads; the queue's metrics are labelled `controller="applier"` |
//! | while the main watch relists | reconciles go on against the previous list | none starts while a list is being received (an object the new list lacks must not be reconciled); between failed lists (an outage, a denied `list`) they go on from the last complete list, as in kube-runtime |
//! | order | by due time | controller-runtime's priorities (an initial list and unchanged relisted objects after real changes; the keys of streams given to `for_stream` and the like at the default priority) and aging (due for 60 s: served first) |
//! | trigger backoff | any watch's error holds every trigger; any key resets it | only a failing watch waits, and keys of a working one do not reset it while another fails; retries go out one per delay |
//! | `debounce(d)` | delays every request by `d`, requeues included | delays the triggers' keys only; requeues are not delayed |
//! | graceful shutdown | running reconciles finish, however long they take | they finish within [`Config::shutdown_grace`] (30 s), then are dropped |
//! | every trigger ended (a finite `for_stream`) | stops at once: what is scheduled and not started is dropped (a stream that ends at once reconciles nothing) | reconciles what the triggers queued (debounced ones when their debounce ends), drops requeues and retries, then ends |
//! | where a reconcile runs | each is spawned as a task | on the controller's worker tasks (at most `concurrency` of them), each of which runs one reconcile, then takes the next; one that computes before its first `.await` holds only its own worker |
//! | tracing | a `reconciling object` span (`object.ref`, `object.reason`) | a `reconcile` span (`controller`, `key`, `reconcile_id`, `reasons`, ...), which `error_policy` is called inside too, and controller-runtime's metrics |
//!
//! Nothing of kube-runtime 5's `controller` module is missing.
//!
//! # What a result does to the queue
//!
//! | returned | queue operation |
//! |---|---|
//! | `Ok(Action::requeue(d))` | forget the object's failures; reconcile it again after `d` |
//! | `Ok(Action::await_change())` | forget the object's failures; reconcile it again when it (or a related object) changes |
//! | `Err(e)`, `error_policy` → `requeue(d)` | retry after `d`, as kube-runtime does |
//! | `Err(e)`, `error_policy` → `await_change()` | give up: the failures are forgotten, the next change starts afresh |
//! | `Err(e)`, `error_policy` → `requeue(d)` with [`Config::per_key_backoff`] | retry after the rate limiter's delay for the object, and at least `d` |
//! | a panic of the reconcile | retry after the rate limiter's delay (reported as [`RunnerError::ReconcilerPanicked`]; the controller goes on) |
//!
//! `Action::requeue(Duration::ZERO)` (and [`Action::backoff()`]) is a retry after the rate
//! limiter's delay. With [`Config::outage_detection`] on, a failing object is parked
//! while failures are widespread, as the queue parks any failing key.
//!
//! # Guarantees
//!
//! - No reconcile starts before the main resource's first list is in the store; triggers from
//!   owned or watched objects wait too. A store whose writer is dropped before that ends the
//!   stream with [`RunnerError::Readiness`]. While the main watch receives a relist (after a
//!   broken watch), no reconcile starts either: the store holds the previous list until the new
//!   one is complete, and an object the new list lacks must not be reconciled. A list that fails
//!   leaves the store as it was (the last complete list and the changes since), and reconciles go
//!   on from it until the next attempt, as in kube-runtime, so that a relist that keeps failing
//!   (an outage, a denied `list`) does not hold them for as long as it fails.
//! - An object is reconciled only if it is in the store: a key due for an object that is not is
//!   reported as [`Error::ObjectNotFound`] and forgotten. Deletion is handled by finalizers
//!   ([`finalizer()`](crate::finalizer::finalizer())).
//! - An object is never reconciled twice at once.
//!
//! # What the queue adds
//!
//! - Priorities as controller-runtime sets them: objects of an initial list, and relisted
//!   objects that did not change, are served after real changes.
//! - Aging (an object due for 60 s is served first, whatever its priority), and with
//!   [`Config::fair_namespaces`], fairness across namespaces.
//! - Per-key backoff ([`Config::per_key_backoff`]) and outage-aware retries
//!   ([`Config::outage_detection`]).
//! - controller-runtime's metrics (`controller_runtime_reconcile_*`, `workqueue_*`) labelled with
//!   the kind (`controller="configmap"`), and a `reconcile` span per reconcile.

mod applier;
mod backoff;
mod config;
mod divided;
mod error;
mod guard;
mod labeller;
mod relations;
mod reports;
mod shards;
mod triggers;

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt, TryFuture};
use futures_util::stream::{Stream, StreamExt};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::Client;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use tokio::sync::watch;
use workqueue_tokio::AddOptions;

pub use applier::applier;
pub use config::Config;
pub use error::{Error, RunnerError};
pub use kube::runtime::controller::{
    ReconcileReason, ReconcileRequest, trigger_owners, trigger_self, trigger_with,
};
pub use workqueue_tokio::runner::Action;

use crate::lease::{LeaseClock, LeaseConfig};
use applier::Keys;
use backoff::TriggerBackoff;
use divided::{PlannedWatch, ShardLabel};
use labeller::Labeller;
use reports::{Inbox, Reports};
use shards::Leases;
use triggers::Trigger;

/// What a controller runs: its queue's name, triggers, store and gate, its options, and how it
/// shuts down. Built by `Controller::run` and `applier::applier`, run by `applier::run` (its
/// fields are this module's and its children's).
struct Parts<K: Resource + 'static, QE>
where
    K::DynamicType: Eq + Hash,
{
    /// The queue's name (in metrics and spans).
    name: String,
    triggers: Vec<(String, Keys<K, QE>)>,
    store: Store<K>,
    /// Whether `store` may be read now (see `triggers::main`).
    gate: watch::Receiver<bool>,
    /// Tasks that keep the gate (waiting for a store made elsewhere to be ready).
    tasks: Vec<BoxFuture<'static, ()>>,
    config: Config,
    /// The Lease protocol, if any; why it cannot run, if it cannot.
    leases: Result<Option<Leases>, RunnerError>,
    graceful: Vec<BoxFuture<'static, ()>>,
    forceful: Vec<BoxFuture<'static, ()>>,
    /// The dynamic type, for the Lease watchdog (which lists the store's objects).
    dyntype: Option<K::DynamicType>,
    /// Where the triggers' errors and the runner's reports go, and where the stream reads them.
    reports: (Reports<QE>, Inbox<QE>),
}

/// A controller for the objects of kind `K`: watches them (and the objects they own or relate
/// to), and reconciles each one that changed, one at a time per object, through a work queue.
///
/// Built like kube-runtime's `Controller` ([`Controller::new`], [`owns`](Controller::owns),
/// [`watches`](Controller::watches), [`run`](Controller::run)); see the
/// [module](self) for what differs and what the queue adds. [`run`](Controller::run) returns a
/// stream that does nothing until it is polled, and yields one item per reconcile.
#[must_use = "a controller does nothing until the stream `run` returns is polled"]
pub struct Controller<K>
where
    K: Clone + Resource + Debug + 'static,
    K::DynamicType: Eq + Hash,
{
    triggers: Vec<(String, Trigger<K>)>,
    /// The backoff the watches' triggers share.
    backoff: TriggerBackoff,
    /// What the stream reports besides reconciles: the watches' errors, a mapper's panic, the
    /// Leases' reports (`reports.rs`).
    reports: (Reports<watcher::Error>, Inbox<watcher::Error>),
    reader: Store<K>,
    dyntype: K::DynamicType,
    config: Config,
    /// Whether the store may be read (see `triggers::main`).
    gate: watch::Receiver<bool>,
    tasks: Vec<BoxFuture<'static, ()>>,
    graceful: Vec<BoxFuture<'static, ()>>,
    forceful: Vec<BoxFuture<'static, ()>>,
    /// The main `Api`'s client (the Lease protocol's), when built from an `Api`.
    client: Option<Client>,
    leases: Option<LeaseConfig>,
    /// The clock the Leases are judged by, whichever of `leases` and `lease_clock` came first.
    lease_clock: Option<Arc<dyn LeaseClock>>,
    /// The main watch, when the controller made it (`Controller::new`): whole or divided.
    main_watch: Option<PlannedWatch>,
    /// The owned kinds' watches the controller made (`owns`): whole or divided.
    owned_watches: Vec<PlannedWatch>,
    /// Whether each replica watches only its shards' objects (`divide_caches`).
    divide: bool,
}

/// The names of the metrics of a controller on Leases (with the `metrics` feature), labelled
/// `controller`, all emitted and described in one place: the shards it holds (a gauge), and with
/// one shard, whether it leads (a gauge of 0 or 1, as controller-runtime's
/// `leader_election_master_status`); the hand-overs it made (a counter); the identity
/// collisions it found (a counter: another process renews its membership Lease).
pub const SHARDS_HELD: &str = "workqueue_kube_shards_held";
/// See [`SHARDS_HELD`].
pub const LEADER: &str = "workqueue_kube_leader";
/// See [`SHARDS_HELD`].
pub const HAND_OVERS_TOTAL: &str = "workqueue_kube_shard_hand_overs_total";
/// See [`SHARDS_HELD`].
pub const IDENTITY_COLLISIONS_TOTAL: &str = "workqueue_kube_lease_identity_collisions_total";

impl<K> Controller<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Send + Sync + 'static,
{
    /// A controller for the objects `main_api` sees, selected by `wc`
    /// (`watcher::Config::default()`: all of them).
    pub fn new(main_api: Api<K>, wc: watcher::Config) -> Self
    where
        K::DynamicType: Default,
    {
        Self::new_with(main_api, wc, Default::default())
    }

    /// [`Controller::new`] for a dynamic type (found by discovery).
    pub fn new_with(main_api: Api<K>, wc: watcher::Config, dyntype: K::DynamicType) -> Self {
        let client = main_api.clone().into_client();
        let writer = reflector::store::Writer::<K>::new(dyntype.clone());
        let reader = writer.as_reader();
        let (gate_tx, gate) = watch::channel(false);
        // No backoff on the watcher itself: the trigger backoff applies after its `Init` events.
        let (main_watch, events) = PlannedWatch::main(main_api, wc, writer, dyntype.clone());
        let main = triggers::main(events, gate_tx, dyntype.clone());
        let controller = Self::with_main(main, reader, dyntype, gate, Vec::new(), Some(client));
        Controller {
            main_watch: Some(main_watch),
            ..controller
        }
    }

    /// A controller whose main trigger is `main`, reading `reader`, taking keys once `gate` says
    /// the store is ready (with `tasks` started with it to keep the gate).
    fn with_main(
        main: impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>> + Send + 'static,
        reader: Store<K>,
        dyntype: K::DynamicType,
        gate: watch::Receiver<bool>,
        tasks: Vec<BoxFuture<'static, ()>>,
        client: Option<Client>,
    ) -> Self {
        let name = K::kind(&dyntype).to_lowercase();
        let backoff = TriggerBackoff::default();
        let main = backoff.apply(main).boxed();
        Controller {
            triggers: vec![(name, main)],
            backoff,
            reports: reports::channel(),
            reader,
            dyntype,
            config: Config::default(),
            gate,
            tasks,
            graceful: Vec::new(),
            forceful: Vec::new(),
            client,
            leases: None,
            lease_clock: None,
            main_watch: None,
            owned_watches: Vec::new(),
            divide: false,
        }
    }

    /// A controller fed by a stream of applied objects (a watcher's `applied_objects`, say)
    /// whose reflector `reader` reads; reconciles wait until that store is ready. Every object
    /// is queued at the default priority (the stream does not tell a list from a change).
    pub fn for_stream(
        trigger: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
        reader: Store<K>,
    ) -> Self
    where
        K::DynamicType: Default,
    {
        Self::for_stream_with(trigger, reader, Default::default())
    }

    /// [`Controller::for_stream`] for a dynamic type.
    pub fn for_stream_with(
        trigger: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
        reader: Store<K>,
        dyntype: K::DynamicType,
    ) -> Self {
        let main = triggers::applied(trigger, dyntype.clone());
        Self::on_store(main, reader, dyntype)
    }

    /// A controller fed by a shared stream of objects (a subscriber of a shared store's writer,
    /// `reflector::store_shared` and `Writer::subscribe` with kube's
    /// `unstable-runtime-subscribe` feature), whose store `reader` reads; reconciles wait until
    /// that store is ready. The stream that drives the shared watch must be polled on its own
    /// (it fills the store and feeds every subscriber), as in kube-runtime. Every object is
    /// queued at the default priority.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use futures_util::StreamExt;
    /// use k8s_openapi::api::apps::v1::Deployment;
    /// use kube::runtime::{WatchStreamExt, reflector, watcher};
    /// use kube::{Api, Client};
    /// use workqueue_kube::controller::{Action, Controller};
    ///
    /// # async fn reconcile(_: Arc<Deployment>, _: Arc<()>) -> Result<Action, kube::Error> { Ok(Action::await_change()) }
    /// # fn error_policy(_: Arc<Deployment>, _: &kube::Error, _: Arc<()>) -> Action { Action::await_change() }
    /// # async fn doc(client: Client) {
    /// let (reader, writer) = reflector::store_shared(128);
    /// let subscriber = writer.subscribe().expect("a shared store has subscribers");
    /// let deploys = watcher(Api::<Deployment>::all(client), watcher::Config::default())
    ///     .default_backoff()
    ///     .reflect_shared(writer)
    ///     .for_each(|_| std::future::ready(()));
    /// let controller = Controller::for_shared_stream(subscriber, reader)
    ///     .run(reconcile, error_policy, Arc::new(()))
    ///     .for_each(|_| std::future::ready(()));
    /// tokio::select! {
    ///     () = deploys => {}
    ///     () = controller => {}
    /// }
    /// # }
    /// ```
    pub fn for_shared_stream(
        trigger: impl Stream<Item = Arc<K>> + Send + 'static,
        reader: Store<K>,
    ) -> Self
    where
        K::DynamicType: Default,
    {
        Self::for_shared_stream_with(trigger, reader, Default::default())
    }

    /// [`Controller::for_shared_stream`] for a dynamic type.
    pub fn for_shared_stream_with(
        trigger: impl Stream<Item = Arc<K>> + Send + 'static,
        reader: Store<K>,
        dyntype: K::DynamicType,
    ) -> Self {
        let main = triggers::applied(trigger.map(Ok::<_, watcher::Error>), dyntype.clone());
        Self::on_store(main, reader, dyntype)
    }

    /// A controller whose main trigger is `main`, on a store filled elsewhere (`reader`):
    /// reconciles wait until it is ready.
    fn on_store(
        main: impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>> + Send + 'static,
        reader: Store<K>,
        dyntype: K::DynamicType,
    ) -> Self {
        let (gate_tx, gate) = watch::channel(false);
        let ready = {
            let reader = reader.clone();
            async move {
                // A dropped writer drops `gate_tx` unopened: the stream reports it.
                if reader.wait_until_ready().await.is_ok() {
                    gate_tx.send_replace(true);
                }
            }
        };
        Self::with_main(main, reader, dyntype, gate, vec![ready.boxed()], None)
    }

    /// The backoff of the controller's watches (kube-runtime's `DefaultBackoff` unless set: 0.8 s
    /// doubling to 30 s, with jitter, as client-go's reflectors), and of the fallible streams
    /// given to [`Controller::for_stream`], [`owns_stream`](Controller::owns_stream) and
    /// [`watches_stream`](Controller::watches_stream): one sequence over all of them, as
    /// kube-runtime applies it. (Streams that cannot fail, shared ones and those of
    /// `reconcile_on` and `reconcile_all_on`, are never held.)
    ///
    /// Once a request failed (a list refused, a watch that cannot start), a watch that is not
    /// known to work (it failed last, or has delivered nothing yet) waits for the next slot
    /// before it polls again; each slot admits one attempt and is followed by the policy's next
    /// delay, so an outage costs as few requests with several watches as with one. Unlike
    /// kube-runtime, a watch that delivers keys is never held while another one fails, and its
    /// keys do not reset the sequence: it starts over once no watch is failing. A policy that
    /// gives up (returns `None`) ends every watch: the controller then reconciles what is due
    /// and stops. Every failure is also an item of the stream ([`Error::QueueError`]), as in
    /// kube-runtime.
    pub fn trigger_backoff(self, backoff: impl Backoff + 'static) -> Self {
        self.backoff.set(backoff);
        self
    }

    /// The controller's options.
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Runs this controller as one of several replicas, coordinated by Kubernetes Leases
    /// ([`crate::lease`]): with [`LeaseConfig::leader_election`], one replica (the leader)
    /// reconciles and the others stand by; with [`LeaseConfig::new`], the objects are divided
    /// into shards (32 by default) and each replica reconciles those of the shards it holds, a
    /// fair share of them. The Leases are written with the main `Api`'s client.
    ///
    /// A replica takes a key only while it holds the key's shard (an owned object's key is its
    /// owner's, so a family stays together); a shard it takes has its objects enqueued (behind
    /// real changes); a shard it loses (its deadline passed without a renewal) or hands over
    /// has its queued keys dropped and its running reconciles aborted (their futures dropped: a
    /// reconcile here has no cancellation to watch) before another replica can take it. A task
    /// of the controller's own does this, so it happens on time whatever the application does
    /// with the stream (a consumer that is slow, or waits on something else); and no reconcile
    /// is polled past its shard's deadline. A reconcile whose code is still under way past the
    /// deadline (it computes without awaiting and its runtime runs nothing else) ends the
    /// process, from a thread of the controller's (see [`OnLoss`](crate::lease::OnLoss)). A graceful
    /// shutdown hands its shards over after its reconciles finished, so that other replicas hold
    /// them at once. An invalid `config` is
    /// reported as the stream's first item ([`RunnerError::Leases`]), which then ends.
    ///
    /// ```no_run
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::{Api, Client};
    /// use kube::runtime::watcher;
    /// use workqueue_kube::controller::Controller;
    /// use workqueue_kube::lease::LeaseConfig;
    ///
    /// # async fn build(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// // Each replica's own identity, the pod's name: never a shared default.
    /// let identity = std::env::var("POD_NAME").map_err(|_| "set POD_NAME to the pod's name")?;
    /// let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
    ///     .leases(LeaseConfig::leader_election("counter", "default", identity));
    /// # let _ = controller;
    /// # Ok(())
    /// # }
    /// ```
    pub fn leases(mut self, config: LeaseConfig) -> Self {
        self.leases = Some(config);
        self
    }

    /// Divides the cache too: each replica watches, and keeps in its store, only the objects of
    /// the shards it holds, so that memory and watch traffic per replica shrink with the
    /// number of replicas. Needs [`Controller::leases`] and a controller made with
    /// [`Controller::new`] (else the stream's first item is
    /// [`RunnerError::DividedCachesNeedLeases`]).
    ///
    /// How: every object of the main kind (and each owned object) carries its shard in a label
    /// of the controller's,
    /// `{name}.workqueue-kube.io/shard-of-{shards}` (`name` and `shards` of the
    /// [`LeaseConfig`]), whose value is the object's shard: the same stable hash that assigns
    /// its key ([`shard_of`](crate::lease::shard_of)), so it is written once and never
    /// changes. See it with `kubectl get cm -L counter.workqueue-kube.io/shard-of-32`. The
    /// controller writes it itself, with a merge patch: the replica that holds shard 0 watches
    /// the objects without it (`notin`: nearly nothing once all are labelled) and labels them,
    /// and a replica that sees a wrong value among its shards' objects (a third party changed
    /// it) sets it right. A replica joining or leaving writes no object: the others restart
    /// their watch with the shards they now hold.
    ///
    /// What stays: a key is still run only by the holder of its hashed shard (a missing or
    /// wrong label delays an object until it is relabelled, never gives it to two replicas),
    /// and a replica takes a key of a shard only once its store holds that shard's complete
    /// list. While a replica's watch relists (its shards changed), none of its reconciles
    /// starts, as during any relist. Another number of shards has another label, so a rolling
    /// update that changes it relabels every object once, while the old replicas still find
    /// theirs.
    ///
    /// The watches of [`owns`](Controller::owns) are divided too: a child carries its owner's
    /// shard (its first owner reference to the main kind; a child without one is never
    /// labelled, and stays in the labelling replica's watch), so an object's family stays on
    /// one replica. Not divided: the watches of [`watches`](Controller::watches) (a mapper's
    /// keys cannot be known before it runs) and the streams given to `owns_stream` and the like
    /// (made elsewhere): they stay whole.
    ///
    /// RBAC: `patch` on the main kind and the owned kinds, besides `list` and `watch`.
    ///
    /// ```no_run
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::{Api, Client};
    /// use kube::runtime::watcher;
    /// use workqueue_kube::controller::Controller;
    /// use workqueue_kube::lease::LeaseConfig;
    ///
    /// # fn build(client: Client, identity: String) {
    /// let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
    ///     .leases(LeaseConfig::new("counter", "default", identity))
    ///     .divide_caches();
    /// # let _ = controller;
    /// # }
    /// ```
    pub fn divide_caches(mut self) -> Self {
        self.divide = true;
        self
    }

    /// Judges Lease time by `clock` instead of tokio's (a simulation, or a test that gives each
    /// replica a clock of its own), before or after [`Controller::leases`]. Without it, it
    /// changes nothing.
    pub fn lease_clock(mut self, clock: impl LeaseClock) -> Self {
        self.lease_clock = Some(Arc::new(clock));
        self
    }

    /// The store of the main resource's objects (ready once the first list is complete). With
    /// [divided caches](Controller::divide_caches), the objects of the shards this replica
    /// holds.
    pub fn store(&self) -> Store<K> {
        self.reader.clone()
    }

    /// Reconciles every object in the store each time `trigger` yields (behind real changes,
    /// like a resync).
    pub fn reconcile_all_on(mut self, trigger: impl Stream<Item = ()> + Send + 'static) -> Self {
        let keys = triggers::all_of(trigger, self.reader.clone(), self.dyntype.clone()).boxed();
        self.triggers.push(("reconcile_all".into(), keys));
        self
    }

    /// Reconciles each object `trigger` yields.
    pub fn reconcile_on(
        mut self,
        trigger: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> Self {
        let keys = trigger.map(|key| Ok((key, AddOptions::default()))).boxed();
        self.triggers.push(("reconcile_on".into(), keys));
        self
    }

    /// Shuts down gracefully once `trigger` completes: no reconcile starts any more, the
    /// watches stop, running reconciles finish (within [`Config::shutdown_grace`]), and the
    /// stream ends.
    pub fn graceful_shutdown_on(
        mut self,
        trigger: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Self {
        self.graceful.push(trigger.boxed());
        self
    }

    /// Shuts down gracefully on SIGINT (Ctrl+C) or SIGTERM, and at once on a second one, as
    /// kube-runtime does.
    pub fn shutdown_on_signal(mut self) -> Self {
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
        self.graceful.push(first_rx.map(|_| ()).boxed());
        self.forceful.push(
            async move {
                shutdown_signal().await;
                tracing::info!("graceful shutdown requested; a second signal forces it");
                let _ = first_tx.send(());
                shutdown_signal().await;
                tracing::info!("forced shutdown requested");
            }
            .boxed(),
        );
        self
    }

    /// Runs the controller: a stream with one item per reconcile (the object and the action
    /// taken, or why there was none), which does nothing until it is polled. Built on
    /// [`applier`], as kube-runtime's is.
    ///
    /// `reconciler` and `error_policy` are called on the task that polls the stream, with
    /// `context`, so none of them need be `Send` or `Sync` (a context holding a `Cell` is fine).
    /// Each reconcile's future runs in parallel on the runtime's threads, as kube-runtime spawns
    /// them (hence `Send + 'static`): on the controller's worker tasks, each of which runs one
    /// reconcile to its end and then takes the next (there are at most `concurrency` of them). A
    /// reconcile that computes before its first `.await` holds only its own worker.
    ///
    /// The stream ends after a graceful shutdown ([`Controller::graceful_shutdown_on`],
    /// [`Controller::shutdown_on_signal`]) once running reconciles finished (within
    /// [`Config::shutdown_grace`]); at once on a forced one (their futures are dropped); or once
    /// every trigger has ended and the objects the triggers queued (debounced ones too) were
    /// reconciled (requeues are dropped then). A store whose writer is dropped before it is ready
    /// ends it with [`RunnerError::Readiness`]. Must be polled inside a tokio runtime.
    pub fn run<ReconcilerFut, Ctx>(
        self,
        reconciler: impl FnMut(Arc<K>, Arc<Ctx>) -> ReconcilerFut,
        error_policy: impl Fn(Arc<K>, &ReconcilerFut::Error, Arc<Ctx>) -> Action,
        context: Arc<Ctx>,
    ) -> impl Stream<Item = Result<(ObjectRef<K>, Action), Error<ReconcilerFut::Error, watcher::Error>>>
    where
        K::DynamicType: Debug + Unpin,
        ReconcilerFut: TryFuture<Ok = Action> + Send + 'static,
        ReconcilerFut::Error: std::error::Error + Send + 'static,
    {
        let name = K::kind(&self.dyntype).to_lowercase();
        let label = self
            .leases
            .as_ref()
            .map(|c| ShardLabel::new(&c.name, c.shards));
        let client = self.client.clone();
        let mut leases = match self.leases {
            Some(config) => {
                let clock = self.lease_clock;
                Leases::new(self.client, config, clock, self.reports.0.clone()).map(Some)
            }
            None => Ok(None),
        };
        let mut tasks = self.tasks;
        match (self.main_watch, &mut leases, label, client) {
            (Some(main), Ok(Some(leases)), Some(label), Some(client)) if self.divide => {
                // The main kind is the labeller's kind 0, the owned kinds follow.
                let (assignment, listed) = leases.divide();
                let (relabel, relabels) = tokio::sync::mpsc::unbounded_channel();
                let mut kinds = vec![main.divide(0, &label, &assignment, Some(listed), &relabel)];
                for owned in self.owned_watches {
                    kinds.push(owned.divide(kinds.len(), &label, &assignment, None, &relabel));
                }
                let reports = self.reports.0.clone();
                let report = move |error| reports.send(error);
                let labeller = Labeller::new(client, kinds, label, assignment, relabels, report);
                tasks.push(labeller.run().boxed());
            }
            (_, Ok(_), _, _) if self.divide => {
                leases = Err(RunnerError::DividedCachesNeedLeases);
            }
            (main, _, _, _) => {
                main.into_iter()
                    .chain(self.owned_watches)
                    .for_each(PlannedWatch::whole);
            }
        }
        let parts = Parts {
            name,
            triggers: self.triggers,
            store: self.reader,
            gate: self.gate,
            tasks,
            config: self.config,
            leases,
            graceful: self.graceful,
            forceful: self.forceful,
            dyntype: Some(self.dyntype),
            reports: self.reports,
        };
        applier::run(parts, reconciler, error_policy, context)
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c().map(|_| ());
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    () = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => interrupt.await,
        }
    }
    #[cfg(not(unix))]
    interrupt.await;
}

impl<K> Debug for Controller<K>
where
    K: Clone + Resource + Debug + 'static,
    K::DynamicType: Eq + Hash + Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field(
                "triggers",
                &self.triggers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
