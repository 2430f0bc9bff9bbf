//! The constructors the tests share: durations and objects.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

/// The namespace of [`meta`] and [`cm`].
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
