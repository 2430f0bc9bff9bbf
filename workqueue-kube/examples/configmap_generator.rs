//! kube-rs's ConfigMap-generator pattern on `workqueue_kube::Controller`: a custom resource,
//! `ConfigMapGenerator` (`example.com/v1`), owns a ConfigMap of its name whose `content` key it
//! keeps equal to its `spec.content`. Editing or deleting the ConfigMap by hand triggers its owner
//! (`owns`), which puts it back.
//!
//! The resource's `Resource` impl is written out here (what `#[derive(CustomResource)]` generates,
//! minus the schema), so the example needs no `derive` feature. Its scenarios run against the
//! scripted API server in `tests/configmap_generator.rs`; against a cluster, install the CRD
//! first, then `cargo run -p workqueue-kube --example configmap_generator`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use workqueue_kube::controller::{Action, Config, Controller};

/// A request for a ConfigMap with the given content.
///
/// Written by hand (kube's `CustomResource` derive would need its `derive` feature and schemars);
/// the API server requires `apiVersion` and `kind` in a body, so they are serialized too (below).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ConfigMapGenerator {
    /// Its name, namespace, uid...
    pub metadata: ObjectMeta,
    /// What it asks for.
    pub spec: GeneratorSpec,
}

impl Serialize for ConfigMapGenerator {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut object = serializer.serialize_struct("ConfigMapGenerator", 4)?;
        object.serialize_field("apiVersion", &Self::api_version(&()))?;
        object.serialize_field("kind", &Self::kind(&()))?;
        object.serialize_field("metadata", &self.metadata)?;
        object.serialize_field("spec", &self.spec)?;
        object.end()
    }
}

/// What a generator asks for.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct GeneratorSpec {
    /// The `content` key of the ConfigMap.
    pub content: String,
}

impl Resource for ConfigMapGenerator {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ConfigMapGenerator".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "example.com".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "configmapgenerators".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A generator without a namespace cannot own a ConfigMap.
    #[error("the generator has no namespace")]
    NoNamespace,
}

/// Applies the generator's ConfigMap (server-side apply: creates it, or puts its content back).
pub async fn reconcile(
    generator: Arc<ConfigMapGenerator>,
    client: Arc<Client>,
) -> Result<Action, Error> {
    let ns = generator.namespace().ok_or(Error::NoNamespace)?;
    let owner = generator
        .controller_owner_ref(&())
        .expect("a generator from the API has a uid");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: generator.metadata.name.clone(),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "content".into(),
            generator.spec.content.clone(),
        )])),
        ..Default::default()
    };
    let configmaps = Api::<ConfigMap>::namespaced(client.as_ref().clone(), &ns);
    let params = PatchParams::apply("configmap-generator").force();
    configmaps
        .patch(&cm.name_any(), &params, &Patch::Apply(&cm))
        .await?;
    Ok(Action::await_change())
}

/// Every failure backs off per generator (5 ms doubling, up to 1000 s).
pub fn error_policy(
    _generator: Arc<ConfigMapGenerator>,
    _error: &Error,
    _client: Arc<Client>,
) -> Action {
    Action::backoff()
}

/// The controller for `client`'s cluster, not running yet.
pub fn controller(client: &Client) -> Controller<ConfigMapGenerator> {
    let wc = watcher::Config::default();
    Controller::new(Api::<ConfigMapGenerator>::all(client.clone()), wc.clone())
        .owns(Api::<ConfigMap>::all(client.clone()), wc)
        .with_config(Config::default().concurrency(8).fair_namespaces(true))
}

#[tokio::main]
async fn main() -> Result<(), kube::Error> {
    let client = Client::try_default().await?;
    controller(&client)
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(client))
        .for_each(|result| async move {
            if let Err(error) = result {
                eprintln!("{error}");
            }
        })
        .await;
    Ok(())
}
