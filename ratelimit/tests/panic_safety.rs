//! Keys whose `Clone` or `Hash` panic (the crate docs' rule for user code): the per-key limiters let the panic reach
//! the caller and keep their counts, and their bound on tracked keys, as they were.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use workqueue_ratelimit::{ExponentialFailure, FastSlow, Instant, RateLimiter};

thread_local! {
    static CLONE_PANICS: Cell<bool> = const { Cell::new(false) };
    /// Hashes that pass before one panics (`u32::MAX`: none panics).
    static HASHES_LEFT: Cell<u32> = const { Cell::new(u32::MAX) };
}

#[derive(Debug, PartialEq, Eq)]
struct Key(u32);

impl Clone for Key {
    fn clone(&self) -> Self {
        assert!(!CLONE_PANICS.get(), "injected: clone");
        Key(self.0)
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let left = HASHES_LEFT.get();
        if left != u32::MAX {
            HASHES_LEFT.set(left.saturating_sub(1));
            assert!(left != 0, "injected: hash");
        }
        self.0.hash(state);
    }
}

fn panics(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

const BASE: Duration = Duration::from_millis(5);
const MAX: Duration = Duration::from_secs(1000);

#[test]
fn a_key_whose_clone_panics_does_not_use_up_a_tracked_slot() {
    let limiter = ExponentialFailure::<Key>::new(BASE, MAX).with_max_tracked_keys(1);
    let now = Instant::ZERO;
    CLONE_PANICS.set(true);
    assert!(panics(|| {
        limiter.when(&Key(1), now);
    }));
    CLONE_PANICS.set(false);
    assert_eq!(limiter.tracked_keys(), 0);
    assert_eq!(limiter.num_requeues(&Key(1)), 0);
    assert_eq!(
        limiter.when(&Key(2), now),
        BASE,
        "a fresh key gets the base delay, not the maximum"
    );
}

#[test]
fn fast_slow_with_a_panicking_clone_keeps_its_bound() {
    let limiter = FastSlow::<Key>::new(BASE, Duration::from_secs(10), 3).with_max_tracked_keys(1);
    CLONE_PANICS.set(true);
    assert!(panics(|| {
        limiter.when(&Key(1), Instant::ZERO);
    }));
    CLONE_PANICS.set(false);
    assert_eq!(limiter.when(&Key(2), Instant::ZERO), BASE);
}

#[test]
fn a_hash_that_panics_while_a_table_grows_keeps_every_count() {
    let limiter = ExponentialFailure::<Key>::new(BASE, MAX).with_max_tracked_keys(100_000);
    let now = Instant::ZERO;
    let mut counts = Vec::new();
    for i in 0..2_000u32 {
        // Two failures per key: the second finds the key tracked. Every few keys a hash
        // panics, sometimes the key's own, sometimes one of a growth (all keys of a shard).
        HASHES_LEFT.set(1 + i % 5);
        let first = catch_unwind(AssertUnwindSafe(|| limiter.when(&Key(i), now)));
        HASHES_LEFT.set(u32::MAX);
        if first.is_err() {
            assert_eq!(
                limiter.num_requeues(&Key(i)),
                0,
                "a failed record adds nothing"
            );
            limiter.when(&Key(i), now);
        }
        limiter.when(&Key(i), now);
        counts.push(i);
        // Forgetting leaves tombstones, which make hashbrown rehash in place when it grows.
        if i % 2 == 1 {
            let forgotten = counts.swap_remove(counts.len() / 2);
            limiter.forget(&Key(forgotten));
        }
    }
    for &i in &counts {
        assert_eq!(limiter.num_requeues(&Key(i)), 2, "key {i} lost its count");
    }
    assert_eq!(
        limiter.tracked_keys(),
        counts.len(),
        "the bound counts every key once"
    );
}
