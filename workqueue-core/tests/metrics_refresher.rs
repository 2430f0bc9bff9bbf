//! The process-wide refresher keeps the "unfinished work" gauges fresh while every worker is stuck.
//! (Own test binary: it installs a global recorder, which the refresher thread reports to.)
#![cfg(feature = "metrics")]

use std::thread::sleep;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use workqueue_core::WorkQueue;
use workqueue_core::metrics::{LONGEST_RUNNING_PROCESSOR_SECONDS, UNFINISHED_WORK_SECONDS};

fn gauge(snapshotter: &Snapshotter, name: &str, queue: &str) -> Option<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(k, _, _, v)| {
            let key = k.key();
            let named = key
                .labels()
                .any(|l| l.key() == "name" && l.value() == queue);
            match v {
                DebugValue::Gauge(g) if key.name() == name && named => Some(g.into_inner()),
                _ => None,
            }
        })
}

#[test]
fn refresher_updates_gauges_while_workers_are_stuck() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only global recorder in this binary");

    let q: WorkQueue<&'static str> = WorkQueue::builder().name("stuck").build();
    q.add("a");
    let lease = q.get().unwrap(); // the only worker is now stuck on "a"
    sleep(Duration::from_millis(1200));
    let first = gauge(&snapshotter, UNFINISHED_WORK_SECONDS, "stuck").expect("refreshed");
    assert!(first >= 0.5, "unfinished work {first}");
    sleep(Duration::from_millis(700));
    let second = gauge(&snapshotter, LONGEST_RUNNING_PROCESSOR_SECONDS, "stuck").expect("fresh");
    assert!(second > first, "longest running {second} after {first}");

    // After shutdown the queue leaves the refresher: no more updates.
    q.shut_down();
    sleep(Duration::from_millis(700));
    let _ = snapshotter.snapshot(); // clear
    sleep(Duration::from_millis(700));
    assert_eq!(
        gauge(&snapshotter, UNFINISHED_WORK_SECONDS, "stuck"),
        Some(0.0),
        "refreshed after shutdown"
    );
    lease.done();
}
