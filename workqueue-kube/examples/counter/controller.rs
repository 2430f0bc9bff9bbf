//! The counter controller on kube-rs: a ConfigMap annotated `counter.example/replicas: "N"`
//! drives the Deployment of the same name that it owns to `N` replicas, and records what it
//! applied in its `counter.example/applied` annotation. (workqueue-tokio's `examples/counter` is
//! the same controller on a simulated API.)
//!
//! Input: kube-runtime's watchers, reflectors, predicates and `trigger_owners`, joined to the
//! runner by `workqueue_kube`'s stages. Work: a `workqueue_tokio` runner (per-key backoff, an
//! error policy per object, initial lists at low priority). A reconcile reads both objects from
//! the reflectors' stores in its context: it makes no GET.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use workqueue_kube::{keys, owners, pass_deletes, prioritized};
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Failure, Report, Runner};

/// The annotation that asks for a number of replicas.
pub const REPLICAS: &str = "counter.example/replicas";
/// The annotation where the controller records the replicas it applied (its status).
pub const APPLIED: &str = "counter.example/applied";
/// Failures in a row of an invalid annotation after which the controller stops retrying it (an
/// edit of the ConfigMap brings it back).
pub const INVALID_RETRIES: u32 = 5;
/// Reconciles at once.
pub const WORKERS: usize = 4;

/// What every reconcile and the error policy share.
pub struct State {
    /// The API client.
    pub client: Client,
    /// The ConfigMaps, as the watch last saw them.
    pub configmaps: Store<ConfigMap>,
    /// The Deployments, as the watch last saw them.
    pub deployments: Store<Deployment>,
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API failed: retried with backoff.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The annotation is not a number: the object's own error.
    #[error("invalid {REPLICAS} annotation {0:?}")]
    Invalid(String),
}

/// Brings the Deployment of the ConfigMap `key` to the replicas the ConfigMap asks for; deletes
/// it with its ConfigMap. Level-triggered: it reads the current state (the stores), whatever
/// event queued the key.
pub async fn reconcile(key: ObjectRef<ConfigMap>, ctx: Context<State>) -> Result<Action, Error> {
    let state = ctx.data();
    let ns = key.namespace.as_deref().unwrap_or("default");
    let deployments = Api::<Deployment>::namespaced(state.client.clone(), ns);
    let deployment = state.deployments.get(&ObjectRef::new(&key.name).within(ns));
    let Some(cm) = state.configmaps.get(&key) else {
        // Deleted: so is the Deployment it owns (the garbage collector's job in a real cluster,
        // which may have been first: a 404 is done).
        let ours = |o: &OwnerReference| o.kind == "ConfigMap" && o.name == key.name;
        if deployment.is_some_and(|d| d.owner_references().iter().any(ours)) {
            match deployments.delete(&key.name, &Default::default()).await {
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                result => drop(result?),
            }
        }
        return Ok(Action::await_change());
    };
    let Some(raw) = cm.annotations().get(REPLICAS) else {
        return Ok(Action::await_change()); // not ours
    };
    let Ok(replicas) = raw.parse::<i32>() else {
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidReplicas".into(),
            note: Some(format!("invalid {REPLICAS} annotation {raw:?}")),
            action: "Scale".into(),
            secondary: None,
        };
        state.recorder.publish(&event, &cm.object_ref(&())).await?;
        return Err(Error::Invalid(raw.clone()));
    };
    // No Deployment yet: nothing to do until it appears (its watch event queues this key).
    let Some(deployment) = deployment else {
        return Ok(Action::await_change());
    };
    let params = PatchParams::default();
    if deployment.spec.replicas != Some(replicas) {
        let patch = json!({ "spec": { "replicas": replicas } });
        deployments
            .patch(&key.name, &params, &Patch::Merge(patch))
            .await?;
    }
    let applied = replicas.to_string();
    if cm.annotations().get(APPLIED) != Some(&applied) {
        // Our own write: the ConfigMap predicate keeps it from queueing the key again.
        let patch = json!({ "metadata": { "annotations": { APPLIED: applied } } });
        let configmaps = Api::<ConfigMap>::namespaced(state.client.clone(), ns);
        configmaps
            .patch(&key.name, &params, &Patch::Merge(patch))
            .await?;
    }
    Ok(Action::await_change())
}

/// An invalid annotation (an Event on its ConfigMap each time) is retried with backoff a few
/// times, then given up; anything else retries with the limiter's backoff.
pub fn error_policy(
    _key: &ObjectRef<ConfigMap>,
    failure: &Failure<Error>,
    ctx: &Context<State>,
) -> Action {
    match failure {
        Failure::Error(Error::Invalid(_)) if ctx.failures_in_a_row() >= INVALID_RETRIES => {
            Action::await_change()
        }
        _ => Action::backoff(),
    }
}

/// The part of a ConfigMap that matters: its replicas annotation (not our `applied` write).
fn replicas_annotation(cm: &ConfigMap) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    cm.annotations().get(REPLICAS).hash(&mut hasher);
    Some(hasher.finish())
}

/// Runs the controller on `client`'s cluster (all namespaces) until `shutdown` is cancelled.
pub async fn run(client: Client, shutdown: CancellationToken) -> Report {
    let (configmaps, cm_writer) = reflector::store();
    let (deployments, deployment_writer) = reflector::store();
    let config = watcher::Config::default();
    let cm_events = watcher(Api::<ConfigMap>::all(client.clone()), config.clone())
        .default_backoff()
        .reflect(cm_writer);
    // Only a change of the replicas annotation matters, and a deletion.
    let cms = prioritized(cm_events).predicate_filter(
        pass_deletes(replicas_annotation),
        PredicateConfig::default(),
    );
    // A Deployment that appears, or is scaled by hand (a new generation), queues its owner.
    let deployment_events = watcher(Api::<Deployment>::all(client.clone()), config)
        .default_backoff()
        .reflect(deployment_writer);
    let owned = prioritized(deployment_events)
        .predicate_filter(predicates::generation, PredicateConfig::default());
    let reporter = Reporter {
        controller: "counter".into(),
        instance: None,
    };
    let state = State {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        configmaps,
        deployments,
    };
    let queue = WorkQueue::builder().name("counter").build();
    Runner::with_context(queue, Arc::new(state), reconcile)
        .error_policy(error_policy)
        .workers(WORKERS)
        .shutdown_grace(Duration::from_secs(10))
        .source("configmaps", keys(cms))
        .source("deployments", owners::<ConfigMap, _, _>(owned, (), ()))
        .run(shutdown)
        .await
}
