//! The counter controller example's scenarios (issue 14), on tokio's paused clock: the example's
//! own simulated API and controller, included from `examples/counter/`.

// The example's modules: the test drives only part of the simulated API.
#[allow(dead_code)]
#[path = "../examples/counter/api.rs"]
mod api;
#[allow(dead_code)]
#[path = "../examples/counter/controller.rs"]
mod controller;

mod common;

use std::collections::BTreeMap;

use tokio::task::JoinHandle;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use workqueue_tokio::runner::Report;

use api::{Api, ConfigMap, Deployment};
use common::secs;
use controller::{APPLIED, INVALID_RETRIES, REPLICAS};

fn configmap(name: &str, replicas: &str) -> ConfigMap {
    ConfigMap {
        name: name.to_string(),
        annotations: BTreeMap::from([(REPLICAS.to_string(), replicas.to_string())]),
    }
}

fn deployment(name: &str, replicas: u32) -> Deployment {
    Deployment {
        name: name.to_string(),
        replicas,
        owner: Some(name.to_string()),
    }
}

struct Running {
    api: Api,
    stop: CancellationToken,
    run: JoinHandle<Report>,
}

impl Running {
    fn start(api: &Api) -> Self {
        let stop = CancellationToken::new();
        let run = tokio::spawn(controller::run(api.clone(), stop.clone()));
        Running {
            api: api.clone(),
            stop,
            run,
        }
    }

    fn replicas(&self, name: &str) -> Option<u32> {
        self.api.deployment(name).map(|d| d.replicas)
    }

    fn applied(&self, name: &str) -> Option<String> {
        self.api
            .configmap(name)
            .and_then(|cm| cm.annotations.get(APPLIED).cloned())
    }

    /// Stops the controller (as SIGTERM does) and returns its report.
    async fn stop(self) -> Report {
        self.stop.cancel();
        self.run.await.unwrap()
    }
}

/// Create, then update: the Deployment follows the annotation, and the controller's own status
/// write does not queue the key again (the predicate drops it): after convergence no request is
/// made for ten minutes.
#[tokio::test(start_paused = true)]
async fn create_and_update_scale_the_deployment_without_self_triggering() {
    let api = Api::new();
    api.put_deployment(deployment("web", 1));
    api.put_configmap(configmap("web", "3"));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    assert_eq!(
        (c.replicas("web"), c.applied("web")),
        (Some(3), Some("3".into()))
    );
    api.put_configmap(configmap("web", "5"));
    sleep(secs(1)).await;
    assert_eq!(
        (c.replicas("web"), c.applied("web")),
        (Some(5), Some("5".into()))
    );
    let requests = api.requests();
    sleep(secs(600)).await;
    assert_eq!(api.requests(), requests, "the controller kept itself busy");
    // A change of another annotation is not relevant either.
    let mut cm = api.configmap("web").unwrap();
    cm.annotations.insert("note".into(), "hello".into());
    api.put_configmap(cm);
    sleep(secs(1)).await;
    assert_eq!(api.requests(), requests);
    let report = c.stop().await;
    assert_eq!((report.errors, report.source_errors), (0, 0));
}

/// An invalid annotation is the object's own error: an event each time, a few retries with
/// backoff, then the controller gives up until the ConfigMap changes; no storm. Fixing the
/// annotation brings the key back.
#[tokio::test(start_paused = true)]
async fn an_invalid_annotation_backs_off_records_events_and_recovers_when_fixed() {
    let api = Api::new();
    api.put_deployment(deployment("db", 1));
    api.put_configmap(configmap("db", "three"));
    let c = Running::start(&api);
    sleep(secs(600)).await;
    let attempts = u64::from(INVALID_RETRIES) + 1;
    assert_eq!(api.events().len() as u64, attempts);
    assert!(
        api.events()
            .iter()
            .all(|(object, message)| object == "db" && message.contains("\"three\""))
    );
    // Two list requests (one per watch), then one read per attempt.
    assert_eq!(api.requests(), 2 + attempts);
    assert_eq!(c.replicas("db"), Some(1));
    api.put_configmap(configmap("db", "2"));
    sleep(secs(1)).await;
    assert_eq!(c.replicas("db"), Some(2));
    let report = c.stop().await;
    assert_eq!((report.errors, report.given_up), (attempts, 1));
}

/// A ConfigMap whose Deployment does not exist yet is not an error; when the Deployment appears,
/// its watch event queues the ConfigMap's key (the owner mapping) and it is scaled.
#[tokio::test(start_paused = true)]
async fn a_deployment_that_appears_late_is_scaled() {
    let api = Api::new();
    api.put_configmap(configmap("web", "4"));
    let c = Running::start(&api);
    sleep(secs(60)).await;
    assert_eq!(c.replicas("web"), None);
    api.put_deployment(deployment("web", 1));
    sleep(secs(1)).await;
    assert_eq!(c.replicas("web"), Some(4));
    // A Deployment without an owner queues nothing.
    let requests = api.requests();
    api.put_deployment(Deployment {
        owner: None,
        ..deployment("other", 1)
    });
    sleep(secs(1)).await;
    assert_eq!(api.requests(), requests);
    let report = c.stop().await;
    assert_eq!(report.errors, 0);
}

/// Scaling the Deployment by hand is drift: its watch event queues the owner, which scales it
/// back.
#[tokio::test(start_paused = true)]
async fn drift_from_hand_scaling_is_undone() {
    let api = Api::new();
    api.put_deployment(deployment("web", 3));
    api.put_configmap(configmap("web", "3"));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    api.put_deployment(deployment("web", 9));
    sleep(secs(1)).await;
    assert_eq!(c.replicas("web"), Some(3));
    c.stop().await;
}

/// A short outage: the watches break and relist, reconciles fail and back off; a change made
/// meanwhile is applied after the outage, and the outage costs few requests.
#[tokio::test(start_paused = true)]
async fn a_short_outage_is_ridden_out() {
    let api = Api::new();
    api.put_deployment(deployment("web", 1));
    api.put_configmap(configmap("web", "3"));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    assert_eq!(c.replicas("web"), Some(3));
    let before = api.requests();
    api.set_down(true);
    api.put_configmap(configmap("web", "6"));
    sleep(secs(30)).await;
    let during = api.requests() - before;
    // Each watch relists once a second: about 60; no reconcile storm on top.
    assert!(during <= 70, "{during} requests during a 30 s outage");
    assert_eq!(c.replicas("web"), Some(3));
    api.set_down(false);
    sleep(secs(5)).await;
    assert_eq!(
        (c.replicas("web"), c.applied("web")),
        (Some(6), Some("6".into()))
    );
    let report = c.stop().await;
    assert!(
        report.source_errors >= 2,
        "the watches' errors were skipped"
    );
    assert_eq!(report.sources_ended, 0);
}

/// Deleting the ConfigMap deletes the Deployment it owns, also when the delete happens during an
/// outage (the relist reports it).
#[tokio::test(start_paused = true)]
async fn a_delete_removes_the_owned_deployment() {
    let api = Api::new();
    for name in ["web", "db"] {
        api.put_deployment(deployment(name, 1));
        api.put_configmap(configmap(name, "2"));
    }
    let c = Running::start(&api);
    sleep(secs(1)).await;
    api.delete_configmap("web");
    sleep(secs(1)).await;
    assert_eq!((c.replicas("web"), c.replicas("db")), (None, Some(2)));
    api.set_down(true);
    api.delete_configmap("db");
    sleep(secs(10)).await;
    api.set_down(false);
    sleep(secs(5)).await;
    assert_eq!(c.replicas("db"), None);
    c.stop().await;
}

/// Shutdown (what SIGTERM and SIGINT trigger in the example): the controller stops at once when
/// nothing is in flight, stops reading its watches, and reports nothing left queued.
#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_controller() {
    let api = Api::new();
    api.put_deployment(deployment("web", 1));
    api.put_configmap(configmap("web", "3"));
    let c = Running::start(&api);
    sleep(secs(1)).await;
    let at = tokio::time::Instant::now();
    let report = c.stop().await;
    assert_eq!(tokio::time::Instant::now(), at);
    // Two reconciles: the lists', and the one its own scale of the Deployment queued (the
    // Deployment's replicas are relevant, for drift; that reconcile finds nothing to do).
    assert_eq!(
        (report.processed, report.still_queued, report.sources_ended),
        (2, 0, 0)
    );
}
