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
//! use workqueue_core::{ManualClock, Outcome, WorkQueue};
//!
//! let clock = ManualClock::new();
//! let queue: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
//! queue.add("default/web");
//! let lease = queue.get().unwrap();
//! lease.finish(Outcome::retry()); // failed: back off (5 ms on the first failure with the default limiter)
//! assert!(queue.try_get().is_none());
//! clock.advance(Duration::from_millis(5));
//! let lease = queue.get().unwrap();
//! assert_eq!(*lease, "default/web");
//! lease.finish(Outcome::forget()); // succeeded: reset the backoff
//! ```
//!
//! # User code that panics
//!
//! User code runs inside the queue: a key's `Clone`, `Hash`, `Eq` and `Drop`, the rate limiter,
//! the clock, a `metrics` recorder, the iterator given to a batch add. The rule: user code runs
//! outside the queue's lock, or at a point where a panic leaves the state exactly as it was before
//! the call (keys are cloned before they are marked, the index is rebuilt completely before it
//! replaces the old one, wake-ups are sent from a guard's `Drop`). A panic propagates to the
//! caller of the operation; the queue stays usable, with every invariant intact, and no key is
//! stranded. Place by place:
//!
//! | where | user code | after a panic |
//! |---|---|---|
//! | `add`, `add_ref`, `add_after` | `Hash`, `Eq`; `From<&Q>` (`add_ref`) | the key is not added; keys that came due were promoted |
//! | index growth (in an add) | `Hash` of every key | the old index is kept; the key is not added |
//! | `add_batch` | the iterator, `Hash`, `Eq` | the keys before the panic are added, and waiting getters are woken for them |
//! | `add_rate_limited` | the limiter's `when` | nothing changed |
//! | `get`, `try_get`, `get_timeout` | `Clone`; the recorder | the key stays queued at the head (keys that came due, or became overdue with aging, were moved as any get moves them) |
//! | compaction (in a get, once few keys are live and settled) | `Hash` of every live key | nothing is handed out; the queue is as it was (keys that came due, or became overdue, were moved) |
//! | `try_get_batch` | `Clone`; the recorder | every key taken goes back to the head, in order |
//! | a lease ends | the limiter, the clock | the key is finished; a `Retry` is not re-added (no delay) |
//! | a lease ends | the recorder, the released key's `Drop` | the key is finished, as asked |
//! | a lease is dropped while the thread unwinds | any of the above | as above, and the panic is swallowed (a second panic would abort) |
//! | any operation | the recorder | the operation is done and waiters are woken; only metrics are lost |
//! | `forget`, `num_requeues` | the limiter | nothing changed in the queue |
//!
//! A named queue calls the recorder when it sends its batched metrics (every 64 operations, at a
//! refresh, at shutdown; see [`metrics`]), so "the recorder" above is
//! called by the operation that sends the batch, and by retries and rate-limited adds.
//!
//! The freeing of a key (when a lease ends, at shutdown) calls no user code: a key whose index
//! bucket does not fit its slot (only in tables of more than 2^27 buckets) has its hash stored.
//! [`state::QueueState`] itself follows the same rule; the reference model in `workqueue-model`
//! states it (`Model::interrupted`), and the differential property test and fuzz target inject
//! panics at chosen calls and check the state against the model after each.
//!
//! # Stability
//!
//! The public API is what these docs show: the queue, its [`Builder`] and [`Lease`]s, the
//! clocks, the rate limiters, [`parallelize()`], the metric names, and [`state::QueueState`] with
//! its ticket and result types for a driver of your own.
//!
//! The crate also has one hidden module, `__private`: the unstable seam between the crates of
//! this workspace. It is public only because those crates need it, is not covered by semver, and
//! `workqueue-tokio` depends on an exact version of this crate for that reason. It holds:
//! - the driver core that `workqueue-tokio` builds its queue on (`QueueCore` and its
//!   configuration, `Notifier`, `Locked`, `Drain`), the trait a [`Builder`] builds a queue
//!   through (`BuildQueue`, with `Blocking`, the default builder's marker), and the macro that
//!   writes the operations both queues share (`queue_handle_methods!`, also exported at the
//!   crate root as `__queue_handle_methods!`, as every exported macro is);
//! - `consult_limiter`, the limiter half of an [`Outcome`];
//! - for the workspace's tests, fuzz targets and reference model: `StateTesting`, the
//!   introspection and test switches of a [`state::QueueState`], with `finished_flags` and
//!   `COMPACT_MIN`; `registered_wakers`, a [`ManualClock`]'s count of registered queues;
//!   `refreshed_queues`, the metrics refresher's count of queues; and `FLUSH_EVERY`, the
//!   operations a named queue batches its metrics over.
// Feature badges on docs.rs (nightly, `--cfg docsrs`): `doc_cfg` labels items behind a feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod clock;
mod drain;
mod driver;
mod lease;
pub mod metrics;
mod options;
mod outcome;
mod panics;
mod parallelize;
mod queue;
pub mod state;
mod sync;

#[cfg(all(test, workqueue_loom))]
mod loom_tests;

pub use clock::{Clock, ClockWaker, Instant, ManualClock, SystemClock};
pub use drain::{DrainIncomplete, DrainStop};
pub use lease::Lease;
pub use options::{AddOptions, LOW_PRIORITY};
pub use outcome::Outcome;
pub use panics::panic_message;
pub use parallelize::{ParallelizeError, Parallelized, parallelize};
pub use queue::{Builder, WorkQueue};
pub use state::{AddStatus, Counts};
pub use workqueue_ratelimit as ratelimit;

/// The unstable seam between the crates of this workspace (see the crate docs' Stability
/// section). **Not a stable API**: no semver promise covers anything in here, and it may change in
/// any release.
///
/// Both queues share everything but their waiting: [`QueueCore`](__private::QueueCore) holds the
/// [`QueueState`](state::QueueState) behind a lock, reads the clock, calls the rate limiter
/// outside the lock and hands out [`Lease`]s; a driver supplies a
/// [`Notifier`](__private::Notifier) (how it wakes waiters) and its own `get` and drain loops.
/// `workqueue-tokio` is such a driver, in another crate, so these items must be `pub`; they are
/// gathered here, hidden from the docs and left out of the public-API snapshot (`api/`), rather
/// than promised.
///
/// A driver for another runtime should build on the stable [`state::QueueState`] instead, with
/// its own lease type (as `workqueue-model` does), or ask for a stable seam.
#[doc(hidden)]
pub mod __private {
    pub use crate::__queue_handle_methods as queue_handle_methods;
    pub use crate::clock::registered_wakers;
    pub use crate::driver::{CoreConfig, Drain, GroupFn, Locked, Notifier, OutageHook, QueueCore};
    #[cfg(feature = "metrics")]
    pub use crate::metrics::emit::refreshed_queues;
    pub use crate::metrics::tuning::FLUSH_EVERY;
    pub use crate::outcome::consult_limiter;
    pub use crate::queue::Blocking;
    pub use crate::queue::BuildQueue;
    pub use crate::state::seam::{COMPACT_MIN, StateTesting, finished_flags};
}

/// This crate's README, whose examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct Readme;
