//! Properties of every limiter for arbitrary parameters and call sequences, most of them checked
//! against a small obviously-correct model.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use workqueue_ratelimit::{
    ExponentialFailure, FastSlow, Instant, Jitter, MaxOf, MaxWait, RateLimiter, TokenBucket,
};

#[derive(Debug, Clone, Copy)]
enum Op {
    When(u8),
    Forget(u8),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        8 => (0u8..4).prop_map(Op::When),
        1 => (0u8..4).prop_map(Op::Forget),
    ];
    prop::collection::vec(op, 0..300)
}

/// Durations from zero to `Duration::MAX`, biased to the interesting small and huge ends.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (0u64..10_000).prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// `min(base * 2^(n-1), max)` by repeated checked doubling (a nonzero `Duration` exceeds any
/// other after 128 doublings, so more steps change nothing).
fn model_exponential(base: Duration, max: Duration, n: u32) -> Duration {
    let mut delay = base;
    for _ in 1..n.min(130) {
        match delay.checked_mul(2) {
            Some(d) if d < max => delay = d,
            _ => return max,
        }
    }
    delay.min(max)
}

/// Per-key failure counts with an optional bound; `None` when the key cannot be tracked.
#[derive(Default)]
struct ModelCounts {
    counts: HashMap<u8, u32>,
    limit: Option<usize>,
}

impl ModelCounts {
    fn record(&mut self, key: u8) -> Option<u32> {
        if !self.counts.contains_key(&key) && self.limit.is_some_and(|l| self.counts.len() >= l) {
            return None;
        }
        let count = self.counts.entry(key).or_default();
        *count += 1;
        Some(*count)
    }
}

proptest! {
    #[test]
    fn exponential_matches_model(
        base in duration(),
        max in duration(),
        limit in prop::option::of(0usize..4),
        ops in ops(),
    ) {
        let mut limiter = ExponentialFailure::<u8>::new(base, max);
        if let Some(limit) = limit {
            limiter = limiter.with_max_tracked_keys(limit);
        }
        let mut model = ModelCounts { limit, ..Default::default() };
        let mut last = HashMap::new();
        for op in ops {
            match op {
                Op::When(key) => {
                    let delay = limiter.when(&key, Instant::ZERO);
                    prop_assert!(delay <= max);
                    match model.record(key) {
                        Some(n) => {
                            prop_assert_eq!(delay, model_exponential(base, max, n));
                            // Monotone non-decreasing while tracked, until forgotten.
                            let prev = last.insert(key, delay).unwrap_or(Duration::ZERO);
                            prop_assert!(prev <= delay);
                        }
                        None => prop_assert_eq!(delay, model_exponential(base, max, u32::MAX)),
                    }
                }
                Op::Forget(key) => {
                    limiter.forget(&key);
                    model.counts.remove(&key);
                    last.remove(&key);
                }
            }
            for key in 0..4 {
                let expected = model.counts.get(&key).copied().unwrap_or(0);
                prop_assert_eq!(limiter.num_requeues(&key), expected);
            }
            prop_assert_eq!(limiter.tracked_keys(), model.counts.len());
        }
    }

    #[test]
    fn fast_slow_matches_model(
        fast in duration(),
        slow in duration(),
        max_fast in 0u32..5,
        limit in prop::option::of(0usize..4),
        ops in ops(),
    ) {
        let mut limiter = FastSlow::<u8>::new(fast, slow, max_fast);
        if let Some(limit) = limit {
            limiter = limiter.with_max_tracked_keys(limit);
        }
        let mut model = ModelCounts { limit, ..Default::default() };
        for op in ops {
            match op {
                Op::When(key) => {
                    let expected = match model.record(key) {
                        Some(n) if n <= max_fast => fast,
                        Some(_) => slow,
                        None => fast.max(slow),
                    };
                    prop_assert_eq!(limiter.when(&key, Instant::ZERO), expected);
                }
                Op::Forget(key) => {
                    limiter.forget(&key);
                    model.counts.remove(&key);
                }
            }
        }
        for key in 0..4 {
            let expected = model.counts.get(&key).copied().unwrap_or(0);
            prop_assert_eq!(limiter.num_requeues(&key), expected);
        }
    }

    /// For ordinary rates the bucket is exactly GCRA on unbounded integers.
    #[test]
    fn bucket_matches_gcra(
        qps in 0.001f64..1e6,
        burst in 1u32..1_000,
        steps in prop::collection::vec((0u64..2_000_000_000, any::<bool>()), 0..300),
    ) {
        let bucket = TokenBucket::new(qps, burst).unwrap();
        let interval = u128::from((1e9 / qps).round() as u64);
        let tolerance = interval * u128::from(burst);
        let mut tat = 0u128;
        let mut now = 1_000_000_000_000u64;
        for (step, backwards) in steps {
            // Time mostly advances; sometimes a caller comes with an older instant.
            now = if backwards { now - step / 2 } else { now + step };
            let delay = RateLimiter::<()>::when(&bucket, &(), Instant::from_nanos(now));
            let next = tat.max(now.into()) + interval;
            tat = next;
            let expected = next.saturating_sub(tolerance).saturating_sub(now.into());
            prop_assert_eq!(delay.as_nanos(), expected);
        }
    }

    #[test]
    fn bucket_never_panics(
        qps in prop_oneof![
            Just(0.0), Just(f64::INFINITY), Just(f64::MIN_POSITIVE), Just(f64::MAX),
            any::<f64>(), 0.0f64..1e10,
        ],
        burst in prop_oneof![Just(0u32), Just(1), Just(u32::MAX), any::<u32>()],
        nows in prop::collection::vec(any::<u64>(), 0..100),
    ) {
        let Ok(bucket) = TokenBucket::new(qps, burst) else {
            prop_assert!(qps.is_nan() || qps < 0.0 || (burst == 0 && qps.is_finite()));
            return Ok(());
        };
        let mut zeros = 0u64;
        for now in nows {
            let delay = RateLimiter::<str>::when(&bucket, "k", Instant::from_nanos(now));
            prop_assert!(delay <= TokenBucket::FOREVER);
            zeros += u64::from(delay.is_zero());
            prop_assert_eq!(RateLimiter::<str>::num_requeues(&bucket, "k"), 0);
        }
        if qps == 0.0 {
            prop_assert!(zeros <= u64::from(burst));
        }
    }

    #[test]
    fn jitter_only_lengthens_within_fraction(
        delay in duration(),
        fraction in prop_oneof![Just(0.0), Just(10.0), 0.0f64..=10.0],
        seed in any::<u64>(),
        keys in prop::collection::vec(any::<u32>(), 1..50),
    ) {
        let limiter = Jitter::new(Constant(delay), fraction)
            .unwrap()
            .with_seed(seed);
        for key in keys {
            let jittered = limiter.when(&key, Instant::ZERO);
            prop_assert!(jittered >= delay);
            match u64::try_from(delay.as_nanos()) {
                Ok(nanos) => {
                    let extra = (jittered - delay).as_nanos() as f64;
                    prop_assert!(extra <= nanos as f64 * fraction * (1.0 + 1e-12));
                }
                Err(_) => prop_assert_eq!(jittered, delay),
            }
            prop_assert_eq!(limiter.when(&key, Instant::ZERO), jittered, "deterministic");
        }
    }

    #[test]
    fn composites_stay_within_their_caps(
        base in duration(),
        max in duration(),
        cap in duration(),
        qps in 0.0f64..100.0,
        ops in ops(),
    ) {
        let max_of = MaxOf::<u8>::new()
            .with(ExponentialFailure::<u8>::new(base, max))
            .with(FastSlow::<u8>::new(base, max, 2));
        let capped = MaxWait::new(
            MaxOf::<u8>::new()
                .with(ExponentialFailure::<u8>::new(base, max))
                .with(TokenBucket::new(qps, 3).unwrap()),
            cap,
        );
        for op in ops {
            match op {
                Op::When(key) => {
                    prop_assert!(max_of.when(&key, Instant::ZERO) <= base.max(max));
                    prop_assert!(capped.when(&key, Instant::ZERO) <= cap);
                }
                Op::Forget(key) => {
                    max_of.forget(&key);
                    capped.forget(&key);
                    prop_assert_eq!(max_of.num_requeues(&key), 0);
                    prop_assert_eq!(capped.num_requeues(&key), 0);
                }
            }
        }
    }
}

/// Always the same delay; counts nothing.
struct Constant(Duration);

impl<K: ?Sized> RateLimiter<K> for Constant {
    fn when(&self, _: &K, _: Instant) -> Duration {
        self.0
    }
    fn forget(&self, _: &K) {}
    fn num_requeues(&self, _: &K) -> u32 {
        0
    }
}
