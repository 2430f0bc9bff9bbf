//! Divided caches ([`Controller::divide_caches`](super::Controller::divide_caches)): each
//! replica watches, and keeps in its store, only the objects of the shards it holds.
//!
//! Every object carries its shard in a label of the controller's ([`ShardLabel`]), written once
//! by the labelling duty (`super::labeller`). The main watch selects `label in (shards held)`
//! and is restarted whenever the shards held change: a taken shard's objects are listed, and a
//! given one's leave the store with the new list. The label only says what to watch: which
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

use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use tokio::sync::{mpsc, oneshot, watch};

use crate::lease::{Assignment, shard_of};

/// The shards whose complete list a replica's store holds.
pub(crate) type Listed = BTreeSet<u32>;

/// The label that carries an object's shard, for one controller and one number of shards.
///
/// The key names both, `{controller}.workqueue-kube.io/shard-of-{shards}`, and the value is the
/// shard (`"0"` to `"{shards - 1}"`): a controller deployed with another number of shards has a
/// label of its own, so during a rolling update that changes it the old and the new replicas
/// each watch a complete layout, and every object is relabelled once (the old label stays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ShardLabel {
    key: Arc<str>,
    shards: u32,
}

impl ShardLabel {
    /// The label of `controller` (the Leases' name: a DNS label) with `shards` shards (at least
    /// one).
    pub(crate) fn new(controller: &str, shards: u32) -> Self {
        ShardLabel {
            key: Arc::from(format!("{controller}.workqueue-kube.io/shard-of-{shards}")),
            shards: shards.max(1),
        }
    }

    /// The label's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The shard `object` belongs to: its key's ([`shard_of`]).
    pub(crate) fn shard<K: Resource>(&self, object: &K) -> u32 {
        let meta = object.meta();
        let name = meta.name.as_deref().unwrap_or_default();
        shard_of(meta.namespace.as_deref(), name, self.shards)
    }

    /// The label's value on `object`, if it has one.
    fn value<'a, K: Resource>(&self, object: &'a K) -> Option<&'a str> {
        let labels = object.meta().labels.as_ref()?;
        labels.get(&*self.key).map(String::as_str)
    }

    /// Whether `object` carries its own shard.
    pub(crate) fn is_right<K: Resource>(&self, object: &K) -> bool {
        self.value(object) == Some(self.shard(object).to_string().as_str())
    }

    /// The selector of the objects of `shards` (not empty).
    fn selecting(&self, shards: &Listed) -> String {
        let values: Vec<String> = shards.iter().map(u32::to_string).collect();
        format!("{} in ({})", self.key, values.join(","))
    }

    /// The selector of the objects without a shard: no label, or a value that is no shard.
    pub(crate) fn unlabelled(&self) -> String {
        let values: Vec<String> = (0..self.shards).map(|s| s.to_string()).collect();
        format!("{} notin ({})", self.key, values.join(","))
    }
}

/// `ours` added to the label selector of `wc` (the user's, kept).
pub(crate) fn with_selector(wc: &watcher::Config, ours: &str) -> watcher::Config {
    let selector = match &wc.label_selector {
        Some(user) if !user.is_empty() => format!("{user},{ours}"),
        _ => ours.to_string(),
    };
    wc.clone().labels(&selector)
}

/// An object whose label is missing or wrong: where it is, and the shard it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Relabel {
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    pub(crate) shard: u32,
}

impl Relabel {
    /// `object`, to be labelled with its shard by `label`.
    pub(crate) fn of<K: Resource>(object: &K, label: &ShardLabel) -> Self {
        let meta = object.meta();
        Relabel {
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
            shard: label.shard(object),
        }
    }
}

/// How the main watch runs, decided when the controller runs.
enum Plan {
    /// Every object the user's watch config selects (no division).
    Whole,
    /// Only the held shards' objects.
    Divided(Division),
}

/// What a divided main watch reads and tells.
struct Division {
    /// The shards held (the Lease protocol's).
    assignment: watch::Receiver<Assignment>,
    label: ShardLabel,
    /// Where the shards listed are published.
    listed: watch::Sender<Listed>,
    /// Where objects whose label is wrong go (the labeller's queue).
    relabel: mpsc::UnboundedSender<Relabel>,
}

/// The main watch of a controller made with `Controller::new`, until it runs: whole or divided.
pub(crate) struct MainWatch<K> {
    plan: oneshot::Sender<Plan>,
    api: Api<K>,
    wc: watcher::Config,
}

impl<K> MainWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + Send + Sync,
{
    /// The main watch of `api` with `wc`, filling `writer`'s store: its events, and what
    /// decides how it runs.
    pub(crate) fn new(
        api: Api<K>,
        wc: watcher::Config,
        writer: Writer<K>,
    ) -> (
        Self,
        impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    ) {
        let (plan, planned) = oneshot::channel();
        let events = main_events(api.clone(), wc.clone(), writer, planned);
        (MainWatch { plan, api, wc }, events)
    }

    /// Runs it whole.
    pub(crate) fn whole(self) {
        let _ = self.plan.send(Plan::Whole);
    }

    /// Runs it divided by the shards `assignment` holds, publishing the shards listed on
    /// `listed`: the labelling duty (a task of the controller's, to run with it), which reports
    /// on `report`.
    pub(crate) fn divide(
        self,
        label: ShardLabel,
        dyntype: &K::DynamicType,
        assignment: watch::Receiver<Assignment>,
        listed: watch::Sender<Listed>,
        report: impl Fn(super::error::RunnerError) + Send + Sync + 'static,
    ) -> super::labeller::Labeller<K> {
        let (relabel, relabels) = mpsc::unbounded_channel();
        let division = Division {
            assignment: assignment.clone(),
            label: label.clone(),
            listed,
            relabel,
        };
        let _ = self.plan.send(Plan::Divided(division));
        super::labeller::Labeller::new(
            self.api, self.wc, label, dyntype, assignment, relabels, report,
        )
    }
}

/// The main resource's events, applied to `writer`'s store: a watch of `api` with `wc`, whole
/// or divided as `plan` says once the controller runs (a plan never sent: whole).
fn main_events<K>(
    api: Api<K>,
    wc: watcher::Config,
    writer: Writer<K>,
    plan: oneshot::Receiver<Plan>,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + Send + Sync,
{
    stream::once(async move {
        match plan.await {
            Ok(Plan::Divided(division)) => {
                let divided = DividedWatch::new(api, wc, writer, division);
                stream::unfold(divided, |mut divided| async move {
                    let event = divided.next().await?;
                    Some((event, divided))
                })
                .boxed()
            }
            _ => reflector::reflector(writer, watcher(api, wc)).boxed(),
        }
    })
    .flatten()
}

/// A watch of the objects of the shards held, restarted as they change (see the module docs).
struct DividedWatch<K: Resource + Clone + 'static>
where
    K::DynamicType: Clone + Eq + Hash,
{
    api: Api<K>,
    wc: watcher::Config,
    writer: Writer<K>,
    division: Division,
    /// The shards the current watch selects (`None` before the first).
    selected: Option<Listed>,
    /// The current watch's events (`None`: no shard is held, nothing is watched).
    events: Option<BoxStream<'static, watcher::Result<watcher::Event<K>>>>,
    /// Whether the current watch's list is under way.
    listing: bool,
    /// Events made here, yielded before the watch's: the empty list of no shard.
    made: VecDeque<watcher::Event<K>>,
    /// Whether the assignment can still change (its sender is alive).
    assignment_open: bool,
}

impl<K> DividedWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + Send + Sync,
{
    fn new(api: Api<K>, wc: watcher::Config, writer: Writer<K>, division: Division) -> Self {
        DividedWatch {
            api,
            wc,
            writer,
            division,
            selected: None,
            events: None,
            listing: false,
            made: VecDeque::new(),
            assignment_open: true,
        }
    }

    /// The next event, applied to the store.
    async fn next(&mut self) -> Option<watcher::Result<watcher::Event<K>>> {
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
        tracing::debug!(shards = ?shards, "the divided watch restarts");
        if shards.is_empty() {
            // No shard: nothing to watch, and an empty list.
            self.events = None;
            self.made
                .extend([watcher::Event::Init, watcher::Event::InitDone]);
        } else {
            let selector = self.division.label.selecting(&shards);
            let wc = with_selector(&self.wc, &selector);
            self.events = Some(watcher(self.api.clone(), wc).boxed());
        }
        self.listing = true;
        self.selected = Some(shards);
    }

    /// Applies `event` to the store; publishes the shards listed at the end of a list, and
    /// sends an object whose label is wrong to be relabelled.
    fn apply(&mut self, event: watcher::Event<K>) -> watcher::Event<K> {
        self.writer.apply_watcher_event(&event);
        match &event {
            watcher::Event::Init => self.listing = true,
            watcher::Event::InitDone => {
                self.listing = false;
                let listed = self.selected.clone().unwrap_or_default();
                self.division.listed.send_replace(listed);
            }
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let label = &self.division.label;
                if !label.is_right(object) {
                    let _ = self.division.relabel.send(Relabel::of(object, label));
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
pub(crate) async fn next_of<T>(events: &mut Option<BoxStream<'static, T>>) -> Option<T> {
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
    fn an_object_is_right_only_with_its_own_shard() {
        let label = ShardLabel::new("counter", 4);
        let shard = shard_of(Some("default"), "web", 4);
        let right = cm("web", &[(label.key(), &shard.to_string())]);
        let wrong = cm("web", &[(label.key(), &((shard + 1) % 4).to_string())]);
        let other = cm("web", &[("counter.workqueue-kube.io/shard-of-8", "0")]);
        assert!(label.is_right(&right));
        assert!(!label.is_right(&wrong));
        assert!(!label.is_right(&other));
        assert!(!label.is_right(&cm("web", &[])));
        assert_eq!(Relabel::of(&wrong, &label).shard, shard);
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
