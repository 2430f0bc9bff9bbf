//! The deadline a reconcile can fence its own writes with: [`deadline`].

use std::future::Future;

use tokio::sync::watch;
use tokio::time::Instant;

use super::assignment::Assignment;

tokio::task_local! {
    /// The shard of the object the current reconcile works on, and where its holding is
    /// published.
    static HELD: Held;
}

/// A reconcile's shard and the replica's published [`Assignment`].
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) assignment: watch::Receiver<Assignment>,
    pub(crate) shard: u32,
}

/// Runs `reconcile` with [`deadline`] answering for `held`.
pub(crate) fn scope<F: Future>(held: Held, reconcile: F) -> impl Future<Output = F::Output> {
    HELD.scope(held, reconcile)
}

/// Until when this replica holds the shard of the object the calling reconcile works on (tokio's
/// clock): the end of its belief, which each renewal of its membership Lease moves forward. A
/// time already past once the shard is lost or given away (the reconcile is then about to be
/// aborted). `None` outside a reconcile of a [`Controller`](crate::controller::Controller) on
/// Leases ([`Controller::leases`](crate::controller::Controller::leases)).
///
/// What it fences: no other replica takes the shard before this deadline (given the clock-rate
/// bound the protocol assumes), so a write that completes before it cannot overlap another
/// replica's work on the object. A process stalled between the check and the write (a pause, a
/// slow network) can still write after it: for that, a write with a resourceVersion precondition
/// (a replace of the object as read) is refused with 409 once another replica wrote, while merge
/// and JSON patches without one, server-side apply and creates are not fenced by anything.
///
/// ```no_run
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use workqueue_kube::controller::Action;
/// use workqueue_kube::lease;
///
/// async fn reconcile(cm: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, kube::Error> {
///     let compute = std::time::Duration::from_secs(1);
///     if lease::deadline().is_some_and(|d| d < tokio::time::Instant::now() + compute) {
///         // Not enough time left to finish the write under this replica's holding.
///         return Ok(Action::requeue(compute));
///     }
///     // ... a replace with the resourceVersion read ...
///     Ok(Action::await_change())
/// }
/// ```
pub fn deadline() -> Option<Instant> {
    HELD.try_with(|held| {
        held.assignment
            .borrow()
            .state(held.shard)
            .holding()
            .map_or_else(Instant::now, |holding| holding.valid_until)
    })
    .ok()
}
