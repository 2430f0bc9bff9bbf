//! Scenario 1 on the real server: the kube-rs counter controller (`examples/counter/`), wired as
//! its `main` wires it but in a namespace of its own: create, update, an invalid annotation, a
//! late Deployment, drift, delete (no garbage collector: the Deployment stays, owned), the
//! initial list in pages, and graceful shutdown. Each exists on the scripted server in
//! `workqueue-kube/tests/counter_controller.rs`; here on wall-clock time with generous bounds.

#[allow(dead_code)]
#[path = "../../workqueue-kube/examples/counter/main.rs"]
mod controller;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use http::Method;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use workqueue_e2e::counting::{self, Counter};
use workqueue_e2e::until;
use workqueue_kube::controller::Controller;
use workqueue_test_support::control_plane::ControlPlane;
use workqueue_test_support::fixtures::{deployment_in, meta_in};

use controller::{APPLIED, REPLICAS};

const SOON: Duration = Duration::from_secs(30);

fn configmap(ns: &str, name: &str, replicas: &str) -> ConfigMap {
    let mut metadata = meta_in(ns, name);
    metadata.annotations = Some(BTreeMap::from([(REPLICAS.into(), replicas.into())]));
    ConfigMap {
        metadata,
        ..Default::default()
    }
}

/// One namespace, its objects, and the counter controller on a counting client.
struct Running {
    ns: String,
    configmaps: Api<ConfigMap>,
    deployments: Api<Deployment>,
    requests: Counter,
    stop: Option<oneshot::Sender<()>>,
    run: Option<JoinHandle<Vec<String>>>,
}

impl Running {
    async fn namespace(prefix: &str) -> Running {
        let plane = ControlPlane::shared().await;
        let ns = plane.namespace(prefix).await;
        let admin = plane.client();
        Running {
            configmaps: Api::namespaced(admin.clone(), &ns),
            deployments: Api::namespaced(admin, &ns),
            ns,
            requests: Counter::default(),
            stop: None,
            run: None,
        }
    }

    async fn create_configmap(&self, name: &str, replicas: &str) -> ConfigMap {
        let cm = configmap(&self.ns, name, replicas);
        let pp = PostParams::default();
        self.configmaps.create(&pp, &cm).await.unwrap()
    }

    async fn create_deployment(&self, name: &str, replicas: i32, owned: bool) {
        let owner = match owned {
            true => Some(self.configmaps.get(name).await.unwrap()),
            false => None,
        };
        let d = deployment_in(&self.ns, name, replicas, owner.as_ref());
        let pp = PostParams::default();
        self.deployments.create(&pp, &d).await.unwrap();
    }

    /// Starts the example's controller (its reconcile, error policy and wiring), on the
    /// namespace's objects, with `page_size` for its watchers' lists.
    async fn start(&mut self, page_size: u32) {
        let plane = ControlPlane::shared().await;
        let client = counting::client(plane.config(), &self.requests);
        let (stop, stopped) = oneshot::channel::<()>();
        let reporter = Reporter {
            controller: "counter".into(),
            instance: None,
        };
        let state = Arc::new(controller::State {
            recorder: Recorder::new(client.clone(), reporter),
            client: client.clone(),
        });
        let config = watcher::Config::default().page_size(page_size);
        let counter = Controller::new(
            Api::<ConfigMap>::namespaced(client.clone(), &self.ns),
            config.clone(),
        )
        .owns(Api::<Deployment>::namespaced(client, &self.ns), config)
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        })
        .run(controller::reconcile, controller::error_policy, state)
        .map(|item| format!("{item:?}"))
        .collect::<Vec<_>>();
        self.stop = Some(stop);
        self.run = Some(tokio::spawn(counter));
    }

    async fn replicas(&self, name: &str) -> Option<i32> {
        let d = self.deployments.get_opt(name).await.unwrap()?;
        d.spec.replicas
    }

    async fn applied(&self, name: &str) -> Option<String> {
        let cm = self.configmaps.get_opt(name).await.unwrap()?;
        cm.annotations().get(APPLIED).cloned()
    }

    async fn until_scaled(&self, name: &str, replicas: i32) -> Duration {
        let what = format!("{} scaled to {replicas}", name);
        until(SOON, &what, || async {
            self.replicas(name).await == Some(replicas)
                && self.applied(name).await == Some(replicas.to_string())
        })
        .await
    }

    fn writes(&self) -> usize {
        self.requests.get() - self.requests.count(&Method::GET, "")
    }

    /// Stops the controller (as SIGTERM does); returns how long it took and its stream's items.
    async fn stop(&mut self) -> (Duration, Vec<String>) {
        let start = Instant::now();
        let _ = self.stop.take().unwrap().send(());
        let items = self.run.take().unwrap().await.unwrap();
        (start.elapsed(), items)
    }
}

/// Create, then update: the Deployment follows the annotation; once converged, the controller
/// writes nothing more, and a change of another annotation writes nothing either.
#[tokio::test]
async fn create_and_update_scale_the_deployment_without_self_triggering() {
    let mut c = Running::namespace("counter-update").await;
    c.create_configmap("web", "3").await;
    c.create_deployment("web", 1, true).await;
    c.start(500).await;
    let took = c.until_scaled("web", 3).await;
    println!("scaled to 3 in {took:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let scales = c.requests.count(&Method::PATCH, "/deployments/");
    let status = c.requests.count(&Method::PATCH, "/configmaps/");
    assert_eq!(scales, 1, "{:#?}", c.requests.log());
    assert!((1..=2).contains(&status), "{:#?}", c.requests.log());
    let patch = json!({ "metadata": { "annotations": { REPLICAS: "5" } } });
    let pp = PatchParams::default();
    c.configmaps
        .patch("web", &pp, &Patch::Merge(&patch))
        .await
        .unwrap();
    c.until_scaled("web", 5).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = c.writes();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        c.writes(),
        writes,
        "the controller kept itself busy: {:#?}",
        c.requests.log()
    );
    let note = json!({ "metadata": { "annotations": { "note": "hello" } } });
    c.configmaps
        .patch("web", &pp, &Patch::Merge(&note))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.writes(), writes, "{:#?}", c.requests.log());
    c.stop().await;
}

/// An invalid annotation: an Event (events.k8s.io/v1, its series counting the repeats) and
/// retries with per-key backoff; fixing the annotation scales at once.
#[tokio::test]
async fn an_invalid_annotation_records_events_and_backs_off() {
    let mut c = Running::namespace("counter-invalid").await;
    c.create_configmap("db", "three").await;
    c.create_deployment("db", 1, true).await;
    c.start(500).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let events = Api::<Event>::namespaced(ControlPlane::shared().await.client(), &c.ns);
    let recorded = events.list(&Default::default()).await.unwrap().items;
    assert_eq!(recorded.len(), 1, "{recorded:#?}");
    let event = &recorded[0];
    let attempts =
        c.requests.count(&Method::POST, "/events") + c.requests.count(&Method::PATCH, "/events/");
    let series = event.series.as_ref().map_or(1, |s| s.count);
    println!("{attempts} attempts in 10 s; the Event's series count {series}");
    // 5 ms doubling: attempts at 0, 5, 15, 35 ms ... 5.1 s; 12 within 10 s (a fixed 5 s
    // requeue would make 2, kube-runtime's default error policy none).
    assert!(
        (8..=14).contains(&attempts),
        "{attempts}: {:#?}",
        c.requests.log()
    );
    assert_eq!(series, attempts as i32, "{event:#?}");
    assert!(event.note.as_deref().unwrap_or("").contains("\"three\""));
    assert_eq!(event.reason.as_deref(), Some("InvalidReplicas"));
    assert_eq!(c.replicas("db").await, Some(1));
    let fix = json!({ "metadata": { "annotations": { REPLICAS: "2" } } });
    let pp = PatchParams::default();
    c.configmaps
        .patch("db", &pp, &Patch::Merge(&fix))
        .await
        .unwrap();
    let took = c.until_scaled("db", 2).await;
    println!("fixed annotation applied in {took:?}");
    c.stop().await;
}

/// A Deployment that appears late is scaled (its owner is queued); one without an owner
/// queues nothing.
#[tokio::test]
async fn a_deployment_that_appears_late_is_scaled() {
    let mut c = Running::namespace("counter-late").await;
    c.create_configmap("web", "4").await;
    c.start(500).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.replicas("web").await, None);
    assert_eq!(c.writes(), 0, "{:#?}", c.requests.log());
    c.create_deployment("web", 1, true).await;
    c.until_scaled("web", 4).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = c.writes();
    c.create_deployment("other", 1, false).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.writes(), writes, "{:#?}", c.requests.log());
    c.stop().await;
}

/// Scaling the Deployment by hand is drift: it is scaled back.
#[tokio::test]
async fn drift_from_hand_scaling_is_undone() {
    let mut c = Running::namespace("counter-drift").await;
    c.create_configmap("web", "3").await;
    c.create_deployment("web", 3, true).await;
    c.start(500).await;
    c.until_scaled("web", 3).await;
    let scale = json!({ "spec": { "replicas": 9 } });
    let pp = PatchParams::default();
    let start = Instant::now();
    c.deployments
        .patch("web", &pp, &Patch::Merge(&scale))
        .await
        .unwrap();
    until(SOON, "scaled back to 3", || async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.replicas("web").await == Some(3)
    })
    .await;
    println!("drift undone in {:?}", start.elapsed());
    c.stop().await;
}

/// A deleted ConfigMap is not reconciled. kube-apiserver runs no garbage collector, so its
/// Deployment stays, owned by a uid that no longer exists; the controller writes nothing for
/// it; the other pair is untouched.
#[tokio::test]
async fn a_deleted_configmap_is_not_reconciled_and_its_deployment_stays_owned() {
    let mut c = Running::namespace("counter-delete").await;
    for name in ["web", "db"] {
        c.create_configmap(name, "2").await;
        c.create_deployment(name, 1, true).await;
    }
    c.start(500).await;
    c.until_scaled("web", 2).await;
    c.until_scaled("db", 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = c.writes();
    let uid = c.configmaps.get("web").await.unwrap().uid().unwrap();
    c.configmaps
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(c.writes(), writes, "{:#?}", c.requests.log());
    let orphan = c.deployments.get("web").await.unwrap();
    let owners = orphan.owner_references();
    assert_eq!((owners.len(), owners[0].uid.as_str()), (1, uid.as_str()));
    assert_eq!(c.replicas("db").await, Some(2));
    c.stop().await;
}

/// The initial list in pages: 60 pairs, lists of 7 per page, so the ConfigMaps' list takes
/// nine pages while the Deployments' events come in; every pair converges and nothing is
/// taken for deleted.
#[tokio::test]
async fn the_initial_list_in_pages_converges() {
    const PAIRS: usize = 60;
    let mut c = Running::namespace("counter-pages").await;
    for i in 0..PAIRS {
        c.create_configmap(&format!("cm-{i:02}"), "2").await;
        c.create_deployment(&format!("cm-{i:02}"), 1, true).await;
    }
    c.start(7).await;
    let took = until(Duration::from_secs(60), "every pair scaled", || async {
        let list = c.deployments.list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .filter(|d| d.spec.replicas == Some(2))
            .count()
            == PAIRS
    })
    .await;
    let pages = c.requests.count(&Method::GET, "/configmaps");
    println!("{PAIRS} pairs converged in {took:?}; {pages} GETs of configmaps (lists and watches)");
    assert!(pages >= PAIRS.div_ceil(7), "{:#?}", c.requests.log());
    assert_eq!(c.requests.count(&Method::DELETE, ""), 0);
    let (_, items) = c.stop().await;
    let failed: Vec<_> = items.iter().filter(|i| i.starts_with("Err")).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Shutdown (what SIGTERM and SIGINT trigger in the example) with nothing in flight is prompt.
#[tokio::test]
async fn shutdown_stops_the_controller() {
    let mut c = Running::namespace("counter-shutdown").await;
    c.create_configmap("web", "3").await;
    c.create_deployment("web", 1, true).await;
    c.start(500).await;
    c.until_scaled("web", 3).await;
    let (took, items) = c.stop().await;
    println!("stopped in {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(items.iter().all(|i| i.starts_with("Ok")), "{items:#?}");
}
