//! A `watches` mapper that panics, on the scripted API server and paused time: the panic costs
//! the keys of that one object and is reported on the controller's stream; the relation goes on
//! (the related objects' later changes still reconcile). kube-runtime, in the same scenario,
//! lets the panic reach the task that polls its stream.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::time::sleep;
use workqueue_kube::controller::{Action, Controller, Error, RunnerError};
use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::{cm, meta, secs};

fn secret(name: &str, value: &str) -> Secret {
    Secret {
        metadata: meta(name),
        string_data: Some([("v".to_string(), value.to_string())].into()),
        ..Default::default()
    }
}

/// The ConfigMap of a Secret's name; panics for the Secret named `bad`.
fn config_of(secret: &Secret) -> Option<ObjectRef<ConfigMap>> {
    let name = secret.name_any();
    assert_ne!(name, "bad", "no ConfigMap for a bad Secret");
    Some(ObjectRef::new(&name).within(&secret.namespace()?))
}

/// What a run saw: the reconciled ConfigMaps and the stream's other items.
#[derive(Default)]
struct Seen {
    reconciled: Vec<String>,
    reports: Vec<String>,
}

async fn start(
    controller: Controller<ConfigMap>,
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    let stream = controller.run(
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            log.lock().unwrap().reconciled.push(cm.name_any());
            async { Ok::<_, kube::Error>(Action::await_change()) }
        },
        |_, _, _| Action::await_change(),
        Arc::new(()),
    );
    let items = seen.clone();
    let task = tokio::spawn(stream.for_each(move |item| {
        match item {
            Ok(_) => {}
            Err(Error::RunnerError(RunnerError::MapperPanicked { object, message })) => items
                .lock()
                .unwrap()
                .reports
                .push(format!("{} {message}", object.name)),
            Err(other) => items.lock().unwrap().reports.push(other.to_string()),
        }
        std::future::ready(())
    }));
    (seen, task)
}

fn count(seen: &Mutex<Seen>, name: &str) -> usize {
    let seen = seen.lock().unwrap();
    seen.reconciled.iter().filter(|n| *n == name).count()
}

/// The scenario on one of this crate's relations (`watches`, `watches_stream`): `bad` panics at
/// the initial list and again when it changes, each time reported; `a`'s later change still
/// reconciles its ConfigMap.
async fn scenario(
    relate: impl FnOnce(Controller<ConfigMap>, kube::Client) -> Controller<ConfigMap>,
) {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    server.put(&secret("a", "1"));
    server.put(&secret("bad", "1"));
    let controller = Controller::new(Api::all(server.client()), watcher::Config::default());
    let (seen, task) = start(relate(controller, server.client())).await;
    sleep(secs(2)).await;
    let message = "assertion `left != right` failed: no ConfigMap for a bad Secret";
    let expected_report = format!("bad {message}\n  left: \"bad\"\n right: \"bad\"");
    assert_eq!(
        seen.lock().unwrap().reports,
        std::slice::from_ref(&expected_report)
    );
    let before = count(&seen, "a");
    assert!(before >= 1, "a was reconciled at the start");

    server.put(&secret("a", "2"));
    sleep(secs(2)).await;
    assert_eq!(
        count(&seen, "a"),
        before + 1,
        "the relation goes on after the panic"
    );

    server.put(&secret("bad", "2"));
    sleep(secs(2)).await;
    assert_eq!(
        seen.lock().unwrap().reports,
        [expected_report.clone(), expected_report]
    );
    assert!(!task.is_finished(), "the controller goes on");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_watches_mapper_is_reported_and_the_watch_goes_on() {
    scenario(|controller, client| {
        controller.watches(
            Api::<Secret>::all(client),
            watcher::Config::default(),
            |s| config_of(&s),
        )
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_watches_stream_mapper_is_reported_and_the_stream_goes_on() {
    scenario(|controller, client| {
        let secrets =
            watcher(Api::<Secret>::all(client), watcher::Config::default()).touched_objects();
        controller.watches_stream(secrets, |s| config_of(&s))
    })
    .await;
}

/// kube-runtime in the same scenario: the panic unwinds through the stream's poll into the task
/// that polls it.
#[tokio::test(start_paused = true)]
async fn on_kube_runtime_the_panic_reaches_the_consumer() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    server.put(&secret("bad", "1"));
    let client = server.client();
    let stream = kube::runtime::Controller::new(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<Secret>::all(client),
        watcher::Config::default(),
        |s| config_of(&s),
    )
    .run(
        |_: Arc<ConfigMap>, _: Arc<()>| async {
            Ok::<_, kube::Error>(kube::runtime::controller::Action::await_change())
        },
        |_, _, _| kube::runtime::controller::Action::await_change(),
        Arc::new(()),
    );
    let task = tokio::spawn(stream.for_each(|_| std::future::ready(())));
    sleep(secs(2)).await;
    assert!(task.is_finished());
    assert!(task.await.unwrap_err().is_panic());
}
