// A controller of ConfigMaps with the watches one scenario of `tests/watch_retries.rs` needs,
// included twice: after `use` lines that name kube-runtime's `Controller`, and after lines that
// name workqueue-kube's. Nothing else differs.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use super::{Steps, Watches};

/// Runs the controller until the task running it is aborted; counts the stream's errors.
pub async fn run(client: Client, watches: Watches, backoff: Option<Steps>, errors: Arc<std::sync::atomic::AtomicUsize>) {
    let wc = watcher::Config::default();
    let mut controller = Controller::new(Api::<ConfigMap>::all(client.clone()), wc.clone());
    if watches.owns {
        controller = controller.owns(Api::<Deployment>::all(client.clone()), wc.clone());
    }
    if watches.watches {
        controller = controller.watches(Api::<Secret>::all(client), wc, |secret: Secret| {
            let ns = secret.namespace().unwrap_or_default();
            Some(ObjectRef::<ConfigMap>::new(&secret.name_any()).within(&ns))
        });
    }
    if let Some(backoff) = backoff {
        controller = controller.trigger_backoff(backoff);
    }
    controller
        .run(
            |_cm: Arc<ConfigMap>, _: Arc<()>| async { Ok::<_, kube::Error>(Action::await_change()) },
            |_, _: &kube::Error, _| Action::await_change(),
            Arc::new(()),
        )
        .for_each(|item| {
            if item.is_err() {
                errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            std::future::ready(())
        })
        .await;
}
