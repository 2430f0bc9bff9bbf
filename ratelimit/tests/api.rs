//! The API composes as documented: thread safety, trait objects, borrowed keys.

use std::sync::Arc;
use std::time::Duration;

use workqueue_ratelimit::{
    DefaultControllerRateLimiter, ExponentialFailure, FastSlow, Instant, InvalidLimiter, Jitter,
    JitteredControllerRateLimiter, MaxOf, MaxPair, MaxWait, RateLimiter, TokenBucket,
    default_controller_rate_limiter,
};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn limiters_are_send_and_sync() {
    assert_send_sync::<ExponentialFailure<String>>();
    assert_send_sync::<ExponentialFailure<String, std::hash::RandomState>>();
    assert_send_sync::<FastSlow<Arc<str>>>();
    assert_send_sync::<TokenBucket>();
    assert_send_sync::<MaxOf<str>>();
    assert_send_sync::<MaxOf<String>>();
    assert_send_sync::<MaxPair<TokenBucket, TokenBucket>>();
    assert_send_sync::<MaxWait<TokenBucket>>();
    assert_send_sync::<Jitter<ExponentialFailure<u64>>>();
    assert_send_sync::<DefaultControllerRateLimiter<String>>();
    assert_send_sync::<JitteredControllerRateLimiter<String>>();
    assert_send_sync::<InvalidLimiter>();
    assert_send_sync::<Box<dyn RateLimiter<String>>>();
}

#[test]
fn trait_objects_of_owned_and_borrowed_keys() {
    let boxed: Box<dyn RateLimiter<String>> = Box::new(default_controller_rate_limiter());
    assert_eq!(
        boxed.when(&"a".to_owned(), Instant::ZERO),
        Duration::from_millis(5)
    );

    // A limiter that stores `String`s serves `str` keys, so no `String` is built per call.
    let shared: Arc<dyn RateLimiter<str>> = Arc::new(default_controller_rate_limiter::<String>());
    let worker = Arc::clone(&shared);
    std::thread::spawn(move || worker.when("ns/pod", Instant::ZERO))
        .join()
        .unwrap();
    assert_eq!(shared.num_requeues("ns/pod"), 1);

    // Forwarding impls: `&L`, `Box<L>` and `Arc<L>` are limiters, and nest in combinators.
    let bucket = TokenBucket::new(1.0, 1).unwrap();
    let by_ref: &dyn RateLimiter<str> = &bucket;
    let capped = MaxWait::new(by_ref, Duration::from_millis(10));
    assert_eq!(capped.when("x", Instant::ZERO), Duration::ZERO);
    assert_eq!(capped.when("x", Instant::ZERO), Duration::from_millis(10));

    let any: MaxOf<str> =
        MaxOf::new()
            .with(Arc::clone(&shared))
            .with(Box::new(FastSlow::<String>::new(
                Duration::from_secs(1),
                Duration::from_secs(2),
                1,
            )) as Box<dyn RateLimiter<str>>);
    assert_eq!(any.when("ns/pod", Instant::ZERO), Duration::from_secs(1));
    assert_eq!(any.num_requeues("ns/pod"), 2);
}

/// How a queue generic over its key picks the default: the stored key type is inferred.
fn default_for<T: std::hash::Hash + Eq + Clone + Send + Sync + 'static>() -> Arc<dyn RateLimiter<T>>
{
    Arc::new(default_controller_rate_limiter())
}

#[test]
fn default_limiter_for_a_generic_key() {
    let limiter = default_for::<(u8, String)>();
    let key = (1, "a".to_owned());
    assert_eq!(limiter.when(&key, Instant::ZERO), Duration::from_millis(5));
    assert_eq!(limiter.num_requeues(&key), 1);
}

#[test]
fn one_limiter_shared_by_threads() {
    let limiter = Arc::new(
        ExponentialFailure::<u64>::new(Duration::from_millis(1), Duration::from_secs(1))
            .with_max_tracked_keys(1_000),
    );
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let limiter = &limiter;
            s.spawn(move || {
                for i in 0..10_000u64 {
                    limiter.when(&((i * 4 + t) % 2_000), Instant::ZERO);
                }
            });
        }
    });
    assert_eq!(limiter.tracked_keys(), 1_000);
    let counted: u32 = (0..2_000).map(|k| limiter.num_requeues(&k)).sum();
    assert!(counted <= 40_000);
    for k in 0..2_000 {
        limiter.forget(&k);
    }
    assert_eq!(limiter.tracked_keys(), 0);
}

#[test]
fn errors_say_what_to_change() {
    let burst = TokenBucket::new(5.0, 0).unwrap_err();
    assert_eq!(
        burst.to_string(),
        "token bucket burst must be at least 1 for a finite rate (qps = 5); \
         use qps = f64::INFINITY for no limit"
    );
    let rate = TokenBucket::new(f64::NAN, 1).unwrap_err().to_string();
    assert!(rate.contains(">= 0") && rate.contains("NaN"), "{rate}");
    let jitter = Jitter::new((), -1.0).unwrap_err().to_string();
    assert!(
        jitter.contains("[0, 10]") && jitter.contains("-1"),
        "{jitter}"
    );
}
