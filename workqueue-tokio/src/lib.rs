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
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod clock;
mod queue;
pub mod runner;

pub use clock::TokioClock;
pub use queue::{Notifies, Tokio, WorkQueue};
pub use workqueue_core::{AddOptions, LOW_PRIORITY, Lease, Outcome};
