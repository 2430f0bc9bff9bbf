//! What a controller's stream reports besides reconciles, while its consumer is behind: every
//! error of a trigger (none is dropped), and at most 64 of the runner's reports (a mapper's
//! panic, a Lease report) waiting at once (each was logged when it happened); and what is
//! reported while the controller shuts down. On the scripted API server and paused time.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use tokio::sync::oneshot;
use tokio::time::{sleep, timeout};
use workqueue_kube::controller::{Action, Config, Controller, Error, RunnerError, applier};
use workqueue_kube::lease::LeaseConfig;
use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::{cm, meta, secs};

#[derive(Debug, thiserror::Error)]
#[error("queue error {0}")]
struct QueueFailed(usize);

/// The items a stream yields until it is quiet for a second.
async fn drain<T>(mut items: impl futures_util::Stream<Item = T> + Unpin) -> Vec<T> {
    let mut drained = Vec::new();
    while let Ok(Some(item)) = timeout(secs(1), items.next()).await {
        drained.push(item);
    }
    drained
}

/// 100 errors of the applier's queue while its consumer does not poll: all 100 are yielded.
#[tokio::test(start_paused = true)]
async fn every_queue_error_is_yielded_however_far_behind_the_consumer() {
    let (store, _writer) = reflector::store::<ConfigMap>();
    let errors = (0..100).map(|i| Err::<ObjectRef<ConfigMap>, _>(QueueFailed(i)));
    let queue = stream::iter(errors).chain(stream::pending());
    let mut items = pin!(applier(
        |_: Arc<ConfigMap>, _: Arc<()>| async { Ok::<_, kube::Error>(Action::await_change()) },
        |_, _, _| Action::await_change(),
        Arc::new(()),
        store,
        queue,
        Config::default(),
    ));
    // The first poll starts the applier; the consumer then falls behind.
    let first = items.next().await;
    sleep(secs(5)).await;
    let rest = drain(items).await;
    let queue_errors = std::iter::once(first.unwrap())
        .chain(rest)
        .map(|item| match item {
            Err(Error::QueueError(QueueFailed(i))) => i,
            other => panic!("not a queue error: {other:?}"),
        })
        .collect::<Vec<_>>();
    assert_eq!(queue_errors, (0..100).collect::<Vec<_>>());
}

/// A `watches` mapper that panics on 100 objects while the consumer does not poll: 64 reports
/// are yielded, the rest were dropped; the controller goes on.
#[tokio::test(start_paused = true)]
async fn runner_reports_past_64_waiting_are_dropped() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let secret = |name: String, value: &str| Secret {
        metadata: meta(&name),
        string_data: Some([("v".to_string(), value.to_string())].into()),
        ..Default::default()
    };
    for i in 0..100 {
        server.put(&secret(format!("s-{i:03}"), "1"));
    }
    let panicking = Arc::new(AtomicBool::new(false));
    let mapper = {
        let panicking = panicking.clone();
        move |_: Secret| {
            assert!(!panicking.load(Ordering::Relaxed), "the mapper panics");
            None::<ObjectRef<ConfigMap>>
        }
    };
    let controller = Controller::new(Api::all(server.client()), watcher::Config::default())
        .watches(
            Api::<Secret>::all(server.client()),
            watcher::Config::default(),
            mapper,
        );
    let mut items = pin!(controller.run(
        |_: Arc<ConfigMap>, _: Arc<()>| async { Ok::<_, kube::Error>(Action::await_change()) },
        |_, _, _| Action::await_change(),
        Arc::new(()),
    ));
    let first = items.next().await;
    assert!(
        matches!(first, Some(Ok((ref key, _))) if key.name == "a"),
        "{first:?}"
    );
    // The consumer falls behind while the mapper panics on every Secret's change.
    panicking.store(true, Ordering::Relaxed);
    for i in 0..100 {
        server.put(&secret(format!("s-{i:03}"), "2"));
    }
    sleep(secs(5)).await;
    let rest = drain(items.as_mut()).await;
    let panics = rest
        .iter()
        .filter(|item| {
            matches!(
                item,
                Err(Error::RunnerError(RunnerError::MapperPanicked { .. }))
            )
        })
        .count();
    assert_eq!(panics, 64, "{rest:?}");
    assert_eq!(rest.len(), 64, "{rest:?}");
    // The controller goes on: a change of `a` is reconciled.
    server.put(&cm("a", "2"));
    let next = drain(items).await;
    assert!(
        matches!(&next[..], [Ok((key, _))] if key.name == "a"),
        "{next:?}"
    );
}

/// A Lease report made while the controller shuts down (the release of its membership Lease
/// refused as its last reconcile ends) is yielded before the stream ends.
#[tokio::test(start_paused = true)]
async fn a_report_made_while_shutting_down_is_yielded() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let (stop, stopped) = oneshot::channel::<()>();
    let said = Arc::new(Mutex::new(Vec::new()));
    let log = said.clone();
    // The reconcile takes 10 s; as it ends, Lease updates start being refused.
    let reconcile = {
        let server = server.clone();
        move |_: Arc<ConfigMap>, _: Arc<()>| {
            let server = server.clone();
            async move {
                sleep(secs(10)).await;
                server.deny("update", "leases");
                Ok::<_, kube::Error>(Action::await_change())
            }
        }
    };
    let run = tokio::spawn(
        Controller::new(
            Api::<ConfigMap>::all(server.client_named("r1")),
            watcher::Config::default(),
        )
        .leases(LeaseConfig::leader_election("reports", "default", "r1"))
        .graceful_shutdown_on(async {
            let _ = stopped.await;
        })
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .for_each(move |item| {
            log.lock().unwrap().push(match item {
                Ok((object, _)) => format!("ok {}", object.name),
                Err(Error::RunnerError(RunnerError::LeaseRequestFailed {
                    verb, lease, ..
                })) => {
                    format!("failed {verb} {lease}")
                }
                Err(other) => format!("other {other}"),
            });
            async {}
        }),
    );
    // Shut down while `a`'s reconcile runs.
    sleep(secs(5)).await;
    let _ = stop.send(());
    timeout(secs(60), run).await.unwrap().unwrap();
    let said = said.lock().unwrap().clone();
    assert_eq!(said.first().map(String::as_str), Some("ok a"), "{said:#?}");
    assert!(
        said.iter().any(|s| s.starts_with("failed update")),
        "{said:#?}"
    );
}
