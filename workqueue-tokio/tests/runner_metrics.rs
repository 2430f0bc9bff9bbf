//! Metrics of the tokio queue and of the runner (controller-runtime's names), on tokio's paused
//! clock, through a thread-local `DebuggingRecorder` (current-thread runtime: every task runs on
//! the test's thread).
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use workqueue_core::metrics as qm;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::metrics::*;
use workqueue_tokio::runner::{Action, Decision, Runner};

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
    let q: WorkQueue<&'static str> = WorkQueue::builder().name("tq").build();
    q.add("a");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lease = q.get().await.unwrap();
    tokio::time::sleep(Duration::from_millis(25)).await;
    q.refresh_metrics();
    let m = snapshot(&recorder);
    let name = [("name", "tq")];
    assert_eq!(counter(&m, qm::ADDS_TOTAL, &name), 1);
    assert_eq!(gauge(&m, qm::DEPTH, &name), 0.0);
    assert_eq!(histogram(&m, qm::QUEUE_DURATION_SECONDS, &name), vec![0.05]);
    assert_eq!(gauge(&m, qm::UNFINISHED_WORK_SECONDS, &name), 0.025);
    lease.done();
    let m = snapshot(&recorder);
    assert_eq!(histogram(&m, qm::WORK_DURATION_SECONDS, &name), vec![0.025]);
}

#[tokio::test(start_paused = true)]
async fn runner_emits_controller_runtime_metrics() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q: WorkQueue<&'static str> = WorkQueue::builder().name("ctl").build();
    for key in ["ok", "poll", "err", "panic", "slow", "giveup"] {
        q.add(key);
    }
    let runner = Runner::new(q.clone(), |key: &'static str, _ctx| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match key {
            "ok" => Ok(Action::Done),
            "poll" => Ok(Action::RequeueAfter(Duration::from_secs(3600))),
            "panic" => panic!("boom"),
            "slow" => {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(Action::Done)
            }
            _ => Err("failed"),
        }
    })
    .workers(3)
    .reconcile_timeout(Duration::from_secs(1))
    .cancel_grace(Duration::from_millis(100))
    .error_policy(|key: &&'static str, _: &_, _| match *key {
        "giveup" => Decision::GiveUp,
        _ => Decision::RetryAfter(Duration::from_secs(3600)),
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
    assert_eq!(result("error"), 2); // "err", and "slow" timing out
    assert_eq!(result("panic"), 1);
    assert_eq!(result("given_up"), 1);
    assert_eq!(counter(&m, RECONCILE_ERRORS_TOTAL, &ctl), 4);
    assert_eq!(counter(&m, RECONCILE_PANICS_TOTAL, &ctl), 1);
    assert_eq!(counter(&m, RECONCILE_TIMEOUTS_TOTAL, &ctl), 1);
    let mut times = histogram(&m, RECONCILE_TIME_SECONDS, &ctl);
    times.sort_by(f64::total_cmp);
    assert_eq!(times, vec![0.1, 0.1, 0.1, 0.1, 0.1, 1.1]);
    assert_eq!(gauge(&m, MAX_CONCURRENT_RECONCILES, &ctl), 3.0);
    assert_eq!(gauge(&m, ACTIVE_WORKERS, &ctl), 0.0);
    // The queue's own metrics, labelled with its name.
    assert_eq!(counter(&m, qm::RETRIES_TOTAL, &[("name", "ctl")]), 4);
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
            Ok::<_, ()>(Action::Done)
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
