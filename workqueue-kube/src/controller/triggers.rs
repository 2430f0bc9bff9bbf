//! What queues a controller's keys: the main resource's watch (which also fills the store and
//! opens the gate), owned and watched resources, and triggers of the user's.

use std::sync::Arc;

use futures_util::future::ready;
use futures_util::stream::{self, BoxStream, Stream, StreamExt, TryStreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::watch;
use workqueue_tokio::{AddOptions, LOW_PRIORITY};

use crate::{Change, Prioritized, prioritized};

/// A stream of keys and how to add them, or a watch's error.
pub(crate) type Trigger<K> = BoxStream<'static, Result<(ObjectRef<K>, AddOptions), watcher::Error>>;

/// The main resource's triggers: every object the watch lists or applies (not a deletion: a
/// deleted object is not reconciled, its clean-up is a finalizer's), with controller-runtime's
/// priorities.
///
/// It also keeps `gate`, whether the store may be read: a reconcile reads its object there, so
/// none starts before the first list is complete, nor while a relist is being received (the
/// store then still holds the previous list, which may have objects the new one lacks). A list
/// that fails leaves the store as it was, holding the last complete list and the changes since:
/// after it, and while the watch waits to try again, the store may be read as kube-runtime and
/// client-go read theirs, so that a relist that keeps failing (an outage, a denied `list`) does
/// not hold every reconcile for as long as it fails. The watch's events reach this stage after
/// the reflector applied them to the store, so a list's `InitDone` opens the gate only once the
/// store holds that list.
pub(crate) fn main<K, S>(
    events: S,
    gate: watch::Sender<bool>,
    dyntype: K::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    K::DynamicType: Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut listed = false;
    let events = events.inspect(move |event| match event {
        Ok(watcher::Event::Init) => {
            gate.send_replace(false);
        }
        Ok(watcher::Event::InitDone) => {
            listed = true;
            gate.send_replace(true);
        }
        Err(_) if listed => {
            gate.send_replace(true);
        }
        _ => {}
    });
    prioritized(events).try_filter_map(move |touched: Prioritized<K>| {
        ready(Ok(match touched.change {
            Change::Deleted => None,
            Change::Listed | Change::Applied => Some((
                ObjectRef::from_obj_with(&touched.object, dyntype.clone()),
                touched.options(),
            )),
        }))
    })
}

/// The keys of `objects`' owners of the main resource, each at the priority of the event.
pub(crate) fn owners<K, Child, S>(
    objects: S,
    dyntype: K::DynamicType,
    child_type: Child::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    K::DynamicType: Clone,
    Child: Resource,
    Child::DynamicType: Clone,
    S: Stream<Item = Result<watcher::Event<Child>, watcher::Error>>,
{
    crate::owners::<K, Child, _>(prioritized(objects), dyntype, child_type)
}

/// The keys `mapper` relates each object of `objects` to, each at the priority of the event.
pub(crate) fn related<K, Other, S, I>(
    objects: S,
    mapper: impl Fn(Other) -> I + Send + Sync + 'static,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    Other: Resource,
    I: IntoIterator<Item = ObjectRef<K>>,
    S: Stream<Item = Result<watcher::Event<Other>, watcher::Error>>,
{
    prioritized(objects).flat_map(move |item| match item {
        Ok(touched) => {
            let opts = touched.options();
            let keys: Vec<_> = mapper(touched.object).into_iter().collect();
            stream::iter(keys.into_iter().map(move |key| Ok((key, opts)))).left_stream()
        }
        Err(error) => stream::iter([Err(error)]).right_stream(),
    })
}

/// Every object in `store` each time `trigger` yields, behind real changes (a resync).
pub(crate) fn all_of<K>(
    trigger: impl Stream<Item = ()> + Send + 'static,
    store: Store<K>,
    dyntype: K::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    trigger.flat_map(move |()| {
        let dyntype = dyntype.clone();
        let keys = store.state().into_iter().map(move |object: Arc<K>| {
            Ok((
                ObjectRef::from_obj_with(&*object, dyntype.clone()),
                AddOptions::new().priority(LOW_PRIORITY),
            ))
        });
        stream::iter(keys)
    })
}

/// The objects of a stream of applied objects (`Controller::for_stream`), at the default
/// priority: such a stream does not tell a list from a change.
pub(crate) fn applied<K>(
    objects: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    dyntype: K::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    K::DynamicType: Clone,
{
    objects.map_ok(move |object| {
        (
            ObjectRef::from_obj_with(&object, dyntype.clone()),
            AddOptions::default(),
        )
    })
}
