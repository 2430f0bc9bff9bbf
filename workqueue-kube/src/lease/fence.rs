//! The deadline a reconcile can fence its own writes with: [`deadline`].

use std::future::Future;

use tokio::sync::watch;
use tokio::time::Instant;

use super::assignment::{Assignment, Holding};

tokio::task_local! {
    /// The shard of the object the current reconcile works on, and where its holding is
    /// published.
    static HELD: Held;
}

/// A reconcile's shard and the replica's published [`Assignment`].
struct Held {
    assignment: watch::Receiver<Assignment>,
    shard: u32,
}

/// Runs `reconcile` with [`deadline`] answering for `shard` by `assignment`.
pub(crate) fn scope<F: Future>(
    assignment: watch::Receiver<Assignment>,
    shard: u32,
    reconcile: F,
) -> impl Future<Output = F::Output> {
    HELD.scope(Held { assignment, shard }, reconcile)
}

/// Until when this replica holds the shard of the object the calling reconcile works on (tokio's
/// clock): the end of its belief, which each renewal of its membership Lease moves forward. A
/// time already past once the shard is lost or given away (the reconcile is then about to be
/// aborted). `None` outside a reconcile of a [`Controller`](crate::controller::Controller) on
/// Leases ([`Controller::leases`](crate::controller::Controller::leases)).
///
/// What it fences: no other replica takes the shard before this deadline (given the clock-rate
/// bound the protocol assumes), so a write that completes before it cannot overlap another
/// replica's work on the object. A write can still land after it: a process stalled between the
/// check and the write (a pause), or a request the network delivers late (a partition that
/// heals delivers what was in flight). What fences those is the API server's resourceVersion
/// precondition, which refuses a write with 409 once anyone wrote the object since the version
/// the reconcile read:
///
/// - fenced: a replace of the object as read (its `metadata.resourceVersion` is the
///   precondition), and a merge patch, strategic merge patch or server-side apply whose body
///   carries `metadata.resourceVersion` (the server checks it as a precondition);
/// - not fenced: a patch or an apply without it, a JSON patch without a `test` of it, a create.
///
/// So the easy path: put the resourceVersion the reconcile was given into the patch.
///
/// ```no_run
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::api::{Api, Patch, PatchParams};
/// use kube::ResourceExt;
/// use workqueue_kube::controller::Action;
/// use workqueue_kube::lease;
///
/// async fn reconcile(cm: Arc<ConfigMap>, api: Arc<Api<ConfigMap>>) -> Result<Action, kube::Error> {
///     let compute = std::time::Duration::from_secs(1);
///     if lease::deadline().is_some_and(|d| d < tokio::time::Instant::now() + compute) {
///         // Not enough time left to finish the write under this replica's holding.
///         return Ok(Action::requeue(compute));
///     }
///     // Fenced: refused with 409 if another replica (or anyone) wrote since this version.
///     let patch = serde_json::json!({
///         "metadata": { "resourceVersion": cm.resource_version() },
///         "data": { "reconciled": "yes" },
///     });
///     api.patch(&cm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
///         .await?;
///     Ok(Action::await_change())
/// }
/// ```
pub fn deadline() -> Option<Instant> {
    HELD.try_with(|held| {
        held.assignment
            .borrow()
            .state(held.shard)
            .holding()
            .map_or_else(Instant::now, Holding::valid_until)
    })
    .ok()
}
