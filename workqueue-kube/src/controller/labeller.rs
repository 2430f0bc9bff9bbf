//! The labelling duty of a controller with divided caches (`super::divided`): objects without
//! their shard's label get it.
//!
//! The kinds are those the controller watches divided: the main kind (an object's shard is its
//! key's) and the owned kinds of `owns` (a child's shard is its first owner's of the main kind;
//! a child without one is left alone). Two kinds of object need a label, and each is found
//! where it costs nearly nothing:
//! - those without it, or with a value that is no shard (created by anyone, or stripped by a
//!   third party): the replica that holds shard 0 watches them (`label notin (0..shards)`,
//!   nearly nothing in steady state, but the children without an owner of the main kind) and
//!   labels each one. One replica at a time holds shard 0, as any shard; two at once during a
//!   hand-over would write the same value;
//! - those whose value is another shard (changed by a third party): the replica that holds
//!   that shard sees them in its own watch, and relabels them (see `divided::Division`).
//!
//! A label is written with a merge patch of the object's metadata (RBAC: `patch` on the main
//! kind and the owned kinds). A patch that fails is retried with a backoff until it succeeds or the object is gone;
//! the first failure after a success is reported on the controller's stream.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, FuturesUnordered, StreamExt};
use kube::Client;
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::divided::{Labelled, Relabel, ShardLabel, next_of};
use super::error::RunnerError;
use crate::lease::Assignment;

/// How many label patches are in flight at once.
const IN_FLIGHT: usize = 16;

/// The first and the longest wait between the attempts of a patch that fails.
const RETRY: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(30));

/// The labelling duty, for the kinds of a controller's divided watches (see the module docs):
/// runs until dropped (with the controller's run).
pub(super) struct Labeller {
    client: Client,
    /// The kinds, by the index a [`Relabel`] names.
    kinds: Vec<Labelled>,
    label: ShardLabel,
    assignment: watch::Receiver<Assignment>,
    relabel: mpsc::UnboundedReceiver<Relabel>,
    report: Box<dyn Fn(RunnerError) + Send + Sync>,
}

/// How one patch ended.
enum Patched {
    Done(Relabel),
    /// The object is gone.
    Gone(Relabel),
    /// It failed, at this attempt (from 0).
    Failed(Relabel, kube::Error, u32),
}

impl Labeller {
    pub(super) fn new(
        client: Client,
        kinds: Vec<Labelled>,
        label: ShardLabel,
        assignment: watch::Receiver<Assignment>,
        relabel: mpsc::UnboundedReceiver<Relabel>,
        report: impl Fn(RunnerError) + Send + Sync + 'static,
    ) -> Self {
        Labeller {
            client,
            kinds,
            label,
            assignment,
            relabel,
            report: Box::new(report),
        }
    }

    /// Labels what needs a label, until dropped or the Lease protocol ends.
    pub(super) async fn run(mut self) {
        let mut waiting: VecDeque<Relabel> = VecDeque::new();
        // Waiting or in flight: an object seen twice before its patch is patched once.
        let mut pending: HashSet<Relabel> = HashSet::new();
        let mut patches: FuturesUnordered<BoxFuture<'static, Patched>> = FuturesUnordered::new();
        let mut unlabelled: Option<BoxStream<'static, Relabel>> = None;
        let mut relabel_open = true;
        let mut failing = false;
        loop {
            let duty = self
                .assignment
                .borrow_and_update()
                .accepts(0, Instant::now());
            match (duty, unlabelled.is_some()) {
                (true, false) => {
                    tracing::info!(selector = %self.label.unlabelled(), "labelling duty taken");
                    let watches = self.kinds.iter().map(|kind| (kind.unlabelled)());
                    unlabelled = Some(stream::select_all(watches).boxed());
                }
                (false, true) => unlabelled = None,
                _ => {}
            }
            while patches.len() < IN_FLIGHT
                && let Some(relabel) = waiting.pop_front()
            {
                patches.push(Box::pin(self.patch(relabel, 0)));
            }
            let mut found = None;
            tokio::select! {
                biased;
                Some(patched) = patches.next(), if !patches.is_empty() => match patched {
                    Patched::Done(relabel) | Patched::Gone(relabel) => {
                        failing = false;
                        pending.remove(&relabel);
                    }
                    Patched::Failed(relabel, error, attempt) => {
                        tracing::warn!(name = %relabel.name, %error, "labelling an object failed; retried");
                        if !failing {
                            failing = true;
                            (self.report)(RunnerError::LabelFailed {
                                namespace: relabel.namespace.clone(),
                                name: relabel.name.clone(),
                                message: error.to_string(),
                            });
                        }
                        patches.push(Box::pin(self.patch(relabel, attempt + 1)));
                    }
                },
                relabel = self.relabel.recv(), if relabel_open => match relabel {
                    Some(relabel) => found = Some(relabel),
                    None => relabel_open = false,
                },
                relabel = next_of(&mut unlabelled) => match relabel {
                    Some(relabel) => found = Some(relabel),
                    None => unlabelled = None,
                },
                changed = self.assignment.changed() => {
                    if changed.is_err() {
                        // The protocol ended: this replica holds nothing any more.
                        return;
                    }
                }
            }
            if let Some(relabel) = found
                && pending.insert(relabel.clone())
            {
                waiting.push_back(relabel);
            }
        }
    }

    /// Labels the object of `relabel` with its shard; `attempt` (from 0) sets how long it waits
    /// first (a retry's backoff).
    fn patch(
        &self,
        relabel: Relabel,
        attempt: u32,
    ) -> impl Future<Output = Patched> + Send + 'static {
        let (client, resource) = (self.client.clone(), &self.kinds[relabel.kind].resource);
        let api: Api<DynamicObject> = match &relabel.namespace {
            Some(namespace) => Api::namespaced_with(client, namespace, resource),
            None => Api::all_with(client, resource),
        };
        // `{"metadata": {"labels": {key: shard}}}` (the other fields of `ObjectMeta` are left
        // out when `None`).
        let labels = [(self.label.key().to_string(), relabel.shard.to_string())];
        let metadata = ObjectMeta {
            labels: Some(labels.into_iter().collect()),
            ..ObjectMeta::default()
        };
        let patch = BTreeMap::from([("metadata", metadata)]);
        async move {
            if attempt > 0 {
                let wait = RETRY.0.saturating_mul(1 << (attempt - 1).min(16));
                tokio::time::sleep(wait.min(RETRY.1)).await;
            }
            let patched = api
                .patch_metadata(
                    &relabel.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await;
            match patched {
                Ok(_) => Patched::Done(relabel),
                Err(kube::Error::Api(status)) if status.code == 404 => Patched::Gone(relabel),
                Err(error) => Patched::Failed(relabel, error, attempt),
            }
        }
    }
}
