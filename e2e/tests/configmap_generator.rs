//! Scenario 3 on the real server: the ConfigMap generator (`examples/configmap_generator.rs`),
//! a custom resource (its CRD created and established first) that owns a ConfigMap it keeps
//! by server-side apply, with the real field managers: a hand edit (another manager) is taken
//! back by the forced apply, a non-forced apply of its field by another manager is a conflict,
//! and a deleted ConfigMap is made again. The scripted version:
//! `workqueue-kube/tests/configmap_generator.rs`. This binary has the control plane to itself:
//! the example's controller watches all namespaces.

#[allow(dead_code)]
#[path = "../../workqueue-kube/examples/configmap_generator.rs"]
mod example;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::oneshot;
use workqueue_e2e::until;
use workqueue_test_support::control_plane::ControlPlane;

use example::{ConfigMapGenerator, GeneratorSpec};

const SOON: Duration = Duration::from_secs(30);

fn generator(ns: &str, name: &str, content: &str) -> ConfigMapGenerator {
    ConfigMapGenerator {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: GeneratorSpec {
            content: content.into(),
        },
    }
}

/// Creates the generators' CRD and waits until it is established.
async fn install_crd(client: &kube::Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "configmapgenerators.example.com" },
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {
                "plural": "configmapgenerators",
                "singular": "configmapgenerator",
                "kind": "ConfigMapGenerator"
            },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": {
                        "type": "object",
                        "properties": { "content": { "type": "string" } }
                    } }
                } }
            }]
        }
    }))
    .unwrap();
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    until(SOON, "the CRD is established", || async {
        let crd = crds.get("configmapgenerators.example.com").await.unwrap();
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    })
    .await;
}

async fn content(api: &Api<ConfigMap>, name: &str) -> Option<String> {
    let cm = api.get_opt(name).await.unwrap()?;
    cm.data.and_then(|d| d.get("content").cloned())
}

async fn until_content(api: &Api<ConfigMap>, name: &str, want: &str) -> Duration {
    let what = format!("{name}'s content is {want}");
    until(SOON, &what, || async {
        content(api, name).await.as_deref() == Some(want)
    })
    .await
}

#[tokio::test]
async fn generators_keep_their_configmaps_by_server_side_apply() {
    let plane = ControlPlane::shared().await;
    let client = plane.client();
    install_crd(&client).await;
    let ns = plane.namespace("generator").await;
    let generators = Api::<ConfigMapGenerator>::namespaced(client.clone(), &ns);
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    for (name, content) in [("a", "one"), ("b", "two")] {
        generators
            .create(&PostParams::default(), &generator(&ns, name, content))
            .await
            .unwrap();
    }

    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(
        example::controller(&client)
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(
                example::reconcile,
                example::error_policy,
                Arc::new(client.clone()),
            )
            .collect::<Vec<_>>(),
    );
    until_content(&configmaps, "a", "one").await;
    until_content(&configmaps, "b", "two").await;
    let a = configmaps.get("a").await.unwrap();
    let owner = &a.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("ConfigMapGenerator", Some(true))
    );
    // The real field manager: the example's apply owns data.content.
    let managers = a.metadata.managed_fields.clone().unwrap_or_default();
    let applied = managers
        .iter()
        .find(|m| m.manager.as_deref() == Some("configmap-generator"))
        .unwrap_or_else(|| panic!("{managers:#?}"));
    assert_eq!(applied.operation.as_deref(), Some("Apply"));
    let fields = serde_json::to_string(&applied.fields_v1).unwrap();
    assert!(fields.contains("f:content"), "{fields}");

    // Another manager's non-forced apply of the same field is a conflict naming the owner.
    let rival = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "a" },
        "data": { "content": "rival" }
    });
    let conflict = configmaps
        .patch("a", &PatchParams::apply("rival"), &Patch::Apply(&rival))
        .await;
    match conflict {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"), "{s:?}");
            assert!(s.message.contains("configmap-generator"), "{}", s.message);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }

    // A hand edit (an update by another manager) is taken back; a deleted ConfigMap is made
    // again.
    let tamper = json!({ "data": { "content": "tampered" } });
    let params = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    configmaps
        .patch("a", &params, &Patch::Merge(&tamper))
        .await
        .unwrap();
    configmaps
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    let took = until_content(&configmaps, "a", "one").await;
    until_content(&configmaps, "b", "two").await;
    println!("hand edit taken back in {took:?}");
    let a = configmaps.get("a").await.unwrap();
    let managers: Vec<_> = a
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    // The forced apply took data.content from kubectl-edit, which owns nothing more.
    assert_eq!(managers, ["configmap-generator"], "managers of a");

    // A new content is applied.
    let new = json!({ "spec": { "content": "uno" } });
    generators
        .patch("a", &PatchParams::default(), &Patch::Merge(&new))
        .await
        .unwrap();
    until_content(&configmaps, "a", "uno").await;
    // A custom resource deleted at once answers a Status, as a built-in one does.
    let gone = generators
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    let details = gone.right().expect("a Status").details.unwrap();
    assert_eq!(
        (details.group.as_str(), details.kind.as_str()),
        ("example.com", "configmapgenerators")
    );
    let _ = stop.send(());
    let items = run.await.unwrap();
    assert!(items.iter().all(Result::is_ok), "{items:?}");
}
