//! Feeding the queue from the runner's sources: one task per source reads what is ready, in
//! batches, and adds it through the queue's batch add.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use futures_util::stream::{BoxStream, Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::catch;
use super::engine::{Belongs, belongs};
use super::reasons::{Reasons, source_bit};
use super::report::Counters;
use crate::source::{BATCH, SourceItem};
use crate::{AddOptions, WorkQueue};

/// A source's item once its user type is gone: a key and its options, or an error's message.
type Item<T> = Result<(T, AddOptions), String>;

/// A named stream of keys given to [`Runner::source`](super::Runner::source).
pub(crate) struct Source<T> {
    pub(crate) name: Arc<str>,
    stream: BoxStream<'static, Item<T>>,
}

impl<T: Send + 'static> Source<T> {
    /// A source named `name` (in logs, reasons and metrics) reading `stream`.
    pub(crate) fn new<St>(name: &str, stream: St) -> Self
    where
        St: Stream + Send + 'static,
        St::Item: SourceItem<T>,
    {
        Source {
            name: Arc::from(name),
            // An error is formatted here, inside the poll the feeder guards: a `Display` that
            // panics is a panicking source.
            stream: stream
                .map(|item| item.into_add().map_err(|e| e.to_string()))
                .boxed(),
        }
    }
}

impl<T> fmt::Debug for Source<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How reading a batch ended.
enum Read {
    /// The source may have more.
    More,
    /// The source's stream ended.
    Ended,
    /// Polling the source panicked, with this message.
    Panicked(String),
}

/// Reads into `batch` what the stream has ready, up to [`BATCH`] items; waits for the first.
/// Cancel-safe: it returns as soon as it holds an item, so dropping it while it waits loses
/// nothing.
async fn read_batch<T>(stream: &mut BoxStream<'static, Item<T>>, batch: &mut Vec<Item<T>>) -> Read {
    std::future::poll_fn(|cx| {
        loop {
            // A panicking stream is not polled again (its state is unknown): it is ended, and
            // what it yielded before is kept.
            let polled = catch(|| Pin::new(&mut *stream).poll_next(cx));
            match polled {
                Ok(Poll::Ready(Some(item))) => {
                    batch.push(item);
                    if batch.len() >= BATCH {
                        return Poll::Ready(Read::More);
                    }
                }
                Ok(Poll::Ready(None)) => return Poll::Ready(Read::Ended),
                Err(message) => return Poll::Ready(Read::Panicked(message)),
                Ok(Poll::Pending) if batch.is_empty() => return Poll::Pending,
                Ok(Poll::Pending) => return Poll::Ready(Read::More),
            }
        }
    })
    .await
}

/// What a feeder needs of the runner.
pub(crate) struct Feeder<T, S> {
    pub(crate) queue: WorkQueue<T, S>,
    pub(crate) reasons: Arc<Reasons<T>>,
    pub(crate) counters: Arc<Counters>,
    /// Intake: cancelled at shutdown, when the runner stops reading its sources.
    pub(crate) intake: CancellationToken,
    /// Cancelled when the run ends for any reason.
    pub(crate) stop: CancellationToken,
    /// The runner's belongs rule: a key that does not belong is not queued.
    pub(crate) belongs: Option<Arc<Belongs<T>>>,
}

impl<T, S> Feeder<T, S>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Feeds the queue from the source at `index` until it ends or panics, or the run stops.
    pub(crate) async fn feed(self: Arc<Self>, index: usize, mut source: Source<T>) {
        let name = source.name.clone();
        let mut batch = Vec::new();
        loop {
            let read = tokio::select! {
                biased;
                () = self.intake.cancelled() => return,
                () = self.stop.cancelled() => return,
                read = read_batch(&mut source.stream, &mut batch) => read,
            };
            self.add(index, &name, &mut batch);
            match read {
                Read::More => {}
                Read::Ended => {
                    self.counters.source_ended(false);
                    tracing::info!(source = %name, "a source ended; the runner goes on without it");
                    return;
                }
                Read::Panicked(message) => {
                    self.counters.source_ended(true);
                    tracing::error!(
                        source = %name,
                        panic = %message,
                        "a source panicked; it is ended, the runner goes on without it"
                    );
                    return;
                }
            }
            // A source that is always ready must not starve the workers on this runtime.
            tokio::task::coop::consume_budget().await;
        }
    }

    /// Adds a batch to the queue: errors are logged and skipped, runs of keys with equal options
    /// go in one batch add each. Empties `batch`. Never panics: a key whose `Hash`, `Eq` or
    /// `Clone` panics is lost, with a log; the keys after it are still added.
    fn add(&self, index: usize, name: &str, batch: &mut Vec<Item<T>>) {
        let mut keys = Vec::with_capacity(batch.len());
        for item in batch.drain(..) {
            match item {
                // A key of another owner is not queued (the rule catches its own panics).
                Ok((key, _)) if self.belongs.as_ref().is_some_and(|r| !belongs(&**r, &key)) => {}
                Ok(key) => keys.push(key),
                Err(error) => {
                    self.counters.source_error();
                    tracing::warn!(source = %name, %error, "a source yielded an error; skipped");
                }
            }
        }
        if keys.is_empty() {
            return;
        }
        self.counters.source_items(keys.len());
        // The reasons first, so the lease that an add causes finds its reason.
        if let Err(message) = catch(|| {
            self.reasons
                .mark(keys.iter().map(|(k, _)| k), source_bit(index))
        }) {
            tracing::error!(source = %name, panic = %message, "a key panicked while its reason was recorded");
        }
        let mut keys = keys.into_iter().peekable();
        while let Some(&(_, opts)) = keys.peek() {
            // `run` borrows `keys`: keys after one that panics stay there for the next round.
            let run = std::iter::from_fn(|| keys.next_if(|(_, o)| *o == opts)).map(|(k, _)| k);
            let added = catch(|| {
                if opts == AddOptions::default() {
                    self.queue.add_batch(run);
                } else {
                    self.queue.add_batch_with(run, opts);
                }
            });
            if let Err(message) = added {
                tracing::error!(source = %name, panic = %message, "adding a key panicked; that key is lost");
            }
        }
    }
}
