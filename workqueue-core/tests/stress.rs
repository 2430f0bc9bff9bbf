//! Multi-threaded stress test of the blocking queue: 4 producers and 4 consumers on one queue.
//!
//! Producers add, add in batches, add by reference, add with small delays and add rate-limited,
//! all from a seeded RNG; consumers re-add while processing, retry, retry after a delay, forget
//! and finish. Two properties are checked, neither of which depends on timing:
//! - exclusivity: a key is never held by two leases at once (a per-key "held" flag, set on get and
//!   cleared just before the lease is finished, is never found already set);
//! - no lost add: every key is processed at least once after its last add. Each add takes a
//!   stamp of a global clock and records it as the key's last add *before* calling the queue;
//!   each get stamps the key's last lease. At the end the second must be later than the first for
//!   every key. (Both checks are `workqueue_model::Ledger`'s.)
//!
//! Delayed entries are dropped by shutdown (by design), so before shutting down the test waits
//! until the queue is quiescent (nothing ready, processing or waiting): producers have stopped,
//! and consumers stop re-adding once they see that, so it gets there within the longest delay
//! (2 ms of real time). The system clock is used; no assertion depends on it.

use std::borrow::Borrow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::thread;
use std::time::Duration;

use workqueue_core::ratelimit::ExponentialFailure;
use workqueue_core::state::Counts;
use workqueue_core::{Outcome, WorkQueue};
use workqueue_model::{Ledger, SplitMix64};

const PRODUCERS: u64 = 4;
const CONSUMERS: u64 = 4;
const KEYS: u32 = 1000;
/// Producer operations in all; consumers add their own re-adds and retries on top.
const PRODUCER_OPS: u64 = 160_000;
const SEED: u64 = 0x5EED_0F57_2E55;

/// The queue's key: a newtype so that `add_ref(&u32)` works (`From<&u32>`, `Borrow<u32>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key(u32);

impl Borrow<u32> for Key {
    fn borrow(&self) -> &u32 {
        &self.0
    }
}

impl From<&u32> for Key {
    fn from(k: &u32) -> Self {
        Key(*k)
    }
}

struct Tracker {
    /// Exclusivity and "processed after the last add", keyed by `Key.0`.
    ledger: Ledger,
    gets: AtomicU64,
    /// Set once producers have finished: consumers then stop adding.
    producers_done: AtomicBool,
}

impl Tracker {
    fn new() -> Self {
        Tracker {
            ledger: Ledger::new(KEYS as usize, "stress"),
            gets: AtomicU64::new(0),
            producers_done: AtomicBool::new(false),
        }
    }

    /// Records an add of `k`; call it before the queue operation.
    fn added(&self, k: Key) {
        self.ledger.adding(k.0 as usize);
    }

    fn got(&self, k: Key) {
        self.ledger.leased(k.0 as usize);
        self.gets.fetch_add(1, SeqCst);
    }

    /// Call it just before finishing the lease.
    fn finishing(&self, k: Key) {
        self.ledger.releasing(k.0 as usize);
    }
}

fn random_key(rng: &mut SplitMix64) -> Key {
    Key(rng.below(u64::from(KEYS)) as u32)
}

fn small_delay(rng: &mut SplitMix64) -> Duration {
    Duration::from_micros(rng.below(2_000))
}

fn produce(queue: &WorkQueue<Key>, tracker: &Tracker, mut rng: SplitMix64) {
    for _ in 0..PRODUCER_OPS / PRODUCERS {
        let key = random_key(&mut rng);
        match rng.below(100) {
            0..=49 => {
                tracker.added(key);
                queue.add(key);
            }
            50..=59 => {
                tracker.added(key);
                queue.add_ref(&key.0);
            }
            60..=74 => {
                let n = 1 + rng.below(4);
                let keys: Vec<Key> = (0..n).map(|_| random_key(&mut rng)).collect();
                for &k in &keys {
                    tracker.added(k);
                }
                queue.add_batch(keys);
            }
            75..=89 => {
                tracker.added(key);
                queue.add_after(key, small_delay(&mut rng));
            }
            _ => {
                tracker.added(key);
                queue.add_rate_limited(key);
            }
        }
        if rng.below(4) == 0 {
            thread::yield_now(); // give the consumers a chance on a small machine
        }
    }
}

fn consume(queue: &WorkQueue<Key>, tracker: &Tracker, mut rng: SplitMix64) {
    loop {
        let leases = if rng.below(8) == 0 {
            let batch = queue.try_get_batch(1 + rng.below(4) as usize);
            if batch.is_empty() {
                match queue.get() {
                    Some(lease) => vec![lease],
                    None => return,
                }
            } else {
                batch
            }
        } else {
            match queue.get() {
                Some(lease) => vec![lease],
                None => return,
            }
        };
        // Every lease in hand is held, batch or not.
        for lease in &leases {
            tracker.got(**lease);
        }
        for lease in leases {
            let key = *lease;
            if rng.below(4) == 0 {
                thread::yield_now(); // "work", letting other threads run while the key is held
            }
            // Read once per lease: once it is set, this consumer adds nothing more for it.
            let may_add = !tracker.producers_done.load(SeqCst);
            let action = rng.below(100);
            if may_add && action < 10 {
                tracker.added(key);
                queue.add(key); // re-add while processing: dirty
            }
            tracker.finishing(key);
            match action {
                10..=14 if may_add => {
                    tracker.added(key);
                    lease.finish(Outcome::retry_after(small_delay(&mut rng)));
                }
                15..=19 if may_add => {
                    tracker.added(key);
                    lease.finish(Outcome::retry());
                }
                20..=39 => lease.finish(Outcome::forget()),
                _ => lease.done(),
            }
        }
    }
}

#[test]
fn four_producers_four_consumers() {
    let queue: WorkQueue<Key> = WorkQueue::builder()
        // Small backoffs, so rate-limited adds and retries settle within 2 ms.
        .rate_limiter(ExponentialFailure::new(
            Duration::from_micros(1),
            Duration::from_millis(2),
        ))
        .build();
    let tracker = Arc::new(Tracker::new());

    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|i| {
            let (queue, tracker) = (queue.clone(), tracker.clone());
            let rng = SplitMix64::new(SEED ^ (0xC0 + i));
            thread::spawn(move || consume(&queue, &tracker, rng))
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|i| {
            let (queue, tracker) = (queue.clone(), tracker.clone());
            let rng = SplitMix64::new(SEED ^ (0x90 + i));
            thread::spawn(move || produce(&queue, &tracker, rng))
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    tracker.producers_done.store(true, SeqCst);

    // Wait for quiescence. A consumer that still holds a lease counts as processing, and a
    // consumer re-adds only while it holds one, so a snapshot with nothing ready, processing or
    // waiting is final: nothing can become ready again. (Only `counts()` is used here: it does not
    // promote due keys, so the consumers' own waits have to do that.)
    // The bound is not a timing assertion: it only turns a hang (a getter that slept through a due
    // key) into a failure; quiescence takes a few milliseconds.
    let started = std::time::Instant::now();
    loop {
        let c = queue.counts();
        if c.ready == 0 && c.processing == 0 && c.waiting == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the queue never became quiescent: {c:?}"
        );
        thread::yield_now();
    }

    queue.shut_down_with_drain();
    for c in consumers {
        c.join().unwrap();
    }

    let ledger = &tracker.ledger;
    assert_eq!(ledger.check_released(""), 0, "a key is still held");
    assert_eq!(
        ledger.check_processed(""),
        0,
        "a key was not processed after its last add"
    );
    assert_eq!(
        ledger.violations(),
        0,
        "a key was leased twice at once (see stderr)"
    );
    let added_keys = (0..KEYS as usize).filter(|&k| ledger.was_added(k)).count();
    assert_eq!(added_keys, KEYS as usize, "the RNG should touch every key");
    assert!(tracker.gets.load(SeqCst) > 0);
    assert_eq!(queue.counts(), Counts::default());
    assert!(queue.get().is_none());
}
