//! The counter controller: a ConfigMap annotated `counter.example/replicas: "N"` drives the
//! Deployment it owns (same name) to `N` replicas, and records what it applied in its
//! `counter.example/applied` annotation.
//!
//! What the controller writes is its logic ([`reconcile`], [`error_policy`]) and its wiring
//! ([`run`]): two watches, each narrowed by a predicate (`source::changed`) and mapped to keys
//! (`source::keys`), fed to a runner with the API client as shared context.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::StreamExt;
use tokio_util::sync::CancellationToken;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Failure, Report, Runner};
use workqueue_tokio::source::{Relevant, changed, keys};

use crate::api::{Api, ApiError, ConfigMap, Deployment, Event};

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
    pub api: Api,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API failed: retried with backoff.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The annotation is not a number: the object's own error.
    #[error("invalid {REPLICAS} annotation {0:?}")]
    Invalid(String),
}

/// Brings the Deployment named `name` to the replicas its ConfigMap asks for; deletes it with
/// its ConfigMap. Level-triggered: it reads the current state, whatever event queued the key.
pub async fn reconcile(name: String, ctx: Context<State>) -> Result<Action, Error> {
    let api = &ctx.data().api;
    let Some(cm) = api.get_configmap(&name).await? else {
        // Deleted: so is the Deployment it owns (a garbage collector's job in a real cluster).
        if api.get_deployment(&name).await?.and_then(|d| d.owner) == Some(name.clone()) {
            api.delete_deployment(&name).await?;
        }
        return Ok(Action::await_change());
    };
    let Some(raw) = cm.annotations.get(REPLICAS) else {
        return Ok(Action::await_change()); // not ours
    };
    let replicas: u32 = raw.parse().map_err(|_| Error::Invalid(raw.clone()))?;
    // No Deployment yet: nothing to do until it appears (its watch event queues this key).
    let Some(deployment) = api.get_deployment(&name).await? else {
        return Ok(Action::await_change());
    };
    if deployment.replicas != replicas {
        api.scale_deployment(&name, replicas).await?;
    }
    let applied = replicas.to_string();
    if cm.annotations.get(APPLIED) != Some(&applied) {
        // Our own write: the ConfigMap predicate keeps it from queueing the key again.
        api.annotate_configmap(&name, APPLIED, &applied).await?;
    }
    Ok(Action::await_change())
}

/// An invalid annotation is recorded as an event on its ConfigMap and retried with backoff a few
/// times, then given up; anything else retries with the limiter's backoff.
#[allow(clippy::ptr_arg)] // an error policy is given `&T`, the queue's key type
pub fn error_policy(name: &String, failure: &Failure<Error>, ctx: &Context<State>) -> Action {
    match failure {
        Failure::Error(e @ Error::Invalid(_)) => {
            ctx.data().api.record_event(name, e.to_string());
            if ctx.failures_in_a_row() < INVALID_RETRIES {
                Action::backoff()
            } else {
                Action::await_change()
            }
        }
        _ => Action::backoff(),
    }
}

/// Runs the controller against `api` until `shutdown` is cancelled.
pub async fn run(api: Api, shutdown: CancellationToken) -> Report {
    // Only a change of the replicas annotation matters, not our own `applied` write.
    let configmaps = changed(api.watch::<ConfigMap>(), |e| match e {
        Ok(Event::Applied(cm)) => {
            Relevant::Object(cm.name.clone(), cm.annotations.get(REPLICAS).cloned())
        }
        Ok(Event::Deleted(cm)) => Relevant::Deleted(cm.name.clone()),
        Err(_) => Relevant::Other,
    });
    // A Deployment that appears, or is scaled by hand, queues its owner.
    let deployments = changed(api.watch::<Deployment>(), |e| match e {
        Ok(Event::Applied(d)) => Relevant::Object(d.name.clone(), (d.replicas, d.owner.clone())),
        Ok(Event::Deleted(d)) => Relevant::Deleted(d.name.clone()),
        Err(_) => Relevant::Other,
    });
    let owners = keys(deployments, |e| {
        e.map(|e| e.object().owner.clone()).transpose()
    });
    let queue = WorkQueue::builder().name("counter").build();
    Runner::with_context(queue, Arc::new(State { api }), reconcile)
        .error_policy(error_policy)
        .workers(WORKERS)
        .shutdown_grace(Duration::from_secs(10))
        .source(
            "configmaps",
            configmaps.map(|e| e.map(|e| e.object().name.clone())),
        )
        .source("deployments", owners)
        .run(shutdown)
        .await
}
