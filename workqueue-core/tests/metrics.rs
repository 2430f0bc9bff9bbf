//! Queue metrics: client-go's `TestMetrics` with its exact values, and one test per metric.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use workqueue_core::metrics::*;
use workqueue_core::{AddOptions, LOW_PRIORITY, ManualClock, Outcome, WorkQueue};

/// A local recorder, and what it saw.
///
/// `DebuggingRecorder`'s snapshots reset what they read (counters and gauges to 0, histograms
/// emptied), so the probe snapshots once after each step: counters accumulate, histograms
/// accumulate, and a gauge is set back to what it read, so it holds its last value as in a real
/// recorder.
struct Probe {
    recorder: DebuggingRecorder,
    snapshotter: Snapshotter,
    histograms: HashMap<Id, Vec<f64>>,
    values: HashMap<Id, f64>,
}

type Id = (String, Vec<(String, String)>);

impl Probe {
    fn new() -> Self {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        Probe {
            recorder,
            snapshotter,
            histograms: HashMap::new(),
            values: HashMap::new(),
        }
    }

    /// Runs one step under the recorder, then flushes the test's queues (a queue sends its
    /// metrics in batches of 64 operations, and at every refresh), then collects what
    /// was emitted.
    fn run<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let r = metrics::with_local_recorder(&self.recorder, || {
            let r = f();
            QUEUES.with_borrow(|queues| queues.iter().for_each(WorkQueue::refresh_metrics));
            r
        });
        self.collect();
        r
    }

    fn collect(&mut self) {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let k = key.key();
            let labels = k
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            let id = (k.name().to_string(), labels);
            match value {
                DebugValue::Counter(c) => *self.values.entry(id).or_default() += c as f64,
                DebugValue::Gauge(g) => {
                    // The snapshot zeroed the gauge: set it back, as a real recorder keeps a
                    // gauge's value until it is set again (the queue sets only what changed).
                    static META: metrics::Metadata<'static> =
                        metrics::Metadata::new("probe", metrics::Level::INFO, None);
                    metrics::Recorder::register_gauge(&self.recorder, k, &META).set(g.into_inner());
                    self.values.insert(id, g.into_inner());
                }
                DebugValue::Histogram(h) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(h.into_iter().map(|v| v.into_inner())),
            }
        }
    }

    fn id(name: &str, queue: &str) -> Id {
        (name.to_string(), vec![("name".into(), queue.into())])
    }

    fn value(&self, name: &str) -> Option<f64> {
        self.values.get(&Self::id(name, "test")).copied()
    }

    /// The depth gauge of queue `test` for one `priority` label value.
    fn depth(&self, priority: &str) -> Option<f64> {
        let labels = vec![
            ("name".into(), "test".into()),
            ("priority".into(), priority.into()),
        ];
        self.values.get(&(DEPTH.to_string(), labels)).copied()
    }

    /// Every `priority` value the depth gauge of queue `test` has a series for.
    fn depth_labels(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .values
            .keys()
            .filter(|(name, _)| name == DEPTH)
            .map(|(_, labels)| {
                assert_eq!(
                    labels.len(),
                    2,
                    "a depth series without its priority: {labels:?}"
                );
                labels[1].1.clone()
            })
            .collect();
        out.sort();
        out
    }

    fn histogram(&self, name: &str) -> Vec<f64> {
        self.histograms
            .get(&Self::id(name, "test"))
            .cloned()
            .unwrap_or_default()
    }

    fn is_empty(&self) -> bool {
        self.values.is_empty() && self.histograms.is_empty()
    }
}

thread_local! {
    /// The named queues of the running test, which `Probe::run` flushes after each step.
    static QUEUES: std::cell::RefCell<Vec<WorkQueue<&'static str>>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn named(clock: &ManualClock) -> WorkQueue<&'static str> {
    let q: WorkQueue<&'static str> = WorkQueue::builder()
        .name("test")
        .clock(clock.clone())
        // This test flushes (`Probe::run`): the refresher thread would flush to another recorder.
        .metrics_refresh_thread(false)
        .build();
    QUEUES.with_borrow_mut(|queues| queues.push(q.clone()));
    q
}

/// client-go `metrics_test.go` `TestMetrics`, value for value.
#[test]
fn client_go_test_metrics() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q = named(&clock);

    p.run(|| q.add("foo"));
    assert_eq!(p.value(ADDS_TOTAL), Some(1.0));
    assert_eq!(p.depth("0"), Some(1.0));

    clock.advance(Duration::from_micros(50));
    let lease = p.run(|| q.try_get()).expect("foo");
    assert_eq!(*lease, "foo");
    assert_eq!(p.histogram(QUEUE_DURATION_SECONDS), vec![5e-05]);

    // Re-adds while processing count once.
    p.run(|| {
        for _ in 0..5 {
            q.add("foo");
        }
    });
    assert_eq!(p.value(ADDS_TOTAL), Some(2.0));
    assert_eq!(p.depth("0"), Some(1.0));

    clock.advance(Duration::from_micros(25));
    p.run(|| lease.done());
    assert_eq!(p.histogram(WORK_DURATION_SECONDS), vec![2.5e-05]);
    assert_eq!(p.depth("0"), Some(1.0));

    let lease = p.run(|| q.try_get()).expect("foo again");
    assert_eq!(*lease, "foo");
    assert_eq!(p.histogram(QUEUE_DURATION_SECONDS), vec![5e-05, 2.5e-05]);

    clock.advance(Duration::from_millis(1));
    p.run(|| q.refresh_metrics());
    assert_eq!(p.value(UNFINISHED_WORK_SECONDS), Some(0.001));
    assert_eq!(p.value(LONGEST_RUNNING_PROCESSOR_SECONDS), Some(0.001));

    p.run(|| lease.done());
    assert_eq!(p.histogram(WORK_DURATION_SECONDS), vec![2.5e-05, 0.001]);
    assert_eq!(p.depth("0"), Some(0.0));
}

#[test]
fn unnamed_queue_emits_nothing() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q: WorkQueue<&'static str> = WorkQueue::builder().clock(clock.clone()).build();
    p.run(|| {
        q.add("a");
        q.add_after("b", Duration::from_secs(1));
        q.add_rate_limited("c");
        let lease = q.try_get().unwrap();
        clock.advance(Duration::from_secs(2));
        lease.finish(Outcome::retry());
        q.refresh_metrics();
        q.shut_down();
    });
    assert!(p.is_empty());
}

#[test]
fn unnamed_queue_keeps_no_per_key_timing() {
    let clock = ManualClock::new();
    let unnamed: WorkQueue<u32> = WorkQueue::builder().clock(clock.clone()).build();
    let named: WorkQueue<u32> = WorkQueue::builder().name("n").clock(clock).build();
    for k in 0..1000 {
        unnamed.add(k);
        named.add(k);
    }
    let leases: Vec<_> = (0..1000).filter_map(|_| unnamed.try_get()).collect();
    let named_leases: Vec<_> = (0..1000).filter_map(|_| named.try_get()).collect();
    assert!(unnamed.allocated_bytes() < named.allocated_bytes());
    drop((leases, named_leases));
}

#[test]
fn recorder_installed_after_construction_still_receives() {
    let clock = ManualClock::new();
    let q = named(&clock); // built before any recorder exists
    q.add("early"); // recorded, not yet sent: metrics go out in batches
    let mut p = Probe::new();
    p.run(|| q.add("late"));
    // The batch, early add included, goes to the recorder in effect when it is sent.
    assert_eq!(p.value(ADDS_TOTAL), Some(2.0));
    assert_eq!(p.depth("0"), Some(2.0));
}

#[test]
fn depth_and_adds_count_due_delayed_keys() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q = named(&clock);
    p.run(|| q.add_after("a", Duration::from_secs(1)));
    // Registered with the queue's other handles, not incremented: a delayed add is not an add.
    assert_eq!(p.value(ADDS_TOTAL), Some(0.0));
    assert_eq!(p.depth("0"), Some(0.0));
    assert_eq!(p.value(WAITING_DEPTH), Some(1.0));
    clock.advance(Duration::from_secs(1));
    p.run(|| assert_eq!(q.len(), 1));
    assert_eq!(p.value(ADDS_TOTAL), Some(1.0));
    assert_eq!(p.depth("0"), Some(1.0));
    assert_eq!(p.value(WAITING_DEPTH), Some(0.0));
    clock.advance(Duration::from_millis(2));
    let lease = p.run(|| q.try_get()).unwrap();
    // Queue duration runs from when the key became due (its add), not from add_after.
    assert_eq!(p.histogram(QUEUE_DURATION_SECONDS), vec![0.002]);
    assert_eq!(p.depth("0"), Some(0.0));
    p.run(|| lease.done());
}

#[test]
fn retries_count_every_delayed_add_not_rejected_by_shutdown() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q = named(&clock);
    p.run(|| {
        q.add_after("a", Duration::ZERO); // delay 0 counts, as in client-go
        q.add_after("b", Duration::from_secs(1));
        q.add_after("b", Duration::from_secs(2)); // de-duplicated, still a retry
        q.add_rate_limited("c");
    });
    assert_eq!(p.value(RETRIES_TOTAL), Some(4.0));
    p.run(|| {
        let lease = q.try_get().unwrap(); // "a"
        lease.finish(Outcome::retry());
        q.add("x");
        let lease = q.try_get().unwrap();
        lease.finish(Outcome::retry_after(Duration::from_secs(1)));
        q.add("d");
        let lease = q.try_get().unwrap();
        lease.finish(Outcome::requeue_after(Duration::from_secs(1)));
        q.add("e");
        let lease = q.try_get().unwrap();
        lease.finish(Outcome::forget()); // not a retry
    });
    assert_eq!(p.value(RETRIES_TOTAL), Some(7.0));
    p.run(|| {
        q.add("f");
        let lease = q.try_get().unwrap();
        q.shut_down();
        q.add_after("g", Duration::ZERO);
        q.add_rate_limited("g");
        lease.finish(Outcome::retry());
    });
    assert_eq!(p.value(RETRIES_TOTAL), Some(7.0));
}

#[test]
fn rate_limiter_delays_are_observed() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q = named(&clock);
    p.run(|| {
        q.add_rate_limited("a"); // 5 ms, the default limiter's first failure
        q.add_rate_limited("a"); // 10 ms
        clock.advance(Duration::from_millis(5));
        let lease = q.try_get().unwrap();
        lease.finish(Outcome::retry()); // 20 ms
    });
    let delays = p.histogram(RATE_LIMITER_DELAY_SECONDS);
    assert_eq!(delays, vec![0.005, 0.01, 0.02]);
    assert_eq!(p.value(WAITING_DEPTH), Some(1.0));
}

#[test]
fn work_duration_and_unfinished_work_with_two_leases() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q = named(&clock);
    p.run(|| q.add("a"));
    let a = p.run(|| q.try_get()).unwrap();
    clock.advance(Duration::from_millis(3));
    p.run(|| q.add("b"));
    let b = p.run(|| q.try_get()).unwrap();
    clock.advance(Duration::from_millis(1));
    p.run(|| q.refresh_metrics());
    assert_eq!(p.value(UNFINISHED_WORK_SECONDS), Some(0.005));
    assert_eq!(p.value(LONGEST_RUNNING_PROCESSOR_SECONDS), Some(0.004));
    p.run(|| a.done());
    p.run(|| q.refresh_metrics());
    assert_eq!(p.value(UNFINISHED_WORK_SECONDS), Some(0.001));
    assert_eq!(p.value(LONGEST_RUNNING_PROCESSOR_SECONDS), Some(0.001));
    p.run(|| b.done());
    p.run(|| q.refresh_metrics());
    assert_eq!(p.value(UNFINISHED_WORK_SECONDS), Some(0.0));
    assert_eq!(p.histogram(WORK_DURATION_SECONDS), vec![0.004, 0.001]);
}

#[test]
fn metrics_are_described_with_units() {
    // Descriptions are sent once per process, to the recorder current at the first emission:
    // run this test's emission under a recorder that sees them if it is the first.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let clock = ManualClock::new();
    let q = named(&clock);
    metrics::with_local_recorder(&recorder, || q.add("a"));
    let units: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(k, unit, desc, _)| Some((k.key().name().to_string(), unit?, desc?)))
        .collect();
    // Either this recorder saw the descriptions, or another test's did first.
    for (name, unit, _) in units {
        if name == DEPTH || name == ADDS_TOTAL {
            assert_eq!(unit, metrics::Unit::Count);
        }
    }
}

/// controller-runtime's `ExponentialBuckets(10e-9, 10, 12)`.
#[test]
fn buckets_are_controller_runtime_s() {
    let expected: Vec<f64> = (0..12).map(|i| 1e-8 * 10f64.powi(i)).collect();
    assert_eq!(DURATION_BUCKETS.len(), expected.len());
    for (a, b) in DURATION_BUCKETS.iter().zip(&expected) {
        assert!((a - b).abs() <= b * 1e-9, "{a} vs {b}");
    }
}

#[test]
fn depth_is_labelled_by_priority_and_moves_with_a_raise() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q = named(&clock);
    p.run(|| q.add("a"));
    p.run(|| q.add_with("b", AddOptions::new().priority(LOW_PRIORITY)));
    p.run(|| q.add_with("c", AddOptions::new().priority(10)));
    assert_eq!(p.depth("0"), Some(1.0));
    assert_eq!(p.depth("-100"), Some(1.0));
    assert_eq!(p.depth("10"), Some(1.0));

    // Raised: its depth moves to the new priority.
    p.run(|| q.add_with("b", AddOptions::new().priority(10)));
    assert_eq!(p.depth("-100"), Some(0.0));
    assert_eq!(p.depth("10"), Some(2.0));

    // Handed out, then re-added while processing (dirty), raised, and queued when it ends.
    let c = p.run(|| q.try_get()).unwrap();
    assert_eq!(*c, "c");
    assert_eq!(p.depth("10"), Some(1.0));
    p.run(|| q.add_with("c", AddOptions::new().priority(5)));
    assert_eq!(p.depth("5"), Some(1.0));
    p.run(|| q.add_with("c", AddOptions::new().priority(20)));
    assert_eq!((p.depth("5"), p.depth("20")), (Some(0.0), Some(1.0)));
    p.run(|| c.done());
    assert_eq!(p.depth("20"), Some(1.0));

    // One series per priority, no unlabelled one beside them.
    assert_eq!(p.depth_labels(), ["-100", "0", "10", "20", "5"]);
    assert_eq!(p.value(DEPTH), None);
}

#[test]
fn priorities_beyond_the_label_limit_share_the_overflow_value_and_stay_exact() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q = named(&clock);
    // The documented cap: 25 priorities get a series each. Priority 0 always has its series: 24
    // more priorities get one each, the rest overflow.
    const PRIORITY_LABELS: usize = 25;
    let labelled = PRIORITY_LABELS as i32 - 1;
    let extra = 5;
    for i in 1..=labelled + extra {
        p.run(|| {
            q.add_with(
                format!("k{i}").leak() as &str,
                AddOptions::new().priority(i),
            )
        });
    }
    assert_eq!(p.depth_labels().len(), PRIORITY_LABELS + 1);
    assert_eq!(p.depth("0"), Some(0.0));
    assert_eq!(p.depth(EXCEEDED_CARDINALITY_LIMIT), Some(f64::from(extra)));
    for i in 1..=labelled {
        assert_eq!(p.depth(&i.to_string()), Some(1.0), "priority {i}");
    }
    // The highest priorities, the overflowed ones, go first: the overflow value drains to 0 and
    // every labelled series keeps its exact value (controller-runtime's would go stale).
    for _ in 0..extra {
        p.run(|| q.try_get()).unwrap().done();
    }
    assert_eq!(p.depth(EXCEEDED_CARDINALITY_LIMIT), Some(0.0));
    assert_eq!(p.depth(&labelled.to_string()), Some(1.0));
    let lease = p.run(|| q.try_get()).unwrap();
    assert_eq!(*lease, format!("k{labelled}"));
    assert_eq!(p.depth(&labelled.to_string()), Some(0.0));
}

#[test]
fn oldest_ready_is_the_longest_wait_of_a_queued_key() {
    let mut p = Probe::new();
    let clock = ManualClock::new();
    let q = named(&clock);
    p.run(|| q.add_with("low", AddOptions::new().priority(LOW_PRIORITY)));
    clock.advance(Duration::from_secs(2));
    p.run(|| q.add("normal"));
    clock.advance(Duration::from_secs(1));
    p.run(|| q.refresh_metrics());
    assert_eq!(p.value(OLDEST_READY_SECONDS), Some(3.0));

    // The normal key goes first; the low one is still the oldest.
    let normal = p.run(|| q.try_get()).unwrap();
    assert_eq!(*normal, "normal");
    p.run(|| q.refresh_metrics());
    assert_eq!(p.value(OLDEST_READY_SECONDS), Some(3.0));

    // A key re-added while processing is not ready: it does not count.
    let low = p.run(|| q.try_get()).unwrap();
    clock.advance(Duration::from_secs(1));
    p.run(|| q.add("normal"));
    p.run(|| q.refresh_metrics());
    assert_eq!(p.value(OLDEST_READY_SECONDS), Some(0.0));
    p.run(|| normal.done());
    clock.advance(Duration::from_secs(1));
    p.run(|| q.refresh_metrics());
    assert_eq!(p.value(OLDEST_READY_SECONDS), Some(1.0));
    low.done();
}
