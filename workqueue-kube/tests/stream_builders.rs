//! The builders that take streams of the user's (`owns_stream`, `watches_shared_stream`), on
//! the scripted API server and paused time: a change of a related object reconciles the right
//! object, and a stream that keeps failing is retried with the controller's trigger backoff.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use http::Method;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::task::JoinHandle;
use tokio::time::sleep;
use workqueue_kube::controller::{Action, Controller};
use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::{cm, deployment, meta, secs};

type Log = Arc<Mutex<Vec<String>>>;

fn start(controller: Controller<ConfigMap>) -> (Log, JoinHandle<()>) {
    let log = Log::default();
    let reconciled = log.clone();
    let stream = controller.run(
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            reconciled.lock().unwrap().push(cm.name_any());
            async { Ok::<_, kube::Error>(Action::await_change()) }
        },
        |_, _, _| Action::await_change(),
        Arc::new(()),
    );
    (
        log,
        tokio::spawn(stream.for_each(|_| std::future::ready(()))),
    )
}

fn drain(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[tokio::test(start_paused = true)]
async fn owns_stream_reconciles_the_owner_of_a_changed_child() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    server.put(&cm("b", "1"));
    let owner = server.get::<ConfigMap>("a").unwrap();
    server.put(&deployment("web", 1, Some(&owner)));
    let client = server.client();
    let children =
        watcher(Api::<Deployment>::all(client.clone()), Default::default()).touched_objects();
    let controller = Controller::new(Api::all(client), Default::default()).owns_stream(children);
    let (log, task) = start(controller);
    sleep(secs(2)).await;
    let mut first = drain(&log);
    first.sort();
    assert_eq!(
        first,
        ["a", "b"],
        "each once: the child's key coalesces with its owner's"
    );
    server.put(&deployment("web", 2, Some(&owner)));
    sleep(secs(2)).await;
    assert_eq!(drain(&log), ["a"]);
    server.delete::<Deployment>("web");
    sleep(secs(2)).await;
    assert_eq!(drain(&log), ["a"], "a deleted child reconciles its owner");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn watches_shared_stream_reconciles_what_the_mapper_names() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let secret = |value: &str| Secret {
        metadata: meta("for-a"),
        string_data: Some([("v".to_string(), value.to_string())].into()),
        ..Default::default()
    };
    server.put(&secret("1"));
    let client = server.client();
    let (_secrets, writer) = reflector::store_shared(16);
    let subscriber = writer.subscribe().unwrap();
    let watch = watcher(Api::<Secret>::all(client.clone()), Default::default())
        .reflect_shared(writer)
        .for_each(|_| std::future::ready(()));
    let watch = tokio::spawn(watch);
    let controller = Controller::new(Api::all(client), Default::default()).watches_shared_stream(
        subscriber,
        |secret: Arc<Secret>| {
            let name = secret.name_any();
            let target = name.strip_prefix("for-")?.to_string();
            Some(ObjectRef::new(&target).within(&secret.namespace()?))
        },
    );
    let (log, task) = start(controller);
    sleep(secs(2)).await;
    assert_eq!(drain(&log), ["a"]);
    server.put(&secret("2"));
    sleep(secs(2)).await;
    assert_eq!(drain(&log), ["a"]);
    task.abort();
    watch.abort();
}

/// A stream given to `owns_stream` whose list is denied, with no backoff of its own: the
/// controller's trigger backoff paces it (at most 15 lists in 5 minutes with kube's default;
/// about every second without it).
#[tokio::test(start_paused = true)]
async fn a_failing_stream_is_retried_with_the_trigger_backoff() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    server.deny("list", "deployments.apps");
    let client = server.client();
    let children =
        watcher(Api::<Deployment>::all(client.clone()), Default::default()).touched_objects();
    let controller = Controller::new(Api::all(client), Default::default()).owns_stream(children);
    let (log, task) = start(controller);
    sleep(secs(300)).await;
    task.abort();
    let lists = server
        .request_log()
        .iter()
        .filter(|l| l.method == Method::GET && l.is_to("deployments") && !l.uri.contains("watch"))
        .count();
    assert!((2..=15).contains(&lists), "{lists} lists");
    assert_eq!(drain(&log), ["a"], "the main watch is not held back");
}
