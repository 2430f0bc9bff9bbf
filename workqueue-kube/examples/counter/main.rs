//! The counter controller on `workqueue_kube::Controller`: a ConfigMap annotated
//! `counter.example/replicas: "N"` drives the Deployment of the same name that it owns to `N`
//! replicas, and records what it applied in its `counter.example/applied` annotation.
//!
//! It is `examples/counter_kube_runtime.rs`, kube-runtime's `Controller` program, with its `use`
//! lines changed and an error policy that backs off per object instead of retrying every 5 s.
//! Priorities (the initial list after real changes), aging and controller-runtime's metrics
//! (`controller="configmap"`) come with the `Controller`. Its scenarios run against a scripted API
//! server in `tests/counter_controller.rs`.
//!
//! `cargo run -p workqueue-kube --example kube_counter` runs it against the cluster of the current
//! kubeconfig context (or the in-cluster config); it watches ConfigMaps and Deployments in all
//! namespaces, and patches them, until SIGINT or SIGTERM. Try it:
//!
//! ```text
//! kubectl create configmap web
//! kubectl create deployment web --image=nginx --replicas=1
//! kubectl patch deployment web --type=merge -p "{\"metadata\":{\"ownerReferences\":[{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"name\":\"web\",\"uid\":\"$(kubectl get configmap web -o jsonpath='{.metadata.uid}')\"}]}}"
//! kubectl annotate configmap web counter.example/replicas=3   # web is scaled to 3
//! kubectl scale deployment web --replicas=9                   # and back to 3
//! kubectl annotate --overwrite configmap web counter.example/replicas=three  # Events, backing off
//! ```

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use workqueue_kube::controller::{Action, Controller};

/// The annotation that asks for a number of replicas.
pub const REPLICAS: &str = "counter.example/replicas";
/// The annotation where the controller records the replicas it applied.
pub const APPLIED: &str = "counter.example/applied";

/// What every reconcile and the error policy share.
pub(crate) struct State {
    pub(crate) client: Client,
    pub(crate) recorder: Recorder,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The annotation is not a number: the object's own error.
    #[error("invalid {REPLICAS} annotation {0:?}")]
    Invalid(String),
}

/// Brings the Deployment of the ConfigMap to the replicas it asks for.
pub(crate) async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<State>) -> Result<Action, Error> {
    let ns = cm.namespace().unwrap_or_else(|| "default".into());
    let name = cm.name_any();
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
        ctx.recorder.publish(&event, &cm.object_ref(&())).await?;
        return Err(Error::Invalid(raw.clone()));
    };
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), &ns);
    let Some(deployment) = deployments.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    let params = PatchParams::default();
    if deployment.spec.replicas != Some(replicas) {
        let patch = json!({ "spec": { "replicas": replicas } });
        deployments
            .patch(&name, &params, &Patch::Merge(patch))
            .await?;
    }
    let applied = replicas.to_string();
    if cm.annotations().get(APPLIED) != Some(&applied) {
        let patch = json!({ "metadata": { "annotations": { APPLIED: applied } } });
        let configmaps = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns);
        configmaps
            .patch(&name, &params, &Patch::Merge(patch))
            .await?;
    }
    Ok(Action::await_change())
}

/// Per-key exponential backoff: 5 ms doubling per failure of this object, up to 1000 s.
pub(crate) fn error_policy(_cm: Arc<ConfigMap>, _error: &Error, _ctx: Arc<State>) -> Action {
    Action::backoff()
}

#[tokio::main]
async fn main() -> Result<(), kube::Error> {
    let client = Client::try_default().await?;
    let reporter = Reporter {
        controller: "counter".into(),
        instance: None,
    };
    let state = Arc::new(State {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
    });
    let config = watcher::Config::default();
    Controller::new(Api::<ConfigMap>::all(client.clone()), config.clone())
        .owns(Api::<Deployment>::all(client), config)
        .shutdown_on_signal()
        .run(reconcile, error_policy, state)
        .for_each(|_| async {})
        .await;
    Ok(())
}
