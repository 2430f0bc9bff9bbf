// A kube-runtime controller program, included twice by `tests/kube_runtime_program.rs`: once
// after `use` lines that name kube-runtime's `Controller`, once after lines that name
// workqueue-kube's. Nothing else differs. It uses the builder (`new`, `owns`, `owns_with`,
// `watches`, `watches_with`, `reconcile_all_on`, `with_config`, `store`, `graceful_shutdown_on`,
// `shutdown_on_signal`), `Config`, `run` with kube's signatures, `Action`, `finalizer` with its
// `Event`, and matches every variant of both error types.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

/// What the reconciles share: the client, and what they did.
pub struct Ctx {
    pub client: Client,
    pub log: Mutex<Vec<String>>,
}

impl Ctx {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

/// Applies a ConfigMap behind a finalizer; cleans up after it when it is deleted.
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, FinalizerError<kube::Error>> {
    let ns = cm.namespace().unwrap_or_else(|| "default".into());
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, "example.com/cleanup", cm, |event| async {
        match event {
            Event::Apply(cm) => {
                ctx.note(format!("apply {}", cm.name_any()));
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(Action::requeue(Duration::from_secs(300)))
            }
            Event::Cleanup(cm) => {
                ctx.note(format!("cleanup {}", cm.name_any()));
                Ok(Action::await_change())
            }
        }
    })
    .await
}

fn error_policy(_cm: Arc<ConfigMap>, error: &FinalizerError<kube::Error>, ctx: Arc<Ctx>) -> Action {
    let what = match error {
        FinalizerError::ApplyFailed(e) | FinalizerError::CleanupFailed(e) => format!("user {e}"),
        FinalizerError::AddFinalizer(e) | FinalizerError::RemoveFinalizer(e) => format!("api {e}"),
        FinalizerError::UnnamedObject => "unnamed".to_string(),
        FinalizerError::InvalidFinalizer => "invalid".to_string(),
    };
    ctx.note(format!("policy {what}"));
    Action::requeue(Duration::from_secs(1))
}

/// What each item of the controller's stream says.
fn describe(item: Result<(ObjectRef<ConfigMap>, Action), Error<FinalizerError<kube::Error>, watcher::Error>>) -> String {
    match item {
        Ok((object, action)) => format!("reconciled {} {action:?}", object.name),
        Err(Error::ObjectNotFound(object)) => format!("not found {}", object.name),
        Err(Error::ReconcilerFailed(error, object)) => format!("failed {} {error}", object.name),
        Err(Error::QueueError(error)) => format!("watch {error}"),
        Err(Error::RunnerError(error)) => format!("runner {error}"),
    }
}

/// Installs the signal handlers (compiled, not run by the test: it would take the process's
/// signals).
#[allow(dead_code)]
fn on_signals(controller: Controller<ConfigMap>) -> Controller<ConfigMap> {
    controller.shutdown_on_signal()
}

/// Runs the controller until `shutdown`; returns what its stream said.
pub async fn run(
    client: Client,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ctx: Arc<Ctx>,
) -> Vec<String> {
    let wc = watcher::Config::default();
    let controller = Controller::new(Api::<ConfigMap>::all(client.clone()), wc.clone());
    let store = controller.store();
    assert!(store.is_empty());
    let resync = futures_util::stream::empty::<()>();
    controller
        .owns(Api::<Secret>::all(client.clone()), wc.clone())
        .owns_with(Api::<Deployment>::all(client.clone()), (), wc.clone())
        .watches(Api::<Service>::all(client.clone()), wc.clone(), |service: Service| {
            let ns = service.namespace().unwrap_or_default();
            Some(ObjectRef::new(&service.name_any()).within(&ns))
        })
        .watches_with(Api::<Secret>::all(client), (), wc, |_: Secret| None::<ObjectRef<ConfigMap>>)
        .reconcile_all_on(resync)
        .with_config(Config::default().concurrency(2).debounce(Duration::ZERO))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .map(describe)
        .collect()
        .await
}
