//! One kube-runtime controller program (`kube_runtime_program/program.rs`), compiled against
//! kube-runtime and against this crate with nothing but its `use` lines changed, and run against
//! the scripted API server both ways: the same finalizer's apply and cleanup, with the object
//! deleted while its apply is in flight.

/// The program on kube-runtime's `Controller`.
mod on_kube_runtime {
    use kube::runtime::controller::{Action, Config, Controller, Error};
    use kube::runtime::finalizer::{Error as FinalizerError, Event, finalizer};

    include!("kube_runtime_program/program.rs");
}

/// The same program on this crate's `Controller`: only the two `use` lines differ.
mod on_workqueue_kube {
    use workqueue_kube::controller::{Action, Config, Controller, Error};
    use workqueue_kube::finalizer::{Error as FinalizerError, Event, finalizer};

    include!("kube_runtime_program/program.rs");
}

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::oneshot;
use tokio::time::sleep;

use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::cm;

/// Runs one build of the program: the ConfigMap is created, its finalizer added and applied; it
/// is deleted while its apply runs; the cleanup then removes the finalizer and the object goes.
/// Returns the reconciles' log and the stream's items.
async fn scenario<F, Fut>(run: F) -> (Vec<String>, Vec<String>)
where
    F: FnOnce(kube::Client, oneshot::Receiver<()>, Arc<Mutex<Vec<String>>>) -> Fut,
    Fut: std::future::Future<Output = Vec<String>> + Send + 'static,
{
    let server = ApiServer::new();
    server.put(&cm("web", "1"));
    let (stop, stopped) = oneshot::channel();
    let log = Arc::new(Mutex::new(Vec::new()));
    let task = tokio::spawn(run(server.client(), stopped, log.clone()));
    // The finalizer is added (a patch), which triggers the apply; 2 s into its 5 s, delete.
    sleep(Duration::from_secs(2)).await;
    let with_finalizer = server.get::<ConfigMap>("web").unwrap();
    assert_eq!(
        with_finalizer.metadata.finalizers,
        Some(vec!["example.com/cleanup".to_string()])
    );
    server.delete::<ConfigMap>("web");
    assert!(
        server.get::<ConfigMap>("web").is_some(),
        "held by its finalizer"
    );
    sleep(Duration::from_secs(10)).await;
    assert!(
        server.get::<ConfigMap>("web").is_none(),
        "gone after the cleanup"
    );
    let _ = stop.send(());
    let items = task.await.unwrap();
    let log = log.lock().unwrap().clone();
    (log, items)
}

#[tokio::test(start_paused = true)]
async fn the_same_program_runs_on_kube_runtime_and_on_workqueue_kube() {
    let kube = scenario(|client, stopped, log| {
        let ctx = Arc::new(on_kube_runtime::Ctx {
            client: client.clone(),
            log: Mutex::new(Vec::new()),
        });
        let shared = ctx.clone();
        async move {
            let items = on_kube_runtime::run(
                client,
                async move {
                    let _ = stopped.await;
                },
                ctx,
            )
            .await;
            *log.lock().unwrap() = shared.log.lock().unwrap().clone();
            items
        }
    })
    .await;
    let ours = scenario(|client, stopped, log| {
        let ctx = Arc::new(on_workqueue_kube::Ctx {
            client: client.clone(),
            log: Mutex::new(Vec::new()),
        });
        let shared = ctx.clone();
        async move {
            let items = on_workqueue_kube::run(
                client,
                async move {
                    let _ = stopped.await;
                },
                ctx,
            )
            .await;
            *log.lock().unwrap() = shared.log.lock().unwrap().clone();
            items
        }
    })
    .await;
    assert_eq!(
        kube.0,
        ["apply web", "cleanup web"],
        "kube-runtime: {:?}",
        kube.1
    );
    assert_eq!(ours.0, kube.0, "ours: {:?}", ours.1);
}
