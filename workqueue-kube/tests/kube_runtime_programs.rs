//! kube-runtime programs on the shared-stream and stream builders, each compiled against
//! kube-runtime and against this crate with nothing but the `use` lines of `Controller`,
//! `Config` and `Action` changed: kube-rs's `shared_stream_controllers` example (run against
//! the scripted API server both ways: the same objects reconciled), and kube-runtime 5's doc
//! examples of `for_shared_stream`, `owns_stream`, `owns_shared_stream`, `watches_stream` and
//! `watches_shared_stream` (compiled). `tests/kube_runtime_program.rs` has the builders of the
//! first release, `finalizer` and the error types.

/// The example on kube-runtime's `Controller`.
mod shared_on_kube_runtime {
    use kube::runtime::{Config, Controller, controller::Action};

    include!("kube_runtime_programs/shared_stream_controllers.rs");
}

/// The same example on this crate's `Controller`: only the `use` line differs.
mod shared_on_workqueue_kube {
    use workqueue_kube::{Config, Controller, controller::Action};

    include!("kube_runtime_programs/shared_stream_controllers.rs");
}

/// The doc examples on kube-runtime's `Controller`.
#[allow(dead_code)]
mod builders_on_kube_runtime {
    use kube::runtime::controller::{Action, Controller};

    include!("kube_runtime_programs/stream_builders.rs");
}

/// The same doc examples on this crate's `Controller`.
#[allow(dead_code)]
mod builders_on_workqueue_kube {
    use workqueue_kube::controller::{Action, Controller};

    include!("kube_runtime_programs/stream_builders.rs");
}

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use tokio::time::sleep;
use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::{meta, secs};

/// A Pod, owned by the Deployment `owner` (with the uid the server gave it) if any.
fn pod(server: &ApiServer, name: &str, owner: Option<&str>, image: &str) -> Pod {
    let mut pod = Pod {
        metadata: meta(name),
        ..Default::default()
    };
    pod.metadata.labels = Some([("image".to_string(), image.to_string())].into());
    if let Some(owner) = owner {
        let uid = server.get::<Deployment>(owner).and_then(|d| d.uid());
        pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: owner.into(),
            uid: uid.unwrap_or_default(),
            ..Default::default()
        }]);
    }
    pod
}

/// What one build of the example reconciled: at the start, and after a pod changed.
async fn scenario<F, Fut>(run: F) -> (BTreeSet<String>, BTreeSet<String>)
where
    F: FnOnce(kube::Client, Arc<Mutex<Vec<String>>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let server = ApiServer::new();
    server.put(&Deployment {
        metadata: meta("web"),
        ..Default::default()
    });
    server.put(&pod(&server, "web-1", Some("web"), "v1"));
    server.put(&pod(&server, "web-2", Some("web"), "v1"));
    server.put(&pod(&server, "lone", None, "v1"));
    let log = Arc::new(Mutex::new(Vec::new()));
    let task = tokio::spawn(run(server.client(), log.clone()));
    sleep(secs(5)).await;
    let first: BTreeSet<_> = log.lock().unwrap().drain(..).collect();
    server.put(&pod(&server, "web-1", Some("web"), "v2"));
    sleep(secs(5)).await;
    let second: BTreeSet<_> = log.lock().unwrap().drain(..).collect();
    task.abort();
    (first, second)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Both builds reconcile every pod (the shared stream) and the deployment (its own watch and
/// its pods' owner references) at the start, then the changed pod and its owner.
#[tokio::test(start_paused = true)]
async fn the_shared_stream_example_runs_the_same_on_both() {
    let kube = scenario(shared_on_kube_runtime::run).await;
    let ours = scenario(shared_on_workqueue_kube::run).await;
    assert_eq!(
        kube,
        (
            set(&["Deployment web", "Pod lone", "Pod web-1", "Pod web-2"]),
            set(&["Deployment web", "Pod web-1"])
        ),
        "kube-runtime"
    );
    assert_eq!(ours, kube);
}
