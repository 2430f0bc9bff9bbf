//! A Kubernetes-style work queue: de-duplicating, delaying, rate-limited, with leases.
//!
//! The crate has three layers:
//! - [`state::QueueState`]: the queue's semantics as a pure state machine (no locks, no threads,
//!   no clock reads), for any runtime to drive;
//! - [`Clock`]s: [`SystemClock`] for real time, [`ManualClock`] for tests on virtual time;
//! - [`WorkQueue`]: the blocking, thread-safe queue built on both, which hands out [`Lease`]s
//!   that guarantee every key is finished exactly once.
//!
//! Rate limiters come from [`workqueue_ratelimit`], re-exported as [`ratelimit`].
//!
//! ```
//! use std::time::Duration;
//! use workqueue_core::{ManualClock, WorkQueue};
//!
//! let clock = ManualClock::new();
//! let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
//! queue.add("default/web");
//! let lease = queue.get().unwrap();
//! lease.retry(); // failed: back off (5 ms on the first failure with the default limiter)
//! assert!(queue.try_get().is_none());
//! clock.advance(Duration::from_millis(5));
//! let lease = queue.get().unwrap();
//! assert_eq!(*lease, "default/web");
//! lease.forget(); // succeeded: reset the backoff
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod clock;
pub mod driver;
mod lease;
pub mod metrics;
mod outcome;
pub mod parallelize;
mod queue;
pub mod state;
mod sync;

#[cfg(all(test, workqueue_loom))]
mod loom_tests;

pub use clock::{Clock, ClockWaker, Instant, ManualClock, SystemClock};
pub use lease::{Lease, LeaseOwner};
pub use outcome::Outcome;
pub use parallelize::{panic_message, parallelize};
pub use queue::{Blocking, BuildQueue, Builder, Condvars, DrainIncomplete, DrainStop, WorkQueue};
pub use workqueue_ratelimit as ratelimit;
