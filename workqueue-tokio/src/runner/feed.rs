//! Feeding the queue from the runner's sources. The dispatcher reads them (see
//! [`super::dispatch`]) between its other steps, as kube-runtime's controller reads its watches
//! on the task that polls it: whatever a source decodes, and whatever a store it fills keeps,
//! is allocated on the task that runs the runner. Each read takes what every source has ready
//! (up to [`BATCH`] items each) and adds it through the queue's batch add.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_util::stream::{BoxStream, Stream, StreamExt};

use super::catch;
use super::engine::Engine;
use super::reasons::source_bit;
use crate::AddOptions;
use crate::source::{BATCH, SourceItem};

/// A source's item once its user type is gone: a key and its options, or an error's message.
type Item<T> = Result<(T, AddOptions), String>;

/// A named stream of keys given to [`Runner::source`](super::Runner::source).
pub(super) struct Source<T> {
    name: Arc<str>,
    stream: BoxStream<'static, Item<T>>,
}

impl<T: Send + 'static> Source<T> {
    /// A source named `name` (in logs, reasons and metrics) reading `stream`.
    pub(super) fn new<St>(name: &str, stream: St) -> Self
    where
        St: Stream + Send + 'static,
        St::Item: SourceItem<T>,
    {
        Source {
            name: Arc::from(name),
            // An error is formatted here, inside the poll the reader guards: a `Display` that
            // panics is a panicking source.
            stream: stream
                .map(|item| item.into_add().map_err(|e| e.to_string()))
                .boxed(),
        }
    }
}

impl<T> Source<T> {
    /// The source's name.
    pub(super) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Reads into `batch` what the stream has ready, up to [`BATCH`] items; `Pending` only while
    /// `batch` is empty.
    fn poll_batch(&mut self, cx: &mut Context<'_>, batch: &mut Vec<Item<T>>) -> Poll<Read> {
        loop {
            // A panicking stream is not polled again (its state is unknown): it is ended, and
            // what it yielded before is kept.
            match catch(|| self.stream.poll_next_unpin(cx)) {
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

/// The runner's sources while they are read.
///
/// Invariants: `batch` is empty between reads (a read's items are added before the next read);
/// an ended source is `None` and never polled again.
pub(super) struct Sources<T> {
    sources: Vec<Option<Source<T>>>,
    batch: Vec<Item<T>>,
}

impl<T> Sources<T> {
    pub(super) fn new(sources: Vec<Source<T>>) -> Self {
        Sources {
            sources: sources.into_iter().map(Some).collect(),
            batch: Vec::new(),
        }
    }

    /// Whether some source is still read.
    pub(super) fn open(&self) -> bool {
        self.sources.iter().any(Option::is_some)
    }

    /// Waits until a source has something, reads what each source has ready (up to [`BATCH`]
    /// items each) and adds it to `engine`'s queue (see [`add`]), so that keys ready in several
    /// sources at once are queued once before any is taken. Returns whether the last source
    /// ended. Cancel-safe: it adds what it read before it returns. Each read is a unit of the
    /// task's cooperative budget: sources that are always ready let the runtime run other
    /// tasks, as a channel that is always ready does.
    pub(super) async fn feed<E, C, S>(&mut self, engine: &Engine<T, E, C, S>) -> bool
    where
        T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
        S: BuildHasher + Send + Sync + 'static,
        E: fmt::Debug + Send + 'static,
        C: Send + Sync + 'static,
    {
        std::future::poll_fn(|cx| self.poll_feed(cx, engine)).await
    }

    /// [`Sources::feed`]'s poll.
    fn poll_feed<E, C, S>(
        &mut self,
        cx: &mut Context<'_>,
        engine: &Engine<T, E, C, S>,
    ) -> Poll<bool>
    where
        T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
        S: BuildHasher + Send + Sync + 'static,
        E: fmt::Debug + Send + 'static,
        C: Send + Sync + 'static,
    {
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        let mut progress = false;
        for index in 0..self.sources.len() {
            let Some(source) = &mut self.sources[index] else {
                continue;
            };
            let Poll::Ready(read) = source.poll_batch(cx, &mut self.batch) else {
                continue;
            };
            progress = true;
            let name = source.name.clone();
            add(engine, index, &name, &mut self.batch);
            match read {
                Read::More => continue,
                Read::Ended => {
                    engine.counters().source_ended(false);
                    tracing::info!(source = %name, "a source ended; the runner goes on without it");
                }
                Read::Panicked(message) => {
                    engine.counters().source_ended(true);
                    tracing::error!(
                        source = %name,
                        panic = %message,
                        "a source panicked; it is ended, the runner goes on without it"
                    );
                }
            }
            self.end(index);
        }
        if !progress {
            return Poll::Pending;
        }
        coop.made_progress();
        Poll::Ready(!self.open())
    }

    /// Drops every source (at the end of the run).
    pub(super) fn close(&mut self) {
        for index in 0..self.sources.len() {
            self.end(index);
        }
    }

    /// Drops the source at `index`. A stream whose drop panics is logged.
    fn end(&mut self, index: usize) {
        let Some(source) = self.sources[index].take() else {
            return;
        };
        let name = source.name.clone();
        if let Err(message) = catch(|| drop(source)) {
            tracing::error!(source = %name, panic = %message, "dropping a source panicked");
        }
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
    // In place: reads allocate nothing once the batch's buffer has grown.
    batch.retain(|item| match item {
        // A key of another owner is not queued (the rule catches its own panics).
        Ok((key, _)) => engine.belongs(key),
        Err(error) => {
            engine.counters().source_error();
            tracing::warn!(source = %name, %error, "a source yielded an error; skipped");
            false
        }
    });
    if batch.is_empty() {
        return;
    }
    engine.counters().source_items(batch.len());
    // The reasons first, so the lease that an add causes finds its reason.
    if let Err(message) = catch(|| {
        let keys = batch.iter().filter_map(|item| item.as_ref().ok());
        engine
            .reasons()
            .mark(keys.map(|(k, _)| k), source_bit(index))
    }) {
        tracing::error!(source = %name, panic = %message, "a key panicked while its reason was recorded");
    }
    let mut keys = batch.drain(..).filter_map(Result::ok).peekable();
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
