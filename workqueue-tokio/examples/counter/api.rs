//! A simulated API server for the counter controller: an in-memory store of ConfigMaps and
//! Deployments, a watch channel, latency and outages, in the style of the storm demo.
//!
//! It stands in for a cluster and for a client library (kube's `Api` and `watcher`): the watch
//! streams list, then watch, relist after a lag or a disconnect, and report deletions they missed
//! in between, as kube-runtime's watcher does. None of that is the controller's code. Time is
//! tokio's, so tests run it on the paused clock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::{self, Stream};
use tokio::sync::broadcast;
use tokio::time::sleep;

/// How long every request of the controller takes.
pub const LATENCY: Duration = Duration::from_millis(10);
/// How long a watch waits before it relists after an error.
pub const WATCH_RETRY: Duration = Duration::from_secs(1);
/// Watch events buffered per watcher before it lags (and relists).
const WATCH_BUFFER: usize = 1024;

/// A ConfigMap: a name and its annotations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigMap {
    /// The object's key, `namespace/name`.
    pub name: String,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

/// A Deployment: a name, its replicas, and the ConfigMap that owns it, if any.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Deployment {
    /// The object's key, `namespace/name`.
    pub name: String,
    /// `spec.replicas`.
    pub replicas: u32,
    /// The owner reference: the name of the ConfigMap that drives it.
    pub owner: Option<String>,
}

/// What a watch sees happen to an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<O> {
    /// Created or updated (or listed).
    Applied(O),
    /// Deleted.
    Deleted(O),
}

impl<O> Event<O> {
    /// The object the event is about.
    pub fn object(&self) -> &O {
        match self {
            Event::Applied(o) | Event::Deleted(o) => o,
        }
    }
}

/// A request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The server cannot be reached.
    #[error("the API server is unavailable")]
    Unavailable,
}

/// A change on the watch channel.
#[derive(Debug, Clone)]
pub enum Change {
    /// A ConfigMap changed.
    ConfigMap(Event<ConfigMap>),
    /// A Deployment changed.
    Deployment(Event<Deployment>),
    /// The controller's connection dropped: every watch breaks.
    Disconnect,
}

/// An object kind the API serves.
pub trait Object: Clone + Send + Sync + 'static {
    /// The object's key.
    fn name(&self) -> &str;
    /// What a relist knows of an object that vanished while the watch was broken: its name.
    fn tombstone(name: &str) -> Self;
    /// Every stored object of this kind.
    fn list(store: &Store) -> Vec<Self>;
    /// The event of this kind in a change, if it is one.
    fn event(change: Change) -> Option<Event<Self>>;
}

impl Object for ConfigMap {
    fn name(&self) -> &str {
        &self.name
    }
    fn tombstone(name: &str) -> Self {
        ConfigMap {
            name: name.to_string(),
            ..ConfigMap::default()
        }
    }
    fn list(store: &Store) -> Vec<Self> {
        store.configmaps.values().cloned().collect()
    }
    fn event(change: Change) -> Option<Event<Self>> {
        match change {
            Change::ConfigMap(e) => Some(e),
            _ => None,
        }
    }
}

impl Object for Deployment {
    fn name(&self) -> &str {
        &self.name
    }
    fn tombstone(name: &str) -> Self {
        Deployment {
            name: name.to_string(),
            ..Deployment::default()
        }
    }
    fn list(store: &Store) -> Vec<Self> {
        store.deployments.values().cloned().collect()
    }
    fn event(change: Change) -> Option<Event<Self>> {
        match change {
            Change::Deployment(e) => Some(e),
            _ => None,
        }
    }
}

/// The stored objects, and what was recorded about them.
#[derive(Debug, Default)]
pub struct Store {
    configmaps: BTreeMap<String, ConfigMap>,
    deployments: BTreeMap<String, Deployment>,
    events: Vec<(String, String)>,
}

struct Inner {
    store: Mutex<Store>,
    changes: broadcast::Sender<Change>,
    down: AtomicBool,
    requests: AtomicU64,
}

/// A handle to the simulated API server (cheap to clone).
///
/// The controller's methods (`get_*`, `scale_deployment`, ...) take [`LATENCY`] and fail while
/// the server is down. The `put_*`/`delete_configmap` methods are the rest of the world (a user
/// with kubectl, another controller): instant, and they work during an outage, which is the
/// controller's connection failing, not the cluster.
#[derive(Clone)]
pub struct Api(Arc<Inner>);

impl Default for Api {
    fn default() -> Self {
        Self::new()
    }
}

impl Api {
    /// An empty, healthy server.
    pub fn new() -> Self {
        Api(Arc::new(Inner {
            store: Mutex::new(Store::default()),
            changes: broadcast::channel(WATCH_BUFFER).0,
            down: AtomicBool::new(false),
            requests: AtomicU64::new(0),
        }))
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.0.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, change: Change) {
        // No watcher is not an error.
        let _ = self.0.changes.send(change);
    }

    /// One request of the controller: counted, slow, failing while the server is down.
    async fn request(&self) -> Result<(), ApiError> {
        self.0.requests.fetch_add(1, Ordering::Relaxed);
        sleep(LATENCY).await;
        if self.0.down.load(Ordering::Relaxed) {
            Err(ApiError::Unavailable)
        } else {
            Ok(())
        }
    }

    // ---- the controller's requests ------------------------------------------------------------

    /// Reads a ConfigMap.
    pub async fn get_configmap(&self, name: &str) -> Result<Option<ConfigMap>, ApiError> {
        self.request().await?;
        Ok(self.store().configmaps.get(name).cloned())
    }

    /// Reads a Deployment.
    pub async fn get_deployment(&self, name: &str) -> Result<Option<Deployment>, ApiError> {
        self.request().await?;
        Ok(self.store().deployments.get(name).cloned())
    }

    /// Sets a Deployment's replicas (nothing if it is gone).
    pub async fn scale_deployment(&self, name: &str, replicas: u32) -> Result<(), ApiError> {
        self.request().await?;
        let changed = {
            let mut store = self.store();
            store.deployments.get_mut(name).map(|d| {
                d.replicas = replicas;
                d.clone()
            })
        };
        if let Some(d) = changed {
            self.publish(Change::Deployment(Event::Applied(d)));
        }
        Ok(())
    }

    /// Deletes a Deployment (nothing if it is gone).
    pub async fn delete_deployment(&self, name: &str) -> Result<(), ApiError> {
        self.request().await?;
        let removed = self.store().deployments.remove(name);
        if let Some(d) = removed {
            self.publish(Change::Deployment(Event::Deleted(d)));
        }
        Ok(())
    }

    /// Sets one annotation of a ConfigMap (nothing if it is gone).
    pub async fn annotate_configmap(
        &self,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ApiError> {
        self.request().await?;
        let changed = {
            let mut store = self.store();
            store.configmaps.get_mut(name).map(|cm| {
                cm.annotations.insert(key.to_string(), value.to_string());
                cm.clone()
            })
        };
        if let Some(cm) = changed {
            self.publish(Change::ConfigMap(Event::Applied(cm)));
        }
        Ok(())
    }

    /// Records an event about an object (like kube's `Recorder`: best effort, never fails).
    pub fn record_event(&self, object: &str, message: String) {
        self.store().events.push((object.to_string(), message));
    }

    /// A watch of every object of kind `O`: an initial list, then changes. After a disconnect or a
    /// lag it yields an error, waits [`WATCH_RETRY`], and relists, yielding `Deleted` for the
    /// objects that vanished meanwhile; it retries a failed list the same way. It never ends (it
    /// holds the server).
    pub fn watch<O: Object>(
        &self,
    ) -> impl Stream<Item = Result<Event<O>, ApiError>> + Send + 'static {
        let state = Watch {
            api: self.clone(),
            phase: Phase::List { wait: false },
            rx: None,
            known: BTreeSet::new(),
            pending: VecDeque::new(),
        };
        stream::unfold(state, |mut w| async move {
            let item = w.next().await?;
            Some((item, w))
        })
    }

    // ---- the rest of the world --------------------------------------------------------------

    /// Creates or replaces a ConfigMap.
    pub fn put_configmap(&self, cm: ConfigMap) {
        self.store().configmaps.insert(cm.name.clone(), cm.clone());
        self.publish(Change::ConfigMap(Event::Applied(cm)));
    }

    /// Deletes a ConfigMap.
    pub fn delete_configmap(&self, name: &str) {
        let removed = self.store().configmaps.remove(name);
        if let Some(cm) = removed {
            self.publish(Change::ConfigMap(Event::Deleted(cm)));
        }
    }

    /// Creates or replaces a Deployment (a user creating it, or scaling it by hand).
    pub fn put_deployment(&self, d: Deployment) {
        self.store().deployments.insert(d.name.clone(), d.clone());
        self.publish(Change::Deployment(Event::Applied(d)));
    }

    /// Starts (`true`) or ends an outage of the controller's connection; starting one breaks
    /// every watch.
    pub fn set_down(&self, down: bool) {
        self.0.down.store(down, Ordering::Relaxed);
        if down {
            self.publish(Change::Disconnect);
        }
    }

    /// A ConfigMap as stored now.
    pub fn configmap(&self, name: &str) -> Option<ConfigMap> {
        self.store().configmaps.get(name).cloned()
    }

    /// A Deployment as stored now.
    pub fn deployment(&self, name: &str) -> Option<Deployment> {
        self.store().deployments.get(name).cloned()
    }

    /// The events recorded so far, as (object, message).
    pub fn events(&self) -> Vec<(String, String)> {
        self.store().events.clone()
    }

    /// The controller's requests so far (the watches' lists included).
    pub fn requests(&self) -> u64 {
        self.0.requests.load(Ordering::Relaxed)
    }
}

/// Where a watch is.
enum Phase {
    /// About to list (after [`WATCH_RETRY`] if `wait`).
    List { wait: bool },
    /// Watching the channel.
    Watch,
}

/// A watch's state: the objects it has reported as existing, so that a relist can report what was
/// deleted meanwhile.
struct Watch<O> {
    api: Api,
    phase: Phase,
    rx: Option<broadcast::Receiver<Change>>,
    known: BTreeSet<String>,
    pending: VecDeque<Event<O>>,
}

impl<O: Object> Watch<O> {
    async fn next(&mut self) -> Option<Result<Event<O>, ApiError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                match &event {
                    Event::Applied(o) => self.known.insert(o.name().to_string()),
                    Event::Deleted(o) => self.known.remove(o.name()),
                };
                return Some(Ok(event));
            }
            match self.phase {
                Phase::List { wait } => {
                    if wait {
                        sleep(WATCH_RETRY).await;
                    }
                    // Subscribe before listing, so no change falls between the two.
                    let rx = self.api.0.changes.subscribe();
                    if let Err(e) = self.api.request().await {
                        self.phase = Phase::List { wait: true };
                        return Some(Err(e));
                    }
                    let listed = O::list(&self.api.store());
                    let names: BTreeSet<String> =
                        listed.iter().map(|o| o.name().to_string()).collect();
                    let gone = self.known.difference(&names).cloned().collect::<Vec<_>>();
                    for name in gone {
                        self.pending.push_back(Event::Deleted(O::tombstone(&name)));
                    }
                    self.pending.extend(listed.into_iter().map(Event::Applied));
                    self.rx = Some(rx);
                    self.phase = Phase::Watch;
                }
                Phase::Watch => {
                    let rx = self.rx.as_mut()?;
                    match rx.recv().await {
                        Ok(Change::Disconnect) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            self.rx = None;
                            self.phase = Phase::List { wait: true };
                            return Some(Err(ApiError::Unavailable));
                        }
                        Ok(change) => self.pending.extend(O::event(change)),
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        }
    }
}
