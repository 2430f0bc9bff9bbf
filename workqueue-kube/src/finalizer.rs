//! Clean-up before deletion: kube-runtime's [`finalizer`](kube::runtime::finalizer()) helper,
//! returning this crate's [`Action`].
//!
//! The protocol (add the finalizer, run [`Event::Apply`], and once the object is being deleted
//! run [`Event::Cleanup`] and remove the finalizer, each patch guarded by JSON Patch `test`
//! operations) is kube-runtime's own: this module calls it. Only the action type differs, so a
//! kube-runtime program keeps its reconcile and changes its `use` lines:
//!
//! ```no_run
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{Api, ResourceExt};
//! use workqueue_kube::controller::Action;
//! use workqueue_kube::finalizer::{Error, Event, finalizer};
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("cleanup failed")]
//! struct CleanupError;
//!
//! async fn reconcile(cm: Arc<ConfigMap>, api: Api<ConfigMap>) -> Result<Action, Error<CleanupError>> {
//!     finalizer(&api, "example.com/cleanup", cm, |event| async move {
//!         match event {
//!             Event::Apply(cm) => {
//!                 println!("apply {}", cm.name_any());
//!                 Ok(Action::await_change())
//!             }
//!             Event::Cleanup(cm) => {
//!                 println!("clean up after {}", cm.name_any());
//!                 Ok(Action::await_change())
//!             }
//!         }
//!     })
//!     .await
//! }
//! ```

use std::error::Error as StdError;
use std::fmt::Debug;
use std::sync::Arc;

use futures_util::{TryFuture, TryFutureExt};
use k8s_openapi::serde::Serialize;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::api::Api;
use kube::runtime::controller::Action as KubeAction;
use kube::{Resource, runtime};

pub use kube::runtime::finalizer::{Error, Event};

use crate::controller::Action;

/// Reconciles `obj` through the finalizer `finalizer_name`: kube-runtime's
/// [`finalizer`](kube::runtime::finalizer()), with this crate's [`Action`].
///
/// `reconcile` gets [`Event::Apply`] while the object lives (once the finalizer is on it) and
/// [`Event::Cleanup`] once it is being deleted; the finalizer is removed only after a cleanup
/// succeeded, so a failed cleanup is retried before the object can go. The action `reconcile`
/// returns is returned; when the helper itself finishes the reconcile (it added the finalizer,
/// whose patch triggers the next reconcile, or the object is being deleted and the finalizer is
/// already gone) the action is [`Action::await_change()`], as in kube-runtime.
///
/// Errors: [`Error::ApplyFailed`] and [`Error::CleanupFailed`] carry `reconcile`'s error;
/// [`Error::AddFinalizer`] and [`Error::RemoveFinalizer`] the API's (a conflict with another
/// writer of the finalizers among them: the next reconcile tries again).
pub async fn finalizer<K, ReconcileFut>(
    api: &Api<K>,
    finalizer_name: &str,
    obj: Arc<K>,
    reconcile: impl FnOnce(Event<K>) -> ReconcileFut,
) -> Result<Action, Error<ReconcileFut::Error>>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    ReconcileFut: TryFuture<Ok = Action>,
    ReconcileFut::Error: StdError + 'static,
{
    // kube-runtime's helper returns its own action, whose content cannot be read: the user's
    // action travels beside it. The helper returns either what `reconcile` returned or its own
    // `await_change()`.
    let mut action = None;
    let slot = &mut action;
    let reconcile = move |event| {
        let run = TryFutureExt::into_future(reconcile(event));
        async move {
            *slot = Some(run.await?);
            Ok::<_, ReconcileFut::Error>(KubeAction::await_change())
        }
    };
    runtime::finalizer(api, finalizer_name, obj, reconcile).await?;
    Ok(action.unwrap_or_else(Action::await_change))
}
