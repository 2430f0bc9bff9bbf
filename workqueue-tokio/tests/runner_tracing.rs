//! The runner under tracing subscribers: one that formats every field, as real ones do, so that
//! the key's `Debug` runs in the runner's span; one that records the fields of that span.
//!
//! In a test binary of its own: tracing caches each callsite's interest process-wide, and a test
//! on another thread that reaches the runner's span first, with no subscriber, could leave it
//! disabled for this test's thread-local subscriber.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Fragile;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_ratelimit::ExponentialFailure;
use workqueue_tokio::runner::{Action, Context, Failure, Runner};
use workqueue_tokio::{AddOptions, LOW_PRIORITY, WorkQueue};

struct Formatting;

struct FormatFields;

impl tracing::field::Visit for FormatFields {
    // `%value` fields arrive here too, through a `Debug` wrapper around their `Display`.
    fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = format!("{value:?}");
    }
}

impl tracing::Subscriber for Formatting {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        span.record(&mut FormatFields);
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut FormatFields);
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        event.record(&mut FormatFields);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// The key's `Debug` runs when the runner's span for the reconcile is recorded; a panic there is
/// a `Failure::Panic` for that key, given to the policy, whose decision finishes the lease. The
/// single worker survives. (A current-thread runtime: the thread-local subscriber sees every
/// task.)
#[tokio::test(start_paused = true)]
async fn a_panicking_key_display_in_the_span_does_not_kill_the_worker() {
    let _subscriber = tracing::subscriber::set_default(Formatting);
    let queue: WorkQueue<Fragile> = WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        ))
        .build();
    let start = Instant::now();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let reconcile = {
        let runs = runs.clone();
        move |key: Fragile, _ctx: Context| {
            runs.lock().unwrap().push((key.name, start.elapsed()));
            std::future::ready(Ok::<_, &'static str>(Action::await_change()))
        }
    };
    let policy = {
        let failures = failures.clone();
        move |key: &Fragile, failure: &Failure<&'static str>, ctx: &Context| {
            failures.lock().unwrap().push((
                key.name,
                failure.to_string(),
                ctx.rate_limited_retries(),
            ));
            Action::requeue(Duration::from_secs(7))
        }
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(1)
        .error_policy(policy);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));

    queue.add(Fragile::new("bad-display", |_| false, |n| n == 1));
    queue.add(Fragile::sturdy("good"));
    sleep(Duration::from_secs(60)).await;
    assert!(!handle.is_finished(), "run returned: its only worker died");
    assert_eq!(
        *runs.lock().unwrap(),
        [
            ("good", Duration::ZERO),
            ("bad-display", Duration::from_secs(7))
        ]
    );
    assert_eq!(
        *failures.lock().unwrap(),
        [(
            "bad-display",
            "reconcile panicked: display 1 of bad-display panicked (expected by this test)"
                .to_string(),
            0
        )]
    );

    queue.shut_down();
    let report = handle.await.unwrap();
    assert_eq!((report.processed, report.retried), (2, 1), "{report:?}");
    assert_eq!((report.panics, report.errors), (1, 0), "{report:?}");
}

/// Records the fields of every `reconcile` span, as `name=value` pairs.
struct ReconcileSpans(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        self.0.push_str(&format!("{}={value:?}", field.name()));
    }
}

impl tracing::Subscriber for ReconcileSpans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        if span.metadata().name() == "reconcile" {
            let mut fields = Fields(String::new());
            span.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// The reconcile span carries the controller's name, the key (its `Display`), a reconcile id
/// unique to each reconcile, the two failure counts, the priority the key was handed out at,
/// and why it was queued (`direct`: added to the queue, not by the runner).
#[tokio::test(start_paused = true)]
async fn the_reconcile_span_records_the_priority() {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let _subscriber = tracing::subscriber::set_default(ReconcileSpans(spans.clone()));
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add_with("resync", AddOptions::new().priority(LOW_PRIORITY));
    queue.add("changed");
    let reconcile =
        |_key: &'static str, _ctx: Context| std::future::ready(Ok::<_, ()>(Action::await_change()));
    let handle = tokio::spawn(Runner::new(queue.clone(), reconcile).run(CancellationToken::new()));
    sleep(Duration::from_secs(1)).await;
    queue.shut_down();
    handle.await.unwrap();
    let spans = spans.lock().unwrap().clone();
    // The ids, 16 hex digits, differ; the rest is fixed.
    let mut ids = Vec::new();
    let fixed: Vec<String> = spans
        .iter()
        .map(|span| {
            let (before, rest) = span.split_once("reconcile_id=").expect("an id");
            let (id, after) = rest.split_once(' ').expect("fields after the id");
            assert!(
                id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()),
                "{id}"
            );
            ids.push(id.to_string());
            format!("{before}reconcile_id=ID {after}")
        })
        .collect();
    assert_ne!(ids[0], ids[1]);
    assert_eq!(
        fixed,
        [
            "controller=unnamed key=changed reconcile_id=ID rate_limited_retries=0 failures_in_a_row=0 priority=0 reasons=direct",
            "controller=unnamed key=resync reconcile_id=ID rate_limited_retries=0 failures_in_a_row=0 priority=-100 reasons=direct",
        ]
    );
}

/// Records every event: its level and fields.
struct Events(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Events {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let line = format!("{} {}", event.metadata().level(), fields.0);
        self.0.lock().unwrap().push(line);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// The events a runner logs for one reconcile that fails with an error and is given up on,
/// with failure logging at `level`.
async fn failure_events(level: Option<tracing::Level>) -> Vec<String> {
    let events = Arc::new(Mutex::new(Vec::new()));
    let _subscriber = tracing::subscriber::set_default(Events(events.clone()));
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("bad");
    let reconcile = |_key: &'static str, _ctx: Context| std::future::ready(Err("invalid spec"));
    let runner = Runner::new(queue.clone(), reconcile)
        .error_policy(|_, _, _| Action::await_change())
        .failure_log(level);
    let handle = tokio::spawn(runner.run(CancellationToken::new()));
    sleep(Duration::from_secs(1)).await;
    queue.shut_down();
    handle.await.unwrap();
    events.lock().unwrap().clone()
}

/// A failure is one event, at the level the runner is given, or none.
#[tokio::test(start_paused = true)]
async fn a_failure_is_one_event_at_the_chosen_level() {
    let logged = r#"message=reconcile failed error="invalid spec" action=await_change()"#;
    assert_eq!(
        failure_events(Some(tracing::Level::ERROR)).await,
        [format!("ERROR {logged}")]
    );
    assert_eq!(
        failure_events(Some(tracing::Level::WARN)).await,
        [format!("WARN {logged}")]
    );
    assert_eq!(failure_events(None).await, Vec::<String>::new());
}
