//! Metrics of the tokio queue and of the runner (controller-runtime's names), on tokio's paused
//! clock, through a thread-local `DebuggingRecorder` (current-thread runtime: every task runs on
//! the test's thread).
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::GET_PANIC_PAUSE;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use workqueue_core::metrics as qm;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::metrics::*;
use workqueue_tokio::runner::{Action, Failure, Runner};

type Metrics = HashMap<(String, Vec<(String, String)>), DebugValue>;

/// Everything the recorder holds, by name and sorted labels (a snapshot resets what it reads).
fn snapshot(recorder: &DebuggingRecorder) -> Metrics {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let key = k.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            ((key.name().to_string(), labels), v)
        })
        .collect()
}

fn get<'a>(m: &'a Metrics, name: &str, labels: &[(&str, &str)]) -> &'a DebugValue {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    m.get(&(name.to_string(), labels))
        .unwrap_or_else(|| panic!("no {name} in {m:?}"))
}

fn counter(m: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
    match get(m, name, labels) {
        DebugValue::Counter(c) => *c,
        other => panic!("{name} is {other:?}"),
    }
}

fn gauge(m: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    match get(m, name, labels) {
        DebugValue::Gauge(g) => g.into_inner(),
        other => panic!("{name} is {other:?}"),
    }
}

fn histogram(m: &Metrics, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    match get(m, name, labels) {
        DebugValue::Histogram(h) => h.iter().map(|v| v.into_inner()).collect(),
        other => panic!("{name} is {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn tokio_queue_measures_on_the_runtime_clock() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q: WorkQueue<&'static str> = WorkQueue::builder()
        .name("tq")
        .metrics_refresh_thread(false)
        .build();
    q.add("a");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lease = q.get().await.unwrap();
    tokio::time::sleep(Duration::from_millis(25)).await;
    q.refresh_metrics();
    let m = snapshot(&recorder);
    let name = [("name", "tq")];
    assert_eq!(counter(&m, qm::ADDS_TOTAL, &name), 1);
    assert_eq!(
        gauge(&m, qm::DEPTH, &[("name", "tq"), ("priority", "0")]),
        0.0
    );
    assert_eq!(gauge(&m, qm::OLDEST_READY_SECONDS, &name), 0.0);
    assert_eq!(histogram(&m, qm::QUEUE_DURATION_SECONDS, &name), vec![0.05]);
    assert_eq!(gauge(&m, qm::UNFINISHED_WORK_SECONDS, &name), 0.025);
    lease.done();
    q.refresh_metrics(); // metrics are sent in batches, and at every refresh
    let m = snapshot(&recorder);
    assert_eq!(histogram(&m, qm::WORK_DURATION_SECONDS, &name), vec![0.025]);
}

#[tokio::test(start_paused = true)]
async fn runner_emits_controller_runtime_metrics() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q: WorkQueue<&'static str> = WorkQueue::builder()
        .name("ctl")
        .metrics_refresh_thread(false)
        .build();
    for key in ["ok", "poll", "err", "panic", "slow", "giveup"] {
        q.add(key);
    }
    let runner = Runner::new(q.clone(), |key: &'static str, _ctx| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match key {
            "ok" => Ok(Action::await_change()),
            "poll" => Ok(Action::requeue(Duration::from_secs(3600))),
            "panic" => panic!("boom"),
            "slow" => {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(Action::await_change())
            }
            _ => Err("failed"),
        }
    })
    .workers(3)
    .reconcile_timeout(Duration::from_secs(1))
    .cancel_grace(Duration::from_millis(100))
    .error_policy(|key: &&'static str, _: &_, _: &_| match *key {
        "giveup" => Action::await_change(),
        _ => Action::requeue(Duration::from_secs(3600)),
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.cancel();
    run.await.unwrap();

    let m = snapshot(&recorder);
    let ctl = [("controller", "ctl")];
    let result = |r: &'static str| counter(&m, RECONCILE_TOTAL, &[ctl[0], ("result", r)]);
    assert_eq!(result("success"), 1);
    assert_eq!(result("requeue_after"), 1);
    assert_eq!(result("requeue"), 0);
    // Every failure is an error, as controller-runtime counts it: "err", "slow" timing out,
    // "panic", and "giveup" (a terminal error).
    assert_eq!(result("error"), 4);
    let results: Vec<&str> = m
        .keys()
        .filter(|(name, _)| name == RECONCILE_TOTAL)
        .flat_map(|(_, labels)| labels.iter().filter(|(k, _)| k == "result"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert!(
        results.iter().all(|r| RESULTS.contains(r)) && results.len() == 4,
        "controller-runtime's four results only: {results:?}"
    );
    assert_eq!(counter(&m, RECONCILE_ERRORS_TOTAL, &ctl), 4);
    assert_eq!(counter(&m, TERMINAL_RECONCILE_ERRORS_TOTAL, &ctl), 1);
    assert_eq!(counter(&m, RECONCILE_PANICS_TOTAL, &ctl), 1);
    assert_eq!(counter(&m, RECONCILE_TIMEOUTS_TOTAL, &ctl), 1);
    let mut times = histogram(&m, RECONCILE_TIME_SECONDS, &ctl);
    times.sort_by(f64::total_cmp);
    assert_eq!(times, vec![0.1, 0.1, 0.1, 0.1, 0.1, 1.1]);
    assert_eq!(gauge(&m, MAX_CONCURRENT_RECONCILES, &ctl), 3.0);
    assert_eq!(gauge(&m, ACTIVE_WORKERS, &ctl), 0.0);
    // The queue's own metrics, labelled with its name, and as a runner's queue with the
    // controller's (controller-runtime's labels).
    assert_eq!(
        counter(
            &m,
            qm::RETRIES_TOTAL,
            &[("name", "ctl"), ("controller", "ctl")]
        ),
        4
    );
}

#[tokio::test(start_paused = true)]
async fn active_workers_counts_reconciles_in_flight_and_unnamed_is_labelled() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q: WorkQueue<u32> = WorkQueue::new();
    for k in 0..3 {
        q.add(k);
    }
    let release = Arc::new(Notify::new());
    let r = release.clone();
    let runner = Runner::new(q.clone(), move |_key: u32, _ctx| {
        let r = r.clone();
        async move {
            r.notified().await;
            Ok::<_, ()>(Action::await_change())
        }
    })
    .workers(2);
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let m = snapshot(&recorder);
    let unnamed = [("controller", UNNAMED)];
    assert_eq!(gauge(&m, ACTIVE_WORKERS, &unnamed), 2.0);
    assert_eq!(gauge(&m, MAX_CONCURRENT_RECONCILES, &unnamed), 2.0);
    // An unnamed queue emits no queue metrics.
    assert!(m.keys().all(|(name, _)| !name.starts_with("workqueue_")));
    q.shut_down();
    for _ in 0..3 {
        release.notify_waiters();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    run.await.unwrap();
    let m = snapshot(&recorder);
    assert_eq!(
        counter(&m, RECONCILE_TOTAL, &[unnamed[0], ("result", "success")]),
        3
    );
}

/// Where a [`Trapping`] recorder panics.
#[derive(Debug, Clone, Copy)]
enum Trap {
    /// Registering the `n`-th handle (1-based) named `name`.
    Register(&'static str, u32),
    /// The first value recorded into the histogram `name`.
    FirstRecord(&'static str),
}

/// A recorder that records into a `DebuggingRecorder`, except that it panics once, where its
/// [`Trap`] says: a metrics recorder is user code in the runner's and the queue's paths.
struct Trapping {
    inner: DebuggingRecorder,
    trap: Trap,
    registered: AtomicU32,
    armed: Arc<AtomicBool>,
}

impl Trapping {
    fn new(trap: Trap) -> Self {
        Trapping {
            inner: DebuggingRecorder::new(),
            trap,
            registered: AtomicU32::new(0),
            armed: Arc::new(AtomicBool::new(true)),
        }
    }

    fn registering(&self, key: &Key) {
        if let Trap::Register(name, n) = self.trap
            && key.name() == name
            && self.registered.fetch_add(1, SeqCst) + 1 == n
        {
            panic!("registering {name} #{n} panicked (expected by this test)");
        }
    }
}

/// A histogram whose first record panics while `armed`.
struct PanicOnce(Histogram, Arc<AtomicBool>);

impl HistogramFn for PanicOnce {
    fn record(&self, value: f64) {
        if self.1.swap(false, SeqCst) {
            panic!("recording a histogram panicked (expected by this test)");
        }
        self.0.record(value);
    }
}

impl Recorder for Trapping {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description)
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description)
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description)
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.registering(key);
        self.inner.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.registering(key);
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.registering(key);
        let histogram = self.inner.register_histogram(key, metadata);
        match self.trap {
            Trap::FirstRecord(name) if key.name() == name => {
                Histogram::from_arc(Arc::new(PanicOnce(histogram, self.armed.clone())))
            }
            _ => histogram,
        }
    }
}

/// A recorder that panics in any of the runner's emissions does not kill a worker: at the start of
/// `run` it is logged and ignored; for a leased key (the active-workers gauge before or after the
/// reconcile, the reconcile's result) it is a `Failure::Panic` for that key, given to the policy,
/// whose decision finishes the lease, and counted as result `panic`.
#[tokio::test(start_paused = true)]
async fn a_panicking_metrics_recorder_does_not_kill_the_worker() {
    // (trap, reconciles, panics): the registrations of the active-workers gauge are `start`'s
    // (#1), then +1 and -1 around each reconcile.
    let cases = [
        (Trap::Register(MAX_CONCURRENT_RECONCILES, 1), 1, 0),
        (Trap::Register(ACTIVE_WORKERS, 2), 1, 1),
        (Trap::Register(ACTIVE_WORKERS, 3), 2, 1),
        (Trap::Register(RECONCILE_TIME_SECONDS, 1), 2, 1),
    ];
    for (trap, reconciles, panics) in cases {
        let recorder = Trapping::new(trap);
        let _local = metrics::set_default_local_recorder(&recorder);
        let q: WorkQueue<&'static str> = WorkQueue::new();
        let calls = Arc::new(AtomicU32::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let runner = Runner::new(q.clone(), {
            let calls = calls.clone();
            move |_key: &'static str, _ctx| {
                calls.fetch_add(1, SeqCst);
                std::future::ready(Ok::<_, &'static str>(Action::await_change()))
            }
        })
        .error_policy({
            let failures = failures.clone();
            move |_: &&'static str, failure: &Failure<&'static str>, _: &_| {
                failures.lock().unwrap().push(format!("{failure}"));
                Action::requeue(Duration::from_secs(1))
            }
        });
        let run = tokio::spawn(runner.run(CancellationToken::new()));
        q.add("k");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            !run.is_finished(),
            "{trap:?}: run returned (its worker died)"
        );
        q.shut_down();
        let report = run.await.unwrap();
        assert_eq!(calls.load(SeqCst), reconciles, "{trap:?}");
        assert_eq!(
            (report.processed, report.panics),
            (1, panics),
            "{trap:?}: {report:?}"
        );
        let failures = failures.lock().unwrap().clone();
        assert_eq!(failures.len() as u64, panics, "{trap:?}: {failures:?}");
        assert!(
            failures
                .iter()
                .all(|f| f.contains("(expected by this test)")),
            "{trap:?}: {failures:?}"
        );
        let m = snapshot(&recorder.inner);
        let unnamed = [("controller", UNNAMED)];
        // (A recorder that panicked in `start` missed the zeroing of the other results.)
        let result = |r: &'static str| {
            let labels = [unnamed[0], ("result", r)];
            let zeroed = m.contains_key(&(
                RECONCILE_TOTAL.to_string(),
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ));
            if zeroed {
                counter(&m, RECONCILE_TOTAL, &labels)
            } else {
                0
            }
        };
        assert_eq!(
            (result("success"), result("error")),
            (1, panics),
            "{trap:?}"
        );
        assert_eq!(gauge(&m, ACTIVE_WORKERS, &unnamed), 0.0, "{trap:?}");
    }
}

/// A recorder that panics inside the queue's `get` (it emits the queue's metrics) leases no key:
/// the worker counts it (`Report::get_panics`), pauses, and goes on.
#[tokio::test(start_paused = true)]
async fn a_panicking_queue_metrics_recorder_in_get_does_not_kill_the_worker() {
    let recorder = Trapping::new(Trap::FirstRecord(qm::QUEUE_DURATION_SECONDS));
    let _local = metrics::set_default_local_recorder(&recorder);
    let q: WorkQueue<&'static str> = WorkQueue::builder()
        .name("q")
        .metrics_refresh_thread(false)
        .build();
    q.add("a");
    q.add("b");
    // The queue sends its metrics every `FLUSH_EVERY` operations: re-adds bring it to one
    // operation before a flush, so that the runner's first get sends them, and panics.
    for _ in 2..workqueue_core::__private::FLUSH_EVERY - 1 {
        q.add("a");
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let runner = Runner::new(q.clone(), {
        let seen = seen.clone();
        move |key: &'static str, _ctx| {
            seen.lock()
                .unwrap()
                .push((key, tokio::time::Instant::now()));
            std::future::ready(Ok::<_, &'static str>(Action::await_change()))
        }
    });
    let start = tokio::time::Instant::now();
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!run.is_finished(), "run returned (its worker died)");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.contains(&("b", start + GET_PANIC_PAUSE)),
        "the worker goes on after the pause: {seen:?}"
    );
    q.shut_down();
    let report = run.await.unwrap();
    assert_eq!((report.get_panics, report.panics), (1, 0), "{report:?}");
}

/// `Action::requeue(Duration::ZERO)` is counted as result `requeue` (controller-runtime's
/// `Requeue: true`), and so is a backoff at another priority; every result is zeroed at the
/// start, and the queue counts the rate-limited requeue as a retry.
#[tokio::test(start_paused = true)]
async fn requeue_after_zero_counts_as_result_requeue() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q: WorkQueue<&'static str> = WorkQueue::builder()
        .name("rq")
        .metrics_refresh_thread(false)
        .build();
    q.add("k");
    let runner = Runner::new(
        q.clone(),
        |_key: &'static str, ctx: workqueue_tokio::runner::Context| {
            std::future::ready(Ok::<_, ()>(match ctx.rate_limited_retries() {
                0 => Action::requeue(Duration::ZERO),
                1 => Action::backoff().with_priority(5),
                _ => Action::await_change(),
            }))
        },
    );
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.processed, 3, "{report:?}");

    let m = snapshot(&recorder);
    let ctl = ("controller", "rq");
    for result in RESULTS {
        let expected = match result {
            "requeue" => 2,
            "success" => 1,
            _ => 0,
        };
        assert_eq!(
            counter(&m, RECONCILE_TOTAL, &[ctl, ("result", result)]),
            expected,
            "{result}"
        );
    }
    assert_eq!(counter(&m, RECONCILE_ERRORS_TOTAL, &[ctl]), 0);
    assert_eq!(
        counter(
            &m,
            qm::RETRIES_TOTAL,
            &[("name", "rq"), ("controller", "rq")]
        ),
        2
    );
}

/// Why keys were queued, counted by reason: a source's name, the runner's own retry, and keys
/// added to the queue directly.
#[tokio::test(start_paused = true)]
async fn runner_counts_why_keys_were_queued() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q: WorkQueue<&'static str> = WorkQueue::builder()
        .name("why")
        .metrics_refresh_thread(false)
        .build();
    q.add("direct");
    let failed = Arc::new(AtomicBool::new(false));
    let runner = Runner::new(q.clone(), {
        let failed = failed.clone();
        move |key: &'static str, _ctx| {
            let fail = key == "a" && !failed.swap(true, SeqCst);
            std::future::ready(if fail {
                Err("once")
            } else {
                Ok(Action::await_change())
            })
        }
    })
    .source("watch", futures_util::stream::iter(["a", "b"]));
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    q.shut_down();
    run.await.unwrap();
    let m = snapshot(&recorder);
    let reason = |r| {
        counter(
            &m,
            RECONCILE_REASONS_TOTAL,
            &[("controller", "why"), ("reason", r)],
        )
    };
    assert_eq!(
        (reason("direct"), reason("source:watch"), reason("retry")),
        (1, 2, 1)
    );
}

/// controller-runtime's `controller_runtime_reconcile_time_seconds` buckets, written out as its
/// source lists them: 0.005, 0.01, 0.025, 0.05, 0.1 to 0.5 by 0.05, 0.6 to 1.0 by 0.1, 1.25,
/// 1.5, 1.75, 2, 2.5, 3 to 5 by 0.5, 6 to 10 by 1, 15, 20, 25, 30, 40, 50, 60.
#[test]
fn reconcile_time_buckets_are_controller_runtime_s() {
    let mut expected = vec![0.005, 0.01, 0.025, 0.05];
    expected.extend((2..=10).map(|i| f64::from(i) * 0.05));
    expected.extend((6..=10).map(|i| f64::from(i) * 0.1));
    expected.extend([1.25, 1.5, 1.75, 2.0, 2.5]);
    expected.extend((6..=10).map(|i| f64::from(i) * 0.5));
    expected.extend((6..=10).map(f64::from));
    expected.extend([15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0]);
    assert_eq!(RECONCILE_TIME_BUCKETS.len(), expected.len());
    for (ours, theirs) in RECONCILE_TIME_BUCKETS.iter().zip(&expected) {
        assert!((ours - theirs).abs() < 1e-9, "{ours} against {theirs}");
    }
}
