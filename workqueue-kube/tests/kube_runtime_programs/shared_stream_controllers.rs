// kube-rs's `examples/shared_stream_controllers.rs`, included twice by
// `tests/kube_runtime_programs.rs`: after `use` lines that name kube-runtime's `Config`,
// `Controller` and `Action`, and after lines that name workqueue-kube's. Adapted to run in a
// test: `main` is `run(client, log)`, the reconciles write to `log` instead of a tracing
// subscriber, `futures` is `futures_util`, and there is no `shutdown_on_signal` (the test aborts
// the task). The controllers, the shared store and its subscribers are the example's.

use std::{future, ops::Deref, sync::Arc, sync::Mutex, time::Duration};

use futures_util::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        WatchStreamExt, predicates,
        reflector::{self, ReflectHandle},
        watcher,
    },
};
use tracing::{debug, error, warn};

use thiserror::Error;

const SUBSCRIBE_BUFFER_SIZE: usize = 256;

#[derive(Debug, Error)]
pub enum Infallible {}

/// What the reconciles did: "{kind} {name}", in order.
pub type Log = Arc<Mutex<Vec<String>>>;

// A generic reconciler that can be used with any object whose type is known at
// compile time. Will simply log its kind on reconciliation.
async fn reconcile<K>(obj: Arc<K>, ctx: Arc<Log>) -> Result<Action, Infallible>
where
    K: ResourceExt<DynamicType = ()>,
{
    let kind = K::kind(&());
    ctx.lock().unwrap().push(format!("{kind} {}", obj.name_any()));
    Ok(Action::await_change())
}

fn error_policy<K: ResourceExt>(obj: Arc<K>, error: &Infallible, _ctx: Arc<Log>) -> Action {
    error!(%error, name = %obj.name_any(), "Failed reconciliation");
    Action::requeue(Duration::from_secs(10))
}

pub async fn run(client: Client, log: Log) {
    let pods = Api::<Pod>::all(client.clone());
    let config = Config::default().concurrency(2);

    // Create a shared store with a predefined buffer that will be shared between subscribers.
    let (reader, writer) = reflector::store_shared(SUBSCRIBE_BUFFER_SIZE);
    // Before threading an object watch through the store, create a subscriber.
    // Any number of subscribers can be created from one writer.
    let subscriber: ReflectHandle<Pod> = writer
        .subscribe()
        .expect("subscribers can only be created from shared stores");

    // Subscriber events can be filtered in advance with predicates
    let filtered = subscriber
        .clone()
        .map(|r| Ok(r.deref().clone()))
        .predicate_filter(predicates::resource_version, Default::default())
        .filter_map(|r| future::ready(r.ok().map(Arc::new)));

    // Reflect a stream of pod watch events into the store and apply a backoff. For subscribers to
    // be able to consume updates, the reflector must be shared.
    let pod_watch = watcher(pods.clone(), Default::default())
        .default_backoff()
        .reflect_shared(writer)
        .for_each(|res| async move {
            match res {
                Ok(event) => debug!("Received event on root stream {event:?}"),
                Err(error) => error!(%error, "Unexpected error when watching resource"),
            }
        });

    // Create the first controller; the controller will log whenever it
    // reconciles a pod. The reconcile is a no-op.
    // Controllers accept subscribers through a dedicated interface.
    let pod_controller = Controller::for_shared_stream(filtered, reader)
        .with_config(config.clone())
        .run(reconcile, error_policy, Arc::new(log.clone()))
        .for_each(|res| async move {
            match res {
                Ok(v) => debug!("Reconciled pod {v:?}"),
                Err(error) => warn!(%error, "Failed to reconcile metadata"),
            }
        });

    // Create the second controller; the controller will log whenever it
    // reconciles a deployment. Any changes to a pod will trigger a
    // reconciliation to the owner (a deployment). Reconciliations are no-op.
    let deploys = Api::<Deployment>::all(client.clone());
    let deploy_controller = Controller::new(deploys, Default::default())
        .with_config(config)
        .owns_shared_stream(subscriber)
        .run(reconcile, error_policy, Arc::new(log))
        .for_each(|res| async move {
            match res {
                Ok(v) => debug!("Reconciled deployment {v:?}"),
                Err(error) => warn!(%error, "Failed to reconcile status"),
            }
        });

    // Drive streams to readiness. The initial watch (that is reflected) needs to be driven to
    // consume events from the API Server and forward them to subscribers.
    //
    // Both controllers will operate on shared objects.
    tokio::select! {
        _ = futures_util::future::join(pod_controller, deploy_controller) => {},
        _ = pod_watch => {}
    }
}
