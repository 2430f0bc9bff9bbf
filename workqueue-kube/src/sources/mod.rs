//! kube-rs watchers as sources of a [`workqueue_tokio`] runner: the stream stages beneath
//! [`Controller`](crate::controller::Controller), for a controller wired by hand.
//!
//! kube-runtime has the input side (its [`watcher()`](kube::runtime::watcher()),
//! [reflectors](mod@kube::runtime::reflector) and [`predicates`](kube::runtime::predicates));
//! `workqueue-tokio` has the queue and the workers. Three stages join them:
//!
//! - [`prioritized`] reads a watcher's events and gives each touched object the priority
//!   controller-runtime gives its key: the initial list at [`LOW_PRIORITY`], a re-listed object
//!   at `LOW_PRIORITY` only if its resourceVersion is unchanged, every real change at the
//!   default priority 0 (see [`Prioritized`]);
//! - between the two, kube-runtime's own `predicate_filter` works unchanged
//!   ([`Prioritized`] is a [`Resource`](kube::Resource)); [`pass_deletes`] lets deletions
//!   through a predicate, as controller-runtime's predicates do;
//! - [`keys`] maps each object to its own key, [`owners`] to its owners' keys, each an
//!   [`ObjectRef`] with the [`AddOptions`] of its priority: a source for
//!   [`Runner::source`](workqueue_tokio::runner::Runner::source).
//!
//! A watcher's errors pass through as `Err` items: the runner logs them, counts them in
//! [`Report::source_errors`](workqueue_tokio::runner::Report::source_errors) and goes on, while
//! the watcher retries. Put its backoff after these stages (`keys(prioritized(events))
//! .default_backoff()`, with kube-runtime's `WatchStreamExt`), not on the watcher itself: a
//! watcher yields `Init` before every list attempt, and a backoff that sees it resets before
//! every retry, so a list that keeps failing (an outage, a denied `list`, a missing CRD) is
//! retried about every second for ever. A hand-wired runner must also keep the guarantees
//! `Controller` keeps for it (no reconcile before its store is ready, in particular).
//!
//! ```
//! use futures_util::stream::{self, StreamExt};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::ObjectMeta;
//! use kube::runtime::watcher::Event;
//! use workqueue_kube::sources::{AddOptions, LOW_PRIORITY, keys, prioritized};
//!
//! fn cm(name: &str, rv: &str) -> ConfigMap {
//!     let metadata = ObjectMeta {
//!         name: Some(name.into()),
//!         namespace: Some("default".into()),
//!         resource_version: Some(rv.into()),
//!         ..Default::default()
//!     };
//!     ConfigMap { metadata, ..Default::default() }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // What a watcher yields: an initial list, a change, then a relist after the watch broke.
//! let events = stream::iter([
//!     Event::Init,
//!     Event::InitApply(cm("a", "1")),
//!     Event::InitApply(cm("b", "2")),
//!     Event::InitDone,
//!     Event::Apply(cm("a", "3")),
//!     Event::Init,
//!     Event::InitApply(cm("a", "3")), // unchanged since the last event
//!     Event::InitApply(cm("b", "4")), // changed while the watch was down
//!     Event::InitDone,
//! ])
//! .map(Ok);
//! let added: Vec<_> = keys(prioritized(events))
//!     .map(|item| item.map(|(key, opts)| (key.name, opts)).unwrap())
//!     .collect()
//!     .await;
//! let (low, normal) = (AddOptions::new().priority(LOW_PRIORITY), AddOptions::new());
//! assert_eq!(added, [
//!     ("a".to_string(), low),
//!     ("b".to_string(), low),
//!     ("a".to_string(), normal),
//!     ("a".to_string(), low),
//!     ("b".to_string(), normal),
//! ]);
//! # }
//! ```

mod keys;
mod pass_deletes;
mod prioritized;

pub use keys::{keys, owners};
pub use kube::runtime::reflector::ObjectRef;
pub use pass_deletes::{PassDeletes, pass_deletes};
pub use prioritized::{Change, Prioritized, prioritized};
pub use workqueue_tokio::{AddOptions, LOW_PRIORITY};

pub(crate) use keys::owner_keys;
