//! The kube-rs counter controller example's scenarios (issue 15), on tokio's paused clock: the
//! example's own controller, included from `examples/counter/`, with a `kube::Client` on a
//! scripted API server in memory (`apiserver/`). No cluster, no network.

mod apiserver;
#[allow(dead_code)]
#[path = "../examples/counter/controller.rs"]
mod controller;

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::ObjectMeta;
use tokio::task::JoinHandle;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use workqueue_tokio::runner::Report;

use apiserver::ApiServer;
use controller::{APPLIED, INVALID_RETRIES, REPLICAS};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        ..Default::default()
    }
}

fn configmap(name: &str, replicas: &str) -> ConfigMap {
    let mut metadata = meta(name);
    metadata.annotations = Some(BTreeMap::from([(REPLICAS.into(), replicas.into())]));
    ConfigMap {
        metadata,
        ..Default::default()
    }
}

/// A Deployment owned by the ConfigMap of its name (if the server has it: its uid).
fn deployment(api: &ApiServer, name: &str, replicas: i32) -> Deployment {
    let mut metadata = meta(name);
    metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: name.into(),
        uid: api
            .get::<ConfigMap>(name)
            .and_then(|cm| cm.uid())
            .unwrap_or_default(),
        ..Default::default()
    }]);
    Deployment {
        metadata,
        spec: DeploymentSpec {
            replicas: Some(replicas),
            ..Default::default()
        },
        ..Default::default()
    }
}

struct Running {
    api: ApiServer,
    stop: CancellationToken,
    run: JoinHandle<Report>,
}

impl Running {
    fn start(api: &ApiServer) -> Self {
        let stop = CancellationToken::new();
        let run = tokio::spawn(controller::run(api.client(), stop.clone()));
        Running {
            api: api.clone(),
            stop,
            run,
        }
    }

    fn replicas(&self, name: &str) -> Option<i32> {
        self.api
            .get::<Deployment>(name)
            .and_then(|d| d.spec.replicas)
    }

    fn applied(&self, name: &str) -> Option<String> {
        self.api
            .get::<ConfigMap>(name)
            .and_then(|cm| cm.annotations().get(APPLIED).cloned())
    }

    /// Stops the controller (as SIGTERM does) and returns its report.
    async fn stop(self) -> Report {
        self.stop.cancel();
        self.run.await.unwrap()
    }
}

/// Create, then update: the Deployment follows the annotation, and the controller's own status
/// write does not queue the key again (the predicate drops it): after convergence nothing is
/// written for ten minutes. The reconciles read the stores: they make no GET.
#[tokio::test(start_paused = true)]
async fn create_and_update_scale_the_deployment_without_self_triggering() {
    let api = ApiServer::new();
    api.put(&configmap("web", "3"));
    api.put(&deployment(&api, "web", 1));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    assert_eq!(
        (c.replicas("web"), c.applied("web")),
        (Some(3), Some("3".into()))
    );
    // One scale; the ConfigMap's status once, or twice when the reconcile that the scale's
    // watch event queues runs before the store has seen the first write (a no-op patch).
    assert_eq!(api.requests_to(Method::PATCH, "deployments"), 1);
    let status_writes = api.requests_to(Method::PATCH, "configmaps");
    assert!((1..=2).contains(&status_writes), "{:#?}", api.log());
    api.put(&configmap("web", "5"));
    sleep(secs(1)).await;
    assert_eq!(
        (c.replicas("web"), c.applied("web")),
        (Some(5), Some("5".into()))
    );
    let writes = api.writes();
    sleep(secs(600)).await;
    assert_eq!(api.writes(), writes, "the controller kept itself busy");
    // A change of another annotation is not relevant either.
    let mut cm = api.get::<ConfigMap>("web").unwrap();
    cm.annotations_mut().insert("note".into(), "hello".into());
    api.put(&cm);
    sleep(secs(1)).await;
    assert_eq!(api.writes(), writes);
    let report = c.stop().await;
    assert_eq!((report.errors, report.source_errors), (0, 0));
}

/// An invalid annotation is the object's own error: an Event each time (created, then its
/// series patched), a few retries with backoff, then the controller gives up until the
/// ConfigMap changes; no storm. Fixing the annotation brings the key back.
#[tokio::test(start_paused = true)]
async fn an_invalid_annotation_backs_off_records_events_and_recovers_when_fixed() {
    let api = ApiServer::new();
    api.put(&configmap("db", "three"));
    api.put(&deployment(&api, "db", 1));
    let c = Running::start(&api);
    sleep(secs(600)).await;
    let attempts = INVALID_RETRIES as usize + 1;
    let events = api.requests_to(Method::POST, "events") + api.requests_to(Method::PATCH, "events");
    assert_eq!(events, attempts);
    let recorded = api.all("events");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0]["series"]["count"], attempts);
    assert!(recorded[0]["note"].as_str().unwrap().contains("\"three\""));
    // No other write; and no GET besides the lists and watches (renewed every 290 s).
    assert_eq!(api.writes(), attempts, "{:#?}", api.log());
    assert_eq!(api.requests(), 4 + 4 + attempts, "{:#?}", api.log());
    assert_eq!(c.replicas("db"), Some(1));
    api.put(&configmap("db", "2"));
    sleep(secs(1)).await;
    assert_eq!(c.replicas("db"), Some(2));
    let report = c.stop().await;
    assert_eq!((report.errors, report.given_up), (attempts as u64, 1));
}

/// A ConfigMap whose Deployment does not exist yet is not an error; when the Deployment appears,
/// its watch event queues the ConfigMap's key (its owner reference) and it is scaled.
#[tokio::test(start_paused = true)]
async fn a_deployment_that_appears_late_is_scaled() {
    let api = ApiServer::new();
    api.put(&configmap("web", "4"));
    let c = Running::start(&api);
    sleep(secs(60)).await;
    assert_eq!(c.replicas("web"), None);
    api.put(&deployment(&api, "web", 1));
    sleep(secs(1)).await;
    assert_eq!(c.replicas("web"), Some(4));
    // A Deployment without an owner queues nothing.
    let writes = api.writes();
    let mut other = deployment(&api, "other", 1);
    other.metadata.owner_references = None;
    api.put(&other);
    sleep(secs(1)).await;
    assert_eq!(api.writes(), writes);
    let report = c.stop().await;
    assert_eq!(report.errors, 0);
}

/// Scaling the Deployment by hand is drift: its watch event (a new generation) queues the owner,
/// which scales it back.
#[tokio::test(start_paused = true)]
async fn drift_from_hand_scaling_is_undone() {
    let api = ApiServer::new();
    api.put(&configmap("web", "3"));
    api.put(&deployment(&api, "web", 3));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    api.put(&deployment(&api, "web", 9));
    sleep(secs(1)).await;
    assert_eq!(c.replicas("web"), Some(3));
    c.stop().await;
}

/// Deleting the ConfigMap deletes the Deployment it owns (the scripted server has no garbage
/// collector: the controller does it); the other pair is untouched.
#[tokio::test(start_paused = true)]
async fn a_delete_removes_the_owned_deployment() {
    let api = ApiServer::new();
    for name in ["web", "db"] {
        api.put(&configmap(name, "2"));
        api.put(&deployment(&api, name, 1));
    }
    let c = Running::start(&api);
    sleep(secs(1)).await;
    assert_eq!((c.replicas("web"), c.replicas("db")), (Some(2), Some(2)));
    api.delete::<ConfigMap>("web");
    sleep(secs(1)).await;
    assert_eq!((c.replicas("web"), c.replicas("db")), (None, Some(2)));
    assert_eq!(api.requests_to(Method::DELETE, "deployments"), 1);
    let report = c.stop().await;
    assert_eq!(report.errors, 0);
}

/// An outage: the watches break, and the watchers' errors (each retry while the server is down)
/// are skipped by the runner, which goes on; after the outage the watchers relist, and a change
/// made meanwhile is applied. The watchers' backoff keeps the outage cheap.
#[tokio::test(start_paused = true)]
async fn watcher_errors_during_an_outage_do_not_stop_the_runner() {
    let api = ApiServer::new();
    api.put(&configmap("web", "3"));
    api.put(&deployment(&api, "web", 1));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    assert_eq!(c.replicas("web"), Some(3));
    let before = api.requests();
    api.set_down(true);
    api.put(&configmap("web", "6"));
    sleep(secs(30)).await;
    let during = api.requests() - before;
    assert!(during <= 40, "{during} requests during a 30 s outage");
    assert_eq!(c.replicas("web"), Some(3));
    api.set_down(false);
    sleep(secs(60)).await;
    assert_eq!(
        (c.replicas("web"), c.applied("web")),
        (Some(6), Some("6".into()))
    );
    let report = c.stop().await;
    assert!(
        report.source_errors >= 2,
        "the watches' errors were skipped: {report:?}"
    );
    assert_eq!(report.sources_ended, 0);
}

/// Shutdown (what SIGTERM and SIGINT trigger in the example): the controller stops at once when
/// nothing is in flight, stops reading its watches, and reports nothing left queued.
#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_controller() {
    let api = ApiServer::new();
    api.put(&configmap("web", "3"));
    api.put(&deployment(&api, "web", 1));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    let at = tokio::time::Instant::now();
    let report = c.stop().await;
    assert_eq!(tokio::time::Instant::now(), at);
    assert_eq!((report.still_queued, report.sources_ended), (0, 0));
    assert!(report.processed >= 2, "{report:?}");
}
