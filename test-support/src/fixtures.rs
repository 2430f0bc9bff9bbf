//! The constructors the tests share: durations and objects.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;
use kube::api::ObjectMeta;

/// The namespace of [`meta`], [`cm`] and [`deployment`].
pub const NAMESPACE: &str = "default";

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The metadata of an object named `name` in namespace [`NAMESPACE`].
pub fn meta(name: &str) -> ObjectMeta {
    meta_in(NAMESPACE, name)
}

/// The metadata of an object named `name` in `namespace`.
pub fn meta_in(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

/// A ConfigMap in namespace [`NAMESPACE`] whose data is `v: value`.
pub fn cm(name: &str, value: &str) -> ConfigMap {
    cm_in(NAMESPACE, name, value)
}

/// A ConfigMap in `namespace` whose data is `v: value`.
pub fn cm_in(namespace: &str, name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: meta_in(namespace, name),
        data: Some(BTreeMap::from([("v".into(), value.into())])),
        ..Default::default()
    }
}

/// A Deployment in namespace [`NAMESPACE`]: see [`deployment_in`].
pub fn deployment(name: &str, replicas: i32, owner: Option<&ConfigMap>) -> Deployment {
    deployment_in(NAMESPACE, name, replicas, owner)
}

/// A Deployment in `namespace` with `replicas`, owned by `owner` when given (an owner reference
/// with its name and uid, neither `controller` nor `blockOwnerDeletion` set).
///
/// It passes a real API server's validation: a selector `app: <name>`, a pod template with that
/// label and one container. The image does not exist (`registry.invalid`): the tests' servers run
/// no kubelet, so nothing pulls it.
///
/// Panics if `owner` has no name or no uid: an owner reference needs both, so the ConfigMap must
/// be one read back from a server.
pub fn deployment_in(
    namespace: &str,
    name: &str,
    replicas: i32,
    owner: Option<&ConfigMap>,
) -> Deployment {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    let mut metadata = meta_in(namespace, name);
    metadata.owner_references = owner.map(|cm| {
        vec![
            cm.owner_ref(&())
                .expect("an owner read back from a server (a name and a uid)"),
        ]
    });
    Deployment {
        metadata,
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "app".into(),
                        image: Some("registry.invalid/app:1".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    }
}
