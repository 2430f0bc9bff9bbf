//! Memory follows the live size (issue 12), measured with the counting allocator.
//!
//! On the way down from a burst of 200,000 keys, at 50,000, 10,000 and 1,000 live keys, the
//! heap bytes a queue or a limiter retains must be at most 4x what a fresh one holding the same
//! keys uses. The queue holds one key processing and one waiting throughout (a controller that
//! polls); the limiter is `ExponentialFailure`, whose per-key table `FastSlow` shares. The
//! queue's compactions are counted too: at most one per halving of the live size.
//!
//! The queue compacts once its live count has settled below a threshold (see the `state` module
//! docs): at each checkpoint it first works at that size, `live` rounds of a get, a re-add of
//! the same key while it is processing, and done (which keeps the live count), then the bytes are
//! measured. A pure drain to empty never settles, and must not compact at all.
//!
//! Keys are `u64`, which own no heap bytes, so the bytes measured are the structures' alone. The
//! fresh sizes are measured first, then the burst under one running count. Its own test binary:
//! the counting allocator is process-wide, and the two tests take a lock so they run one at a
//! time.

use std::sync::Mutex;
use std::time::Duration;

use workqueue_benches::alloc::{CountingAlloc, Meter, is_installed, measure};
use workqueue_core::{ManualClock, WorkQueue};
use workqueue_ratelimit::{ExponentialFailure, Instant, RateLimiter};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// One measurement at a time: the count is process-wide.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const PEAK: usize = 200_000;
const CHECKPOINTS: [usize; 3] = [50_000, 10_000, 1_000];
const BOUND: f64 = 4.0;
/// The processing and the waiting key, outside the burst's range.
const PROCESSING: u64 = u64::MAX;
const WAITING: u64 = u64::MAX - 1;

fn queue(shrink: bool) -> WorkQueue<u64> {
    WorkQueue::builder()
        .clock(ManualClock::new())
        .shrink_memory(shrink)
        .build()
}

/// A queue in the burst's shape with `live` keys: one processing, one waiting, the rest queued
/// (`first..`). Returns the queue and the lease.
fn filled(live: usize, shrink: bool) -> (WorkQueue<u64>, workqueue_core::Lease<u64>) {
    let q = queue(shrink);
    q.add(PROCESSING);
    let lease = q.try_get().expect("a key");
    q.add_after(WAITING, Duration::from_secs(3600));
    for k in 0..(live - 2) as u64 {
        q.add(k);
    }
    (q, lease)
}

fn fresh_queue_bytes(live: usize) -> isize {
    let (held, bytes) = measure(|| filled(live, true));
    drop(held);
    bytes.expect("the counting allocator is installed")
}

/// The queue's burst: bytes retained at each checkpoint, and compactions by then.
fn queue_burst(shrink: bool) -> (isize, Vec<(usize, isize)>, u64) {
    let meter = Meter::start();
    let (q, held) = filled(PEAK + 2, shrink);
    let peak = meter.net();
    let mut live = PEAK + 2;
    let mut retained = Vec::new();
    for &at in &CHECKPOINTS {
        while live > at {
            q.try_get().expect("a queued key").done();
            live -= 1;
        }
        // Settled at this size: `at` gets, each key re-added while it is processing.
        for _ in 0..at {
            let lease = q.try_get().expect("a queued key");
            q.add(*lease.key());
            lease.done();
        }
        assert_eq!(q.len(), at - 2);
        retained.push((at, meter.net()));
    }
    let compactions = q.compactions();
    drop(meter);
    assert_eq!(held.key(), &PROCESSING, "the held lease kept its key");
    drop((q, held));
    (peak, retained, compactions)
}

#[test]
fn queue_retains_at_most_4x_a_fresh_queue_on_the_way_down() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert!(is_installed(), "the counting allocator is not installed");
    let fresh: Vec<isize> = CHECKPOINTS.iter().map(|&n| fresh_queue_bytes(n)).collect();
    let (peak, retained, compactions) = queue_burst(true);
    for ((at, kept), fresh) in retained.iter().zip(&fresh) {
        let ratio = *kept as f64 / *fresh as f64;
        println!(
            "queue: {at} live: retained {kept} B, fresh {fresh} B: {ratio:.2}x (peak {peak} B)"
        );
        assert!(
            ratio <= BOUND,
            "the queue at {at} live keys retains {kept} B, {ratio:.2}x a fresh queue's {fresh} B"
        );
    }
    // 200k to 1k is under eight halvings: at most one compaction each.
    println!("queue: {compactions} compactions from {PEAK} to 1000 live keys");
    assert!((1..=8).contains(&compactions), "{compactions} compactions");

    // Shrinking off keeps the peak (the `Builder::shrink_memory(false)` promise).
    let (peak, retained, compactions) = queue_burst(false);
    assert_eq!(compactions, 0);
    assert!(retained.iter().all(|&(_, kept)| kept * 10 > peak * 9));
}

#[test]
fn a_pure_drain_from_200k_to_empty_never_compacts() {
    // W1's shape at twice its size: distinct keys in, then get and done until empty. Every
    // compaction on the way would be wasted: the empty queue frees its buffers anyway.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let q = queue(true);
    for k in 0..PEAK as u64 {
        q.add(k);
    }
    let peak = q.allocated_bytes();
    let mut next = 0;
    while let Some(lease) = q.try_get() {
        assert_eq!(*lease.key(), next);
        next += 1;
        lease.done();
    }
    assert_eq!(next, PEAK as u64);
    assert_eq!(q.compactions(), 0, "a pure drain compacted");
    assert!(
        q.allocated_bytes() * 100 < peak,
        "the empty queue kept its buffers"
    );
}

fn limiter() -> ExponentialFailure<u64> {
    ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(1000))
}

fn fresh_limiter_bytes(live: usize) -> isize {
    let (l, bytes) = measure(|| {
        let l = limiter();
        for k in 0..live as u64 {
            l.when(&k, Instant::ZERO);
        }
        l
    });
    drop(l);
    bytes.expect("the counting allocator is installed")
}

#[test]
fn limiter_retains_at_most_4x_a_fresh_limiter_on_the_way_down() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert!(is_installed(), "the counting allocator is not installed");
    let fresh: Vec<isize> = CHECKPOINTS
        .iter()
        .map(|&n| fresh_limiter_bytes(n))
        .collect();
    let meter = Meter::start();
    let l = limiter();
    for k in 0..PEAK as u64 {
        l.when(&k, Instant::ZERO);
    }
    let peak = meter.net();
    let mut live = PEAK;
    for (&at, fresh) in CHECKPOINTS.iter().zip(&fresh) {
        while live > at {
            live -= 1;
            l.forget(&(live as u64));
        }
        assert_eq!(l.tracked_keys(), at);
        let kept = meter.net();
        let ratio = kept as f64 / *fresh as f64;
        println!(
            "limiter: {at} live: retained {kept} B, fresh {fresh} B: {ratio:.2}x (peak {peak} B)"
        );
        assert!(
            ratio <= BOUND,
            "the limiter at {at} tracked keys retains {kept} B, {ratio:.2}x a fresh one's {fresh} B"
        );
    }
    drop(meter);
}
