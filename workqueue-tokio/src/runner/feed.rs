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
use super::engine::Engine;
use super::reasons::source_bit;
use crate::AddOptions;
use crate::source::{BATCH, SourceItem};

/// A source's item once its user type is gone: a key and its options, or an error's message.
type Item<T> = Result<(T, AddOptions), String>;

/// A named stream of keys given to [`Runner::source`](super::Runner::source).
pub(crate) struct Source<T> {
    name: Arc<str>,
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

impl<T> Source<T> {
    /// The source's name.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
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

/// Feeds the queue from the source at `index` until it ends or panics, or the run stops
/// (`stop`, cancelled when the run ends for any reason, or the engine's intake, at shutdown).
pub(crate) async fn feed<T, E, C, S>(
    engine: Arc<Engine<T, E, C, S>>,
    stop: CancellationToken,
    index: usize,
    mut source: Source<T>,
) where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    E: fmt::Debug + Send + 'static,
    C: Send + Sync + 'static,
{
    let name = source.name.clone();
    let mut batch = Vec::new();
    loop {
        let read = tokio::select! {
            biased;
            () = engine.intake().cancelled() => return,
            () = stop.cancelled() => return,
            read = read_batch(&mut source.stream, &mut batch) => read,
        };
        add(&engine, index, &name, &mut batch);
        match read {
            Read::More => {}
            Read::Ended => {
                engine.counters().source_ended(false);
                tracing::info!(source = %name, "a source ended; the runner goes on without it");
                return;
            }
            Read::Panicked(message) => {
                engine.counters().source_ended(true);
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
fn add<T, E, C, S>(engine: &Engine<T, E, C, S>, index: usize, name: &str, batch: &mut Vec<Item<T>>)
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    E: fmt::Debug + Send + 'static,
    C: Send + Sync + 'static,
{
    let mut keys = Vec::with_capacity(batch.len());
    for item in batch.drain(..) {
        match item {
            // A key of another owner is not queued (the rule catches its own panics).
            Ok((key, _)) if !engine.belongs(&key) => {}
            Ok(key) => keys.push(key),
            Err(error) => {
                engine.counters().source_error();
                tracing::warn!(source = %name, %error, "a source yielded an error; skipped");
            }
        }
    }
    if keys.is_empty() {
        return;
    }
    engine.counters().source_items(keys.len());
    // The reasons first, so the lease that an add causes finds its reason.
    if let Err(message) = catch(|| {
        engine
            .reasons()
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
                engine.queue().add_batch(run);
            } else {
                engine.queue().add_batch_with(run, opts);
            }
        });
        if let Err(message) = added {
            tracing::error!(source = %name, panic = %message, "adding a key panicked; that key is lost");
        }
    }
}
