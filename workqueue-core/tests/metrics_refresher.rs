//! The process-wide refresher keeps the "unfinished work" gauges fresh while every worker is stuck.
//! (Own test binary: it installs a global recorder, which the refresher thread reports to.)
//!
//! The queue runs on a `ManualClock`, so the gauges' values are exact; only the refresher's
//! period is real time, and the test waits for its effect with a generous guard (a liveness
//! bound, not a timing assertion).
#![cfg(feature = "metrics")]

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use workqueue_core::__private::refreshed_queues;
use workqueue_core::metrics::{LONGEST_RUNNING_PROCESSOR_SECONDS, UNFINISHED_WORK_SECONDS};
use workqueue_core::{ManualClock, WorkQueue};

const GUARD: Duration = Duration::from_secs(60);

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

/// Waits until the refresher has published `want` for `name` (it runs every 500 ms).
fn wait_for(snapshotter: &Snapshotter, name: &str, want: f64) {
    let give_up = std::time::Instant::now() + GUARD;
    loop {
        if gauge(snapshotter, name, "stuck") == Some(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the refresher never published {name} = {want}"
        );
        std::thread::park_timeout(Duration::from_millis(20));
    }
}

#[test]
fn refresher_updates_gauges_while_workers_are_stuck() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only global recorder in this binary");

    let clock = ManualClock::new();
    let q: WorkQueue<&'static str> = WorkQueue::builder()
        .name("stuck")
        .clock(clock.clone())
        .build();
    q.add("a");
    let lease = q.get().unwrap(); // the only worker is now stuck on "a"
    assert_eq!(refreshed_queues(), 1);

    // Nothing touches the queue: only the refresher can publish these values.
    clock.advance(Duration::from_millis(1500));
    wait_for(&snapshotter, UNFINISHED_WORK_SECONDS, 1.5);
    wait_for(&snapshotter, LONGEST_RUNNING_PROCESSOR_SECONDS, 1.5);
    clock.advance(Duration::from_secs(1));
    wait_for(&snapshotter, LONGEST_RUNNING_PROCESSOR_SECONDS, 2.5);

    // After shutdown the queue leaves the refresher.
    q.shut_down();
    assert_eq!(refreshed_queues(), 0);
    lease.done();
}
