//! Outage-aware retries in the blocking queue, on a manual clock: what each way of finishing a
//! lease tells the detector, parking, round-robin probes, the paced release in park order, the
//! events, metrics, and user code that panics (a probe, the limiter's pace, the event hook).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use workqueue_core::ratelimit::{
    ExponentialFailure, Instant, MaxPair, OutageConfig, RateLimiter, Signal, TokenBucket,
};
use workqueue_core::state::OutageEvent;
use workqueue_core::{AddOptions, AddStatus, ManualClock, Outcome, WorkQueue};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

type Events = Arc<Mutex<Vec<OutageEvent>>>;

/// A queue on a manual clock with the default detector, a 5 ms backoff and a 1 qps / burst 2
/// bucket (so that the release's pacing shows), recording the detector's events.
fn queue(clock: &ManualClock) -> (WorkQueue<u32>, Events) {
    let events: Events = Arc::default();
    let limiter = MaxPair::new(
        ExponentialFailure::new(ms(5), secs(1000)),
        TokenBucket::new(1.0, 2).unwrap(),
    );
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(limiter)
        .outage_detection(OutageConfig::default())
        .on_outage_event({
            let events = events.clone();
            move |e| events.lock().unwrap().push(*e)
        })
        .build();
    (queue, events)
}

/// Fails every ready key with `retry` until none is ready.
fn fail_all(queue: &WorkQueue<u32>) -> Vec<u32> {
    let mut failed = Vec::new();
    while let Some(lease) = queue.try_get() {
        failed.push(*lease);
        lease.finish(Outcome::retry());
    }
    failed
}

/// Opens the detector over keys `0..n` (n >= 5): every key fails; the first ones retry on their
/// backoff, fail again and are parked too.
fn open(queue: &WorkQueue<u32>, clock: &ManualClock, n: u32) {
    queue.add_batch(0..n);
    fail_all(queue);
    assert!(queue.is_outage_open());
    // Bucket delays reach a few seconds (1 qps); the first probe is due after 1 s: fail it too.
    for _ in 0..20 {
        clock.advance(ms(500));
        fail_all(queue);
    }
}

#[test]
fn forget_is_a_success_retry_a_failure_and_done_says_nothing() {
    let clock = ManualClock::new();
    let (queue, _) = queue(&clock);
    // Four first failures, then successes and `done`s: never five first failures.
    queue.add_batch(0..4);
    fail_all(&queue);
    clock.advance(secs(10));
    for _ in 0..4 {
        queue.try_get().unwrap().finish(Outcome::retry()); // not first failures: the limiter has one recorded
    }
    queue.add_batch(10..20);
    while let Some(lease) = queue.try_get() {
        match *lease {
            10..15 => lease.done(),
            _ => lease.finish(Outcome::forget()),
        }
    }
    assert!(!queue.is_outage_open());
    // A fifth first failure: 5 first failures against 5 successes (`forget`) opens it (ratio
    // 0.5); the 5 `done`s said nothing.
    queue.add(30);
    queue
        .try_get()
        .unwrap()
        .finish(Outcome::retry_after(secs(1)));
    assert!(queue.is_outage_open());
}

#[test]
fn failing_keys_are_parked_and_probed_round_robin_one_at_a_time() {
    let clock = ManualClock::new();
    let (queue, events) = queue(&clock);
    open(&queue, &clock, 8);
    // Seven parked; the eighth waits as the probe (or runs).
    assert_eq!(queue.parked_len(), 7);
    let mut probed = Vec::new();
    for _ in 0..16 {
        clock.advance(secs(5));
        let lease = queue.try_get().expect("one probe per interval");
        assert!(queue.try_get().is_none(), "one probe at a time");
        probed.push(*lease);
        lease.finish(Outcome::retry());
    }
    // Round-robin: every key is probed, each twice in 16 probes.
    let mut counts = [0; 8];
    for k in &probed {
        counts[*k as usize] += 1;
    }
    assert_eq!(counts, [2; 8], "{probed:?}");
    let e = events.lock().unwrap();
    assert_eq!(e[0], OutageEvent::Opened);
    assert!(
        e[1..]
            .iter()
            .all(|e| matches!(e, OutageEvent::ProbeFailed { .. }))
    );
    assert_eq!(
        e.last(),
        Some(&OutageEvent::ProbeFailed { next: secs(5) }),
        "the interval backs off to its cap"
    );
}

#[test]
fn a_successful_probe_releases_every_key_paced_by_the_bucket_in_park_order() {
    let clock = ManualClock::new();
    let (queue, events) = queue(&clock);
    open(&queue, &clock, 6);
    // Let the bucket refill, and find the probe.
    clock.advance(secs(60));
    let probe = queue.try_get().expect("the probe");
    let parked_before = queue.parked_len();
    assert_eq!(parked_before, 5);
    probe.finish(Outcome::forget());
    assert!(!queue.is_outage_open());
    assert_eq!(queue.parked_len(), 0);
    let closed = *events.lock().unwrap().last().unwrap();
    assert!(matches!(closed, OutageEvent::Closed { released: 5, lasted } if lasted > secs(60)));
    // Burst 2 at once, then one per second; never more than that.
    assert_eq!(queue.len(), 2);
    let mut order = Vec::new();
    for _ in 0..2 {
        let lease = queue.try_get().unwrap();
        // Forgotten by the release: no failure recorded, and the release recorded none.
        assert_eq!(queue.num_requeues(&lease), 0);
        order.push(*lease);
        lease.finish(Outcome::forget());
    }
    for _ in 0..3 {
        clock.advance(secs(1));
        assert_eq!(queue.len(), 1);
        let lease = queue.try_get().unwrap();
        order.push(*lease);
        lease.finish(Outcome::forget());
    }
    assert_eq!(order.len(), 5);
}

/// Every kind of add of a parked key leaves it parked: no run, no failure counted, no backoff
/// moved. A higher priority is kept for the release.
#[test]
fn an_add_of_a_parked_key_leaves_it_parked() {
    let clock = ManualClock::new();
    let (queue, _) = queue(&clock);
    open(&queue, &clock, 6);
    let parked = (0..6).find(|&k| queue.is_parked(&k)).unwrap();
    let failures = queue.num_requeues(&parked);
    let before = queue.counts();
    assert_eq!(queue.add(parked), AddStatus::Parked);
    assert_eq!(queue.add_after(parked, ms(1)), AddStatus::Parked);
    assert_eq!(queue.add_rate_limited(parked), AddStatus::Parked);
    let debounced = AddOptions::new().after(ms(1)).debounced(true);
    assert_eq!(queue.add_with(parked, debounced), AddStatus::Parked);
    assert_eq!(
        queue.add_with(parked, AddOptions::new().priority(5)),
        AddStatus::Parked
    );
    queue.add_batch_with([parked], AddOptions::new().rate_limited(true));
    assert!(queue.try_get().is_none(), "nothing runs");
    assert_eq!(queue.counts(), before);
    assert!(queue.is_parked(&parked));
    assert_eq!(queue.num_requeues(&parked), failures, "no failure counted");
    // Released at priority 5: once the bucket's pacing has let every key through, it is first.
    clock.advance(secs(60));
    queue
        .try_get()
        .expect("the probe")
        .finish(Outcome::forget());
    assert!(!queue.is_outage_open());
    clock.advance(secs(10));
    assert_eq!(queue.len(), 5);
    let first = queue.try_get().unwrap();
    assert_eq!((*first, first.priority()), (parked, 5));
}

/// The one way to run a parked key at once: an add that bypasses parking. Its run is an extra
/// probe: a failure parks it again, a success closes the detector and releases every key.
#[test]
fn an_add_that_bypasses_parking_runs_the_key_as_an_extra_probe() {
    let clock = ManualClock::new();
    let (queue, _) = queue(&clock);
    open(&queue, &clock, 6);
    let parked = (0..6).find(|&k| queue.is_parked(&k)).unwrap();
    let bypass = AddOptions::new().bypass_parking(true);
    assert_eq!(queue.add_with(parked, bypass), AddStatus::Queued);
    let lease = queue.try_get().expect("the parked key runs at once");
    assert_eq!(*lease, parked);
    lease.finish(Outcome::retry()); // still down: parked again, the detector stays open
    assert!(queue.is_outage_open());
    assert!(queue.is_parked(&parked));
    queue.add_with(parked, bypass);
    queue.try_get().unwrap().finish(Outcome::forget()); // back: it closes, everything is released
    assert!(!queue.is_outage_open());
    assert_eq!(queue.parked_len(), 0);
}

/// The dirty path: a key re-added during a run that fails while the detector is open is parked,
/// not run again at once; the re-add's priority is carried. A run that succeeds meanwhile is
/// re-queued as usual.
#[test]
fn a_key_re_added_during_a_run_that_fails_while_open_is_parked() {
    let clock = ManualClock::new();
    let (queue, _) = queue(&clock);
    open(&queue, &clock, 6);
    queue.add(100);
    let lease = queue.try_get().unwrap();
    assert_eq!(
        queue.add_with(100, AddOptions::new().priority(3)),
        AddStatus::Dirty
    );
    lease.finish(Outcome::retry());
    assert!(queue.is_parked(&100));
    assert!(queue.try_get().is_none(), "not re-queued");
    // Even a give-up: something asked for it to run again.
    queue.add(101);
    let lease = queue.try_get().unwrap();
    queue.add(101);
    lease.finish(Outcome::forget().with_signal(Signal::Failure));
    assert!(queue.is_parked(&101));
    // A per-object failure (not an outage signal) is re-queued as usual.
    queue.add(102);
    let lease = queue.try_get().unwrap();
    queue.add(102);
    lease.finish(Outcome::retry().with_signal(Signal::Ignored));
    assert!(!queue.is_parked(&102));
    assert_eq!(*queue.try_get().unwrap(), 102);
}

/// A key waiting on its own backoff when the detector opened is not parked: an add runs it at
/// once, as without detection; its failure parks it (its backoff entry is replaced).
#[test]
fn a_key_in_backoff_is_added_as_usual_and_parked_when_it_fails() {
    let clock = ManualClock::new();
    let (queue, _) = queue(&clock);
    open(&queue, &clock, 6);
    // A per-object failure: it waits an hour on its own, not parked.
    queue.add(51);
    let lease = queue.try_get().unwrap();
    lease.finish(Outcome::retry_after(secs(3600)).with_signal(Signal::Ignored));
    assert_eq!(
        queue.add(51),
        AddStatus::Queued,
        "a key in backoff runs at once"
    );
    let lease = queue.try_get().unwrap();
    lease.finish(Outcome::retry());
    assert!(
        queue.is_parked(&51),
        "its failure parks it, replacing its hour"
    );
    assert_eq!(queue.counts().waiting, queue.parked_len() + 1); // and the probe
}

#[test]
fn a_probe_that_panics_is_a_failure() {
    let clock = ManualClock::new();
    let (queue, events) = queue(&clock);
    open(&queue, &clock, 6);
    let n = events.lock().unwrap().len();
    clock.advance(secs(5));
    let probe = queue.try_get().expect("the probe");
    let key = *probe;
    let r = std::thread::spawn(move || {
        let _lease = probe;
        panic!("probe panicked (expected)");
    })
    .join();
    assert!(r.is_err());
    // A lease dropped while panicking retries: a failed probe, parked again.
    assert!(queue.is_outage_open());
    assert!(matches!(
        events.lock().unwrap()[n],
        OutageEvent::ProbeFailed { .. }
    ));
    assert!(queue.is_parked(&key));
}

#[test]
fn give_ups_while_open_are_not_parked() {
    let clock = ManualClock::new();
    let (queue, _) = queue(&clock);
    open(&queue, &clock, 6);
    queue.add(100);
    // A failure given up: a per-object or terminal error.
    queue
        .try_get()
        .unwrap()
        .finish(Outcome::forget().with_signal(Signal::Failure));
    assert!(!queue.is_parked(&100));
    assert_eq!(queue.counts().tracked, 6);
    // A per-object failure retried on its backoff: not parked either.
    queue.add(101);
    queue
        .try_get()
        .unwrap()
        .finish(Outcome::retry().with_signal(Signal::Ignored));
    assert!(!queue.is_parked(&101));
    assert_eq!(queue.parked_len(), 5);
}

#[test]
fn shutdown_drops_parked_keys_and_counts_them() {
    let clock = ManualClock::new();
    let (queue, _) = queue(&clock);
    open(&queue, &clock, 6);
    let parked = queue.parked_len();
    queue.shut_down();
    assert_eq!(queue.parked_dropped_at_shutdown(), parked);
    assert_eq!(queue.parked_len(), 0);
    assert!(queue.try_get().is_none());
    // Drains do not wait for parked keys (there is nothing processing).
    queue.shut_down_with_drain();
}

/// A limiter whose `pace` panics: the probe's lease is finished, the keys are released without
/// delay, and the panic propagates from the finish.
#[test]
fn a_pace_that_panics_still_releases_every_key() {
    struct PanicsOnPace;
    impl RateLimiter<u32> for PanicsOnPace {
        fn when(&self, _: &u32, _: Instant) -> Duration {
            ms(5)
        }
        fn forget(&self, _: &u32) {}
        fn num_requeues(&self, _: &u32) -> u32 {
            0
        }
        fn pace(&self, _: &u32, _: Instant) -> Duration {
            panic!("pace panicked (expected)")
        }
    }
    let clock = ManualClock::new();
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(PanicsOnPace)
        .outage_detection(OutageConfig::default())
        .build();
    queue.add_batch(0..6);
    fail_all(&queue);
    assert!(queue.is_outage_open());
    clock.advance(ms(10));
    fail_all(&queue); // the keys that failed before the opening are parked now
    clock.advance(secs(1));
    let probe = queue.try_get().expect("the probe");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        probe.finish(Outcome::forget())
    }));
    assert!(r.is_err(), "the pace's panic propagates");
    assert!(!queue.is_outage_open());
    assert_eq!(queue.counts().processing, 0);
    assert_eq!(queue.len(), 5, "released without delay");
}

/// An event hook that panics: the key is finished first, the detector changed, then the panic
/// propagates from the finish.
#[test]
fn an_event_hook_that_panics_propagates_after_the_finish() {
    let clock = ManualClock::new();
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .clock(clock.clone())
        .outage_detection(OutageConfig::default())
        .on_outage_event(|_| panic!("hook panicked (expected)"))
        .build();
    queue.add_batch(0..5);
    for _ in 0..4 {
        queue.try_get().unwrap().finish(Outcome::retry());
    }
    let lease = queue.try_get().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lease.finish(Outcome::retry())
    }));
    assert!(r.is_err());
    assert!(queue.is_outage_open());
    assert_eq!(queue.counts().processing, 0);
}

#[cfg(feature = "metrics")]
#[test]
fn a_named_queue_emits_the_parked_gauge_and_the_openings_counter() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let clock = ManualClock::new();
    metrics::with_local_recorder(&recorder, || {
        let queue: WorkQueue<u32> = WorkQueue::builder()
            .name("outage-metrics")
            .clock(clock.clone())
            .outage_detection(OutageConfig::default())
            .build();
        open(&queue, &clock, 6);
    });
    let mut parked = None;
    let mut openings = None;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        match (key.key().name(), value) {
            (workqueue_core::metrics::PARKED_KEYS, DebugValue::Gauge(v)) => {
                parked = Some(v.into_inner())
            }
            (workqueue_core::metrics::OUTAGE_OPENINGS_TOTAL, DebugValue::Counter(n)) => {
                openings = Some(n)
            }
            _ => {}
        }
    }
    assert_eq!(parked, Some(5.0));
    assert_eq!(openings, Some(1));
}

/// Off by default: a queue without outage detection never parks, whatever fails.
#[test]
fn off_by_default() {
    let clock = ManualClock::new();
    let queue: WorkQueue<u32> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_batch(0..50);
    fail_all(&queue);
    assert!(!queue.is_outage_open());
    assert_eq!(queue.parked_len(), 0);
    assert_eq!(queue.counts().waiting, 50);
}
