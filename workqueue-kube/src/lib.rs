//! kube-runtime's `Controller` on a work queue, and kube-rs watchers as sources of a
//! [`workqueue_tokio`] runner: client-go's retries, priorities and fairness for kube-rs
//! controllers, and replicas coordinated by Leases.
//!
//! - [`controller::Controller`] has kube-runtime's builder and signatures: a kube-runtime program
//!   moves over by changing its `use` lines (`workqueue_kube::controller::{Action, Config,
//!   Controller}` and `workqueue_kube::finalizer::{finalizer, Event}`), and gains per-key backoff,
//!   priorities, aging, fairness, outage-aware retries and controller-runtime's metrics; see the
//!   [`controller`] module for the migration table and the guarantees.
//! - [`Controller::leases`](controller::Controller::leases) runs it as one of several replicas:
//!   leader election, or the objects divided into shards ([`lease`]).
//! - [`finalizer()`] is kube-runtime's finalizer helper with this crate's `Action`.
//!
//! Beneath `Controller`, for a controller wired by hand on a `workqueue_tokio` runner:
//! kube-runtime has the input side (its [`watcher()`](kube::runtime::watcher()),
//! [reflectors](mod@kube::runtime::reflector), [`predicates`](kube::runtime::predicates) and
//! [`trigger_owners`]); `workqueue-tokio` has the queue and the workers. Three stream stages join
//! them:
//!
//! - [`prioritized`] reads a watcher's events and gives each touched object the priority
//!   controller-runtime gives its key: the initial list at [`LOW_PRIORITY`], a re-listed object
//!   at `LOW_PRIORITY` only if its resourceVersion is unchanged, every real change at the
//!   default priority 0 (see [`Prioritized`]);
//! - between the two, kube-runtime's own `predicate_filter` works unchanged
//!   ([`Prioritized`] is a [`Resource`]); [`pass_deletes`] lets deletions through a predicate, as
//!   controller-runtime's predicates do;
//! - [`keys`] maps each object to its own key, [`owners`] to its owners' keys (with
//!   `trigger_owners`), each an [`ObjectRef`] with the [`AddOptions`] of its priority: a source
//!   for [`Runner::source`](workqueue_tokio::runner::Runner::source).
//!
//! A watcher's errors pass through as `Err` items: the runner logs them, counts them in
//! [`Report::source_errors`](workqueue_tokio::runner::Report::source_errors) and goes on, while
//! the watcher retries on its own (with its backoff). A hand-wired runner must keep the
//! guarantees `Controller` keeps for it (no reconcile before its store is ready, in particular).
//!
//! ```
//! use futures_util::stream::{self, StreamExt};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::ObjectMeta;
//! use kube::runtime::watcher::Event;
//! use workqueue_kube::{AddOptions, LOW_PRIORITY, keys, prioritized};
//!
//! fn cm(name: &str, rv: &str) -> ConfigMap {
//!     let metadata = ObjectMeta {
//!         name: Some(name.into()),
//!         namespace: Some("default".into()),
//!         resource_version: Some(rv.into()),
//!         ..Default::default()
//!     };
//!     ConfigMap { metadata, ..Default::default() }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // What a watcher yields: an initial list, a change, then a relist after the watch broke.
//! let events = stream::iter([
//!     Event::Init,
//!     Event::InitApply(cm("a", "1")),
//!     Event::InitApply(cm("b", "2")),
//!     Event::InitDone,
//!     Event::Apply(cm("a", "3")),
//!     Event::Init,
//!     Event::InitApply(cm("a", "3")), // unchanged since the last event
//!     Event::InitApply(cm("b", "4")), // changed while the watch was down
//!     Event::InitDone,
//! ])
//! .map(Ok);
//! let added: Vec<_> = keys(prioritized(events))
//!     .map(|item| item.map(|(key, opts)| (key.name, opts)).unwrap())
//!     .collect()
//!     .await;
//! let (low, normal) = (AddOptions::new().priority(LOW_PRIORITY), AddOptions::new());
//! assert_eq!(added, [
//!     ("a".to_string(), low),
//!     ("b".to_string(), low),
//!     ("a".to_string(), normal),
//!     ("a".to_string(), low),
//!     ("b".to_string(), normal),
//! ]);
//! # }
//! ```
//!
//! The crate enables no Kubernetes version feature of `k8s-openapi`: the application picks one,
//! as kube-rs asks of libraries. `examples/counter/` (the counter controller) and
//! `examples/configmap_generator.rs` (a custom resource that owns ConfigMaps) are complete
//! controllers on `Controller` (a real cluster given a kubeconfig); their tests run them against a
//! scripted API server.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod controller;
pub mod finalizer;

pub use controller::{Config, Controller};
pub use finalizer::finalizer;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::ops::{Deref, DerefMut};

use futures_util::future::ready;
use futures_util::stream::{self, Stream, StreamExt, TryStreamExt};
use kube::Resource;
use kube::core::ObjectMeta;
use kube::runtime::Predicate;
use kube::runtime::controller::trigger_owners;
pub use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
pub use workqueue_tokio::{AddOptions, LOW_PRIORITY};

pub mod lease;

/// What a watch event did to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Listed: the initial list, or a relist after the watch broke (`InitApply`).
    Listed,
    /// Added or modified (`Apply`).
    Applied,
    /// Deleted (`Delete`).
    Deleted,
}

/// An object a watch event touched, with the priority its key goes into the queue at.
///
/// The priority follows controller-runtime (its `WithLowPriorityWhenUnchanged` handlers):
/// [`LOW_PRIORITY`] for an object of the watcher's initial list, and for a re-listed object
/// whose resourceVersion is the one last seen for it (nothing changed: a resync); 0, the
/// default, for every real change (an add, a modification, a delete, a relisted object that
/// changed or is new). So a controller that starts, or whose watch relists, serves real changes
/// before it walks through the objects it already knew.
///
/// It is a [`Resource`] whose metadata is the object's, so kube-runtime's `predicate_filter`
/// and [`predicates`](kube::runtime::predicates) apply to it unchanged, and it derefs to the
/// object.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::ResourceExt;
/// use workqueue_kube::{AddOptions, Change, LOW_PRIORITY, Prioritized};
///
/// let cm = ConfigMap::default();
/// let listed = Prioritized { object: cm, change: Change::Listed, priority: LOW_PRIORITY };
/// assert_eq!(listed.options(), AddOptions::new().priority(LOW_PRIORITY));
/// assert_eq!(listed.name_any(), ""); // ResourceExt, through the object's metadata
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Prioritized<K> {
    /// The object as the event carried it (for a deletion, its last state).
    pub object: K,
    /// What the event did.
    pub change: Change,
    /// The priority its key is added at: [`LOW_PRIORITY`] or 0.
    pub priority: i32,
}

impl<K> Prioritized<K> {
    /// The options to add its key with: its priority, no delay.
    pub const fn options(&self) -> AddOptions {
        AddOptions::new().priority(self.priority)
    }
}

impl<K> Deref for Prioritized<K> {
    type Target = K;

    fn deref(&self) -> &K {
        &self.object
    }
}

impl<K> DerefMut for Prioritized<K> {
    fn deref_mut(&mut self) -> &mut K {
        &mut self.object
    }
}

impl<K: Resource> Resource for Prioritized<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.object.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.object.meta_mut()
    }
}

/// An object's identity within one watch: namespace and name.
type Name = (Option<String>, String);

fn name_of<K: Resource>(object: &K) -> Name {
    let meta = object.meta();
    (
        meta.namespace.clone(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The state [`prioritized`] keeps: the resourceVersion last seen of each live object.
#[derive(Debug, Default)]
struct Versions {
    /// The last resourceVersion seen of each object the watch knows.
    seen: HashMap<Name, Option<String>>,
    /// Whether a list has completed (`InitDone`): the next ones are relists.
    listed: bool,
    /// The objects listed so far in the list under way.
    listing: HashSet<Name>,
}

impl Versions {
    fn classify<K: Resource>(&mut self, event: watcher::Event<K>) -> Option<Prioritized<K>> {
        let (object, change, priority) = match event {
            watcher::Event::Init => {
                self.listing.clear();
                return None;
            }
            watcher::Event::InitDone => {
                // Objects the relist did not return are gone (the reflector's store drops them
                // too): forget them.
                let listing = std::mem::take(&mut self.listing);
                self.seen.retain(|name, _| listing.contains(name));
                self.listed = true;
                return None;
            }
            watcher::Event::InitApply(object) => {
                let name = name_of(&object);
                let version = object.meta().resource_version.clone();
                let unchanged = version.is_some() && self.seen.get(&name) == Some(&version);
                let priority = if !self.listed || unchanged {
                    LOW_PRIORITY
                } else {
                    0
                };
                self.seen.insert(name.clone(), version);
                self.listing.insert(name);
                (object, Change::Listed, priority)
            }
            watcher::Event::Apply(object) => {
                let version = object.meta().resource_version.clone();
                self.seen.insert(name_of(&object), version);
                (object, Change::Applied, 0)
            }
            watcher::Event::Delete(object) => {
                self.seen.remove(&name_of(&object));
                (object, Change::Deleted, 0)
            }
        };
        Some(Prioritized {
            object,
            change,
            priority,
        })
    }
}

/// Reads a watcher's events (after its `reflect`, if it feeds a store) and yields each object an
/// event touched, with the priority of its key ([`Prioritized`]); errors pass through.
///
/// `Init` and `InitDone` yield nothing. Memory: the namespace, name and resourceVersion of each
/// live object. An object deleted while the watch was down is not reported (the relist just does
/// not return it, and kube-runtime's watcher does not say so): the reflector's store drops it,
/// and a controller that must act on it finds it by other means (owner references and the
/// cluster's garbage collector, a finalizer, a periodic resync).
///
/// ```
/// use futures_util::stream::{self, StreamExt};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::runtime::watcher::Event;
/// use workqueue_kube::{Change, LOW_PRIORITY, prioritized};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let events = stream::iter([Event::Init, Event::InitApply(ConfigMap::default()), Event::InitDone]);
/// let touched: Vec<_> = prioritized(events.map(Ok)).collect().await;
/// let listed = touched[0].as_ref().unwrap();
/// assert_eq!((touched.len(), listed.change, listed.priority), (1, Change::Listed, LOW_PRIORITY));
/// # }
/// ```
pub fn prioritized<K, S>(events: S) -> impl Stream<Item = Result<Prioritized<K>, watcher::Error>>
where
    K: Resource,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut versions = Versions::default();
    events.filter_map(move |event| {
        ready(match event {
            Ok(event) => versions.classify(event).map(Ok),
            Err(error) => Some(Err(error)),
        })
    })
}

/// Maps each touched object to its own key, an [`ObjectRef`], with the [`AddOptions`] of its
/// priority: a source for [`Runner::source`](workqueue_tokio::runner::Runner::source).
///
/// See the [crate's example](crate).
pub fn keys<K, S>(
    objects: S,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    K::DynamicType: Default,
    S: Stream<Item = Result<Prioritized<K>, watcher::Error>>,
{
    objects.map_ok(|touched| (ObjectRef::from_obj(&touched.object), touched.options()))
}

/// Maps each touched object to the keys of its owners of type `KOwner` (its owner references,
/// read by kube-runtime's [`trigger_owners`]), each with the [`AddOptions`] of the object's
/// priority: an owned object's initial list queues its owner at [`LOW_PRIORITY`], as
/// controller-runtime's `EnqueueRequestForOwner` does.
///
/// ```
/// use futures_util::stream::{self, StreamExt};
/// use k8s_openapi::api::apps::v1::Deployment;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::api::ObjectMeta;
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
/// use kube::runtime::watcher::Event;
/// use workqueue_kube::{AddOptions, owners, prioritized};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let owner = OwnerReference {
///     api_version: "v1".into(),
///     kind: "ConfigMap".into(),
///     name: "web".into(),
///     uid: "1234".into(),
///     ..Default::default()
/// };
/// let deployment = |name: &str, owners| Deployment {
///     metadata: ObjectMeta {
///         name: Some(name.into()),
///         namespace: Some("default".into()),
///         owner_references: owners,
///         ..Default::default()
///     },
///     ..Default::default()
/// };
/// let owned = deployment("web", Some(vec![owner]));
/// let orphan = deployment("orphan", None); // queues nothing
/// let events = stream::iter([Event::Apply(owned), Event::Apply(orphan)]).map(Ok);
/// let queued: Vec<_> = owners::<ConfigMap, _, _>(prioritized(events), (), ()).collect().await;
/// let (key, opts) = queued[0].as_ref().unwrap();
/// assert_eq!((queued.len(), key.name.as_str(), *opts), (1, "web", AddOptions::new()));
/// # }
/// ```
pub fn owners<KOwner, K, S>(
    objects: S,
    owner_type: KOwner::DynamicType,
    child_type: K::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<KOwner>, AddOptions), watcher::Error>>
where
    KOwner: Resource,
    KOwner::DynamicType: Clone,
    K: Resource,
    K::DynamicType: Clone,
    S: Stream<Item = Result<Prioritized<K>, watcher::Error>>,
{
    objects.flat_map(move |item| match item {
        Ok(touched) => {
            let opts = touched.options();
            // One object at a time through kube-runtime's mapping, so that each owner key keeps
            // the priority of the event that queued it.
            let one = stream::iter([Ok::<K, watcher::Error>(touched.object)]);
            trigger_owners::<KOwner, _>(one, owner_type.clone(), child_type.clone())
                .map_ok(move |request| (request.obj_ref, opts))
                .left_stream()
        }
        Err(error) => stream::iter([Err(error)]).right_stream(),
    })
}

/// A predicate for kube-runtime's `predicate_filter` over [`Prioritized`] objects that lets
/// every deletion through and filters the rest with `predicate`: controller-runtime's predicates
/// (`GenerationChangedPredicate` and the like) filter updates, not deletes, while kube-runtime's
/// can drop a deleted object whose hashed part did not change.
///
/// ```
/// use futures_util::stream::{self, StreamExt};
/// use k8s_openapi::api::apps::v1::Deployment;
/// use kube::api::ObjectMeta;
/// use kube::runtime::{WatchStreamExt, predicates, watcher::Event};
/// use workqueue_kube::{Change, pass_deletes, prioritized};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let d = Deployment {
///     metadata: ObjectMeta { name: Some("web".into()), generation: Some(1), ..Default::default() },
///     ..Default::default()
/// };
/// let events = stream::iter([Event::Apply(d.clone()), Event::Apply(d.clone()), Event::Delete(d)]);
/// let passed: Vec<_> = prioritized(events.map(Ok))
///     .predicate_filter(pass_deletes(predicates::generation), Default::default())
///     .map(|touched| touched.unwrap().change)
///     .collect()
///     .await;
/// assert_eq!(passed, [Change::Applied, Change::Deleted]);
/// # }
/// ```
pub fn pass_deletes<P>(predicate: P) -> PassDeletes<P> {
    PassDeletes(predicate)
}

/// See [`pass_deletes`].
#[derive(Debug, Clone, Copy)]
pub struct PassDeletes<P>(P);

impl<K, P: Predicate<K>> Predicate<Prioritized<K>> for PassDeletes<P> {
    fn hash_property(&self, touched: &Prioritized<K>) -> Option<u64> {
        let hash = self.0.hash_property(&touched.object);
        if touched.change == Change::Deleted {
            // Never the hash of a live object: the deletion passes. (The same object cannot be
            // deleted twice; a re-created one has a new UID, a new entry of the filter.)
            let mut hasher = DefaultHasher::new();
            (hash, "deleted").hash(&mut hasher);
            Some(hasher.finish())
        } else {
            hash
        }
    }
}

/// This crate's README, whose example compiles as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct Readme;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use watcher::Event;

    fn cm(name: &str, rv: &str) -> ConfigMap {
        let metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        };
        ConfigMap {
            metadata,
            ..Default::default()
        }
    }

    fn classify(events: Vec<Event<ConfigMap>>) -> Vec<(String, Change, i32)> {
        let mut versions = Versions::default();
        events
            .into_iter()
            .filter_map(|e| versions.classify(e))
            .map(|t| {
                (
                    t.object.metadata.name.clone().unwrap(),
                    t.change,
                    t.priority,
                )
            })
            .collect()
    }

    fn item(name: &str, change: Change, priority: i32) -> (String, Change, i32) {
        (name.into(), change, priority)
    }

    /// An initial list that breaks off and starts over is still the initial list: LOW.
    #[test]
    fn an_interrupted_initial_list_stays_low() {
        let got = classify(vec![
            Event::Init,
            Event::InitApply(cm("a", "1")),
            Event::Init,
            Event::InitApply(cm("a", "2")),
            Event::InitApply(cm("b", "3")),
            Event::InitDone,
        ]);
        assert_eq!(
            got,
            [
                item("a", Change::Listed, LOW_PRIORITY),
                item("a", Change::Listed, LOW_PRIORITY),
                item("b", Change::Listed, LOW_PRIORITY),
            ]
        );
    }

    /// A relist forgets what it did not return: an object of that name listed later is new (0),
    /// even with the resourceVersion it had; and a deleted object re-created is new too.
    #[test]
    fn a_relist_forgets_objects_it_did_not_return() {
        let got = classify(vec![
            Event::Init,
            Event::InitApply(cm("a", "1")),
            Event::InitApply(cm("b", "2")),
            Event::InitDone,
            Event::Init,
            Event::InitApply(cm("a", "1")),
            Event::InitDone,
            Event::Init,
            Event::InitApply(cm("a", "1")),
            Event::InitApply(cm("b", "2")),
            Event::InitDone,
            Event::Delete(cm("a", "4")),
            Event::Init,
            Event::InitApply(cm("a", "1")),
            Event::InitDone,
        ]);
        assert_eq!(
            got,
            [
                item("a", Change::Listed, LOW_PRIORITY),
                item("b", Change::Listed, LOW_PRIORITY),
                item("a", Change::Listed, LOW_PRIORITY),
                item("a", Change::Listed, LOW_PRIORITY),
                item("b", Change::Listed, 0),
                item("a", Change::Deleted, 0),
                item("a", Change::Listed, 0),
            ]
        );
    }

    /// Applied and deleted objects are always at the default priority, and an object without a
    /// resourceVersion is never "unchanged".
    #[test]
    fn changes_are_normal_and_no_version_is_not_unchanged() {
        let mut bare = cm("c", "");
        bare.metadata.resource_version = None;
        let got = classify(vec![
            Event::Init,
            Event::InitApply(bare.clone()),
            Event::InitDone,
            Event::Apply(cm("a", "1")),
            Event::Init,
            Event::InitApply(bare),
            Event::InitApply(cm("a", "1")),
            Event::InitDone,
        ]);
        assert_eq!(
            got,
            [
                item("c", Change::Listed, LOW_PRIORITY),
                item("a", Change::Applied, 0),
                item("c", Change::Listed, 0),
                item("a", Change::Listed, LOW_PRIORITY),
            ]
        );
    }
}
