//! The runner's sources: streams of keys fed into its queue (issue 14). All on tokio's paused
//! clock.

mod common;
mod sources_common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use workqueue_tokio::runner::{Action, Context, Report, Runner};
use workqueue_tokio::{AddOptions, LOW_PRIORITY, WorkQueue};

use common::{Fragile, secs};
use sources_common::{WatchError, channel, recording, taken};

/// The backpressure claim: a source far faster than the workers (100k events for 1k keys, one
/// worker taking 10 ms a key) never makes the queue hold more than one entry per key, and each
/// key is reconciled at most twice (once for the events before its first lease, once for those
/// during it).
#[tokio::test(start_paused = true)]
async fn a_burst_of_100k_events_for_1k_keys_keeps_the_queue_at_1k_keys() {
    const KEYS: usize = 1_000;
    const EVENTS: usize = 100_000;
    let queue: WorkQueue<usize> = WorkQueue::new();
    let peak = Arc::new(AtomicUsize::new(0));
    let sample = {
        let (queue, peak) = (queue.clone(), peak.clone());
        move || {
            peak.fetch_max(queue.counts().tracked, SeqCst);
        }
    };
    let events = stream::iter(0..EVENTS).map(|i| i % KEYS).inspect({
        let sample = sample.clone();
        move |_| sample()
    });
    let reconciles = Arc::new(AtomicUsize::new(0));
    let reconcile = {
        let reconciles = reconciles.clone();
        move |_key: usize, _ctx: Context| {
            reconciles.fetch_add(1, SeqCst);
            sample();
            async {
                sleep(Duration::from_millis(10)).await;
                Ok::<_, ()>(Action::await_change())
            }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile).source("burst", events);
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    // 1k keys at 10 ms each: all done well within a minute.
    sleep(secs(60)).await;
    queue.shut_down();
    let report = run.await.unwrap();
    assert_eq!(report.source_items, EVENTS as u64);
    assert_eq!(report.sources_ended, 1);
    assert!(
        peak.load(SeqCst) <= KEYS,
        "the queue held {} keys",
        peak.load(SeqCst)
    );
    assert!(
        peak.load(SeqCst) >= KEYS / 2,
        "the burst did outpace the worker"
    );
    let n = reconciles.load(SeqCst);
    assert!(
        (KEYS..=2 * KEYS).contains(&n),
        "{n} reconciles for {KEYS} keys"
    );
    assert_eq!(report.processed, n as u64);
}

/// A source that ends is reported and the runner goes on: later keys from another source are
/// still reconciled, and `run` only returns at shutdown.
#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_is_reported_and_the_runner_goes_on() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, watch, _) = channel();
    let list = stream::iter(["a", "b"].map(String::from));
    let stop = CancellationToken::new();
    let runner = Runner::new(queue.clone(), recording(&log))
        .source("list", list)
        .source("watch", watch);
    let run = tokio::spawn(runner.run(stop.clone()));
    sleep(secs(1)).await;
    assert_eq!(taken(&log), ["a", "b"]);
    tx.send("c".to_string()).unwrap();
    sleep(secs(1)).await;
    assert_eq!(taken(&log), ["c"]);
    assert!(!run.is_finished(), "the runner stopped when a source ended");
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(
        (report.sources_ended, report.source_items, report.processed),
        (1, 3, 3)
    );
}

/// Errors in a stream of `Result`s are logged, counted and skipped; the keys around them are
/// added, and the runner keeps reading the stream.
#[tokio::test(start_paused = true)]
async fn a_stream_that_errors_is_skipped_not_stopped() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, watch, _) = channel::<Result<String, WatchError>>();
    let stop = CancellationToken::new();
    let runner = Runner::new(queue.clone(), recording(&log)).source("watch", watch);
    let run = tokio::spawn(runner.run(stop.clone()));
    tx.send(Ok("a".into())).unwrap();
    tx.send(Err(WatchError(1))).unwrap();
    tx.send(Ok("b".into())).unwrap();
    sleep(secs(1)).await;
    tx.send(Err(WatchError(2))).unwrap();
    sleep(secs(1)).await;
    tx.send(Ok("c".into())).unwrap();
    sleep(secs(1)).await;
    assert_eq!(taken(&log), ["a", "b", "c"]);
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(
        (
            report.source_errors,
            report.source_items,
            report.sources_ended
        ),
        (2, 3, 0)
    );
}

/// Shutdown while a source is pending: `run` returns at once (nothing in flight), the source is
/// dropped (the runner stops reading it), and it is not counted as ended.
#[tokio::test(start_paused = true)]
async fn shutdown_while_a_source_is_pending() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, watch, dropped) = channel::<String>();
    let stop = CancellationToken::new();
    let runner = Runner::new(queue.clone(), recording(&log))
        .source("pending", stream::pending::<String>())
        .source("watch", watch);
    let run = tokio::spawn(runner.run(stop.clone()));
    sleep(secs(1)).await;
    let cancelled_at = tokio::time::Instant::now();
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(tokio::time::Instant::now(), cancelled_at, "run waited");
    assert!(dropped.load(SeqCst), "the source outlived the run");
    assert!(tx.send("late".into()).is_err());
    assert_eq!((report.sources_ended, report.source_items), (0, 0));
    assert!(taken(&log).is_empty());
}

/// The runner also stops reading its sources when its queue is shut down (and drained).
#[tokio::test(start_paused = true)]
async fn a_queue_shut_down_ends_the_run_with_sources_open() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (_tx, watch, dropped) = channel::<String>();
    let runner = Runner::new(queue.clone(), recording(&log)).source("watch", watch);
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    sleep(secs(1)).await;
    queue.shut_down();
    tokio::time::timeout(secs(1), run)
        .await
        .expect("run did not return")
        .unwrap();
    assert!(dropped.load(SeqCst));
}

/// A source that panics when polled is ended there: what it yielded before is reconciled, the
/// panic is counted, and the runner and its other sources go on.
#[tokio::test(start_paused = true)]
async fn a_panicking_source_is_ended_without_losing_its_items() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let fragile = stream::iter(["a", "b", "boom", "never"]).map(|k| {
        assert_ne!(k, "boom", "the source panicked (expected by this test)");
        k.to_string()
    });
    let (tx, watch, _) = channel();
    let stop = CancellationToken::new();
    let runner = Runner::new(queue.clone(), recording(&log))
        .source("fragile", fragile)
        .source("watch", watch);
    let run = tokio::spawn(runner.run(stop.clone()));
    sleep(secs(1)).await;
    assert_eq!(taken(&log), ["a", "b"]);
    tx.send("c".to_string()).unwrap();
    sleep(secs(1)).await;
    assert_eq!(taken(&log), ["c"]);
    assert!(!run.is_finished());
    stop.cancel();
    let report: Report = run.await.unwrap();
    assert_eq!(
        (
            report.source_panics,
            report.sources_ended,
            report.source_items,
            report.worker_panics
        ),
        (1, 1, 3, 0)
    );
}

/// Items with options go in with them: a source of `(key, AddOptions)` sets priorities (keys
/// read together in one batch are served by priority), and a delay is honoured.
#[tokio::test(start_paused = true)]
async fn a_source_of_keys_with_options() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reconcile = {
        let seen = seen.clone();
        move |key: String, ctx: Context| {
            seen.lock()
                .unwrap()
                .push((key, ctx.priority(), tokio::time::Instant::now()));
            std::future::ready(Ok::<_, ()>(Action::await_change()))
        }
    };
    let low = AddOptions::new().priority(LOW_PRIORITY);
    let later = AddOptions::new().after(secs(5));
    let items = stream::iter([
        ("resync".to_string(), low),
        ("changed".to_string(), AddOptions::default()),
        ("later".to_string(), later),
    ]);
    let start = tokio::time::Instant::now();
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Runner::new(queue.clone(), reconcile)
            .source("items", items)
            .run(stop.clone()),
    );
    sleep(secs(10)).await;
    stop.cancel();
    run.await.unwrap();
    let seen = seen.lock().unwrap();
    let got: Vec<_> = seen
        .iter()
        .map(|(k, p, at)| (k.as_str(), *p, at.duration_since(start).as_secs()))
        .collect();
    assert_eq!(
        got,
        [
            ("changed", 0, 0),
            ("resync", LOW_PRIORITY, 0),
            ("later", 0, 5)
        ]
    );
}

/// A key whose `Clone` panics while the runner records why it was queued (its first clone) is
/// still added, and so are the keys after it in the same batch: the source's reader survives.
#[tokio::test(start_paused = true)]
async fn a_key_that_panics_in_a_batch_loses_nothing_after_it() {
    let queue: WorkQueue<Fragile> = WorkQueue::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let reconcile = {
        let log = log.clone();
        move |key: Fragile, _ctx: Context| {
            log.lock().unwrap().push(key.name);
            std::future::ready(Ok::<_, ()>(Action::await_change()))
        }
    };
    let keys = stream::iter([
        Fragile::sturdy("a"),
        Fragile::new("bad", |n| n == 1, |_| false),
        Fragile::sturdy("c"),
    ]);
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Runner::new(queue.clone(), reconcile)
            .source("fragile", keys)
            .run(stop.clone()),
    );
    sleep(secs(1)).await;
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(*log.lock().unwrap(), ["a", "bad", "c"]);
    assert_eq!(
        (
            report.processed,
            report.panics,
            report.source_panics,
            report.sources_ended
        ),
        (3, 0, 0, 1)
    );
}

/// The sources are read by the task that runs the runner (as kube-runtime reads its watches), so
/// what a source allocates is allocated there: on a multi-thread runtime, a stream of results
/// polled by `block_on` has its sources polled on the thread that called `block_on`, never on
/// the runtime's workers (where the reconciles run).
#[test]
fn sources_are_read_on_the_task_that_runs_the_runner() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let caller = std::thread::current().id();
    let polls = Arc::new(Mutex::new(Vec::new()));
    let keys = {
        let polls = polls.clone();
        let mut next = 0..100u32;
        stream::poll_fn(move |_| {
            polls.lock().unwrap().push(std::thread::current().id());
            std::task::Poll::Ready(next.next())
        })
    };
    let reconciled_on = Arc::new(Mutex::new(Vec::new()));
    let reconcile = {
        let reconciled_on = reconciled_on.clone();
        move |_key: u32, _ctx: Context| {
            let reconciled_on = reconciled_on.clone();
            async move {
                tokio::task::yield_now().await;
                reconciled_on
                    .lock()
                    .unwrap()
                    .push(std::thread::current().id());
                Ok::<_, ()>(Action::await_change())
            }
        }
    };
    let queue: WorkQueue<u32> = WorkQueue::new();
    let results: Vec<_> = runtime.block_on(
        Runner::new(queue, reconcile)
            .source("keys", keys)
            .results(CancellationToken::new())
            .collect(),
    );
    assert_eq!(results.len(), 100, "the stream ends with its source");
    let polls = polls.lock().unwrap();
    assert!(polls.len() > 100, "the source was polled ({})", polls.len());
    assert!(
        polls.iter().all(|t| *t == caller),
        "polled on another thread"
    );
    let reconciled_on = reconciled_on.lock().unwrap();
    assert_eq!(reconciled_on.len(), 100);
    assert!(
        reconciled_on.iter().all(|t| *t != caller),
        "the reconciles run on the runtime's workers"
    );
}

/// A source whose drop panics (user code) is dropped at the end of the run without ending it
/// badly: the run returns its report, with what the source yielded reconciled.
#[tokio::test(start_paused = true)]
async fn a_source_that_panics_when_dropped_ends_the_run_normally() {
    struct PanicsOnDrop(stream::Iter<std::vec::IntoIter<String>>);
    impl futures_util::Stream for PanicsOnDrop {
        type Item = String;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<String>> {
            match self.0.poll_next_unpin(cx) {
                // Never ends: it is dropped when the run ends.
                std::task::Poll::Ready(None) => std::task::Poll::Pending,
                other => other,
            }
        }
    }
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("the source panicked when dropped (expected by this test)");
        }
    }
    let queue: WorkQueue<String> = WorkQueue::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let source = PanicsOnDrop(stream::iter(vec!["a".to_string(), "b".to_string()]));
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Runner::new(queue, recording(&log))
            .source("fragile", source)
            .run(stop.clone()),
    );
    sleep(secs(1)).await;
    stop.cancel();
    let report = run.await.expect("the run ends without a panic");
    assert_eq!(taken(&log), ["a", "b"]);
    assert_eq!((report.processed, report.sources_ended), (2, 0));
}
