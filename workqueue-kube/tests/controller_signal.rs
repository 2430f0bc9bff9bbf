//! `Controller::shutdown_on_signal`: a real SIGTERM to this test process starts a graceful
//! shutdown; the reconcile in flight finishes and is reported, nothing new starts, and the stream
//! ends. In a test binary of its own (it takes the process's signals), on real time: the signal
//! is an operating-system event. The only time bound is a guard whose expiry fails the test.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::Notify;
use tokio::time::timeout;
use workqueue_kube::controller::{Action, Config, Controller};

use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::cm;

/// Sets a flag when the controller logs that a graceful shutdown was requested.
#[derive(Clone, Default)]
struct Watch(Arc<AtomicBool>, Arc<Notify>);

struct Message(bool);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && format!("{value:?}").contains("graceful shutdown requested")
        {
            self.0 = true;
        }
    }
}

impl tracing::Subscriber for Watch {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            self.0.store(true, SeqCst);
            self.1.notify_waiters();
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_gracefully_and_in_flight_reconciles_finish() {
    let watch = Watch::default();
    tracing::subscriber::set_global_default(watch.clone()).unwrap();
    let server = ApiServer::new();
    for name in ["first", "second"] {
        server.put(&cm(name, "1"));
    }
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let reconciled = Arc::new(Mutex::new(Vec::new()));
    let reconcile = {
        let (started, release, reconciled) = (started.clone(), release.clone(), reconciled.clone());
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            let (started, release, reconciled) =
                (started.clone(), release.clone(), reconciled.clone());
            async move {
                reconciled.lock().unwrap().push(cm.name_any());
                let released = release.notified();
                started.notify_one();
                released.await;
                Ok::<_, Never>(Action::await_change())
            }
        }
    };
    let stream = Controller::new(
        Api::<ConfigMap>::all(server.client()),
        watcher::Config::default(),
    )
    .with_config(Config::default().concurrency(1))
    .shutdown_on_signal()
    .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()));
    let run = tokio::spawn(stream.collect::<Vec<_>>());
    let guard = Duration::from_secs(60);
    timeout(guard, started.notified())
        .await
        .expect("a reconcile starts");
    let requested = watch.1.notified();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    if !watch.0.load(SeqCst) {
        timeout(guard, requested).await.expect("the signal is seen");
    }
    // The log line comes just before its effect (the shutdown future completes, and the runner's
    // intake closes on another task): a release in between could let the next key start, not
    // because the shutdown lets it, but because it has not begun yet. Give it time to begin.
    tokio::time::sleep(Duration::from_millis(500)).await;
    release.notify_waiters();
    let items = timeout(guard, run).await.expect("the stream ends").unwrap();
    assert_eq!(items.len(), 1, "the reconcile in flight is reported");
    assert!(items[0].is_ok());
    assert_eq!(reconciled.lock().unwrap().len(), 1, "nothing new starts");
}
