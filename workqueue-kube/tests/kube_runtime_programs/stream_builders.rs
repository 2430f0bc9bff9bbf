// kube-runtime 5's doc examples of the stream builders (`for_shared_stream`, `owns_stream`,
// `owns_shared_stream`, `watches_stream`, `watches_shared_stream`), each as a function, included
// twice by `tests/kube_runtime_programs.rs`: after `use` lines that name kube-runtime's
// `Controller` and `Action`, and after lines that name workqueue-kube's. Each body is the
// example's, but for those two names, which come from the including module. (The shared-stream
// examples reflect with `reflect`, not `reflect_shared`, as kube-runtime's docs do: their
// subscribers then see nothing; they are compiled, not run.)

pub async fn for_shared_stream(client: kube::Client) {
    use futures_util::StreamExt;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    use kube::{Api, Error};
    use std::sync::Arc;
    async fn reconcile(_: Arc<Deployment>, _: Arc<()>) -> Result<Action, Error> {
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<Deployment>, _: &kube::Error, _: Arc<()>) -> Action {
        Action::await_change()
    }
    let api: Api<Deployment> = Api::default_namespaced(client);
    let (reader, writer) = reflector::store_shared(128);
    let subscriber = writer
        .subscribe()
        .expect("subscribers can only be created from shared stores");
    let deploys = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each(|ev| async move {
            match ev {
                Ok(obj) => tracing::info!("got obj {obj:?}"),
                Err(error) => tracing::error!(%error, "received error"),
            }
        });

    let controller = Controller::for_shared_stream(subscriber, reader)
        .run(reconcile, error_policy, Arc::new(()))
        .for_each(|ev| async move { tracing::info!("reconciled {ev:?}") });

    // Drive streams using a select statement
    tokio::select! {
      _ = deploys => {},
      _ = controller => {},
    }
}

#[allow(deprecated)]
pub async fn owns_stream(client: kube::Client) {
    use futures_util::StreamExt;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{WatchStreamExt, metadata_watcher, predicates, watcher};
    use kube::{Api, Error};
    use std::sync::Arc;
    type CustomResource = ConfigMap;
    async fn reconcile(_: Arc<CustomResource>, _: Arc<()>) -> Result<Action, Error> {
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<CustomResource>, _: &kube::Error, _: Arc<()>) -> Action {
        Action::await_change()
    }
    let sts_stream = metadata_watcher(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default(),
    )
    .touched_objects()
    // Retain observed deletions so the owner can recreate missing children.
    .predicate_filter(predicates::resource_version, Default::default());

    Controller::new(
        Api::<CustomResource>::all(client),
        watcher::Config::default(),
    )
    .owns_stream(sts_stream)
    .run(reconcile, error_policy, Arc::new(()))
    .for_each(|_| std::future::ready(()))
    .await;
}

pub async fn owns_shared_stream(client: kube::Client) {
    use futures_util::StreamExt;
    use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    use kube::{Api, Error};
    use std::sync::Arc;
    async fn reconcile(_: Arc<Deployment>, _: Arc<()>) -> Result<Action, Error> {
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<Deployment>, _: &kube::Error, _: Arc<()>) -> Action {
        Action::await_change()
    }
    let deploys: Api<Deployment> = Api::default_namespaced(client.clone());
    let pod_api: Api<Pod> = Api::default_namespaced(client);

    let (_reader, writer) = reflector::store_shared(128);
    let subscriber = writer
        .subscribe()
        .expect("subscribers can only be created from shared stores");
    let pods = watcher(pod_api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each(|ev| async move {
            match ev {
                Ok(obj) => tracing::info!("got obj {obj:?}"),
                Err(error) => tracing::error!(%error, "received error"),
            }
        });

    let controller = Controller::new(deploys, Default::default())
        .owns_shared_stream(subscriber)
        .run(reconcile, error_policy, Arc::new(()))
        .for_each(|ev| async move { tracing::info!("reconciled {ev:?}") });

    // Drive streams using a select statement
    tokio::select! {
      _ = pods => {},
      _ = controller => {},
    }
}

pub async fn watches_stream(client: kube::Client) {
    use futures_util::StreamExt;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{WatchStreamExt, predicates, reflector::ObjectRef, watcher};
    use kube::{Api, Error};
    use std::sync::Arc;
    type CustomResource = ConfigMap;
    async fn reconcile(_: Arc<CustomResource>, _: Arc<()>) -> Result<Action, Error> {
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<CustomResource>, _: &kube::Error, _: Arc<()>) -> Action {
        Action::await_change()
    }
    fn mapper(_: DaemonSet) -> Option<ObjectRef<CustomResource>> {
        todo!()
    }
    let api: Api<DaemonSet> = Api::all(client.clone());
    let cr: Api<CustomResource> = Api::all(client.clone());
    let daemons = watcher(api, watcher::Config::default())
        .touched_objects()
        // Retain observed deletions as triggers for the mapped objects.
        .predicate_filter(predicates::resource_version, Default::default());

    Controller::new(cr, watcher::Config::default())
        .watches_stream(daemons, mapper)
        .run(reconcile, error_policy, Arc::new(()))
        .for_each(|_| std::future::ready(()))
        .await;
}

pub async fn watches_shared_stream(client: kube::Client) {
    use futures_util::StreamExt;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{WatchStreamExt, reflector::ObjectRef, watcher};
    use kube::{Api, Error};
    use std::sync::Arc;
    type CustomResource = ConfigMap;
    async fn reconcile(_: Arc<CustomResource>, _: Arc<()>) -> Result<Action, Error> {
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<CustomResource>, _: &kube::Error, _: Arc<()>) -> Action {
        Action::await_change()
    }
    fn mapper(_: Arc<DaemonSet>) -> Option<ObjectRef<CustomResource>> {
        todo!()
    }
    let api: Api<DaemonSet> = Api::all(client.clone());
    let cr: Api<CustomResource> = Api::all(client.clone());
    let (_reader, writer) = kube::runtime::reflector::store_shared(128);
    let subscriber = writer
        .subscribe()
        .expect("subscribers can only be created from shared stores");
    let daemons = watcher(api, watcher::Config::default())
        .reflect(writer)
        .touched_objects()
        .for_each(|ev| async move {
            match ev {
                Ok(_obj) => {}
                Err(error) => tracing::error!(%error, "received err"),
            }
        });

    let controller = Controller::new(cr, watcher::Config::default())
        .watches_shared_stream(subscriber, mapper)
        .run(reconcile, error_policy, Arc::new(()))
        .for_each(|_| std::future::ready(()));

    // Drive streams using a select statement
    tokio::select! {
      _ = daemons => {},
      _ = controller => {},
    }
}
