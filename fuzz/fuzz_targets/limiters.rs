//! Every limiter, with arbitrary parameters and call sequences.
//!
//! The input describes a limiter tree (leaves: `ExponentialFailure`, `FastSlow`, `TokenBucket`,
//! the defaults; inner nodes: `Jitter`, `MaxWait`, `MaxOf`, `MaxPair`), then calls `when` with
//! arbitrary keys and `now`s (going backwards too), `forget` and `num_requeues`. Every node is
//! wrapped in a checker that verifies its own contract each time it answers:
//!
//! - nothing panics or overflows (the fuzz profile keeps overflow checks on);
//! - `ExponentialFailure`: exactly `min(base * 2^(n-1), max)` for the n-th failure since `forget`
//!   (so monotone non-decreasing until forget, within `[0, max]`), `max` for a key the bound
//!   cannot track, and `num_requeues` counts failures;
//! - `FastSlow`: `fast` for the first attempts, then `slow`; `max(fast, slow)` untracked;
//! - `TokenBucket`: at most `FOREVER`; for `now`s that do not move forward, delays never shrink;
//!   an unlimited bucket always answers zero;
//! - `Jitter`: between the inner delay and `inner * (1 + fraction)`;
//! - `MaxWait`: `min(inner, max)`; `MaxOf` / `MaxPair`: the maximum of the children.
#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use workqueue_fuzz::FDelay;
use workqueue_ratelimit::{
    ExponentialFailure, FastSlow, Instant, Jitter, MaxOf, MaxPair, MaxWait, RateLimiter,
    TokenBucket, default_controller_rate_limiter, default_item_based_rate_limiter,
    jittered_controller_rate_limiter,
};

type Key = u8;
type Dyn = Box<dyn RateLimiter<Key>>;

#[derive(Debug, Arbitrary)]
enum Spec {
    Exponential {
        base: FDelay,
        max: FDelay,
        bound: Option<u8>,
    },
    FastSlow {
        fast: FDelay,
        slow: FDelay,
        attempts: u32,
        bound: Option<u8>,
    },
    Bucket {
        qps: f64,
        burst: u32,
    },
    /// A bucket with a plausible rate, so that GCRA (not the unlimited / exhaustible cases) runs.
    SaneBucket {
        millis_per_token: u16,
        burst: u8,
    },
    Default,
    ItemBased,
    Jittered {
        fraction: f64,
        seed: Option<u64>,
    },
    Jitter {
        inner: Box<Spec>,
        fraction: f64,
        seed: u64,
    },
    MaxWait {
        inner: Box<Spec>,
        max: FDelay,
    },
    MaxOf(Vec<Spec>),
    Pair(Box<Spec>, Box<Spec>),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Now {
    Same,
    Forward(u32),
    ForwardMs(u16),
    Back(u32),
    Abs(u64),
}

#[derive(Debug, Arbitrary)]
enum LOp {
    When(u8, Now),
    Forget(u8),
    NumRequeues(u8),
}

#[derive(Debug, Arbitrary)]
struct Input {
    spec: Spec,
    ops: Vec<LOp>,
}

/// The last delay a node answered, for its parent's check.
#[derive(Default)]
struct Probe(Mutex<Option<Duration>>);

impl Probe {
    fn take(&self) -> Duration {
        self.0
            .lock()
            .unwrap()
            .take()
            .expect("a child was not consulted")
    }
}

/// Per-key failure counts with an optional bound: the contract of the per-key limiters.
struct Counts {
    counts: BTreeMap<Key, u32>,
    bound: Option<usize>,
}

impl Counts {
    fn new(bound: Option<u8>) -> Self {
        Counts {
            counts: BTreeMap::new(),
            bound: bound.map(usize::from),
        }
    }

    fn record(&mut self, key: Key) -> Option<u32> {
        if let Some(n) = self.counts.get_mut(&key) {
            *n = n.saturating_add(1);
            return Some(*n);
        }
        if self.bound.is_some_and(|b| self.counts.len() >= b) {
            return None;
        }
        self.counts.insert(key, 1);
        Some(1)
    }
}

enum Check {
    Exponential {
        base: Duration,
        max: Duration,
        counts: Counts,
    },
    FastSlow {
        fast: Duration,
        slow: Duration,
        attempts: u32,
        counts: Counts,
    },
    Bucket {
        unlimited: bool,
        last: Option<(Instant, Duration)>,
    },
    Opaque,
    Jitter {
        inner: Arc<Probe>,
        fraction: f64,
    },
    MaxWait {
        inner: Arc<Probe>,
        max: Duration,
    },
    Max(Vec<Arc<Probe>>),
}

/// A limiter node wrapped with the check of its own contract.
struct Checked {
    inner: Dyn,
    check: Mutex<Check>,
    probe: Arc<Probe>,
    name: &'static str,
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

fn from_nanos(n: u128) -> Duration {
    Duration::new((n / NANOS_PER_SEC) as u64, (n % NANOS_PER_SEC) as u32)
}

/// `min(base * 2^(n-1), max)`, exactly (a zero base is always zero).
fn exponential(base: Duration, max: Duration, n: u32) -> Duration {
    if base.is_zero() {
        return Duration::ZERO;
    }
    let e = n.saturating_sub(1);
    let max_n = max.as_nanos();
    if e >= 127 {
        return max;
    }
    match base.as_nanos().checked_mul(1u128 << e) {
        Some(d) if d < max_n => from_nanos(d),
        _ => max,
    }
}

impl RateLimiter<Key> for Checked {
    fn when(&self, key: &Key, now: Instant) -> Duration {
        let d = self.inner.when(key, now);
        let name = self.name;
        match &mut *self.check.lock().unwrap() {
            Check::Exponential { base, max, counts } => {
                let expected = match counts.record(*key) {
                    Some(n) => exponential(*base, *max, n),
                    None if base.is_zero() => Duration::ZERO,
                    None => *max,
                };
                assert_eq!(d, expected, "{name}: delay of key {key}");
                assert!(
                    d <= *max || base.is_zero(),
                    "{name}: {d:?} above max {max:?}"
                );
            }
            Check::FastSlow {
                fast,
                slow,
                attempts,
                counts,
            } => {
                let expected = match counts.record(*key) {
                    Some(n) if n <= *attempts => *fast,
                    Some(_) => *slow,
                    None => (*fast).max(*slow),
                };
                assert_eq!(d, expected, "{name}: delay of key {key}");
            }
            Check::Bucket { unlimited, last } => {
                assert!(d <= TokenBucket::FOREVER, "{name}: {d:?} beyond FOREVER");
                if *unlimited {
                    assert_eq!(d, Duration::ZERO, "{name}: unlimited bucket delayed");
                }
                if let Some((then, before)) = *last
                    && now <= then
                {
                    assert!(
                        d >= before,
                        "{name}: delay shrank from {before:?} to {d:?} without time passing"
                    );
                }
                *last = Some((now, d));
            }
            Check::Opaque => {}
            Check::Jitter { inner, fraction } => {
                let base = inner.take();
                assert!(d >= base, "{name}: jitter shortened {base:?} to {d:?}");
                if let Ok(n) = u64::try_from(base.as_nanos()) {
                    // The scale the limiter derives from the fraction (28 fraction bits), plus
                    // one nanosecond of slack for the float conversion.
                    let scale = (*fraction * f64::from(1u32 << 28)) as u128;
                    let bound = u128::from(n) + ((u128::from(n) * scale) >> 28) + 1;
                    let bound = bound.min(u128::from(u64::MAX));
                    assert!(
                        d.as_nanos() <= bound,
                        "{name}: jitter {fraction} stretched {base:?} to {d:?}"
                    );
                } else {
                    assert_eq!(d, base, "{name}: jitter changed a delay beyond u64 nanos");
                }
            }
            Check::MaxWait { inner, max } => {
                let base = inner.take();
                assert_eq!(d, base.min(*max), "{name}: cap {max:?} of {base:?}");
            }
            Check::Max(children) => {
                let expected = children
                    .iter()
                    .map(|c| c.take())
                    .max()
                    .unwrap_or(Duration::ZERO);
                assert_eq!(d, expected, "{name}: maximum of the children");
            }
        }
        *self.probe.0.lock().unwrap() = Some(d);
        d
    }

    fn forget(&self, key: &Key) {
        self.inner.forget(key);
        match &mut *self.check.lock().unwrap() {
            Check::Exponential { counts, .. } | Check::FastSlow { counts, .. } => {
                counts.counts.remove(key);
            }
            _ => {}
        }
    }

    fn num_requeues(&self, key: &Key) -> u32 {
        let n = self.inner.num_requeues(key);
        match &*self.check.lock().unwrap() {
            Check::Exponential { counts, .. } | Check::FastSlow { counts, .. } => {
                let expected = counts.counts.get(key).copied().unwrap_or(0);
                assert_eq!(n, expected, "{}: num_requeues of key {key}", self.name);
            }
            Check::Bucket { .. } => assert_eq!(n, 0, "{}: a bucket counts no requeues", self.name),
            _ => {}
        }
        n
    }
}

fn checked(inner: Dyn, check: Check, name: &'static str) -> (Dyn, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let node = Checked {
        inner,
        check: Mutex::new(check),
        probe: probe.clone(),
        name,
    };
    (Box::new(node), probe)
}

/// A leaf that answers zero, for specs that cannot be built (invalid floats) or nest too deep.
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

fn zero() -> (Dyn, Arc<Probe>) {
    checked(Box::new(Zero), Check::Opaque, "zero")
}

fn bucket(qps: f64, burst: u32, name: &'static str) -> (Dyn, Arc<Probe>) {
    match TokenBucket::new(qps, burst) {
        Ok(b) => {
            let unlimited = qps == f64::INFINITY;
            let check = Check::Bucket {
                unlimited,
                last: None,
            };
            checked(Box::new(b), check, name)
        }
        Err(_) => {
            // Invalid parameters are a typed error exactly when they have no meaning.
            assert!(qps.is_nan() || qps < 0.0 || (burst == 0 && qps.is_finite()));
            zero()
        }
    }
}

fn build(spec: &Spec, depth: u32, nodes: &mut u32) -> (Dyn, Arc<Probe>) {
    *nodes += 1;
    if depth > 4 || *nodes > 24 {
        return zero();
    }
    match spec {
        Spec::Exponential { base, max, bound } => {
            let (base, max) = (base.get(), max.get());
            let mut l = ExponentialFailure::<Key>::new(base, max);
            if let Some(b) = bound {
                l = l.with_max_tracked_keys(usize::from(*b));
            }
            let check = Check::Exponential {
                base,
                max,
                counts: Counts::new(*bound),
            };
            checked(Box::new(l), check, "exponential")
        }
        Spec::FastSlow {
            fast,
            slow,
            attempts,
            bound,
        } => {
            let (fast, slow) = (fast.get(), slow.get());
            let mut l = FastSlow::<Key>::new(fast, slow, *attempts);
            if let Some(b) = bound {
                l = l.with_max_tracked_keys(usize::from(*b));
            }
            let check = Check::FastSlow {
                fast,
                slow,
                attempts: *attempts,
                counts: Counts::new(*bound),
            };
            checked(Box::new(l), check, "fast_slow")
        }
        Spec::Bucket { qps, burst } => bucket(*qps, *burst, "bucket"),
        Spec::SaneBucket {
            millis_per_token,
            burst,
        } => {
            let qps = 1000.0 / f64::from((*millis_per_token).max(1));
            bucket(qps, u32::from(*burst).max(1), "sane_bucket")
        }
        Spec::Default => checked(
            Box::new(default_controller_rate_limiter::<Key>()),
            Check::Opaque,
            "default",
        ),
        Spec::ItemBased => {
            let check = Check::Exponential {
                base: Duration::from_millis(1),
                max: Duration::from_secs(1000),
                counts: Counts::new(None),
            };
            checked(
                Box::new(default_item_based_rate_limiter::<Key>()),
                check,
                "item_based",
            )
        }
        Spec::Jittered { fraction, seed } => {
            match jittered_controller_rate_limiter::<Key>(*fraction, *seed) {
                Ok(l) => checked(Box::new(l), Check::Opaque, "jittered_default"),
                Err(_) => {
                    assert!(!(0.0..=Jitter::<()>::MAX_FRACTION).contains(fraction));
                    zero()
                }
            }
        }
        Spec::Jitter {
            inner,
            fraction,
            seed,
        } => {
            let (child, probe) = build(inner, depth + 1, nodes);
            match Jitter::new(child, *fraction) {
                Ok(j) => {
                    let check = Check::Jitter {
                        inner: probe,
                        fraction: *fraction,
                    };
                    checked(Box::new(j.with_seed(*seed)), check, "jitter")
                }
                Err(_) => {
                    assert!(!(0.0..=Jitter::<()>::MAX_FRACTION).contains(fraction));
                    zero()
                }
            }
        }
        Spec::MaxWait { inner, max } => {
            let (child, probe) = build(inner, depth + 1, nodes);
            let max = max.get();
            let check = Check::MaxWait { inner: probe, max };
            checked(Box::new(MaxWait::new(child, max)), check, "max_wait")
        }
        Spec::MaxOf(children) => {
            let mut l = MaxOf::<Key>::new();
            let mut probes = Vec::new();
            for c in children.iter().take(4) {
                let (child, probe) = build(c, depth + 1, nodes);
                l.push(child);
                probes.push(probe);
            }
            checked(Box::new(l), Check::Max(probes), "max_of")
        }
        Spec::Pair(a, b) => {
            let (a, pa) = build(a, depth + 1, nodes);
            let (b, pb) = build(b, depth + 1, nodes);
            checked(
                Box::new(MaxPair::new(a, b)),
                Check::Max(vec![pa, pb]),
                "pair",
            )
        }
    }
}

fuzz_target!(|input: Input| {
    let (limiter, probe) = build(&input.spec, 0, &mut 0);
    let mut now = Instant::ZERO;
    for op in input.ops.iter().take(4096) {
        match *op {
            LOp::When(k, step) => {
                now = match step {
                    Now::Same => now,
                    Now::Forward(n) => now.saturating_add(Duration::from_nanos(u64::from(n))),
                    Now::ForwardMs(n) => now.saturating_add(Duration::from_millis(u64::from(n))),
                    Now::Back(n) => now.saturating_sub(Duration::from_nanos(u64::from(n))),
                    Now::Abs(n) => Instant::from_nanos(n),
                };
                let d = limiter.when(&(k % 8), now);
                assert_eq!(probe.take(), d);
            }
            LOp::Forget(k) => limiter.forget(&(k % 8)),
            LOp::NumRequeues(k) => {
                let _ = limiter.num_requeues(&(k % 8));
            }
        }
    }
});
