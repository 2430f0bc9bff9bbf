//! The async side of the work queue family: a tokio [`WorkQueue`] on the same state machine as
//! the blocking queue, and a controller [`runner`] on top of it.
//!
//! ```
//! use workqueue_tokio::WorkQueue;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue: WorkQueue<&'static str> = WorkQueue::new();
//! queue.add("default/web");
//! let lease = queue.get().await.unwrap();
//! assert_eq!(*lease, "default/web");
//! lease.done();
//! # }
//! ```
//!
//! Priorities: higher is served first, and [`LOW_PRIORITY`] is the convention for keys from an
//! initial list or a resync, so that changes are served before them (controller-runtime's
//! priority queue). A requeue or retry keeps the priority the lease had
//! ([`Lease::priority`]) unless it names another ([`Lease::with_priority`];
//! in a [`runner`], `Action::RequeueAfter(d).with_priority(p)`).
//!
//! ```
//! use workqueue_tokio::{AddOptions, AddStatus, LOW_PRIORITY, WorkQueue};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue: WorkQueue<&'static str> = WorkQueue::new();
//! queue.add_with("initial-list/a", AddOptions::priority(LOW_PRIORITY));
//! queue.add_with("initial-list/b", AddOptions::priority(LOW_PRIORITY));
//! queue.add("changed/c");
//! assert_eq!(queue.add("initial-list/b"), AddStatus::Raised); // an event for it: priority 0
//! let lease = queue.get().await.unwrap();
//! assert_eq!((*lease, lease.priority()), ("changed/c", 0));
//! lease.done();
//! let lease = queue.get().await.unwrap();
//! assert_eq!((*lease, lease.priority()), ("initial-list/b", 0));
//! lease.done();
//! let lease = queue.get().await.unwrap();
//! assert_eq!((*lease, lease.priority()), ("initial-list/a", LOW_PRIORITY));
//! lease.done();
//! # }
//! ```
//!
//! # One crate for an async controller
//!
//! This crate re-exports what its users name from the rest of the family: the queue's
//! [`Builder`] and [`AddOptions`], [`AddStatus`], [`Lease`] and [`Outcome`], the drain results,
//! the rate limiters as [`ratelimit`], and tokio-util's [`CancellationToken`] that stops a
//! [`runner`]. A controller needs `workqueue-tokio` and `tokio`:
//!
//! ```
//! use std::time::Duration;
//! use workqueue_tokio::WorkQueue;
//! use workqueue_tokio::ratelimit::ExponentialFailure;
//!
//! let queue: WorkQueue<String> = WorkQueue::builder()
//!     .name("deployments")
//!     .rate_limiter(ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(60)))
//!     .build();
//! assert_eq!(queue.name(), Some("deployments"));
//! ```
//!
//! # How it is built on `workqueue-core`
//!
//! The async queue is the blocking queue's driver core (the state machine behind a lock, the
//! clock, the limiter, the leases) with tokio's `Notify` and timers for waiting. That core lives
//! in `workqueue-core`, in a module that is hidden and explicitly unstable (`__private`), so that
//! both queues share one implementation without promising it to anyone else. This crate
//! therefore depends on an exact version of `workqueue-core` (`=`): the two are released together.
// Feature badges on docs.rs (nightly, `--cfg docsrs`): `doc_cfg` labels items behind a feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod clock;
mod queue;
pub mod runner;

pub use clock::TokioClock;
pub use queue::{Tokio, WorkQueue};
// What users of the async queue name, so that they need no other crate of the family.
/// The rate limiters ([`workqueue_ratelimit`], re-exported): pass one to
/// [`Builder::rate_limiter`].
pub use workqueue_core::ratelimit;

/// This crate's README, whose examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct Readme;

/// The workspace's README (not shipped with the crate), whose examples run as doctests here:
/// this crate's dependencies cover them all.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadme;
pub use tokio_util::sync::CancellationToken;
/// With the async queue:
///
/// ```
/// use workqueue_tokio::WorkQueue;
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() {
///     let queue: WorkQueue<String> = WorkQueue::new();
///     queue.add("default/web".to_string());
///     let lease = queue.get().await.expect("a key is queued");
///     assert_eq!(lease.as_str(), "default/web");
///     lease.forget(); // processed successfully: reset its backoff
/// }
/// ```
///
/// The same type as the blocking queue's lease:
pub use workqueue_core::Lease;
pub use workqueue_core::state::DefaultHashBuilder;
pub use workqueue_core::{
    AddOptions, AddStatus, Builder, Clock, Counts, DrainIncomplete, DrainStop, Instant,
    LOW_PRIORITY, Outcome,
};
