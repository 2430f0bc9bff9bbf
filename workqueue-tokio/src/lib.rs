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
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod clock;
mod queue;
pub mod runner;
pub mod source;

pub use clock::TokioClock;
pub use queue::{Notifies, Tokio, WorkQueue};
pub use workqueue_core::state::AddStatus;
pub use workqueue_core::{AddOptions, LOW_PRIORITY, Lease, Outcome};
