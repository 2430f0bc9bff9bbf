//! The outage detector's tracing events: one when it opens, one when it closes with how long the
//! outage lasted and how many keys were released.
//!
//! In a test binary of its own: tracing caches each callsite's interest process-wide.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use workqueue_ratelimit::OutageConfig;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Runner};

/// Records each event's fields as `name=value` strings.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Vec<String>>>>);

struct Fields<'a>(&'a mut Vec<String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={value:?}", field.name()));
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(start_paused = true)]
async fn open_and_close_are_traced_with_the_duration_and_the_released_count() {
    let recorder = Recorder::default();
    let _guard = tracing::subscriber::set_default(recorder.clone());
    let up = Arc::new(AtomicBool::new(false));
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .outage_detection(OutageConfig::default())
        .build();
    queue.add_batch(0..20);
    let runner = Runner::new(queue.clone(), {
        let up = up.clone();
        move |_key: u32, _ctx: Context| {
            let up = up.load(SeqCst);
            async move {
                match up {
                    true => Ok(Action::await_change()),
                    false => Err("unavailable"),
                }
            }
        }
    })
    .workers(4);
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    sleep(Duration::from_secs(100)).await;
    up.store(true, SeqCst);
    sleep(Duration::from_secs(10)).await;
    stop.cancel();
    run.await.unwrap();
    let events = recorder.0.lock().unwrap();
    let find = |needle: &str| {
        events
            .iter()
            .filter(|fields| fields.iter().any(|f| f.contains(needle)))
            .collect::<Vec<_>>()
    };
    assert_eq!(find("outage detector opened").len(), 1);
    let closed = find("outage detector closed");
    assert_eq!(closed.len(), 1);
    let closed = closed[0].join(" ");
    assert!(closed.contains("released=19"), "{closed}");
    assert!(closed.contains("outage_lasted="), "{closed}");
}
