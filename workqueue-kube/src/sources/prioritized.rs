//! [`prioritized`]: a watcher's events to the objects they touched, each with the priority
//! controller-runtime gives its key.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::ops::{Deref, DerefMut};

use futures_util::future::ready;
use futures_util::stream::{Stream, StreamExt};
use kube::Resource;
use kube::core::ObjectMeta;
use kube::runtime::watcher;

use super::{AddOptions, LOW_PRIORITY};

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
/// use workqueue_kube::sources::{AddOptions, Change, LOW_PRIORITY, Prioritized};
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

/// The state [`prioritized`] keeps: the resourceVersion last seen of each live object, as
/// 64-bit hashes (of the namespace and name, and of the resourceVersion), so that it costs a few
/// bytes per object instead of a copy of three strings. Two objects whose hashes collide share
/// an entry: with 10,000 objects the chance is below one in 10^11, and all it can do is give a
/// changed object the low priority of an unchanged one; it is still reconciled.
///
/// Invariant: outside a relist, `listing` is empty and holds no memory; during the initial list
/// `seen` holds exactly the objects that list returned so far (a restarted initial list starts
/// it over), so the initial list needs no `listing` beside it.
#[derive(Debug, Default)]
struct Versions {
    /// The hash of the last resourceVersion seen of each object the watch knows; [`NO_VERSION`]
    /// when it had none.
    seen: HashMap<u64, u64>,
    /// Whether a list has completed (`InitDone`): the next ones are relists.
    listed: bool,
    /// The objects listed so far in the relist under way.
    listing: HashSet<u64>,
    hasher: RandomState,
}

/// [`Versions::seen`]'s value for an object without a resourceVersion (never "unchanged").
const NO_VERSION: u64 = 0;

impl Versions {
    /// The hash of `object`'s namespace and name, and of its resourceVersion ([`NO_VERSION`]
    /// without one; a resourceVersion whose hash is 0 takes 1).
    fn digest<K: Resource>(&self, object: &K) -> (u64, u64) {
        let meta = object.meta();
        let name = (
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        );
        let version = meta.resource_version.as_deref();
        (
            self.hasher.hash_one(name),
            version.map_or(NO_VERSION, |v| self.hasher.hash_one(v).max(1)),
        )
    }

    fn classify<K: Resource>(&mut self, event: watcher::Event<K>) -> Option<Prioritized<K>> {
        let (object, change, priority) = match event {
            watcher::Event::Init => {
                if !self.listed {
                    // An initial list that starts over: what it returned before may be gone.
                    self.seen.clear();
                }
                self.listing.clear();
                return None;
            }
            watcher::Event::InitDone => {
                // Objects a relist did not return are gone (the reflector's store drops them
                // too): forget them.
                let listing = std::mem::take(&mut self.listing);
                if self.listed {
                    self.seen.retain(|name, _| listing.contains(name));
                }
                self.listed = true;
                return None;
            }
            watcher::Event::InitApply(object) => {
                let (name, version) = self.digest(&object);
                let unchanged = version != NO_VERSION && self.seen.get(&name) == Some(&version);
                let priority = if !self.listed || unchanged {
                    LOW_PRIORITY
                } else {
                    0
                };
                self.seen.insert(name, version);
                if self.listed {
                    self.listing.insert(name);
                }
                (object, Change::Listed, priority)
            }
            watcher::Event::Apply(object) => {
                let (name, version) = self.digest(&object);
                self.seen.insert(name, version);
                (object, Change::Applied, 0)
            }
            watcher::Event::Delete(object) => {
                self.seen.remove(&self.digest(&object).0);
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
/// `Init` and `InitDone` yield nothing. Memory: two 64-bit hashes per live object (of its
/// namespace and name, and of its resourceVersion), and one more per object while a relist is
/// under way; two objects whose hashes collide (below one
/// chance in 10^11 with 10,000 objects) can at worst give a changed object the low priority of
/// an unchanged one, never lose it. An object deleted while the watch was down is not reported (the relist just does
/// not return it, and kube-runtime's watcher does not say so): the reflector's store drops it,
/// and a controller that must act on it finds it by other means (owner references and the
/// cluster's garbage collector, a finalizer, a periodic resync).
///
/// ```
/// use futures_util::stream::{self, StreamExt};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::runtime::watcher::Event;
/// use workqueue_kube::sources::{Change, LOW_PRIORITY, prioritized};
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

    /// An initial list that starts over forgets what its first try returned: an object of that
    /// try, relisted later with the same resourceVersion, is new (0). Only the relist keeps a
    /// set of what it listed.
    #[test]
    fn a_restarted_initial_list_forgets_its_first_try() {
        let mut versions = Versions::default();
        let events = [
            Event::Init,
            Event::InitApply(cm("a", "1")),
            Event::Init,
            Event::InitApply(cm("b", "2")),
        ];
        for event in events {
            versions.classify(event);
        }
        assert!(
            versions.listing.is_empty(),
            "no set beside the initial list"
        );
        versions.classify(Event::<ConfigMap>::InitDone);
        assert_eq!(versions.seen.len(), 1, "only b");
        let relisted: Vec<_> = [
            Event::Init,
            Event::InitApply(cm("a", "1")),
            Event::InitApply(cm("b", "2")),
        ]
        .into_iter()
        .filter_map(|e| versions.classify(e))
        .map(|t| t.priority)
        .collect();
        assert_eq!(relisted, [0, LOW_PRIORITY]);
        assert_eq!(versions.listing.len(), 2, "a relist keeps what it listed");
        versions.classify(Event::<ConfigMap>::InitDone);
        assert!(versions.listing.capacity() == 0, "and frees it at its end");
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
