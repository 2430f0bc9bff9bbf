//! What queues a controller's keys: the main resource's watch (which also fills the store and
//! opens the gate), owned and watched resources (watched by the controller, or streams of the
//! user's), and triggers of the user's.

use std::borrow::Borrow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use futures_util::future::ready;
use futures_util::stream::{self, BoxStream, Stream, StreamExt, TryStreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::watch;
use workqueue_tokio::{AddOptions, LOW_PRIORITY};

use super::error::RunnerError;
use super::reports::Reports;
use crate::sources::{Change, Prioritized, owner_keys, owners as prioritized_owners, prioritized};

/// A stream of keys and how to add them, or a watch's error.
pub(super) type Trigger<K> = BoxStream<'static, Result<(ObjectRef<K>, AddOptions), watcher::Error>>;

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
pub(super) fn main<K, S>(
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

/// The keys of `events`' owners of the main resource, each at the priority of the event.
pub(super) fn owners<K, Child, S>(
    events: S,
    dyntype: K::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    K::DynamicType: Clone,
    Child: Resource,
    S: Stream<Item = Result<watcher::Event<Child>, watcher::Error>>,
{
    prioritized_owners::<K, Child, _>(prioritized(events), dyntype)
}

/// The keys of the owners of the main resource of each object of `objects` (a stream of
/// objects of the user's, owned or shared), at the default priority: such a stream does not tell
/// a list from a change.
pub(super) fn owners_of<K, Child, T, S>(
    objects: S,
    dyntype: K::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    K::DynamicType: Clone,
    Child: Resource,
    T: Borrow<Child>,
    S: Stream<Item = Result<T, watcher::Error>>,
{
    objects.flat_map(move |item| {
        let keys = item.map(|object| owner_keys::<K, Child>(object.borrow(), &dyntype));
        of_one(keys, AddOptions::default())
    })
}

/// A `watches` mapper of the user's, called so that a panic costs the keys of one object: the
/// panic is reported on the controller's stream ([`RunnerError::MapperPanicked`]) and the
/// trigger goes on with the next object.
pub(super) struct Relation<F, D> {
    mapper: F,
    /// The dynamic type of the related objects, to name one in a report.
    dyntype: D,
    reports: Reports<watcher::Error>,
}

impl<F, D> Relation<F, D> {
    pub(super) fn new(mapper: F, dyntype: D, reports: Reports<watcher::Error>) -> Self {
        Relation {
            mapper,
            dyntype,
            reports,
        }
    }

    /// The keys the mapper relates `object` to; none if it panicked.
    fn keys<K, Other, T, I>(&self, object: T) -> Vec<ObjectRef<K>>
    where
        K: Resource,
        Other: Resource<DynamicType = D>,
        D: Clone,
        T: Borrow<Other>,
        F: Fn(T) -> I,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let related = ObjectRef::from_obj_with(object.borrow(), self.dyntype.clone()).erase();
        // The returned iterator is the user's too: it is drained inside the catch.
        let called = catch_unwind(AssertUnwindSafe(|| {
            (self.mapper)(object).into_iter().collect::<Vec<_>>()
        }));
        called.unwrap_or_else(|payload| {
            let message = workqueue_tokio::panic_message(payload.as_ref());
            tracing::error!(object = %related, panic = %message, "a watches mapper panicked; that object's keys were not queued");
            self.reports.send(RunnerError::MapperPanicked {
                object: Box::new(related),
                message,
            });
            Vec::new()
        })
    }
}

/// The keys `relation`'s mapper relates each object an event touched to, each at the priority
/// of the event.
pub(super) fn related<K, Other, S, F, I>(
    events: S,
    relation: Relation<F, Other::DynamicType>,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    Other: Resource,
    Other::DynamicType: Clone,
    F: Fn(Other) -> I,
    I: IntoIterator<Item = ObjectRef<K>>,
    S: Stream<Item = Result<watcher::Event<Other>, watcher::Error>>,
{
    prioritized(events).flat_map(move |item| match item {
        Ok(touched) => {
            let opts = touched.options();
            of_one(Ok(relation.keys::<K, Other, _, _>(touched.object)), opts)
        }
        Err(error) => of_one(Err(error), AddOptions::default()),
    })
}

/// The keys `relation`'s mapper relates each object of `objects` (a stream of the user's, owned
/// or shared) to, at the default priority.
pub(super) fn related_objects<K, Other, T, S, F, I>(
    objects: S,
    relation: Relation<F, Other::DynamicType>,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    Other: Resource,
    Other::DynamicType: Clone,
    T: Borrow<Other>,
    F: Fn(T) -> I,
    I: IntoIterator<Item = ObjectRef<K>>,
    S: Stream<Item = Result<T, watcher::Error>>,
{
    objects.flat_map(move |item| {
        let keys = item.map(|object| relation.keys::<K, Other, _, _>(object));
        of_one(keys, AddOptions::default())
    })
}

/// The items one object (or one error) queues.
fn of_one<K: Resource>(
    keys: Result<Vec<ObjectRef<K>>, watcher::Error>,
    opts: AddOptions,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>> {
    match keys {
        Ok(keys) => stream::iter(keys.into_iter().map(move |key| Ok((key, opts)))).left_stream(),
        Err(error) => stream::iter([Err(error)]).right_stream(),
    }
}

/// Every object in `store` each time `trigger` yields, behind real changes (a resync).
pub(super) fn all_of<K>(
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

/// The objects of a stream of applied objects, owned or shared (`Controller::for_stream`,
/// `Controller::for_shared_stream`), at the default priority: such a stream does not tell a
/// list from a change.
pub(super) fn applied<K, T>(
    objects: impl Stream<Item = Result<T, watcher::Error>>,
    dyntype: K::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    K::DynamicType: Clone,
    T: Borrow<K>,
{
    objects.map_ok(move |object| {
        (
            ObjectRef::from_obj_with(object.borrow(), dyntype.clone()),
            AddOptions::default(),
        )
    })
}
