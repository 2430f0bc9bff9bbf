//! What a [`Controller`](super::Controller)'s stream reports besides successful reconciles.

use kube::core::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::store::WriterDropped;

/// An item of a controller's stream that is not a successful reconcile: kube-runtime's variants,
/// so code that matches on them compiles unchanged.
#[derive(Debug, thiserror::Error)]
pub enum Error<ReconcilerErr: 'static, QueueErr: 'static> {
    /// A key was due for an object that is not in the controller's store (it was deleted, or a
    /// related object named an owner that does not exist). It is not reconciled: clean-up goes
    /// through finalizers. Its key is forgotten until the object is seen again.
    #[error("tried to reconcile object {0} that was not found in local store")]
    ObjectNotFound(Box<ObjectRef<DynamicObject>>),

    /// The reconcile returned this error; the error policy's action was applied.
    #[error("reconciler for object {1} failed: {0}")]
    ReconcilerFailed(#[source] ReconcilerErr, Box<ObjectRef<DynamicObject>>),

    /// A watch (of the main resource, an owned or a watched one) yielded this error. The watch
    /// retries on its own, with its backoff; the controller goes on.
    #[error("event queue error: {0}")]
    QueueError(#[source] QueueErr),

    /// The runner failed: the store never became ready, a reconcile panicked (its key was
    /// retried with the rate limiter's backoff), a `watches` mapper panicked, or the Leases
    /// could not be used.
    #[error("runner error: {0}")]
    RunnerError(#[source] RunnerError),
}

/// What went wrong in the controller's runner rather than in a reconcile: kube-runtime's
/// `Readiness`, and what the runner adds (a reconcile's or a mapper's panic, the Lease
/// configuration).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    /// The store's writer was dropped before the store became ready (its first list): no
    /// reconcile could ever start, and the stream ends after this item (kube-runtime's
    /// `RunnerError::Readiness`).
    #[error("readiness gate failed to become ready: {0}")]
    Readiness(#[source] WriterDropped),
    /// The reconcile panicked; its key is retried with backoff, and the controller goes on.
    #[error("reconciler for object {object} panicked: {message}")]
    ReconcilerPanicked {
        /// The object.
        object: Box<ObjectRef<DynamicObject>>,
        /// The panic's message.
        message: String,
    },
    /// A `watches` mapper (of [`Controller::watches`](super::Controller::watches) or its stream
    /// variants) panicked on this related object: the keys it would have returned were not
    /// queued, and the next change of the object calls it again; the controller goes on.
    #[error("a watches mapper panicked on {object}: {message}")]
    MapperPanicked {
        /// The related object the mapper was given.
        object: Box<ObjectRef<DynamicObject>>,
        /// The panic's message.
        message: String,
    },
    /// The Lease configuration ([`Controller::leases`](super::Controller::leases)) is invalid:
    /// the controller did not start.
    #[error("invalid Lease configuration: {0}")]
    Leases(#[source] crate::lease::ConfigError),
    /// A request of the Lease protocol failed: the API server refused it (a missing RBAC
    /// permission is named in the message; the README lists the Lease verbs a controller
    /// needs) or did not answer in time. The protocol retries on its own, and a shard whose
    /// Lease cannot be renewed ends at its deadline; the controller goes on. Reported once for
    /// each verb until a request with that verb succeeds again.
    #[error("a Lease request failed ({verb} {lease}): {message}")]
    LeaseRequestFailed {
        /// The request's verb, as RBAC names it: `create`, `update`, `delete`, `list` or
        /// `watch`.
        verb: &'static str,
        /// The Lease's name, or for `list` and `watch` the label selector.
        lease: String,
        /// What the API server (or the client) said.
        message: String,
    },
    /// The Lease watch did not show a renewal the API server had stored within the retry
    /// period (a watch that stalls with its connection open): it was replaced by a new list and
    /// watch, and the protocol goes on from what the list shows. Reported once until a watch
    /// delivers again. If it repeats, look for what holds the watch's connection (a proxy, a
    /// load balancer, an overloaded API server).
    #[error("the Lease watch ({selector}) was stale: it was replaced by a new list and watch")]
    LeaseWatchStale {
        /// The label selector of the Lease watch.
        selector: String,
    },
    /// Renewals of this replica's membership Lease were stored by the API server but not read
    /// back within the renew deadline (its reads fail, or come back later than the renew
    /// deadline): this replica could not believe it holds anything, so it stopped renewing,
    /// and another replica takes its shards over once its Lease expires. It joins again under
    /// a new instance once it reads its membership Lease fenced. Look at this replica's
    /// connection to the API server and at the `list` and `watch` permissions on Leases.
    #[error(
        "this replica's Lease renewals were not read back within the renew deadline: it stepped down so that another replica takes its shards"
    )]
    LeaseSteppedDown,
    /// A member's Lease carries a lease duration unlike this replica's: replicas run with
    /// other `LeaseConfig` durations (a rollout that changes them), or someone edited
    /// `leaseDurationSeconds`. Safe: expiry is judged by the longer of the two, so a replica
    /// with the shorter duration waits longer to take over. Give every replica the same
    /// durations. Reported once for each holder.
    #[error(
        "the Lease of member {holder} carries a lease duration of {lease_duration:?}, this replica's is {ours:?}"
    )]
    LeaseTimingMismatch {
        /// The member's holder (`{identity}_{instance}`).
        holder: String,
        /// The lease duration its Lease carries.
        lease_duration: std::time::Duration,
        /// This replica's lease duration.
        ours: std::time::Duration,
    },
    /// [`Controller::leases`](super::Controller::leases) on a controller made without an `Api`
    /// (`for_stream`): the Leases need a client. Use `Controller::new`.
    #[error("a controller on Leases needs a client: build it with Controller::new")]
    LeasesNeedAClient,
    /// [`Controller::divide_caches`](super::Controller::divide_caches) on a controller that
    /// cannot divide its cache: one without [`Controller::leases`](super::Controller::leases)
    /// (there are no shards to divide by), or one made from a stream (`for_stream` and the
    /// like: its store is filled elsewhere). The controller did not start.
    #[error(
        "divided caches need a controller made with Controller::new and run on Leases (Controller::leases)"
    )]
    DividedCachesNeedLeases,
    /// Writing an object's shard label failed (divided caches): the API server refused the
    /// patch (a missing `patch` permission on the main kind is named in the message) or did
    /// not answer. The object is not reconciled until it carries its label; the patch is
    /// retried with a backoff. Reported once until a patch succeeds again.
    #[error("labelling {} with its shard failed: {message}", match namespace { Some(ns) => format!("{ns}/{name}"), None => name.clone() })]
    LabelFailed {
        /// The object's namespace (`None`: cluster-scoped).
        namespace: Option<String>,
        /// The object's name.
        name: String,
        /// What the API server (or the client) said.
        message: String,
    },
}
