//! A scripted Kubernetes API server in memory, behind `kube::Client`s: a `tower::service_fn`
//! that serves any resource of any group from one store (how kube-rs tests itself, but
//! answering any number of concurrent requests in any order, which watchers plus writes need;
//! `tower_test`'s mock answers strictly in order). No network: a client's requests are
//! function calls, and every delay is on tokio's clock, so tests on paused time are exact.
//!
//! # What it models
//!
//! - **Routing**: `/api/v1/...` and `/apis/{group}/{version}/...`, namespaced
//!   (`namespaces/{ns}/{plural}[/{name}]`), across namespaces and cluster-scoped, for any
//!   plural: built-in types, Leases and custom resources alike (a hand-written
//!   `kube::Resource` is served like a derived one). Storage is keyed by group and plural;
//!   versions of a group share it, unconverted.
//! - **Reads**: get (404 `NotFound`); list with label selectors (`=`, `==`, `!=`, `in`,
//!   `notin`, `key`, `!key`) and field selectors (`=`, `!=` on any dotted path); pages with
//!   `limit` and `continue` over a snapshot taken at the first page (later writes do not shift
//!   it; every page reports the snapshot's resourceVersion; `remainingItemCount` without a
//!   selector), 410 `Expired` for a token whose snapshot is gone (see [`ApiServer::compact`])
//!   and 400 for a malformed one. `resourceVersion=0` lists come whole, as the watch cache
//!   serves them (it ignores `limit`). Items come in etcd's order (namespace, then name) unless
//!   a test sets another ([`ApiServer::set_list_order`]).
//! - **Watches**: without a resourceVersion (or with `0`), the current objects as synthetic
//!   ADDED events first; from a resourceVersion, the changes after it from the history, or one
//!   410 `Expired` ERROR event when it was compacted; `sendInitialEvents=true` ends the initial
//!   events with the `k8s.io/initial-events-end` BOOKMARK (kube's streaming lists); with a
//!   selector, an object that starts or stops matching is ADDED or DELETED; the server closes
//!   a watch after its `timeoutSeconds` (kube asks for 290 s).
//! - **Writes**: create (201; 409 `AlreadyExists`; `generateName`; 500 when a
//!   `resourceVersion` is set, as the storage layer answers; 400 for a custom resource whose
//!   body lacks `apiVersion` or `kind`, which built-in types may omit), replace by PUT (404 for a missing
//!   object unless the resource allows create-on-update), merge patch, JSON Patch (RFC 6902,
//!   all six operations, atomic; a failed `test` or an operation that does not apply is 422
//!   `Invalid` with a Status; a `test` of a missing path against `null` passes, as the API
//!   server's patch library has it), strategic merge patch (as a merge patch: list merge keys
//!   are not modelled; 415 for custom resources), server-side apply (create, or merge onto the
//!   stored object), the `/status` subresource, `dryRun=All`, delete and delete-collection.
//! - **Optimistic concurrency**: one resourceVersion counter for all objects; a PUT or patch
//!   whose result carries a `metadata.resourceVersion` other than the stored one is 409
//!   `Conflict`, and so is a `uid` or a delete precondition that does not match; a PUT without
//!   one is 422 for resources that forbid unconditional updates (Leases, custom resources).
//!   A write that changes nothing writes nothing (no new resourceVersion, no event).
//! - **System fields**: `uid`, `creationTimestamp` (2025-01-01 plus the tokio time since the
//!   server was made), `resourceVersion`, `generation` (see [`ResourceRules`]), and
//!   `deletionTimestamp` are the server's: writes cannot change them. Empty `finalizers` and
//!   `ownerReferences` are dropped and `managedFields` are not kept.
//! - **Deletion**: without finalizers, at once (DELETED carries the deletion's
//!   resourceVersion; the DELETE answers a `Status` with the name, group, plural and uid,
//!   not the object); with finalizers, the object gets
//!   `deletionTimestamp` and `deletionGracePeriodSeconds: 0` (MODIFIED) and stays until a
//!   write empties its finalizers, which deletes it without writing that update: the write
//!   answers the updated object at the stored resourceVersion, and DELETED carries the stored
//!   object (finalizers listed) at the deletion's; adding a finalizer to it is 422 `Invalid`
//!   (`FieldValueForbidden`). A second DELETE changes nothing. (Each checked against
//!   kube-apiserver 1.36 in `e2e/tests/`.)
//! - **Faults**: an outage ([`ApiServer::set_down`]: every request 503, watches broken); a
//!   verb that RBAC denies on a resource ([`ApiServer::deny`]: 403 `Forbidden`);
//!   compaction ([`ApiServer::compact`]); per client ([`ApiServer::client_named`]): latency
//!   each way ([`ApiServer::set_latency`], watch events included) and partitions
//!   ([`ApiServer::set_partition`]: refused, or blackholed until healed); slow and held lists
//!   ([`ApiServer::set_list_delay`], [`ApiServer::gate_lists`]) and a server page size
//!   ([`ApiServer::set_max_page_size`]).
//!
//! # What it does not model
//!
//! Field managers and apply conflicts (apply is a merge: fields dropped from an applied
//! configuration are not removed, `force` changes nothing); strategic merge's list merge keys;
//! admission, validation of object contents and defaulting; namespaces' existence and
//! lifecycle; garbage collection (owner references do nothing, propagation policies are
//! ignored) and graceful deletion of Pods; watch bookmarks other than the initial-events end;
//! `resourceVersionMatch=Exact` lists of the past (lists are of now, or of a page's snapshot);
//! authentication and RBAC; the `/scale` and other subresources; conversion between versions;
//! Protobuf, compression, HTTP/2 flow control and TLS.
//!
//! Only a real cluster shows the timing of a real API server and etcd (how stale a
//! `resourceVersion=0` list from a lagging watch cache is, when compaction happens, how long
//! a list of thousands of objects takes), what a real network partition does to a TCP
//! connection (kube's client timeouts and keep-alives), and how several API server replicas
//! behind a load balancer disagree for a moment.

mod list;
mod net;
mod patch;
mod serve;
mod store;
mod wire;

use std::any::type_name;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::Method;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use list::{ListGate, ListOrder};
pub use net::{Logged, Partition};
pub use store::{Generation, ResourceRules};

use net::ClientLink;
use store::{How, ObjKey, Preconditions, Store};
use wire::Gr;

#[derive(Default)]
pub(crate) struct Inner {
    store: Store,
    clients: HashMap<String, Arc<ClientLink>>,
    /// Every request any client sent, in order.
    log: Vec<Logged>,
    down: bool,
    /// Verbs on resources that RBAC denies: (`"list"`, `"deployments.apps"`).
    denied: Vec<(String, String)>,
}

/// The scripted API server. Clones share it.
#[derive(Clone, Default)]
pub struct ApiServer {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("ApiServer")
            .field("objects", &inner.store.objects.len())
            .field("version", &inner.store.version)
            .field("requests", &inner.log.len())
            .field("down", &inner.down)
            .finish()
    }
}

/// The store key of a typed object: cluster-scoped types (k8s-openapi's
/// `ClusterResourceScope`) have no namespace, namespaced ones default to `default`.
fn key_of<K: Resource<DynamicType = ()>>(namespace: Option<&str>, name: &str) -> ObjKey {
    let cluster = type_name::<K::Scope>().ends_with("ClusterResourceScope");
    ObjKey {
        gr: gr_of::<K>(),
        ns: if cluster {
            String::new()
        } else {
            namespace.unwrap_or("default").into()
        },
        name: name.into(),
    }
}

fn gr_of<K: Resource<DynamicType = ()>>() -> Gr {
    Gr {
        group: K::group(&()).into_owned(),
        plural: K::plural(&()).into_owned(),
    }
}

impl ApiServer {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    // Clients and the network.

    /// A client of this server (default namespace `default`), named `"default"`.
    pub fn client(&self) -> kube::Client {
        self.client_named("default")
    }

    /// A client whose requests carry its name (in [`ApiServer::request_log`]) and go through
    /// its own link: its latency and partitions. Clients of one name share the link.
    pub fn client_named(&self, name: &str) -> kube::Client {
        self.client_on(self.link(name))
    }

    /// Sets a client's link: [`Partition::Refused`] fails its requests and open watches at
    /// once, [`Partition::Blackholed`] holds them until the link is
    /// [`Partition::Connected`] again and then fails them, [`Partition::WatchesHang`] stalls
    /// its watches silently, [`Partition::ReadsFail`] fails its reads and lets its writes
    /// through. A response the server produced while the link went down is lost on the way
    /// back (the write happened; the client sees a transport error). The name need not have a
    /// client yet.
    pub fn set_partition(&self, client: &str, partition: Partition) {
        self.link(client).partition.send_replace(partition);
    }

    /// Latency of a client's link, on tokio's clock: `to_server` before each request
    /// reaches the server, `to_client` before each answer and each watch event reaches the
    /// client.
    pub fn set_latency(&self, client: &str, to_server: Duration, to_client: Duration) {
        self.link(client).set_latency(to_server, to_client);
    }

    // A test's own reads and writes: no request, no log entry.

    /// Creates or replaces an object, unconditionally (its resourceVersion is ignored), as a
    /// user or another controller would; its `status` is taken as given.
    pub fn put<K: Resource<DynamicType = ()> + Serialize>(&self, object: &K) {
        let meta = object.meta();
        let key = key_of::<K>(meta.namespace.as_deref(), meta.name.as_deref().unwrap());
        let value = serde_json::to_value(object).unwrap();
        let how = How {
            forced: true,
            ..How::default()
        };
        let mut inner = self.lock();
        let store = &mut inner.store;
        let result = if store.objects.contains_key(&key) {
            store.update(&key, value, how)
        } else {
            store.create(&key.gr, &key.ns, value, &K::api_version(&()), how, true)
        };
        if let Err(e) = result {
            panic!("ApiServer::put of {}/{}: {}", key.ns, key.name, e.message);
        }
    }

    /// Deletes an object in namespace `default`, as `kubectl delete` would: with finalizers,
    /// it is only marked as being deleted.
    pub fn delete<K: Resource<DynamicType = ()>>(&self, name: &str) {
        self.delete_in::<K>("default", name);
    }

    /// Deletes an object of a namespace (ignored for cluster-scoped types), as
    /// [`ApiServer::delete`] does.
    pub fn delete_in<K: Resource<DynamicType = ()>>(&self, namespace: &str, name: &str) {
        let key = key_of::<K>(Some(namespace), name);
        let _ = self
            .lock()
            .store
            .delete(&key, &Preconditions::default(), How::default());
    }

    /// An object of namespace `default` as stored now.
    pub fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(&self, name: &str) -> Option<K> {
        self.get_in("default", name)
    }

    /// An object of a namespace (ignored for cluster-scoped types) as stored now.
    pub fn get_in<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        let key = key_of::<K>(Some(namespace), name);
        let value = self.lock().store.objects.get(&key)?.value.clone();
        Some(serde_json::from_value(value).unwrap())
    }

    /// The objects of one resource (`"events"`, or qualified: `"leases.coordination.k8s.io"`),
    /// as stored now, in etcd's order.
    pub fn all(&self, resource: &str) -> Vec<Value> {
        let inner = self.lock();
        let objects = inner.store.objects.iter();
        objects
            .filter(|(k, _)| k.gr.is(resource))
            .map(|(_, s)| s.value.clone())
            .collect()
    }

    /// The current resourceVersion (of the last write).
    pub fn version(&self) -> u64 {
        self.lock().store.version
    }

    /// The changes to one resource since the last compaction, as watches see them: event
    /// type (`ADDED`, `MODIFIED`, `DELETED`) and object.
    pub fn events(&self, resource: &str) -> Vec<(String, Value)> {
        let inner = self.lock();
        let history = inner.store.history.iter();
        history
            .filter(|c| c.key.gr.is(resource))
            .map(|c| (c.kind.to_string(), c.object.clone()))
            .collect()
    }

    /// Watches of one resource open now.
    pub fn open_watches(&self, resource: &str) -> usize {
        let inner = self.lock();
        let watches = inner.store.watches.iter();
        watches
            .filter(|w| w.gr.is(resource) && !w.tx.is_closed())
            .count()
    }

    // The request log.

    /// Requests that reached the server so far.
    pub fn requests(&self) -> usize {
        self.lock().log.iter().filter(|l| l.reached).count()
    }

    /// Writes (requests other than GET: lists, watches and reads) that reached the server.
    pub fn writes(&self) -> usize {
        let inner = self.lock();
        inner
            .log
            .iter()
            .filter(|l| l.reached && l.is_write())
            .count()
    }

    /// Requests with this method to this resource that reached the server.
    pub fn requests_to(&self, method: Method, resource: &str) -> usize {
        let inner = self.lock();
        let log = inner.log.iter();
        log.filter(|l| l.reached && l.method == method && l.is_to(resource))
            .count()
    }

    /// Every request so far, one line each (client, method, URI, status): for failure
    /// messages.
    pub fn log(&self) -> Vec<String> {
        let inner = self.lock();
        let log = inner.log.iter();
        log.map(|l| {
            let outcome = match (l.reached, l.status) {
                (_, Some(code)) => code.to_string(),
                (true, None) => "pending".into(),
                (false, None) => "not reached".into(),
            };
            format!("[{}] {} {} -> {outcome}", l.client, l.method, l.uri)
        })
        .collect()
    }

    /// Every request so far, sent or not, in the order the clients sent them.
    pub fn request_log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// The requests one client sent (see [`ApiServer::client_named`]).
    pub fn requests_of(&self, client: &str) -> Vec<Logged> {
        let inner = self.lock();
        let log = inner.log.iter();
        log.filter(|l| l.client == client).cloned().collect()
    }

    // Faults.

    /// An outage: while down, every request fails with 503; going down breaks the open watches.
    pub fn set_down(&self, down: bool) {
        let mut inner = self.lock();
        inner.down = down;
        if down {
            inner.store.watches.clear();
        }
    }

    /// RBAC denies `verb` (`"list"`, `"watch"`, `"get"`, `"create"`, `"update"`, `"patch"`,
    /// `"delete"`) on a resource (`"deployments"` or `"deployments.apps"`) to every client: such
    /// requests are answered 403 `Forbidden`, as a role without that verb gets them. Watches
    /// already open stay open (the API server checks a watch when it starts).
    pub fn deny(&self, verb: &str, resource: &str) {
        let mut inner = self.lock();
        inner.denied.push((verb.to_string(), resource.to_string()));
    }

    /// Undoes every [`ApiServer::deny`] of `verb` on `resource`.
    pub fn allow(&self, verb: &str, resource: &str) {
        let mut inner = self.lock();
        inner.denied.retain(|(v, r)| !(v == verb && r == resource));
    }

    /// Compaction: the history so far is forgotten and the open watches break, so that each
    /// watcher's next watch is answered "410 Gone" and it relists; every list snapshot is
    /// forgotten too, so each outstanding `continue` token is answered 410 `Expired`.
    pub fn compact(&self) {
        let mut inner = self.lock();
        let store = &mut inner.store;
        store.compacted = store.version;
        store.history.clear();
        store.watches.clear();
        store.lists.expire();
    }

    // Lists.

    /// The order a resource's lists come in (default [`ListOrder::Key`], etcd's).
    pub fn set_list_order(&self, resource: &str, order: ListOrder) {
        self.lock()
            .store
            .lists
            .set(resource, |k| k.order = Some(order));
    }

    /// The most items the server puts in one page of a resource's list, whatever larger
    /// `limit` the client asks for (a client that sends no `limit` still gets everything, as
    /// from a real server).
    pub fn set_max_page_size(&self, resource: &str, max: usize) {
        assert!(max > 0, "a page holds at least one item");
        self.lock()
            .store
            .lists
            .set(resource, |k| k.max_page = Some(max));
    }

    /// Delays each page of a resource's lists (after its snapshot is taken), on tokio's clock.
    pub fn set_list_delay(&self, resource: &str, delay: Duration) {
        self.lock()
            .store
            .lists
            .set(resource, |k| k.delay = Some(delay));
    }

    /// Holds each page of a resource's lists (after its snapshot is taken) until the returned
    /// gate lets it through: a list that is still running while others finish. A later gate
    /// for the same resource replaces this one for later lists.
    pub fn gate_lists(&self, resource: &str) -> ListGate {
        let gate = ListGate::new();
        let held = gate.clone();
        self.lock()
            .store
            .lists
            .set(resource, |k| k.gate = Some(held));
        gate
    }

    // Rules.

    /// Overrides the write rules of a resource (`"widgets"` or `"widgets.example.com"`);
    /// [`ResourceRules::for_resource`] has the defaults.
    pub fn set_rules(&self, resource: &str, rules: ResourceRules) {
        self.lock().store.set_rules(resource, rules);
    }
}
