//! Divided caches ([`Controller::divide_caches`](super::Controller::divide_caches)): each
//! replica watches, and keeps in its store, only the objects of the shards it holds.
//!
//! Every object carries its shard in a label of the controller's ([`ShardLabel`]), written once
//! by the labelling duty (`super::labeller`): an object of the main kind its own key's shard, an
//! owned object (`owns`) its first owner's. Each watch the controller makes ([`PlannedWatch`]:
//! the main kind's, the owned kinds') selects `label in (shards held)` and is restarted
//! whenever the shards held change: a taken shard's objects are listed, and a given one's leave
//! the store with the new list. The label only says what to watch: which
//! replica runs a key is still the key's hashed shard ([`shard_of`]), so a wrong or missing
//! label can delay an object (until it is relabelled) but never give it to two replicas.
//!
//! Invariants:
//! - [`Listed`] names the shards whose complete list the store holds: it is published only once
//!   the store applied the `InitDone` of a watch that selected them (the controller takes a key
//!   of a held shard only once its shard is listed);
//! - a restart that adds a shard waits for the list under way to complete; one that only drops
//!   shards does not (a replica that took every shard as it started, and gives most of them
//!   away as the others join, need not list them all first). Each restart during a list
//!   strictly shrinks the selection, so at most as many happen as there are shards before a
//!   list completes: a burst of changes cannot keep the store from ever holding one.

use std::collections::{BTreeSet, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures_util::stream::{self, BoxStream, Stream, StreamExt, TryStreamExt};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::Resource;
use kube::api::{Api, ApiResource, PartialObjectMeta};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{mpsc, oneshot, watch};

use crate::lease::{Assignment, shard_of};
use crate::sources::owner_keys;

/// The shards whose complete list a replica's store holds.
pub(super) type Listed = BTreeSet<u32>;

/// The label that carries an object's shard, for one controller and one number of shards.
///
/// The key names both, `{controller}.workqueue-kube.io/shard-of-{shards}`, and the value is the
/// shard (`"0"` to `"{shards - 1}"`): a controller deployed with another number of shards has a
/// label of its own, so during a rolling update that changes it the old and the new replicas
/// each watch a complete layout, and every object is relabelled once (the old label stays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ShardLabel {
    key: Arc<str>,
    shards: u32,
}

impl ShardLabel {
    /// The label of `controller` (the Leases' name: a DNS label) with `shards` shards (at least
    /// one).
    pub(super) fn new(controller: &str, shards: u32) -> Self {
        ShardLabel {
            key: Arc::from(format!("{controller}.workqueue-kube.io/shard-of-{shards}")),
            shards: shards.max(1),
        }
    }

    /// The label's key.
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// The shard of `object`'s own key among `shards` ([`shard_of`]).
    fn key_shard_of<K: Resource>(object: &K, shards: u32) -> u32 {
        let meta = object.meta();
        let name = meta.name.as_deref().unwrap_or_default();
        shard_of(meta.namespace.as_deref(), name, shards)
    }

    /// Whether `object` carries `shard` in the label.
    fn carries<T: Resource>(&self, object: &T, shard: u32) -> bool {
        let labels = object.meta().labels.as_ref();
        let value = labels.and_then(|labels| labels.get(&*self.key));
        value.is_some_and(|value| *value == shard.to_string())
    }

    /// The selector of the objects of `shards` (not empty).
    fn selecting(&self, shards: &Listed) -> String {
        let values: Vec<String> = shards.iter().map(u32::to_string).collect();
        format!("{} in ({})", self.key, values.join(","))
    }

    /// The selector of the objects without a shard: no label, or a value that is no shard.
    pub(super) fn unlabelled(&self) -> String {
        let values: Vec<String> = (0..self.shards).map(|s| s.to_string()).collect();
        format!("{} notin ({})", self.key, values.join(","))
    }
}

/// `ours` added to the label selector of `wc` (the user's, kept).
fn with_selector(wc: &watcher::Config, ours: &str) -> watcher::Config {
    let selector = match &wc.label_selector {
        Some(user) if !user.is_empty() => format!("{user},{ours}"),
        _ => ours.to_string(),
    };
    wc.clone().labels(&selector)
}

/// An object whose label is missing or wrong: its kind (the labeller's index of the kinds it
/// labels), where it is, and the shard it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Relabel {
    pub(super) kind: usize,
    pub(super) namespace: Option<String>,
    pub(super) name: String,
    pub(super) shard: u32,
}

impl Relabel {
    /// `object`, of the labeller's kind `kind`, to be labelled with `shard`.
    fn of<T: Resource>(kind: usize, object: &T, shard: u32) -> Self {
        let meta = object.meta();
        Relabel {
            kind,
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
            shard,
        }
    }
}

/// Starts a watch of one kind with a config.
type Start<T> = Arc<
    dyn Fn(watcher::Config) -> BoxStream<'static, watcher::Result<watcher::Event<T>>> + Send + Sync,
>;

/// Applies a watch's event to a store (the main watch's; nothing for an owned kind).
type Apply<T> = Box<dyn FnMut(&watcher::Event<T>) + Send>;

/// The shard an object of one kind belongs to: its key's for the main kind, its owner's for an
/// owned kind (`None`: it has no owner of the main kind; it is never labelled).
type ShardOf<T> = Arc<dyn Fn(&T) -> Option<u32> + Send + Sync>;

/// A kind the labelling duty labels (`super::labeller`): its API resource, and its objects
/// without a valid label (a watch started while the duty is held).
pub(super) struct Labelled {
    pub(super) resource: ApiResource,
    pub(super) unlabelled: Box<dyn Fn() -> BoxStream<'static, Relabel> + Send>,
}

/// How a watch runs, decided when the controller runs.
enum Plan {
    /// Every object the user's watch config selects (no division).
    Whole,
    /// Only the held shards' objects.
    Divided(Division),
}

/// What a divided watch reads and tells.
struct Division {
    /// The shards held (the Lease protocol's).
    assignment: watch::Receiver<Assignment>,
    label: ShardLabel,
    /// The watched kind's index among those the labeller labels.
    kind: usize,
    /// Where the shards listed are published (the main watch, whose store they are).
    listed: Option<watch::Sender<Listed>>,
    /// Where objects whose label is wrong go (the labeller's queue).
    relabel: mpsc::UnboundedSender<Relabel>,
}

/// A watch the controller makes (the main kind's, or an owned kind's), until it runs: whole or
/// divided.
pub(super) struct PlannedWatch {
    plan: oneshot::Sender<Plan>,
    /// Its kind's labelling (the kind's index, the label).
    labelled: Box<dyn FnOnce(usize, ShardLabel) -> Labelled + Send>,
}

impl PlannedWatch {
    /// The main watch: of `api` with `wc`, filling `writer`'s store; its events.
    pub(super) fn main<K>(
        api: Api<K>,
        wc: watcher::Config,
        mut writer: Writer<K>,
        dyntype: K::DynamicType,
    ) -> (
        Self,
        impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    )
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Clone + Eq + Hash + Send + Sync,
    {
        let start: Start<K> = {
            let api = api.clone();
            Arc::new(move |wc| watcher(api.clone(), wc).boxed())
        };
        let key_shard = |shards: u32| -> ShardOf<K> {
            Arc::new(move |object: &K| Some(ShardLabel::key_shard_of(object, shards)))
        };
        let (plan, planned) = oneshot::channel();
        let events = {
            let (start, wc) = (start.clone(), wc.clone());
            stream::once(async move {
                match planned.await {
                    Ok(Plan::Divided(division)) => {
                        let shard = key_shard(division.label.shards);
                        let apply = Box::new(move |event: &watcher::Event<K>| {
                            writer.apply_watcher_event(event)
                        });
                        DividedWatch::new(start, wc, shard, apply, division).events()
                    }
                    _ => reflector::reflector(writer, start(wc)).boxed(),
                }
            })
            .flatten()
        };
        let labelled = Box::new(move |kind: usize, label: ShardLabel| {
            let resource = ApiResource::erase::<K>(&dyntype);
            let unlabelled = unlabelled(start, &wc, &label, kind, key_shard(label.shards));
            Labelled {
                resource,
                unlabelled,
            }
        });
        (PlannedWatch { plan, labelled }, events)
    }

    /// An owned kind's watch (metadata only): of `api` with `wc`; the shard of a child is its
    /// first owner's of kind `K`; its events.
    #[allow(deprecated)] // as `Controller::owns`: an `Api<Child>` cannot become a metadata one
    pub(super) fn owned<K, Child>(
        api: Api<Child>,
        wc: watcher::Config,
        owner_type: K::DynamicType,
        child_type: Child::DynamicType,
    ) -> (
        Self,
        impl Stream<Item = watcher::Result<watcher::Event<PartialObjectMeta<Child>>>> + Send + 'static,
    )
    where
        K: Resource + 'static,
        K::DynamicType: Clone + Send + Sync + 'static,
        Child: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Child::DynamicType: Clone + Send + Sync + 'static,
    {
        let start: Start<PartialObjectMeta<Child>> = {
            let api = api.clone();
            Arc::new(move |wc| kube::runtime::metadata_watcher(api.clone(), wc).boxed())
        };
        let owner_shard = move |shards: u32| -> ShardOf<PartialObjectMeta<Child>> {
            let owner_type = owner_type.clone();
            Arc::new(move |child: &PartialObjectMeta<Child>| {
                let owner = owner_keys::<K, _>(child, &owner_type).into_iter().next()?;
                Some(shard_of(owner.namespace.as_deref(), &owner.name, shards))
            })
        };
        let (plan, planned) = oneshot::channel();
        let events = {
            let (start, wc, owner_shard) = (start.clone(), wc.clone(), owner_shard.clone());
            stream::once(async move {
                match planned.await {
                    Ok(Plan::Divided(division)) => {
                        let shard = owner_shard(division.label.shards);
                        let apply = Box::new(|_: &watcher::Event<PartialObjectMeta<Child>>| {});
                        DividedWatch::new(start, wc, shard, apply, division).events()
                    }
                    _ => start(wc),
                }
            })
            .flatten()
        };
        let labelled = Box::new(move |kind: usize, label: ShardLabel| {
            let resource = ApiResource::erase::<Child>(&child_type);
            let unlabelled = unlabelled(start, &wc, &label, kind, owner_shard(label.shards));
            Labelled {
                resource,
                unlabelled,
            }
        });
        (PlannedWatch { plan, labelled }, events)
    }

    /// Runs it whole.
    pub(super) fn whole(self) {
        let _ = self.plan.send(Plan::Whole);
    }

    /// Runs it divided by the shards `assignment` holds, as the labeller's kind `kind`,
    /// publishing the shards listed on `listed` (the main watch); what the labeller needs of it.
    pub(super) fn divide(
        self,
        kind: usize,
        label: &ShardLabel,
        assignment: &watch::Receiver<Assignment>,
        listed: Option<watch::Sender<Listed>>,
        relabel: &mpsc::UnboundedSender<Relabel>,
    ) -> Labelled {
        let division = Division {
            assignment: assignment.clone(),
            label: label.clone(),
            kind,
            listed,
            relabel: relabel.clone(),
        };
        let _ = self.plan.send(Plan::Divided(division));
        (self.labelled)(kind, label.clone())
    }
}

/// The objects without a valid label (`label notin (0..shards)`) of the kind `start` watches,
/// as relabels of kind `kind` (those `shard` gives a shard); started anew by each call.
fn unlabelled<T: Resource + Send + 'static>(
    start: Start<T>,
    wc: &watcher::Config,
    label: &ShardLabel,
    kind: usize,
    shard: ShardOf<T>,
) -> Box<dyn Fn() -> BoxStream<'static, Relabel> + Send> {
    let wc = with_selector(wc, &label.unlabelled());
    Box::new(move || {
        let shard = shard.clone();
        // The backoff sees only objects as progress: a list that keeps failing yields an
        // `Init` before each attempt, which would reset it.
        let objects = start(wc.clone()).try_filter(|event| {
            let listing = matches!(event, watcher::Event::Init | watcher::Event::InitDone);
            std::future::ready(!listing)
        });
        objects
            .default_backoff()
            .filter_map(move |event| {
                std::future::ready(match event {
                    Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                        shard(&object).map(|s| Relabel::of(kind, &object, s))
                    }
                    Ok(_) => None,
                    Err(error) => {
                        tracing::warn!(%error, "the watch of unlabelled objects failed; it retries");
                        None
                    }
                })
            })
            .boxed()
    })
}

/// A watch of the objects of the shards held, restarted as they change (see the module docs).
struct DividedWatch<T> {
    start: Start<T>,
    wc: watcher::Config,
    /// The shard an object belongs to.
    shard: ShardOf<T>,
    /// Applies an event to the store (the main watch's; nothing for an owned kind).
    apply: Apply<T>,
    division: Division,
    /// The shards the current watch selects (`None` before the first).
    selected: Option<Listed>,
    /// The current watch's events (`None`: no shard is held, nothing is watched).
    events: Option<BoxStream<'static, watcher::Result<watcher::Event<T>>>>,
    /// Whether the current watch's list is under way.
    listing: bool,
    /// Events made here, yielded before the watch's: the empty list of no shard.
    made: VecDeque<watcher::Event<T>>,
    /// Whether the assignment can still change (its sender is alive).
    assignment_open: bool,
}

impl<T: Resource + Send + 'static> DividedWatch<T> {
    fn new(
        start: Start<T>,
        wc: watcher::Config,
        shard: ShardOf<T>,
        apply: Apply<T>,
        division: Division,
    ) -> Self {
        DividedWatch {
            start,
            wc,
            shard,
            apply,
            division,
            selected: None,
            events: None,
            listing: false,
            made: VecDeque::new(),
            assignment_open: true,
        }
    }

    /// Its events, as a stream.
    fn events(self) -> BoxStream<'static, watcher::Result<watcher::Event<T>>> {
        stream::unfold(self, |mut divided| async move {
            let event = divided.next().await?;
            Some((event, divided))
        })
        .boxed()
    }

    /// The next event, applied to the store.
    async fn next(&mut self) -> Option<watcher::Result<watcher::Event<T>>> {
        loop {
            if let Some(event) = self.made.pop_front() {
                return Some(Ok(self.apply(event)));
            }
            let wanted: Listed = {
                let assignment = self.division.assignment.borrow_and_update();
                assignment.held().map(|(shard, _)| shard).collect()
            };
            if restarts(self.selected.as_ref(), &wanted, self.listing) {
                self.restart(wanted);
                continue;
            }
            let DividedWatch {
                division,
                events,
                assignment_open,
                ..
            } = self;
            tokio::select! {
                biased;
                changed = division.assignment.changed(), if *assignment_open => {
                    *assignment_open = changed.is_ok();
                }
                event = next_of(events) => match event? {
                    Ok(event) => return Some(Ok(self.apply(event))),
                    Err(error) => return Some(Err(error)),
                },
            }
        }
    }

    /// Watches the objects of `shards` from now on: their list first.
    fn restart(&mut self, shards: Listed) {
        tracing::debug!(shards = ?shards, "a divided watch restarts");
        if shards.is_empty() {
            // No shard: nothing to watch, and an empty list.
            self.events = None;
            self.made
                .extend([watcher::Event::Init, watcher::Event::InitDone]);
        } else {
            let selector = self.division.label.selecting(&shards);
            self.events = Some((self.start)(with_selector(&self.wc, &selector)));
        }
        self.listing = true;
        self.selected = Some(shards);
    }

    /// Applies `event` to the store; publishes the shards listed at the end of a list, and
    /// sends an object whose label is wrong to be relabelled.
    fn apply(&mut self, event: watcher::Event<T>) -> watcher::Event<T> {
        (self.apply)(&event);
        match &event {
            watcher::Event::Init => self.listing = true,
            watcher::Event::InitDone => {
                self.listing = false;
                if let Some(listed) = &self.division.listed {
                    listed.send_replace(self.selected.clone().unwrap_or_default());
                }
            }
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let label = &self.division.label;
                if let Some(shard) = (self.shard)(object)
                    && !label.carries(object, shard)
                {
                    let relabel = Relabel::of(self.division.kind, object, shard);
                    let _ = self.division.relabel.send(relabel);
                }
            }
            watcher::Event::Delete(_) => {}
        }
        event
    }
}

/// Whether a watch that selects `selected` (`None`: none yet), listing or not, is restarted to
/// select `wanted`: when they differ, unless a list is under way and `wanted` adds a shard (see
/// the module docs).
fn restarts(selected: Option<&Listed>, wanted: &Listed, listing: bool) -> bool {
    match selected {
        None => true,
        Some(selected) if selected == wanted => false,
        Some(selected) => !listing || wanted.is_subset(selected),
    }
}

/// The next item of `events`; never, without a watch.
pub(super) async fn next_of<T>(events: &mut Option<BoxStream<'static, T>>) -> Option<T> {
    match events {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn the_label_names_the_controller_and_the_number_of_shards() {
        let label = ShardLabel::new("counter", 4);
        assert_eq!(label.key(), "counter.workqueue-kube.io/shard-of-4");
        let shards: Listed = [1, 3].into();
        assert_eq!(
            label.selecting(&shards),
            "counter.workqueue-kube.io/shard-of-4 in (1,3)"
        );
        assert_eq!(
            label.unlabelled(),
            "counter.workqueue-kube.io/shard-of-4 notin (0,1,2,3)"
        );
    }

    #[test]
    fn an_object_carries_a_shard_only_in_its_controllers_label() {
        let label = ShardLabel::new("counter", 4);
        let shard = ShardLabel::key_shard_of(&cm("web", &[]), 4);
        assert_eq!(shard, shard_of(Some("default"), "web", 4));
        let right = cm("web", &[(label.key(), &shard.to_string())]);
        let wrong = cm("web", &[(label.key(), &((shard + 1) % 4).to_string())]);
        let other = cm("web", &[("counter.workqueue-kube.io/shard-of-8", "0")]);
        assert!(label.carries(&right, shard));
        assert!(!label.carries(&wrong, shard));
        assert!(!label.carries(&other, shard));
        assert!(!label.carries(&cm("web", &[]), shard));
        let relabel = Relabel::of(1, &wrong, shard);
        assert_eq!(
            (relabel.kind, relabel.shard, relabel.name.as_str()),
            (1, shard, "web")
        );
    }

    #[test]
    fn a_list_under_way_is_restarted_only_to_drop_shards() {
        let set = |shards: &[u32]| shards.iter().copied().collect::<Listed>();
        let (all, some) = (set(&[0, 1, 2, 3]), set(&[1, 3]));
        assert!(restarts(None, &set(&[]), false), "the first watch starts");
        assert!(restarts(None, &all, true));
        assert!(
            !restarts(Some(&all), &all, false),
            "the same shards: no restart"
        );
        assert!(
            restarts(Some(&some), &all, false),
            "a complete list is restarted to add"
        );
        assert!(
            !restarts(Some(&some), &all, true),
            "a list under way completes first"
        );
        assert!(
            !restarts(Some(&some), &set(&[1, 2]), true),
            "dropping and adding: it completes"
        );
        assert!(restarts(Some(&all), &some, true), "dropping only: at once");
        assert!(
            restarts(Some(&all), &set(&[]), true),
            "dropping all: at once"
        );
    }

    #[test]
    fn the_users_selector_is_kept() {
        let wc = watcher::Config::default().labels("app=web");
        assert_eq!(
            with_selector(&wc, "x in (1)").label_selector.as_deref(),
            Some("app=web,x in (1)")
        );
        let wc = watcher::Config::default();
        assert_eq!(
            with_selector(&wc, "x in (1)").label_selector.as_deref(),
            Some("x in (1)")
        );
    }
}
