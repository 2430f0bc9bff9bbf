//! What the end-to-end tests share (see `tests/`): they run `workqueue-kube`'s controllers
//! against a real kube-apiserver and etcd (`workqueue_test_support::control_plane`).
//!
//! Not published; built by the workspace, but its tests only with the `control-plane` feature.

pub mod child;
pub mod counting;
pub mod faults;
#[cfg(feature = "control-plane")]
pub mod outage;
pub mod replica;
pub mod running;
pub mod traffic;

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, PostParams};

/// Runs `f` to its end on the runtime the benches' processes (harnesses and roles) run on: 2
/// worker threads, so that figures compare across benches.
pub fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

/// Creates a ConfigMap (data `v: "0"`) for each `(namespace, name)` of `objects`, with the label
/// `label: "yes"`, 32 at a time. Panics on a failed create.
pub async fn create_configmaps(
    client: &kube::Client,
    objects: impl IntoIterator<Item = (String, String)>,
    label: &str,
) {
    futures_util::stream::iter(objects)
        .map(|(ns, name)| {
            let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
            let mut cm = workqueue_test_support::fixtures::cm_in(&ns, &name, "0");
            cm.labels_mut().insert(label.into(), "yes".into());
            async move { api.create(&PostParams::default(), &cm).await }
        })
        .buffer_unordered(32)
        .for_each(|created| {
            created.expect("creating a ConfigMap");
            async {}
        })
        .await;
}

/// Waits (wall clock) until `done` returns true, checking every 200 ms; panics with `what`
/// after `limit`. Returns how long it took.
pub async fn until<F, Fut>(limit: Duration, what: &str, mut done: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    start.elapsed()
}
