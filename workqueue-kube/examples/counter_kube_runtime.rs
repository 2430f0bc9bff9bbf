//! For comparison: the counter controller of `examples/counter/` on kube-runtime's own
//! `Controller` (stable API), with its documented error policy, a fixed requeue. Built with the
//! tests (`cargo test` builds the examples), so that it does not rot.
//!
//! `cargo run -p workqueue-kube --example counter_kube_runtime` (a real cluster, as `kube_counter`).
//!
//! What differs from `examples/counter/controller.rs`: every failure is retried after the same
//! 5 s, for ever (no per-key backoff: kube-rs #1916; no giving up an invalid annotation); no
//! priorities (the initial list and real changes share one FIFO); no predicate on the stable
//! API, so the controller's own `applied` write queues its key once more; the owned Deployment
//! is read with a GET (`owns` keeps no store); a deleted ConfigMap is not reconciled (it left
//! the controller's store), so its Deployment goes only by the cluster's garbage collector.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

const REPLICAS: &str = "counter.example/replicas";
const APPLIED: &str = "counter.example/applied";

struct State {
    client: Client,
    recorder: Recorder,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("invalid {REPLICAS} annotation {0:?}")]
    Invalid(String),
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<State>) -> Result<Action, Error> {
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

fn error_policy(_cm: Arc<ConfigMap>, _error: &Error, _ctx: Arc<State>) -> Action {
    Action::requeue(Duration::from_secs(5))
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
