//! The blocking `WorkQueue` on a `ManualClock`, driven from one thread by arbitrary operations.
//!
//! Never a blocking `get`: only `try_get`, `try_get_batch`, `get_timeout(0)`, and `get()` once the
//! queue is shutting down (which returns at once). Leases are held and finished in any order with
//! every finishing method (or dropped). The queue runs in lock step with the reference model; the
//! rate limiter is wrapped so the delays it hands the queue are fed to the model as well: every
//! status, every leased key, `len`, the drain reports and `counts` must agree. After every step:
//! no key is held by two leases, every held key is processing, no limiter answer is left unused.
//! `counts()` promotes due keys, so it is an operation of its own (checking it after every step
//! would promote everything before the next operation, hiding promotions inside the others).
//!
//! Panic injection: `PanicLimiter` makes the limiter panic at its next call (in the next
//! operation only). The panic must reach the caller, and the queue must behave as the driver
//! documents: `add_rate_limited` and `forget` change nothing; a lease whose limiter panics is
//! still finished, with no re-add for a `Retry` (the limiter gave no delay).
#![no_main]

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use workqueue_core::{AddOptions, Clock, DrainStop, Lease, ManualClock, WorkQueue};
use workqueue_fuzz::{FDelay, FOutcome};
use workqueue_model::faults::{self, Fault};
use workqueue_model::{Model, ModelGet, Outcome};
use workqueue_ratelimit::{
    ExponentialFailure, FastSlow, Instant, RateLimiter, TokenBucket,
    default_controller_rate_limiter,
};

type Key = String;

#[derive(Debug, Arbitrary)]
enum LimiterChoice {
    Default,
    Exponential {
        base_ms: u8,
        max_ms: u16,
    },
    FastSlow {
        fast_ms: u8,
        slow_ms: u16,
        attempts: u8,
    },
    Bucket {
        millis_per_token: u8,
        burst: u8,
    },
    /// Runs out after `burst` tokens: later retries never fire (`AddStatus::Never`).
    Exhaustible {
        burst: u8,
    },
    Zero,
}

#[derive(Debug, Arbitrary)]
enum Finish {
    Drop,
    Done,
    Forget,
    Retry,
    RetryAfter(FDelay),
    RequeueAfter(FDelay),
    Outcome(FOutcome),
}

#[derive(Debug, Arbitrary)]
enum QOp {
    Add(u8),
    AddRef(u8),
    AddBatch(Vec<u8>),
    AddAfter(u8, FDelay),
    AddRateLimited(u8),
    /// `add_with`: a priority (a few that collide), a delay, and the rate limiter.
    AddWith(u8, i8, FDelay, bool),
    TryGet,
    GetTimeoutZero,
    TryGetBatch(u8),
    /// A blocking `get`, issued only while shutting down (it cannot block then).
    GetWhenShuttingDown,
    Finish(u8, Finish),
    Forget(u8),
    NumRequeues(u8),
    Advance(FDelay),
    AdvanceMs(u8),
    Len,
    /// `counts()`, which promotes due keys first (so it is an operation, not a passive check).
    Counts,
    ShutDown(u8),
    DrainTimeoutZero(u8),
    /// `shut_down_with_drain()`, issued only when no lease is held (it returns at once then).
    DrainWhenIdle(u8),
    /// The limiter panics at its next call, in the next operation.
    PanicLimiter,
}

#[derive(Debug, Arbitrary)]
struct Input {
    limiter: LimiterChoice,
    ops: Vec<QOp>,
}

/// Records what the limiter answers, so the model gets the same delays.
struct Recording {
    inner: Box<dyn RateLimiter<Key>>,
    answers: Arc<Mutex<Vec<Duration>>>,
}

impl RateLimiter<Key> for Recording {
    fn when(&self, key: &Key, now: Instant) -> Duration {
        faults::strike(Fault::Limiter);
        let d = self.inner.when(key, now);
        self.answers.lock().unwrap().push(d);
        d
    }
    fn forget(&self, key: &Key) {
        faults::strike(Fault::Limiter);
        self.inner.forget(key)
    }
    fn num_requeues(&self, key: &Key) -> u32 {
        self.inner.num_requeues(key)
    }
}

struct Zero;

impl RateLimiter<Key> for Zero {
    fn when(&self, _: &Key, _: Instant) -> Duration {
        Duration::ZERO
    }
    fn forget(&self, _: &Key) {}
    fn num_requeues(&self, _: &Key) -> u32 {
        0
    }
}

fn limiter(choice: &LimiterChoice) -> Box<dyn RateLimiter<Key>> {
    let ms = |n: u64| Duration::from_millis(n);
    match *choice {
        LimiterChoice::Default => Box::new(default_controller_rate_limiter::<Key>()),
        LimiterChoice::Exponential { base_ms, max_ms } => Box::new(ExponentialFailure::<Key>::new(
            ms(base_ms.into()),
            ms(max_ms.into()),
        )),
        LimiterChoice::FastSlow {
            fast_ms,
            slow_ms,
            attempts,
        } => Box::new(FastSlow::<Key>::new(
            ms(fast_ms.into()),
            ms(slow_ms.into()),
            attempts.into(),
        )),
        LimiterChoice::Bucket {
            millis_per_token,
            burst,
        } => {
            let qps = 1000.0 / f64::from(millis_per_token.max(1));
            Box::new(TokenBucket::new(qps, u32::from(burst).max(1)).unwrap())
        }
        LimiterChoice::Exhaustible { burst } => {
            Box::new(TokenBucket::new(0.0, u32::from(burst).max(1)).unwrap())
        }
        LimiterChoice::Zero => Box::new(Zero),
    }
}

struct Harness {
    queue: WorkQueue<Key>,
    clock: ManualClock,
    model: Model<Key>,
    answers: Arc<Mutex<Vec<Duration>>>,
    held: Vec<Lease<Key>>,
    /// Whether the limiter panics at its next call, in the current operation.
    limiter_panics: bool,
}

fn key(k: u8) -> Key {
    format!("k{}", k % 8)
}

impl Harness {
    fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The one limiter answer the last operation caused, if any.
    fn answer(&self) -> Option<Duration> {
        let mut a = self.answers.lock().unwrap();
        assert!(a.len() <= 1, "the limiter was asked {} times", a.len());
        a.pop()
    }

    fn took(&mut self, lease: Option<Lease<Key>>) {
        let expected = self.model.get(self.now());
        match (lease, expected) {
            (Some(lease), ModelGet::Ready(k)) => {
                assert_eq!(*lease, k, "handed out another key");
                assert_eq!(
                    Some(lease.priority()),
                    self.model.processing_priority(&k),
                    "handed out at another priority"
                );
                self.held.push(lease);
            }
            (None, ModelGet::Ready(k)) => panic!("the queue handed out nothing, the model {k}"),
            (Some(lease), other) => panic!("the queue handed out {lease:?}, the model {other:?}"),
            (None, _) => {}
        }
    }

    fn finish(&mut self, i: usize, how: &Finish) {
        let lease = self.held.remove(i);
        let k = lease.key().clone();
        let outcome = match *how {
            Finish::Drop | Finish::Done => Outcome::Done,
            Finish::Forget => Outcome::Forget,
            Finish::Retry => Outcome::Retry,
            Finish::RetryAfter(d) => Outcome::RetryAfter(d.get()),
            Finish::RequeueAfter(d) => Outcome::RequeueAfter(d.get()),
            Finish::Outcome(o) => o.get(),
        };
        let finished = catch_unwind(AssertUnwindSafe(|| match *how {
            Finish::Drop => drop(lease),
            Finish::Done => lease.done(),
            Finish::Forget => lease.finish(workqueue_core::Outcome::forget()),
            Finish::Retry => lease.finish(workqueue_core::Outcome::retry()),
            Finish::RetryAfter(d) => lease.finish(workqueue_core::Outcome::retry_after(d.get())),
            Finish::RequeueAfter(d) => {
                lease.finish(workqueue_core::Outcome::requeue_after(d.get()))
            }
            Finish::Outcome(o) => lease.finish(o.get().to_queue()),
        }));
        let delay = self.answer();
        if finished.is_err() {
            // The limiter panicked before it answered: the key is finished without its delay.
            assert!(self.limiter_panics, "a lease panicked with no fault armed");
            assert!(delay.is_none(), "the panicking limiter answered");
            let now = self.now();
            self.model
                .finish(&k, outcome, None, now)
                .expect("the model was processing the key");
            return;
        }
        if outcome == Outcome::Retry {
            assert_eq!(
                delay.is_some(),
                !self.model.is_shutting_down(),
                "the limiter is consulted for a retry unless shutting down"
            );
        } else {
            assert!(delay.is_none(), "the limiter was consulted for {outcome:?}");
        }
        let now = self.now();
        self.model
            .finish(&k, outcome, delay, now)
            .expect("the model was processing the key");
    }

    fn apply(&mut self, op: &QOp) {
        if let QOp::PanicLimiter = op {
            self.limiter_panics = true;
            return;
        }
        if self.limiter_panics {
            faults::silence_injected_panics();
            faults::arm(Fault::Limiter, 1);
        }
        self.apply_armed(op);
        faults::disarm_all();
        self.limiter_panics = false;
        self.check();
    }

    fn apply_armed(&mut self, op: &QOp) {
        let now = self.now();
        match op {
            QOp::Add(k) => {
                let expected = self.model.add(key(*k), now);
                assert_eq!(self.queue.add(key(*k)), expected, "add");
            }
            QOp::AddRef(k) => {
                let expected = self.model.add(key(*k), now);
                assert_eq!(self.queue.add_ref(key(*k).as_str()), expected, "add_ref");
            }
            QOp::AddBatch(ks) => {
                let ks: Vec<Key> = ks.iter().take(16).map(|&k| key(k)).collect();
                for k in &ks {
                    self.model.add(k.clone(), now);
                }
                self.queue.add_batch(ks);
            }
            QOp::AddAfter(k, d) => {
                let expected = self.model.add_after(key(*k), d.get(), now);
                assert_eq!(
                    self.queue.add_after(key(*k), d.get()),
                    expected,
                    "add_after"
                );
            }
            QOp::AddRateLimited(k) => {
                let status =
                    catch_unwind(AssertUnwindSafe(|| self.queue.add_rate_limited(key(*k))));
                let delay = self.answer();
                let Ok(status) = status else {
                    assert!(
                        self.limiter_panics && delay.is_none(),
                        "add_rate_limited panicked"
                    );
                    return;
                };
                assert_eq!(
                    delay.is_some(),
                    !self.model.is_shutting_down(),
                    "the limiter is consulted unless shutting down"
                );
                let expected = self
                    .model
                    .add_after(key(*k), delay.unwrap_or_default(), now);
                assert_eq!(status, expected, "add_rate_limited");
            }
            QOp::AddWith(k, p, d, rate_limited) => {
                let (priority, after) = (i32::from(*p % 4), d.get());
                let opts = AddOptions::new()
                    .priority(priority)
                    .after(after)
                    .rate_limited(*rate_limited);
                let status = catch_unwind(AssertUnwindSafe(|| self.queue.add_with(key(*k), opts)));
                let delay = self.answer();
                let Ok(status) = status else {
                    assert!(self.limiter_panics && delay.is_none(), "add_with panicked");
                    return;
                };
                assert_eq!(
                    delay.is_some(),
                    *rate_limited && !self.model.is_shutting_down(),
                    "the limiter is consulted for a rate-limited add unless shutting down"
                );
                // The limiter's delay, or the shorter of it and `after` (controller-runtime's).
                let delay = match delay {
                    Some(l) if after.is_zero() => l,
                    Some(l) => l.min(after),
                    None => after,
                };
                let expected = self.model.add_with(key(*k), priority, delay, now);
                assert_eq!(status, expected, "add_with");
            }
            QOp::TryGet => {
                let lease = self.queue.try_get();
                self.took(lease);
            }
            QOp::GetTimeoutZero => {
                let lease = self.queue.get_timeout(Duration::ZERO);
                self.took(lease);
            }
            QOp::TryGetBatch(n) => {
                let n = usize::from(*n % 8);
                let leases = self.queue.try_get_batch(n);
                assert!(leases.len() <= n);
                let got = leases.len();
                for lease in leases {
                    self.took(Some(lease));
                }
                if got < n {
                    // The queue stopped early: the model has nothing ready either.
                    assert_eq!(self.model.len(now), 0, "try_get_batch stopped early");
                }
            }
            QOp::GetWhenShuttingDown => {
                if self.queue.is_shutting_down() {
                    let lease = self.queue.get();
                    self.took(lease);
                }
            }
            QOp::Finish(i, how) => {
                if !self.held.is_empty() {
                    let i = usize::from(*i) % self.held.len();
                    self.finish(i, how);
                }
            }
            QOp::Forget(k) => {
                let forgot = catch_unwind(AssertUnwindSafe(|| self.queue.forget(&key(*k))));
                assert!(forgot.is_ok() || self.limiter_panics, "forget panicked");
            }
            QOp::NumRequeues(k) => {
                let _ = self.queue.num_requeues(&key(*k));
            }
            QOp::Advance(d) => self.clock.advance(d.get()),
            QOp::AdvanceMs(n) => self
                .clock
                .advance(Duration::from_millis(u64::from(*n % 32))),
            QOp::Len => {
                let expected = self.model.len(now);
                assert_eq!(self.queue.len(), expected, "len");
            }
            QOp::Counts => self.check_counts(),
            QOp::ShutDown(n) if *n < 16 => {
                self.model.shut_down();
                self.queue.shut_down();
            }
            QOp::DrainTimeoutZero(n) if *n < 16 => {
                self.model.shut_down();
                match self.queue.shut_down_with_drain_timeout(Duration::ZERO) {
                    Ok(()) => assert!(self.model.is_drained(false), "drained with leases out"),
                    Err(e) => {
                        assert_eq!(e.stop, DrainStop::TimedOut);
                        let mut in_flight = e.in_flight.clone();
                        in_flight.sort();
                        assert_eq!(in_flight, self.model.processing_keys(), "in flight");
                        assert_eq!(e.queued, self.model.counts().ready, "queued");
                    }
                }
            }
            QOp::DrainWhenIdle(n) if *n < 16 => {
                if self.held.is_empty() {
                    self.model.shut_down();
                    self.queue.shut_down_with_drain();
                }
            }
            QOp::ShutDown(_) | QOp::DrainTimeoutZero(_) | QOp::DrainWhenIdle(_) => {}
            QOp::PanicLimiter => unreachable!("handled in apply"),
        }
    }

    fn check(&self) {
        let held: BTreeSet<&Key> = self.held.iter().map(|l| l.key()).collect();
        assert_eq!(held.len(), self.held.len(), "a key is held by two leases");
        for k in &held {
            assert!(self.model.is_processing(k), "{k} held but not processing");
        }
        assert_eq!(
            self.queue.is_shutting_down(),
            self.model.is_shutting_down(),
            "shutting down"
        );
        assert!(
            self.answers.lock().unwrap().is_empty(),
            "unused limiter answer"
        );
    }

    /// `counts()` promotes the keys due now before counting; so does the model's `len`.
    fn check_counts(&mut self) {
        let counts = self.queue.counts();
        self.model.len(self.now());
        assert_eq!(counts, self.model.counts(), "counts");
    }
}

fuzz_target!(|input: Input| {
    let answers = Arc::new(Mutex::new(Vec::new()));
    let clock = ManualClock::new();
    let queue: WorkQueue<Key> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(Recording {
            inner: limiter(&input.limiter),
            answers: answers.clone(),
        })
        .build();
    let mut h = Harness {
        queue,
        clock,
        model: Model::new(),
        answers,
        held: Vec::new(),
        limiter_panics: false,
    };
    for op in input.ops.iter().take(1024) {
        h.apply(op);
    }
    h.check_counts();
    // Wind down: finish everything, shut down, drain; the queue ends empty.
    while !h.held.is_empty() {
        h.apply(&QOp::Finish(0, Finish::Done));
    }
    h.apply(&QOp::DrainWhenIdle(0));
    while h.queue.try_get().map(Lease::done).is_some() {}
    assert_eq!(
        h.queue.counts(),
        Default::default(),
        "queue not empty at the end"
    );
    assert!(h.queue.get().is_none());
});
