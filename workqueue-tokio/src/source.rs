//! What feeds a [`Runner`](crate::runner::Runner): streams of keys, and two stream stages to build
//! them from streams of events.
//!
//! A source is any [`Stream`] whose items are a [`SourceItem`]: a key, a key with
//! [`AddOptions`], or a `Result` of either. The stages are plain functions from a stream to a
//! stream, no framework:
//!
//! - [`changed`] drops an event whose relevant part did not change since the last event for its
//!   key (a controller's own status writes, a resync that changed nothing);
//! - [`keys`] maps one event to any number of keys (an owned object to its owner, one config
//!   object to every object that uses it).
//!
//! ```
//! use futures_util::stream::{self, StreamExt};
//! use workqueue_tokio::source::{Relevant, changed, keys};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Events (name, replicas, labels): the label change and the repeat are not relevant.
//! let events = stream::iter([("web", 1, "a"), ("web", 1, "b"), ("web", 2, "b"), ("web", 2, "b")]);
//! let relevant = changed(events, |&(name, replicas, _)| Relevant::Object(name, replicas));
//! // Each event queues its object and a dashboard that shows it.
//! let keys = keys(relevant, |(name, _, _)| [name.to_string(), format!("dashboards/{name}")]);
//! assert_eq!(
//!     keys.collect::<Vec<_>>().await,
//!     ["web", "dashboards/web", "web", "dashboards/web"],
//! );
//! # }
//! ```
//!
//! # Backpressure
//!
//! There is none, by design, and none is needed. The runner reads every source as fast as it
//! yields, and adds what it read to the queue at once (what is ready, in batches of up to
//! 1,024 items). The queue is unbounded but de-duplicating: a key that is already queued is not
//! queued twice, and a key that is being reconciled is marked to run once more afterwards. So
//! the queue holds at most one entry per distinct key, however fast a source outpaces the
//! workers: a burst of a million events for a thousand objects queues a thousand keys, and each
//! is reconciled once or twice, not a million times. Events are conflated, not buffered, which
//! is what a level-triggered reconcile wants (it reads the current state, not the event). A
//! producer upstream of a bounded channel is therefore never held back by slow reconciles; the
//! memory a source costs is the queue's per-key entry, plus at most one batch in flight.
//!
//! What stays unbounded is what the keys themselves are: a source that invents new keys without
//! end (a key per event instead of per object) grows the queue without end.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::hash::Hash;

use futures_util::future::ready;
use futures_util::stream::{Stream, StreamExt};

use crate::AddOptions;

/// The most items a runner reads from one source before it adds them to the queue in one batch
/// (it adds sooner when the source has nothing more ready).
pub(crate) const BATCH: usize = 1024;

/// An item a source may yield: a key, a key with [`AddOptions`], or a `Result` of either.
///
/// An `Err` is a recoverable error: the runner logs it (a `warn` event naming the source),
/// counts it in [`Report::source_errors`](crate::runner::Report::source_errors), skips it and
/// goes on reading. No error a source yields is fatal to the runner: a source that cannot go on
/// ends its stream (reported in [`Report::sources_ended`](crate::runner::Report::sources_ended)
/// and as an `info` event), and a controller that should stop when a source fails says so with
/// the shutdown token; see the example at [`Runner::source`](crate::runner::Runner::source).
/// (A watch stream's errors are the common case, and they are recoverable: the watch retries
/// and relists on its own.)
pub trait SourceItem<T>: Send + 'static {
    /// The error a source may yield instead of a key.
    type Error: fmt::Display;

    /// The key to add and how, or the error to log.
    fn into_add(self) -> Result<(T, AddOptions), Self::Error>;
}

impl<T: Send + 'static> SourceItem<T> for T {
    type Error = Infallible;

    fn into_add(self) -> Result<(T, AddOptions), Infallible> {
        Ok((self, AddOptions::default()))
    }
}

impl<T: Send + 'static> SourceItem<T> for (T, AddOptions) {
    type Error = Infallible;

    fn into_add(self) -> Result<(T, AddOptions), Infallible> {
        Ok(self)
    }
}

impl<T: Send + 'static, E: fmt::Display + Send + 'static> SourceItem<T> for Result<T, E> {
    type Error = E;

    fn into_add(self) -> Result<(T, AddOptions), E> {
        self.map(|key| (key, AddOptions::default()))
    }
}

impl<T: Send + 'static, E: fmt::Display + Send + 'static> SourceItem<T>
    for Result<(T, AddOptions), E>
{
    type Error = E;

    fn into_add(self) -> Result<(T, AddOptions), E> {
        self
    }
}

/// What [`changed`] needs to know about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relevant<K, V> {
    /// The object `K` exists, and `V` is the part of it that matters (a generation, a spec's
    /// hash, an annotation). The event is passed on unless `V` equals the last `V` passed on for
    /// `K`.
    Object(K, V),
    /// The object `K` was deleted: the event is passed on and `K` is forgotten, so memory follows
    /// the live objects.
    Deleted(K),
    /// The event is not about one object (an error, a "relist started" marker): passed on,
    /// nothing remembered.
    Other,
}

/// Drops each event whose relevant part did not change since the last event passed on for its
/// key; passes the rest on in order.
///
/// `relevant` says, for each event, which object it is about and what matters of it
/// ([`Relevant`]). The first event for a key is always passed on. Memory: one `(K, V)` per object
/// that exists, since a deletion forgets its key; an object whose deletion the stream never
/// reports (a watch that missed it) stays until the stream ends. Keep `V` small: a generation, or
/// a hash of the part that matters.
///
/// `relevant` is user code: if it panics, the panic propagates to whoever polls the stream (a
/// [`Runner`](crate::runner::Runner) ends that source and reports it).
///
/// ```
/// use futures_util::stream::{self, StreamExt};
/// use workqueue_tokio::source::{Relevant, changed};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// enum Event { Applied(&'static str, u64), Deleted(&'static str) }
/// let events = stream::iter([
///     Event::Applied("a", 1),
///     Event::Applied("a", 1), // no change: dropped
///     Event::Deleted("a"),
///     Event::Applied("a", 1), // re-created: a new object
/// ]);
/// let passed = changed(events, |e| match *e {
///     Event::Applied(name, generation) => Relevant::Object(name, generation),
///     Event::Deleted(name) => Relevant::Deleted(name),
/// });
/// assert_eq!(passed.count().await, 3);
/// # }
/// ```
pub fn changed<St, K, V, F>(stream: St, mut relevant: F) -> impl Stream<Item = St::Item>
where
    St: Stream,
    K: Hash + Eq,
    V: PartialEq,
    F: FnMut(&St::Item) -> Relevant<K, V>,
{
    // Invariant: `last` holds, for each key whose last event passed on was `Object`, the `V` of
    // that event, and nothing else.
    let mut last: HashMap<K, V> = HashMap::new();
    stream.filter(move |event| {
        let pass = match relevant(event) {
            Relevant::Object(key, value) => match last.get_mut(&key) {
                Some(seen) if *seen == value => false,
                Some(seen) => {
                    *seen = value;
                    true
                }
                None => {
                    last.insert(key, value);
                    true
                }
            },
            Relevant::Deleted(key) => {
                last.remove(&key);
                true
            }
            Relevant::Other => true,
        };
        ready(pass)
    })
}

/// Maps each event to the keys it should queue, in order: none, one, or several (an owned
/// object to its owner, one config object to every object that uses it).
///
/// ```
/// use futures_util::stream::{self, StreamExt};
/// use workqueue_tokio::source::keys;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // A Deployment event queues the ConfigMap that owns it, if any.
/// let deployments = stream::iter([("web", Some("cm/web")), ("orphan", None)]);
/// let owners = keys(deployments, |(_, owner)| owner);
/// assert_eq!(owners.collect::<Vec<_>>().await, ["cm/web"]);
/// # }
/// ```
pub fn keys<St, I, F>(stream: St, mut to_keys: F) -> impl Stream<Item = I::Item>
where
    St: Stream,
    I: IntoIterator,
    F: FnMut(St::Item) -> I,
{
    stream.flat_map(move |event| futures_util::stream::iter(to_keys(event)))
}
