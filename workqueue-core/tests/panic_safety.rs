//! User code that panics inside the queue (the crate docs' rule for user code): a key's `Clone`, `Hash`, `Eq` or
//! `Drop`, a rate limiter, a metrics recorder, a batch's iterator. Each test arms one panic at a
//! chosen call (`workqueue_model::faults`) and checks that the panic reaches the caller, that no
//! key is stranded, and that the queue stays usable with its invariants intact.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use workqueue_core::__private::StateTesting;
use workqueue_core::ratelimit::ExponentialFailure;
use workqueue_core::state::{Get, QueueState};
use workqueue_core::{AddOptions, Instant, ManualClock, Outcome, WorkQueue};
use workqueue_model::faults::{self, Fault, FaultyKey, FaultyLimiter};

fn key(name: &str) -> FaultyKey {
    FaultyKey::from(name)
}

fn manual_queue() -> WorkQueue<FaultyKey> {
    WorkQueue::builder().clock(ManualClock::new()).build()
}

/// The drain that every test ends with: nothing is processing, so it completes at once.
fn assert_drains(queue: &WorkQueue<FaultyKey>) {
    queue.shut_down();
    while let Some(lease) = queue.try_get() {
        lease.done();
    }
    assert!(
        queue.shut_down_with_drain_timeout(Duration::ZERO).is_ok(),
        "a key is stranded in flight"
    );
}

// ---- 1. a key's Clone in get ------------------------------------------------------------------

#[test]
fn state_get_whose_clone_panics_leaves_the_key_at_the_head() {
    let mut s: QueueState<FaultyKey> = QueueState::new();
    let t = Instant::ZERO;
    s.add(key("a"), AddOptions::new(), t);
    s.add(key("b"), AddOptions::new(), t);
    assert!(faults::with_fault(Fault::Clone, 1, || s.get(t)).is_err());
    s.check_invariants();
    assert_eq!(s.counts().processing, 0);
    let Get::Ready(ticket, k) = s.get(t) else {
        panic!("nothing ready")
    };
    assert_eq!(k.as_str(), "a", "the key stays at the head");
    let _ = s.finish(ticket, Outcome::done(), None, t, |_| Duration::ZERO);
    s.check_invariants();
}

#[test]
fn a_key_whose_clone_panics_in_get_is_handed_out_by_the_next_get() {
    let queue = manual_queue();
    queue.add(key("a"));
    assert!(faults::with_fault(Fault::Clone, 1, || queue.try_get()).is_err());
    let c = queue.counts();
    assert_eq!((c.ready, c.processing), (1, 0), "the key is not stranded");
    // Re-adding it is de-duplicated, as for any queued key, and the next get hands it out.
    queue.add(key("a"));
    let lease = queue.try_get().expect("the key is still queued");
    assert_eq!(lease.as_str(), "a");
    lease.done();
    assert_drains(&queue);
}

#[test]
fn a_batch_get_whose_clone_panics_takes_nothing() {
    let queue = manual_queue();
    queue.add_batch(["a", "b", "c"].map(key));
    assert!(faults::with_fault(Fault::Clone, 3, || queue.try_get_batch(3)).is_err());
    let order: Vec<String> = queue
        .try_get_batch(3)
        .into_iter()
        .map(|l| l.as_str().to_owned())
        .collect();
    assert_eq!(order, ["a", "b", "c"], "the batch went back in order");
    assert_drains(&queue);
}

// ---- 3. a batch's iterator --------------------------------------------------------------------

/// The keys before the panic stay added. (That a getter waiting meanwhile is woken for them is
/// checked deterministically on paused time, in `workqueue-tokio/tests/queue_panic_safety.rs`:
/// both queues send wake-ups through the same `QueueCore::mutate`.)
#[test]
fn an_add_batch_whose_iterator_panics_keeps_the_keys_before_it() {
    let queue = manual_queue();
    let keys = ["a", "b", "c"].into_iter().map(|k| {
        assert_ne!(k, "c", "the iterator panics");
        key(k)
    });
    assert!(catch_unwind(AssertUnwindSafe(|| queue.add_batch(keys))).is_err());
    let order: Vec<String> = queue
        .try_get_batch(3)
        .into_iter()
        .map(|l| l.as_str().to_owned())
        .collect();
    assert_eq!(order, ["a", "b"]);
    assert_drains(&queue);
}

// ---- 4. a key's Hash while the index grows ----------------------------------------------------

#[test]
fn a_hash_that_panics_while_the_index_grows_leaves_the_state_usable() {
    let mut s: QueueState<FaultyKey> = QueueState::new();
    let t = Instant::ZERO;
    let mut added = Vec::new();
    for i in 0..200 {
        let name = format!("k{i}");
        // The first hash is the new key's own; later ones are the growth's, when it grows (at
        // 3, 7, 14, 28, 56 and 112 keys): a panic part-way through it, after some keys.
        let nth = 2 + (i / 2) as u32;
        match faults::with_fault(Fault::Hash, nth, || s.add(key(&name), AddOptions::new(), t)) {
            Ok(_) => added.push(name),
            Err(_) => {
                s.check_invariants();
                s.add(key(&name), AddOptions::new(), t);
                added.push(name);
            }
        }
        s.check_invariants();
    }
    let mut got = Vec::new();
    while let Get::Ready(ticket, k) = s.get(t) {
        got.push(k.as_str().to_owned());
        let _ = s.finish(ticket, Outcome::done(), None, t, |_| Duration::ZERO);
        s.check_invariants();
    }
    assert_eq!(got, added, "every key, once, in FIFO order");
    assert_eq!(s.counts().tracked, 0);
}

#[test]
fn finishing_a_key_never_hashes_it_even_without_a_recorded_bucket() {
    let mut s: QueueState<FaultyKey> = QueueState::new();
    s.limit_recorded_buckets(0);
    let t = Instant::ZERO;
    for name in ["a", "b", "c", "d", "e"] {
        s.add(key(name), AddOptions::new(), t);
    }
    s.add(key("w"), AddOptions::new().after(Duration::from_secs(1)), t);
    while let Get::Ready(ticket, _) = s.get(t) {
        let f = faults::with_fault(Fault::Hash, 1, || {
            s.finish(ticket, Outcome::done(), None, t, |_| Duration::ZERO)
        });
        let f = f
            .expect("finish hashes no key")
            .expect("a ticket of this state");
        assert!(f.released.is_some());
        s.check_invariants();
    }
    let released = faults::with_fault(Fault::Hash, 1, || s.shut_down());
    assert_eq!(released.expect("shut_down hashes no key").len(), 1);
    s.check_invariants();
    assert_eq!(s.counts().tracked, 0);
}

// ---- limiters, recorders and key Drop when a lease ends ----------------------------------------

fn faulty_limiter_queue() -> WorkQueue<FaultyKey> {
    let limiter = FaultyLimiter(ExponentialFailure::new(
        Duration::from_millis(5),
        Duration::from_secs(1),
    ));
    WorkQueue::builder()
        .clock(ManualClock::new())
        .rate_limiter(limiter)
        .build()
}

#[test]
fn a_limiter_that_panics_while_a_lease_retries_still_finishes_the_key() {
    let queue = faulty_limiter_queue();
    queue.add(key("a"));
    let lease = queue.try_get().unwrap();
    assert!(faults::with_fault(Fault::Limiter, 1, || lease.finish(Outcome::retry())).is_err());
    let c = queue.counts();
    assert_eq!(
        (c.processing, c.waiting, c.tracked),
        (0, 0, 0),
        "finished, not re-added: the limiter gave no delay"
    );
    assert_drains(&queue);
}

#[test]
fn a_lease_dropped_while_unwinding_swallows_a_panicking_limiter() {
    let queue = faulty_limiter_queue();
    queue.add(key("a"));
    let r = faults::with_fault(Fault::Limiter, 1, || {
        let _lease = queue.try_get().unwrap();
        panic!("reconcile failed");
    });
    let message = r.unwrap_err();
    assert_eq!(
        message.downcast_ref::<&str>(),
        Some(&"reconcile failed"),
        "the first panic continues; the limiter's was swallowed, not a second panic (abort)"
    );
    assert_eq!(queue.counts().processing, 0);
    assert_drains(&queue);
}

#[test]
fn a_lease_dropped_while_unwinding_swallows_a_panicking_key_drop() {
    let queue = manual_queue();
    queue.add(key("a"));
    // Not while unwinding: the key's Drop panics out of `done`, after the key is finished.
    let lease = queue.try_get().unwrap();
    assert!(faults::with_fault(Fault::Drop, 1, || lease.done()).is_err());
    assert_eq!(queue.counts().processing, 0);
    // While unwinding, the injected Drop panic never fires (it would abort), so also drop a
    // lease whose limiter panics in the same unwinding: both are caught by the lease's Drop.
    queue.add(key("b"));
    let r = faults::with_fault(Fault::Drop, 1, || {
        let _lease = queue.try_get().unwrap();
        panic!("reconcile failed");
    });
    assert!(r.is_err());
    assert_eq!(queue.counts().processing, 0);
    assert_drains(&queue);
}

// ---- 2. a metrics recorder --------------------------------------------------------------------

#[cfg(feature = "metrics")]
mod recorder {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };

    /// A recorder whose every emission panics while `armed` is set.
    #[derive(Debug, Default)]
    pub(super) struct PanickingRecorder {
        pub(super) armed: Arc<AtomicBool>,
    }

    #[derive(Debug)]
    struct Handle(Arc<AtomicBool>);

    impl Handle {
        fn strike(&self) {
            if self.0.load(Ordering::Relaxed) {
                std::panic::panic_any(faults::INJECTED);
            }
        }
    }

    impl CounterFn for Handle {
        fn increment(&self, _: u64) {
            self.strike()
        }
        fn absolute(&self, _: u64) {
            self.strike()
        }
    }

    impl GaugeFn for Handle {
        fn increment(&self, _: f64) {
            self.strike()
        }
        fn decrement(&self, _: f64) {
            self.strike()
        }
        fn set(&self, _: f64) {
            self.strike()
        }
    }

    impl HistogramFn for Handle {
        fn record(&self, _: f64) {
            self.strike()
        }
    }

    impl Recorder for PanickingRecorder {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Handle(self.armed.clone())))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(Handle(self.armed.clone())))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(Arc::new(Handle(self.armed.clone())))
        }
    }

    fn named_queue() -> WorkQueue<FaultyKey> {
        WorkQueue::builder()
            .clock(ManualClock::new())
            .name("panicking-recorder")
            .metrics_refresh_thread(false)
            .build()
    }

    /// Runs `f` under the recorder, armed.
    fn armed<R>(rec: &PanickingRecorder, f: impl FnOnce() -> R) -> std::thread::Result<R> {
        faults::silence_injected_panics();
        metrics::with_local_recorder(rec, || {
            rec.armed.store(true, Ordering::Relaxed);
            let r = catch_unwind(AssertUnwindSafe(f));
            rec.armed.store(false, Ordering::Relaxed);
            r
        })
    }

    /// Brings `queue` to one operation before its next flush (a queue sends its metrics every
    /// `FLUSH_EVERY` operations), with operations that change nothing: re-adds of `queued`.
    fn one_before_a_flush(rec: &PanickingRecorder, queue: &WorkQueue<FaultyKey>, queued: &str) {
        metrics::with_local_recorder(rec, || {
            queue.refresh_metrics();
            for _ in 1..workqueue_core::__private::FLUSH_EVERY {
                queue.add(key(queued));
            }
        });
    }

    #[test]
    fn a_recorder_that_panics_in_get_leaves_the_key_queued() {
        let rec = PanickingRecorder::default();
        let queue = named_queue();
        metrics::with_local_recorder(&rec, || queue.add(key("a")));
        one_before_a_flush(&rec, &queue, "a");
        assert!(armed(&rec, || queue.try_get()).is_err());
        let c = queue.counts();
        assert_eq!((c.ready, c.processing), (1, 0), "the key is not stranded");
        let lease = metrics::with_local_recorder(&rec, || queue.try_get()).expect("still queued");
        assert_eq!(lease.as_str(), "a");
        lease.done();
        assert_drains(&queue);
    }

    #[test]
    fn a_recorder_that_panics_in_add_keeps_the_added_key() {
        let rec = PanickingRecorder::default();
        let queue = named_queue();
        queue.add(key("pad"));
        one_before_a_flush(&rec, &queue, "pad");
        assert!(armed(&rec, || queue.add(key("a"))).is_err());
        assert_eq!(
            queue.len(),
            2,
            "the add happened before the recorder was called"
        );
        assert_drains(&queue);
    }

    #[test]
    fn a_recorder_that_panics_while_a_lease_ends_finishes_the_key() {
        let rec = PanickingRecorder::default();
        let queue = named_queue();
        queue.add(key("a"));
        let lease = queue.try_get().unwrap();
        assert!(armed(&rec, || lease.finish(Outcome::retry())).is_err());
        let c = queue.counts();
        assert_eq!((c.processing, c.waiting), (0, 1), "finished and retried");
        // While unwinding, the lease's Drop swallows the recorder's panic (no abort).
        queue.add(key("b"));
        let lease = queue.try_get().unwrap();
        let r = armed(&rec, move || {
            let _lease = lease;
            panic!("reconcile failed");
        });
        assert!(r.is_err());
        assert_eq!(queue.counts().processing, 0);
        assert_drains(&queue);
    }
}

// ---- a limiter used by add_rate_limited -------------------------------------------------------

#[test]
fn a_limiter_that_panics_in_add_rate_limited_changes_nothing() {
    let queue = faulty_limiter_queue();
    assert!(faults::with_fault(Fault::Limiter, 1, || queue.add_rate_limited(key("a"))).is_err());
    assert_eq!(queue.counts(), Default::default());
    assert_eq!(queue.num_requeues(&key("a")), 0, "no failure was recorded");
    assert_drains(&queue);
}

// ---- a fairness group function ------------------------------------------------------------------

#[test]
fn a_group_function_that_panics_changes_nothing() {
    let queue: WorkQueue<FaultyKey> = WorkQueue::builder()
        .clock(ManualClock::new())
        .fairness(|key: &FaultyKey| {
            assert_ne!(key.as_str(), "bad", "injected: group");
            key.as_str().len()
        })
        .build();
    queue.add(key("a"));
    assert!(catch_unwind(AssertUnwindSafe(|| queue.add(key("bad")))).is_err());
    let c = queue.counts();
    assert_eq!((c.ready, c.tracked), (1, 1));
    queue.add(key("b"));
    assert_eq!(queue.try_get_batch(2).len(), 2);
    assert_drains(&queue);
}

// ---- a clock's `recent` (aging reads it under the lock) ---------------------------------------

/// A manual clock whose [`Clock::recent`] panics while armed.
#[derive(Debug, Clone, Default)]
struct RecentPanics {
    clock: ManualClock,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl workqueue_core::Clock for RecentPanics {
    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn recent(&self) -> Instant {
        assert!(
            !self.armed.load(std::sync::atomic::Ordering::SeqCst),
            "injected: recent"
        );
        self.clock.now()
    }

    fn is_virtual(&self) -> bool {
        true
    }

    fn register(&self, waker: std::sync::Weak<dyn workqueue_core::ClockWaker>) {
        self.clock.register(waker)
    }
}

#[test]
fn a_clock_whose_recent_panics_under_aging_changes_nothing() {
    let clock = RecentPanics::default();
    let queue: WorkQueue<FaultyKey> = WorkQueue::builder()
        .clock(clock.clone())
        .max_ready_wait(Duration::from_secs(1))
        .build();
    queue.add(key("a"));
    clock.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(catch_unwind(AssertUnwindSafe(|| queue.add(key("b")))).is_err());
    assert!(catch_unwind(AssertUnwindSafe(|| queue.try_get())).is_err());
    clock
        .armed
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let c = queue.counts();
    assert_eq!(
        (c.ready, c.processing, c.tracked),
        (1, 0, 1),
        "only `a`, still queued"
    );
    let lease = queue.try_get().expect("`a` is handed out");
    assert_eq!(lease.as_str(), "a");
    lease.done();
    queue.add(key("b"));
    assert_eq!(queue.try_get().expect("`b`").as_str(), "b");
    assert_drains(&queue);
}
