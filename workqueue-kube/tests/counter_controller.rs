//! The kube-rs counter controller example's scenarios, on tokio's paused clock: the example's own
//! controller, included from `examples/counter/`, with a `kube::Client` on a scripted API server
//! in memory (`apiserver/`). No cluster, no network.

#[allow(dead_code)]
#[path = "../examples/counter/main.rs"]
mod controller;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;

use http::Method;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::sleep;
use workqueue_kube::controller::Controller;

use controller::{APPLIED, REPLICAS};
use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::{self, meta, secs};

fn configmap(name: &str, replicas: &str) -> ConfigMap {
    let mut metadata = meta(name);
    metadata.annotations = Some(BTreeMap::from([(REPLICAS.into(), replicas.into())]));
    ConfigMap {
        metadata,
        ..Default::default()
    }
}

/// A Deployment owned by the ConfigMap of its name, which the server must have (for its uid).
fn deployment(api: &ApiServer, name: &str, replicas: i32) -> Deployment {
    let owner = api
        .get::<ConfigMap>(name)
        .expect("its ConfigMap, stored first");
    fixtures::deployment(name, replicas, Some(&owner))
}

struct Running {
    api: ApiServer,
    stop: oneshot::Sender<()>,
    run: JoinHandle<()>,
}

impl Running {
    /// The example's controller, wired as its `main` wires it, with a shutdown the test
    /// triggers instead of a signal.
    fn start(api: &ApiServer) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let client = api.client();
        let reporter = Reporter {
            controller: "counter".into(),
            instance: None,
        };
        let state = Arc::new(controller::State {
            recorder: Recorder::new(client.clone(), reporter),
            client: client.clone(),
        });
        let config = watcher::Config::default();
        let counter = Controller::new(Api::<ConfigMap>::all(client.clone()), config.clone())
            .owns(Api::<Deployment>::all(client), config)
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(controller::reconcile, controller::error_policy, state)
            .for_each(|_| async {});
        let run = tokio::spawn(counter);
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

    /// Stops the controller (as SIGTERM does) and waits until it has stopped.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.run.await.unwrap();
    }
}

/// Create, then update: the Deployment follows the annotation; the controller's own status write
/// queues the ConfigMap once more (kube-runtime's `Controller` has no predicate on it), and that
/// reconcile writes nothing: after convergence nothing is written for ten minutes.
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
    // A change of another annotation writes nothing either.
    let mut cm = api.get::<ConfigMap>("web").unwrap();
    cm.annotations_mut().insert("note".into(), "hello".into());
    api.put(&cm);
    sleep(secs(1)).await;
    assert_eq!(api.writes(), writes);
    c.stop().await;
}

/// An invalid annotation: an Event each time (created, then its series patched), and retries
/// with per-key backoff, so under twenty in ten minutes, not one every 5 s; fixing the
/// annotation queues the key at once, and its success resets its backoff.
#[tokio::test(start_paused = true)]
async fn an_invalid_annotation_records_events_and_backs_off() {
    let api = ApiServer::new();
    api.put(&configmap("db", "three"));
    api.put(&deployment(&api, "db", 1));
    let c = Running::start(&api);
    sleep(secs(600)).await;
    let events = api.requests_to(Method::POST, "events") + api.requests_to(Method::PATCH, "events");
    // 5 ms doubling: failures at 0, 5 ms, 15 ms, ... 5.1 s, 10.2 s, ... 327 s; the 18th is at
    // 655 s. A fixed 5 s requeue would have made 120.
    assert!(
        (15..=18).contains(&events),
        "{events} attempts: {:#?}",
        api.log()
    );
    let recorded = api.all("events");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0]["series"]["count"], events);
    assert!(recorded[0]["note"].as_str().unwrap().contains("\"three\""));
    assert_eq!(api.writes(), events, "{:#?}", api.log());
    assert_eq!(c.replicas("db"), Some(1));
    api.put(&configmap("db", "2"));
    sleep(secs(1)).await;
    assert_eq!(c.replicas("db"), Some(2));
    c.stop().await;
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
    api.put(&fixtures::deployment("other", 1, None));
    sleep(secs(1)).await;
    assert_eq!(api.writes(), writes);
    c.stop().await;
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

/// A deleted ConfigMap is not reconciled (it left the store): its Deployment goes by the
/// cluster's garbage collector, which the scripted server does not run. The controller writes
/// nothing for it; the other pair is untouched.
#[tokio::test(start_paused = true)]
async fn a_deleted_configmap_is_not_reconciled() {
    let api = ApiServer::new();
    for name in ["web", "db"] {
        api.put(&configmap(name, "2"));
        api.put(&deployment(&api, name, 1));
    }
    let c = Running::start(&api);
    sleep(secs(1)).await;
    assert_eq!((c.replicas("web"), c.replicas("db")), (Some(2), Some(2)));
    let writes = api.writes();
    api.delete::<ConfigMap>("web");
    sleep(secs(60)).await;
    assert_eq!(api.writes(), writes, "{:#?}", api.log());
    assert_eq!(c.replicas("db"), Some(2));
    c.stop().await;
}

/// An outage: the watches break, and the watchers' errors (each retry while the server is down)
/// are reported on the controller's stream, which goes on; after the outage the watchers relist,
/// and a change made meanwhile is applied. The watchers' backoff keeps the outage cheap.
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
    // The watches retry on the trigger backoff (kube-runtime's: up to 30 s, with random jitter,
    // one watch's attempt per slot): the change is applied at the latest a few slots after the
    // server's return, not at a fixed time.
    let back = tokio::time::Instant::now();
    while (c.replicas("web"), c.applied("web")) != (Some(6), Some("6".into())) {
        assert!(
            back.elapsed() < secs(150),
            "not applied 150 s after the outage: {:?}",
            (c.replicas("web"), c.applied("web"))
        );
        sleep(secs(1)).await;
    }
    c.stop().await;
}

/// Shutdown (what SIGTERM and SIGINT trigger in the example): the controller stops at once when
/// nothing is in flight.
#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_controller() {
    let api = ApiServer::new();
    api.put(&configmap("web", "3"));
    api.put(&deployment(&api, "web", 1));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    let at = tokio::time::Instant::now();
    c.stop().await;
    assert_eq!(tokio::time::Instant::now(), at);
}

/// The initial-list hazard: the owners' (ConfigMaps') list has two pages, and the Deployments'
/// list completes while the ConfigMaps' is still running. A Deployment's event queues its
/// owner's key before the owner is in the store; the owner must not be taken for deleted (its
/// Deployment, already cached, must survive), and once both lists are in, every pair converges.
#[tokio::test(start_paused = true)]
async fn an_owner_still_being_listed_is_not_taken_for_deleted() {
    let api = ApiServer::new();
    for name in ["a", "b", "c"] {
        api.put(&configmap(name, "2"));
        api.put(&deployment(&api, name, 1));
    }
    api.set_max_page_size("configmaps", 2);
    let pages = api.gate_lists("configmaps");
    let c = Running::start(&api);
    // The first page of ConfigMaps is held; the Deployments' list and watch go on meanwhile.
    pages.until_held(1).await;
    pages.release_one();
    pages.until_held(1).await;
    sleep(secs(5)).await;
    assert_eq!(
        api.requests_to(Method::DELETE, "deployments"),
        0,
        "{:#?}",
        api.log()
    );
    pages.open();
    sleep(secs(5)).await;
    assert_eq!(
        api.requests_to(Method::DELETE, "deployments"),
        0,
        "{:#?}",
        api.log()
    );
    for name in ["a", "b", "c"] {
        assert_eq!(c.replicas(name), Some(2), "{name}");
    }
    c.stop().await;
}
