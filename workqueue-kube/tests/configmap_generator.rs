//! The ConfigMap-generator example (`examples/configmap_generator.rs`) against the scripted API
//! server, on tokio's paused clock: a generator makes its ConfigMap; a hand edit or a delete of
//! the ConfigMap is put back (its owner is triggered); a change of the generator's content is
//! applied.

#[allow(dead_code)]
#[path = "../examples/configmap_generator.rs"]
mod example;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use tokio::sync::oneshot;
use tokio::time::sleep;

use example::{ConfigMapGenerator, GeneratorSpec};
use workqueue_test_support::apiserver::ApiServer;

fn generator(name: &str, content: &str) -> ConfigMapGenerator {
    ConfigMapGenerator {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: GeneratorSpec {
            content: content.into(),
        },
    }
}

fn content(server: &ApiServer, name: &str) -> Option<String> {
    let cm = server.get::<ConfigMap>(name)?;
    cm.data.and_then(|d| d.get("content").cloned())
}

#[tokio::test(start_paused = true)]
async fn generators_keep_their_configmaps() {
    let server = ApiServer::new();
    server.put(&generator("a", "one"));
    server.put(&generator("b", "two"));
    let client = server.client();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(
        example::controller(&client)
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(example::reconcile, example::error_policy, Arc::new(client))
            .collect::<Vec<_>>(),
    );
    sleep(Duration::from_secs(1)).await;
    assert_eq!(content(&server, "a").as_deref(), Some("one"));
    assert_eq!(content(&server, "b").as_deref(), Some("two"));
    let owner = server
        .get::<ConfigMap>("a")
        .unwrap()
        .metadata
        .owner_references
        .unwrap();
    assert_eq!(
        (owner[0].kind.as_str(), owner[0].controller),
        ("ConfigMapGenerator", Some(true))
    );
    // A hand edit of a's ConfigMap is put back; a deleted b is made again.
    let mut edited = server.get::<ConfigMap>("a").unwrap();
    edited
        .data
        .as_mut()
        .unwrap()
        .insert("content".into(), "tampered".into());
    server.put(&edited);
    server.delete::<ConfigMap>("b");
    sleep(Duration::from_secs(1)).await;
    assert_eq!(content(&server, "a").as_deref(), Some("one"));
    assert_eq!(content(&server, "b").as_deref(), Some("two"));
    // A new content is applied.
    server.put(&generator("a", "uno"));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(content(&server, "a").as_deref(), Some("uno"));
    let _ = stop.send(());
    let items = run.await.unwrap();
    assert!(items.iter().all(Result::is_ok), "{items:?}");
}
