//! [`keys`] and [`owners`]: touched objects to the keys a runner queues.

use futures_util::stream::{self, Stream, StreamExt, TryStreamExt};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::{AddOptions, Prioritized};

/// Maps each touched object to its own key, an [`ObjectRef`], with the [`AddOptions`] of its
/// priority: a source for [`Runner::source`](workqueue_tokio::runner::Runner::source).
///
/// See the [module's example](super).
pub fn keys<K, S>(
    objects: S,
) -> impl Stream<Item = Result<(ObjectRef<K>, AddOptions), watcher::Error>>
where
    K: Resource,
    K::DynamicType: Default,
    S: Stream<Item = Result<Prioritized<K>, watcher::Error>>,
{
    objects.map_ok(|touched| (ObjectRef::from_obj(&touched.object), touched.options()))
}

/// Maps each touched object to the keys of its owners of type `KOwner` (`owner_type` is its
/// dynamic type, `()` for a static one): the owner references whose `apiVersion` and `kind` are
/// `KOwner`'s, as kube-runtime's `trigger_owners` reads them. Each key has the [`AddOptions`] of
/// the object's priority: an owned object's initial list queues its owner at
/// [`LOW_PRIORITY`](super::LOW_PRIORITY), as controller-runtime's `EnqueueRequestForOwner` does.
///
/// ```
/// use futures_util::stream::{self, StreamExt};
/// use k8s_openapi::api::apps::v1::Deployment;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::api::ObjectMeta;
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
/// use kube::runtime::watcher::Event;
/// use workqueue_kube::sources::{AddOptions, owners, prioritized};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let owner = OwnerReference {
///     api_version: "v1".into(),
///     kind: "ConfigMap".into(),
///     name: "web".into(),
///     uid: "1234".into(),
///     ..Default::default()
/// };
/// let deployment = |name: &str, owners| Deployment {
///     metadata: ObjectMeta {
///         name: Some(name.into()),
///         namespace: Some("default".into()),
///         owner_references: owners,
///         ..Default::default()
///     },
///     ..Default::default()
/// };
/// let owned = deployment("web", Some(vec![owner]));
/// let orphan = deployment("orphan", None); // queues nothing
/// let events = stream::iter([Event::Apply(owned), Event::Apply(orphan)]).map(Ok);
/// let queued: Vec<_> = owners::<ConfigMap, _, _>(prioritized(events), ()).collect().await;
/// let (key, opts) = queued[0].as_ref().unwrap();
/// assert_eq!((queued.len(), key.name.as_str(), *opts), (1, "web", AddOptions::new()));
/// # }
/// ```
pub fn owners<KOwner, K, S>(
    objects: S,
    owner_type: KOwner::DynamicType,
) -> impl Stream<Item = Result<(ObjectRef<KOwner>, AddOptions), watcher::Error>>
where
    KOwner: Resource,
    KOwner::DynamicType: Clone,
    K: Resource,
    S: Stream<Item = Result<Prioritized<K>, watcher::Error>>,
{
    objects.flat_map(move |item| match item {
        Ok(touched) => {
            let opts = touched.options();
            let owners = owner_keys::<KOwner, K>(&touched.object, &owner_type);
            stream::iter(owners.into_iter().map(move |key| Ok((key, opts)))).left_stream()
        }
        Err(error) => stream::iter([Err(error)]).right_stream(),
    })
}

/// The keys of `child`'s owners of type `KOwner`: the one rule of [`owners`] and of the
/// controller's `owns` relations.
pub(crate) fn owner_keys<KOwner, K>(
    child: &K,
    owner_type: &KOwner::DynamicType,
) -> Vec<ObjectRef<KOwner>>
where
    KOwner: Resource,
    KOwner::DynamicType: Clone,
    K: Resource,
{
    let meta = child.meta();
    let namespace = meta.namespace.as_deref();
    let references = meta.owner_references.iter().flatten();
    references
        .filter_map(|owner| ObjectRef::from_owner_ref(namespace, owner, owner_type.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ..Default::default()
        }
    }

    /// Only references to the owner's type count (apiVersion and kind both), each in the child's
    /// namespace.
    #[test]
    fn owner_keys_read_references_of_the_owners_type() {
        let child = Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("team".into()),
                owner_references: Some(vec![
                    owner("v1", "ConfigMap", "a"),
                    owner("v1", "Secret", "b"),
                    owner("v2", "ConfigMap", "c"),
                    owner("v1", "ConfigMap", "d"),
                ]),
                ..Default::default()
            },
            ..Default::default()
        };
        let keys = owner_keys::<ConfigMap, _>(&child, &());
        let names: Vec<_> = keys
            .iter()
            .map(|k| (k.name.as_str(), k.namespace.as_deref()))
            .collect();
        assert_eq!(names, [("a", Some("team")), ("d", Some("team"))]);
    }
}
