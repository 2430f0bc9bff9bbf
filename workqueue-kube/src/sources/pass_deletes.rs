//! [`pass_deletes`]: kube-runtime's predicates over [`Prioritized`] objects, with deletions let
//! through as controller-runtime's predicates let them.

use std::hash::{DefaultHasher, Hash, Hasher};

use kube::runtime::Predicate;

use super::{Change, Prioritized};

/// A predicate for kube-runtime's `predicate_filter` over [`Prioritized`] objects that lets
/// every deletion through and filters the rest with `predicate`: controller-runtime's predicates
/// (`GenerationChangedPredicate` and the like) filter updates, not deletes, while kube-runtime's
/// can drop a deleted object whose hashed part did not change.
///
/// ```
/// use futures_util::stream::{self, StreamExt};
/// use k8s_openapi::api::apps::v1::Deployment;
/// use kube::api::ObjectMeta;
/// use kube::runtime::{WatchStreamExt, predicates, watcher::Event};
/// use workqueue_kube::sources::{Change, pass_deletes, prioritized};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let d = Deployment {
///     metadata: ObjectMeta { name: Some("web".into()), generation: Some(1), ..Default::default() },
///     ..Default::default()
/// };
/// let events = stream::iter([Event::Apply(d.clone()), Event::Apply(d.clone()), Event::Delete(d)]);
/// let passed: Vec<_> = prioritized(events.map(Ok))
///     .predicate_filter(pass_deletes(predicates::generation), Default::default())
///     .map(|touched| touched.unwrap().change)
///     .collect()
///     .await;
/// assert_eq!(passed, [Change::Applied, Change::Deleted]);
/// # }
/// ```
pub fn pass_deletes<P>(predicate: P) -> PassDeletes<P> {
    PassDeletes(predicate)
}

/// See [`pass_deletes`].
#[derive(Debug, Clone, Copy)]
pub struct PassDeletes<P>(P);

impl<K, P: Predicate<K>> Predicate<Prioritized<K>> for PassDeletes<P> {
    fn hash_property(&self, touched: &Prioritized<K>) -> Option<u64> {
        let hash = self.0.hash_property(&touched.object);
        if touched.change == Change::Deleted {
            // Never the hash of a live object: the deletion passes. (The same object cannot be
            // deleted twice; a re-created one has a new UID, a new entry of the filter.)
            let mut hasher = DefaultHasher::new();
            (hash, "deleted").hash(&mut hasher);
            Some(hasher.finish())
        } else {
            hash
        }
    }
}
