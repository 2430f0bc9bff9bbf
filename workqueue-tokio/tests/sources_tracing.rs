//! What the tracing of a runner with sources says: why a key was queued (the reconcile span's
//! `reasons`), and a source's end, errors and panic. Its own test binary: every test here sets a
//! scoped subscriber, so no test without one races tracing's per-callsite interest cache.

mod common;
#[allow(dead_code)] // not every helper is used here
mod sources_common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Runner};

use common::secs;
use sources_common::{WatchError, channel, recording};

/// Records the `key` and `reasons` fields of every `reconcile` span, and the `source` and
/// `message` of every event that names a source.
#[derive(Default)]
struct ReasonSpans {
    spans: Arc<Mutex<Vec<String>>>,
    events: Arc<Mutex<Vec<String>>>,
}

struct Fields(Vec<String>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if matches!(field.name(), "key" | "reasons" | "source" | "message") {
            self.0.push(format!("{}={value:?}", field.name()));
        }
    }
}

impl tracing::Subscriber for ReasonSpans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        if span.metadata().name() == "reconcile" {
            let mut fields = Fields(Vec::new());
            span.record(&mut fields);
            self.spans.lock().unwrap().push(fields.0.join(" "));
        }
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        if fields.0.iter().any(|f| f.starts_with("source=")) {
            let level = event.metadata().level();
            self.events
                .lock()
                .unwrap()
                .push(format!("{level} {}", fields.0.join(" ")));
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The span of a reconcile names why its key was queued, collapsed across de-duplicated adds: two
/// sources that add a key while it waits give one reconcile with both; then the reconcile's own
/// requeue, and a retry after a failure.
#[tokio::test(start_paused = true)]
async fn the_span_names_why_a_key_was_queued() {
    let subscriber = ReasonSpans::default();
    let spans = subscriber.spans.clone();
    let _subscriber = tracing::subscriber::set_default(subscriber);
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("busy"); // added directly; keeps the only worker busy for a second
    let runs = Arc::new(AtomicUsize::new(0));
    let reconcile = {
        let runs = runs.clone();
        move |key: &'static str, _ctx: Context| {
            let n = if key == "a" {
                runs.fetch_add(1, SeqCst)
            } else {
                usize::MAX
            };
            async move {
                match n {
                    usize::MAX => sleep(secs(1)).await,
                    0 => return Ok(Action::requeue(secs(1))),
                    1 => return Err("failed"),
                    _ => {}
                }
                Ok(Action::await_change())
            }
        }
    };
    let (list_tx, list, _) = channel();
    let (watch_tx, watch, _) = channel();
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Runner::new(queue.clone(), reconcile)
            .source("list", list)
            .source("watch", watch)
            .run(stop.clone()),
    );
    sleep(Duration::from_millis(100)).await;
    list_tx.send("a").unwrap();
    watch_tx.send("a").unwrap();
    watch_tx.send("a").unwrap();
    sleep(secs(10)).await;
    stop.cancel();
    run.await.unwrap();
    assert_eq!(
        *spans.lock().unwrap(),
        [
            "key=busy reasons=direct",
            "key=a reasons=source:list,source:watch",
            "key=a reasons=requeue",
            "key=a reasons=retry",
        ]
    );
}

/// An end, an error and a panic of a source are each a tracing event that names the source.
#[tokio::test(start_paused = true)]
async fn a_source_that_ends_errors_or_panics_is_logged_by_name() {
    let subscriber = ReasonSpans::default();
    let events = subscriber.events.clone();
    let _subscriber = tracing::subscriber::set_default(subscriber);
    let queue: WorkQueue<String> = WorkQueue::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let failing = stream::iter([Err(WatchError(7)), Ok("a".to_string())]);
    let panicking = stream::iter([0]).map(|_| -> String { panic!("boom (expected by this test)") });
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Runner::new(queue.clone(), recording(&log))
            .source("failing", failing)
            .source("panicking", panicking)
            .run(stop.clone()),
    );
    sleep(secs(1)).await;
    stop.cancel();
    run.await.unwrap();
    let mut events = events.lock().unwrap().clone();
    events.sort();
    assert_eq!(
        events,
        [
            r#"ERROR message=a source panicked; it is ended, the runner goes on without it source=panicking"#,
            r#"INFO message=a source ended; the runner goes on without it source=failing"#,
            r#"WARN message=a source yielded an error; skipped source=failing"#,
        ]
    );
}
