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
//! ([`Lease::priority`]) unless it names another ([`Outcome::with_priority`];
//! in a [`runner`], `Action::requeue(d).with_priority(p)`).
//!
//! ```
//! use workqueue_tokio::{AddOptions, AddStatus, LOW_PRIORITY, WorkQueue};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue: WorkQueue<&'static str> = WorkQueue::new();
//! queue.add_with("initial-list/a", AddOptions::new().priority(LOW_PRIORITY));
//! queue.add_with("initial-list/b", AddOptions::new().priority(LOW_PRIORITY));
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
//!
//! # Stability
//!
//! The public API is what these docs show: the queue, the [`runner`] (with its stream of results,
//! on which `workqueue-kube`'s `Controller` stands) and the [`source`] stages. Nothing else is
//! public.
//!
//! # Feeding the runner
//!
//! A [`Runner`](runner::Runner) reads any number of streams of keys ([`Runner::source`](runner::Runner::source)),
//! shapes them with plain stream stages ([`source::changed`], [`source::keys`]), and gives every
//! reconcile and the error policy one shared `Arc` ([`Runner::with_context`](runner::Runner::with_context)).
//! The README's "Feeding the runner" section is this example:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use futures_util::stream::{self, StreamExt};
//! use tokio_util::sync::CancellationToken;
//! use workqueue_tokio::runner::{Action, Context, Failure, Runner};
//! use workqueue_tokio::source::{Relevant, changed, keys};
//! use workqueue_tokio::{AddOptions, LOW_PRIORITY, WorkQueue};
//!
//! /// What a watch yields (kube-runtime's watcher, or your own).
//! enum Event {
//!     Applied { name: String, generation: u64, owner: Option<String> },
//!     Deleted { name: String },
//! }
//!
//! /// Shared by every reconcile and the error policy: an API client, a cache, a recorder...
//! struct State;
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("API error")]
//! struct ApiError;
//!
//! # fn watch_apps() -> impl futures_util::Stream<Item = Event> + Send + 'static {
//! #     let app = |name: &str, generation| Event::Applied { name: name.into(), generation, owner: None };
//! #     stream::iter([app("default/web", 1), app("default/web", 1), Event::Deleted { name: "default/db".into() }])
//! # }
//! # fn watch_pods() -> impl futures_util::Stream<Item = Event> + Send + 'static {
//! #     stream::iter([Event::Applied { name: "default/web-1".into(), generation: 1, owner: Some("default/web".into()) }])
//! # }
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let (apps, pods) = (watch_apps(), watch_pods());
//! let queue: WorkQueue<String> = WorkQueue::new();
//! let shutdown = CancellationToken::new(); // cancelled on SIGTERM, say
//! // Only a spec change (generation) queues an app, not a status write; a delete frees its memory.
//! let apps = changed(apps, |e: &Event| match e {
//!     Event::Applied { name, generation, .. } => Relevant::Object(name.clone(), *generation),
//!     Event::Deleted { name } => Relevant::Deleted(name.clone()),
//! });
//! let apps = apps.map(|e| match e {
//!     Event::Applied { name, .. } | Event::Deleted { name } => name,
//! });
//! // A pod's event queues the app that owns it.
//! let owners = keys(pods, |e: Event| match e {
//!     Event::Applied { owner, .. } => owner,
//!     Event::Deleted { .. } => None,
//! });
//! // A resync (here of one key), served behind every change.
//! let resync = stream::iter(["default/web".to_string()]).map(|k| (k, AddOptions::new().priority(LOW_PRIORITY)));
//! # tokio::spawn({ let s = shutdown.clone(); async move { tokio::time::sleep(Duration::from_secs(1)).await; s.cancel() } });
//! let report = Runner::with_context(queue, Arc::new(State), |key: String, ctx: Context<State>| async move {
//!     let _state: &State = ctx.data();
//!     println!("reconciling {key}");
//!     Ok::<_, ApiError>(Action::await_change())
//! })
//! // Retry every 30 s, at most 5 times: the runner's failure count sees every failure.
//! .error_policy(|_: &String, _: &Failure<ApiError>, ctx: &Context<State>| {
//!     if ctx.failures_in_a_row() < 5 { Action::requeue(Duration::from_secs(30)) } else { Action::await_change() }
//! })
//! .source("apps", apps)
//! .source("pods", owners)
//! .source("resync", resync)
//! .run(shutdown.clone())
//! .await;
//! # // web (from three sources, de-duplicated) and db; the repeated event was dropped.
//! # assert_eq!((report.processed, report.sources_ended, report.source_items), (2, 3, 4));
//! # }
//! ```
// Feature badges on docs.rs (nightly, `--cfg docsrs`): `doc_cfg` labels items behind a feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod clock;
mod queue;
pub mod runner;
pub mod source;

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
/// use workqueue_tokio::{Outcome, WorkQueue};
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() {
///     let queue: WorkQueue<String> = WorkQueue::new();
///     queue.add("default/web".to_string());
///     let lease = queue.get().await.expect("a key is queued");
///     assert_eq!(lease.as_str(), "default/web");
///     lease.finish(Outcome::forget()); // processed successfully: reset its backoff
/// }
/// ```
///
/// The same type as the blocking queue's lease:
pub use workqueue_core::Lease;
pub use workqueue_core::state::DefaultHashBuilder;
pub use workqueue_core::{
    AddOptions, AddStatus, Builder, Clock, Counts, DrainIncomplete, DrainStop, Instant,
    LOW_PRIORITY, Outcome, panic_message,
};
