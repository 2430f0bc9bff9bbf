//! Ports of client-go's `util/workqueue/default_rate_limiters_test.go`, with its exact numbers,
//! and the limiter half of `rate_limiting_queue_test.go`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use workqueue_ratelimit::{ExponentialFailure, FastSlow, Instant, MaxOf, MaxWait, RateLimiter};

const NOW: Instant = Instant::ZERO;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[track_caller]
fn assert_whens<L: RateLimiter<str>>(limiter: &L, key: &str, expected: &[Duration]) {
    let actual: Vec<_> = expected.iter().map(|_| limiter.when(key, NOW)).collect();
    assert_eq!(actual, expected, "key {key:?}");
}

#[test]
fn item_exponential_failure_rate_limiter() {
    let limiter = ExponentialFailure::<String>::new(ms(1), Duration::from_secs(1));

    assert_whens(&limiter, "one", &[ms(1), ms(2), ms(4), ms(8), ms(16)]);
    assert_eq!(limiter.num_requeues("one"), 5);

    assert_whens(&limiter, "two", &[ms(1), ms(2)]);
    assert_eq!(limiter.num_requeues("two"), 2);

    limiter.forget("one");
    assert_eq!(limiter.num_requeues("one"), 0);
    assert_whens(&limiter, "one", &[ms(1)]);
}

#[test]
fn item_exponential_failure_rate_limiter_over_flow() {
    let limiter = ExponentialFailure::<String>::new(ms(1), Duration::from_secs(1000));
    for _ in 0..5 {
        limiter.when("one", NOW);
    }
    assert_eq!(limiter.when("one", NOW), ms(32));
    for _ in 0..1000 {
        limiter.when("overflow1", NOW);
    }
    assert_eq!(limiter.when("overflow1", NOW), Duration::from_secs(1000));

    let minute = Duration::from_secs(60);
    let limiter = ExponentialFailure::<String>::new(minute, 1000 * 60 * minute);
    for _ in 0..2 {
        limiter.when("two", NOW);
    }
    assert_eq!(limiter.when("two", NOW), 4 * minute);
    for _ in 0..1000 {
        limiter.when("overflow2", NOW);
    }
    assert_eq!(limiter.when("overflow2", NOW), 1000 * 60 * minute);
}

/// Beyond client-go: its float arithmetic turns base 1 ns at exponent 63 into a negative
/// duration; here it is the cap.
#[test]
fn item_exponential_failure_rate_limiter_nanosecond_base_reaches_max() {
    let max = Duration::from_secs(1000);
    let limiter = ExponentialFailure::<String>::new(Duration::from_nanos(1), max);
    let mut last = Duration::ZERO;
    for _ in 0..10_000 {
        let delay = limiter.when("one", NOW);
        assert!(last <= delay && delay <= max);
        last = delay;
    }
    assert_eq!(last, max);
    assert_eq!(limiter.num_requeues("one"), 10_000);
}

#[test]
fn item_fast_slow_rate_limiter() {
    let limiter = FastSlow::<String>::new(ms(5), Duration::from_secs(10), 3);
    let slow = Duration::from_secs(10);

    assert_whens(&limiter, "one", &[ms(5), ms(5), ms(5), slow, slow]);
    assert_eq!(limiter.num_requeues("one"), 5);

    assert_whens(&limiter, "two", &[ms(5), ms(5)]);
    assert_eq!(limiter.num_requeues("two"), 2);

    limiter.forget("one");
    assert_eq!(limiter.num_requeues("one"), 0);
    assert_whens(&limiter, "one", &[ms(5)]);
}

#[test]
fn max_of_rate_limiter() {
    let limiter = MaxOf::<str>::new()
        .with(FastSlow::<String>::new(ms(5), Duration::from_secs(3), 3))
        .with(ExponentialFailure::<String>::new(
            ms(1),
            Duration::from_secs(1),
        ));
    let slow = Duration::from_secs(3);

    assert_whens(&limiter, "one", &[ms(5), ms(5), ms(5), slow, slow]);
    assert_eq!(limiter.num_requeues("one"), 5);

    assert_whens(&limiter, "two", &[ms(5), ms(5)]);
    assert_eq!(limiter.num_requeues("two"), 2);

    limiter.forget("one");
    assert_eq!(limiter.num_requeues("one"), 0);
    assert_whens(&limiter, "one", &[ms(5)]);
}

/// client-go's test-local `StepRateLimiter`: one counter for all keys; the first `threshold`
/// calls get `base`, later ones `max`.
struct Step {
    calls: AtomicU32,
    base: Duration,
    max: Duration,
    threshold: u32,
}

impl<K: ?Sized> RateLimiter<K> for Step {
    fn when(&self, _: &K, _: Instant) -> Duration {
        if self.calls.fetch_add(1, Ordering::Relaxed) < self.threshold {
            self.base
        } else {
            self.max
        }
    }

    fn forget(&self, _: &K) {
        self.calls.store(0, Ordering::Relaxed);
    }

    fn num_requeues(&self, _: &K) -> u32 {
        self.calls.load(Ordering::Relaxed)
    }
}

#[test]
fn with_max_wait_rate_limiter() {
    let limiter = MaxWait::new(
        Step {
            calls: AtomicU32::new(0),
            base: ms(5),
            max: Duration::from_secs(1000),
            threshold: 100,
        },
        Duration::from_secs(500),
    );
    for i in 0..100u32 {
        assert_eq!(limiter.when(&i, NOW), ms(5), "call {i}");
    }
    for i in 100..200u32 {
        assert_eq!(limiter.when(&i, NOW), Duration::from_secs(500), "call {i}");
    }
    assert_eq!(RateLimiter::<u32>::num_requeues(&limiter, &0), 200);
}

/// The limiter calls of `rate_limiting_queue_test.go`'s `TestRateLimitingQueue`; the queue part
/// (`readyAt - now`) belongs to the queue's tests.
#[test]
fn rate_limiting_queue_limiter_calls() {
    let limiter = ExponentialFailure::<String>::new(ms(1), Duration::from_secs(1));
    assert_whens(&limiter, "one", &[ms(1), ms(2)]);
    assert_eq!(limiter.num_requeues("one"), 2);
    assert_whens(&limiter, "two", &[ms(1), ms(2)]);
    limiter.forget("one");
    assert_eq!(limiter.num_requeues("one"), 0);
    assert_whens(&limiter, "one", &[ms(1)]);
}
