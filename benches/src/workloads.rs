//! One function per (workload, implementation), shared by the criterion benches and the report.
//!
//! Each function builds its subject outside the timed region, times exactly what `BENCHMARKS.md`
//! says, checks the result (panicking on a wrong one: every key seen exactly once, nothing left
//! queued), tears down outside the timed region, and returns the raw measurement (usually the
//! `Duration` of the whole timed region; the report divides it into the figure).
//!
//! Implementations: `ours` (`workqueue_core::WorkQueue` and `workqueue_ratelimit`),
//! `ours_async` (`workqueue_tokio::WorkQueue`, in [`w5`] and [`w10`]; [`r1`] runs its runner), `naive`
//! ([`crate::naive`]), and the floors `crossbeam` (`crossbeam_channel::unbounded`),
//! `delay_queue` (`tokio_util::time::DelayQueue`) and `governor` (direct `RateLimiter::check`).

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use workqueue_core::ratelimit::{
    ExponentialFailure, MaxPair, RateLimiter, TokenBucket, default_controller_rate_limiter,
};
use workqueue_core::state::Counts;
use workqueue_core::{AddOptions, Clock, Outcome, SystemClock, WorkQueue};

use crate::{Fingerprint, Key, SplitMix64, naive, percentile};

/// Our blocking queue over the benchmark keys (default hasher, default limiter, system clock).
pub type Ours = WorkQueue<Key>;

fn assert_ours_empty(q: &Ours) {
    assert_eq!(
        q.counts(),
        Counts::default(),
        "ours: queue not empty at the end"
    );
}

/// Our async queue (`workqueue_tokio::WorkQueue`: tokio's clock and timers) over the benchmark
/// keys, with the same defaults as [`Ours`].
pub type OursAsync = workqueue_tokio::WorkQueue<Key>;

fn assert_ours_async_empty(q: &OursAsync) {
    assert_eq!(
        q.counts(),
        Counts::default(),
        "ours async: queue not empty at the end"
    );
}

fn assert_naive_empty(q: &naive::Queue<Key>) {
    assert_eq!(
        q.counts(),
        naive::Counts {
            queued: 0,
            dirty: 0,
            processing: 0
        },
        "naive: queue not empty at the end"
    );
}

/// The workloads' tokio runtime, with the time driver only (no workload does I/O): `None` is a
/// `current_thread` runtime (everything on the calling thread), `Some(n)` a multi-thread one with
/// `n` worker threads.
fn runtime(workers: Option<usize>) -> tokio::runtime::Runtime {
    let mut builder = match workers {
        None => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    };
    builder.enable_time().build().expect("a tokio runtime")
}

/// W1 cycle: one thread adds N distinct keys, then N times get + done.
pub mod w1 {
    use super::*;

    /// Our queue.
    pub fn ours(keys: &[Key]) -> Duration {
        ours_on(Ours::new(), keys)
    }

    /// Our queue built with room for every key (`Builder::capacity`): no index growth, so no
    /// rehashing (the `(pre-sized)` row, evidence for the rehash cost).
    pub fn ours_presized(keys: &[Key]) -> Duration {
        ours_on(WorkQueue::builder().capacity(keys.len()).build(), keys)
    }

    /// Our queue with a name: with the `metrics` feature it emits client-go's metrics (to the
    /// no-op recorder, as no exporter is installed), without it a name changes nothing. Compared
    /// with the unnamed row, it shows what metrics cost.
    pub fn ours_named(keys: &[Key]) -> Duration {
        ours_on(WorkQueue::builder().name("w1").build(), keys)
    }

    /// W1's cycle on a queue built elsewhere (W12 runs it on a fair queue).
    pub(crate) fn ours_on(q: Ours, keys: &[Key]) -> Duration {
        let expected = Fingerprint::of(keys);
        let mut seen = Fingerprint::default();
        let t = Instant::now();
        for k in keys {
            q.add(k.clone());
        }
        for _ in 0..keys.len() {
            let lease = q.get().expect("a queued key");
            seen.add(&lease);
            lease.done();
        }
        let d = t.elapsed();
        assert_eq!(seen, expected, "ours: W1 keys seen");
        assert_ours_empty(&q);
        d
    }

    /// The client-go port.
    pub fn naive(keys: &[Key]) -> Duration {
        let q = naive::Queue::new();
        let expected = Fingerprint::of(keys);
        let mut seen = Fingerprint::default();
        let t = Instant::now();
        for k in keys {
            q.add(k.clone());
        }
        for _ in 0..keys.len() {
            let k = q.get().expect("a queued key");
            seen.add(&k);
            q.done(&k);
        }
        let d = t.elapsed();
        assert_eq!(seen, expected, "naive: W1 keys seen");
        assert_naive_empty(&q);
        d
    }

    /// Floor: an unbounded crossbeam channel (no de-duplication, no done).
    pub fn crossbeam(keys: &[Key]) -> Duration {
        let (tx, rx) = crossbeam_channel::unbounded();
        let expected = Fingerprint::of(keys);
        let mut seen = Fingerprint::default();
        let t = Instant::now();
        for k in keys {
            tx.send(k.clone()).expect("receiver alive");
        }
        for _ in 0..keys.len() {
            let k = rx.recv().expect("a sent key");
            seen.add(&k);
        }
        let d = t.elapsed();
        assert_eq!(seen, expected, "crossbeam: W1 keys seen");
        assert!(rx.is_empty());
        d
    }
}

/// W2 dedup: add `keys.len()` distinct keys `rounds` times each, round-robin, then drain.
pub mod w2 {
    use super::*;

    fn check(mut drained: Vec<Key>, keys: &[Key], who: &str) {
        let mut want: Vec<&str> = keys.iter().map(|k| &**k).collect();
        want.sort_unstable();
        drained.sort_unstable();
        let got: Vec<&str> = drained.iter().map(|k| &**k).collect();
        assert_eq!(got, want, "{who}: W2 drained keys");
    }

    /// Our queue, `add` (takes ownership of each key: a duplicate is dropped after the lock).
    pub fn ours(keys: &[Key], rounds: usize) -> Duration {
        let q = Ours::new();
        let mut drained = Vec::with_capacity(keys.len());
        let t = Instant::now();
        for _ in 0..rounds {
            for k in keys {
                q.add(k.clone());
            }
        }
        for _ in 0..keys.len() {
            let lease = q.get().expect("a queued key");
            drained.push(Key::clone(&lease));
            lease.done();
        }
        let d = t.elapsed();
        check(drained, keys, "ours");
        assert_ours_empty(&q);
        d
    }

    /// Our queue, `add_ref` (borrows the key; clones, here allocates, only a key it does not
    /// track yet).
    pub fn ours_add_ref(keys: &[Key], rounds: usize) -> Duration {
        let q = Ours::new();
        let mut drained = Vec::with_capacity(keys.len());
        let t = Instant::now();
        for _ in 0..rounds {
            for k in keys {
                q.add_ref::<str>(k);
            }
        }
        for _ in 0..keys.len() {
            let lease = q.get().expect("a queued key");
            drained.push(Key::clone(&lease));
            lease.done();
        }
        let d = t.elapsed();
        check(drained, keys, "ours add_ref");
        assert_ours_empty(&q);
        d
    }

    /// The client-go port.
    pub fn naive(keys: &[Key], rounds: usize) -> Duration {
        let q = naive::Queue::new();
        let mut drained = Vec::with_capacity(keys.len());
        let t = Instant::now();
        for _ in 0..rounds {
            for k in keys {
                q.add(k.clone());
            }
        }
        for _ in 0..keys.len() {
            let k = q.get().expect("a queued key");
            q.done(&k);
            drained.push(k);
        }
        let d = t.elapsed();
        check(drained, keys, "naive");
        assert_naive_empty(&q);
        d
    }
}

/// W3 mpmc: `producers` threads add disjoint shares of the keys, `consumers` threads get + done
/// until the queue is shut down (when the producers finish) and drained.
pub mod w3 {
    use super::*;

    /// Runs the workload on any queue: producer `i` runs `produce(i, share)`, each consumer runs
    /// `consume()` (returning what it saw), and the main thread runs `close()` once every producer
    /// is done. Times from the common start (a barrier) until the last consumer returns.
    fn run(
        keys: &[Key],
        producers: usize,
        consumers: usize,
        produce: impl Fn(usize, &[Key]) + Sync,
        consume: impl Fn() -> Fingerprint + Sync,
        close: impl FnOnce(),
        who: &str,
    ) -> Duration {
        assert!(producers > 0 && consumers > 0);
        let expected = Fingerprint::of(keys);
        let barrier = Barrier::new(producers + consumers + 1);
        let share = keys.len().div_ceil(producers).max(1);
        let (d, seen) = thread::scope(|s| {
            let (produce, consume, barrier) = (&produce, &consume, &barrier);
            let prods: Vec<_> = (0..producers)
                .map(|i| {
                    let lo = (i * share).min(keys.len());
                    let chunk = &keys[lo..(lo + share).min(keys.len())];
                    s.spawn(move || {
                        barrier.wait();
                        produce(i, chunk);
                    })
                })
                .collect();
            let cons: Vec<_> = (0..consumers)
                .map(|_| {
                    s.spawn(move || {
                        barrier.wait();
                        consume()
                    })
                })
                .collect();
            barrier.wait();
            let t = Instant::now();
            for p in prods {
                p.join().expect("producer");
            }
            close();
            let mut seen = Fingerprint::default();
            for c in cons {
                seen.merge(c.join().expect("consumer"));
            }
            (t.elapsed(), seen)
        });
        assert_eq!(seen, expected, "{who}: W3 keys seen");
        d
    }

    /// Our queue.
    pub fn ours(keys: &[Key], producers: usize, consumers: usize) -> Duration {
        let q = Ours::new();
        let d = run(
            keys,
            producers,
            consumers,
            |_, chunk| {
                for k in chunk {
                    q.add(k.clone());
                }
            },
            || {
                let mut f = Fingerprint::default();
                while let Some(lease) = q.get() {
                    f.add(&lease);
                    lease.done();
                }
                f
            },
            || q.shut_down(),
            "ours",
        );
        assert_ours_empty(&q);
        d
    }

    /// The client-go port.
    pub fn naive(keys: &[Key], producers: usize, consumers: usize) -> Duration {
        let q = naive::Queue::new();
        let d = run(
            keys,
            producers,
            consumers,
            |_, chunk| {
                for k in chunk {
                    q.add(k.clone());
                }
            },
            || {
                let mut f = Fingerprint::default();
                while let Some(k) = q.get() {
                    f.add(&k);
                    q.done(&k);
                }
                f
            },
            || q.shut_down(),
            "naive",
        );
        assert_naive_empty(&q);
        d
    }

    /// Floor: an unbounded crossbeam channel; each producer owns a sender, and "shut down" is
    /// dropping the last one.
    pub fn crossbeam(keys: &[Key], producers: usize, consumers: usize) -> Duration {
        let (tx, rx) = crossbeam_channel::unbounded::<Key>();
        let senders: Vec<Mutex<Option<crossbeam_channel::Sender<Key>>>> = (0..producers)
            .map(|_| Mutex::new(Some(tx.clone())))
            .collect();
        let mut main_tx = Some(tx);
        let d = run(
            keys,
            producers,
            consumers,
            |i, chunk| {
                let tx = senders[i].lock().expect("sender").take().expect("one take");
                for k in chunk {
                    tx.send(k.clone()).expect("receiver alive");
                }
            },
            || {
                let mut f = Fingerprint::default();
                while let Ok(k) = rx.recv() {
                    f.add(&k);
                }
                f
            },
            || drop(main_tx.take()),
            "crossbeam",
        );
        assert!(rx.is_empty());
        d
    }
}

/// W4 delay-insert: one thread `add_after`s N distinct keys with delays uniform in [1 h, 2 h).
pub mod w4 {
    use super::*;

    /// The delays: `1 h + splitmix64(seed 42) mod 1 h`, one per key.
    pub fn delays(n: usize) -> Vec<Duration> {
        const HOUR: u64 = 3_600_000_000_000;
        let mut rng = SplitMix64::new(42);
        (0..n)
            .map(|_| Duration::from_nanos(HOUR + rng.next() % HOUR))
            .collect()
    }

    /// Our queue.
    pub fn ours(keys: &[Key], delays: &[Duration]) -> Duration {
        ours_with(SystemClock, keys, delays)
    }

    /// Our queue on any clock.
    pub fn ours_with(clock: impl Clock, keys: &[Key], delays: &[Duration]) -> Duration {
        ours_on(WorkQueue::builder().clock(clock).build(), keys, delays)
    }

    /// Our queue built with room for every key (the `(pre-sized)` row: no index growth).
    pub fn ours_presized(keys: &[Key], delays: &[Duration]) -> Duration {
        ours_on(
            WorkQueue::builder().capacity(keys.len()).build(),
            keys,
            delays,
        )
    }

    fn ours_on(q: Ours, keys: &[Key], delays: &[Duration]) -> Duration {
        let t = Instant::now();
        for (k, &d) in keys.iter().zip(delays) {
            q.add_after(k.clone(), d);
        }
        let d = t.elapsed();
        let c = q.counts();
        assert_eq!(
            (c.waiting, c.ready, c.tracked),
            (keys.len(), 0, keys.len()),
            "ours: W4 waiting keys"
        );
        q.shut_down();
        assert_ours_empty(&q);
        d
    }

    /// The client-go port (the timer thread takes the entries in concurrently, through a channel
    /// of capacity 1000, as in Go).
    pub fn naive(keys: &[Key], delays: &[Duration]) -> Duration {
        let q = naive::DelayingQueue::new();
        let t = Instant::now();
        for (k, &d) in keys.iter().zip(delays) {
            q.add_after(k.clone(), d);
        }
        let d = t.elapsed();
        assert_eq!(q.waiting_len(), Some(keys.len()), "naive: W4 waiting keys");
        assert_eq!(q.len(), 0);
        q.shut_down();
        d
    }

    /// Floor: `tokio_util::time::DelayQueue::insert` (no de-duplication).
    pub fn delay_queue(keys: &[Key], delays: &[Duration]) -> Duration {
        let rt = runtime(None);
        let _guard = rt.enter();
        let mut dq = tokio_util::time::DelayQueue::new();
        let t = Instant::now();
        for (k, &d) in keys.iter().zip(delays) {
            dq.insert(k.clone(), d);
        }
        let d = t.elapsed();
        assert_eq!(dq.len(), keys.len(), "DelayQueue: W4 entries");
        drop(dq);
        d
    }
}

/// W5 delay-precision: `add_after` 1000 keys with delay `1 + i % 10` ms; one consumer gets and
/// finishes them; lateness = when `get` returned - (add time + delay).
pub mod w5 {
    use super::*;

    /// Lateness percentiles of one run.
    #[derive(Debug, Clone, Copy)]
    pub struct Lateness {
        /// Median.
        pub p50: Duration,
        /// 99th percentile.
        pub p99: Duration,
        /// Worst.
        pub max: Duration,
    }

    /// The delay of key `i`.
    pub fn delay(i: usize) -> Duration {
        Duration::from_millis(1 + (i % 10) as u64)
    }

    /// Computes lateness from the add times and the (key address, get time) pairs a consumer
    /// recorded; checks that every key came exactly once and none came early. Every row's
    /// queue measures its delays on `std::time::Instant`'s clock (`SystemClock` and tokio's
    /// clock read it; client-go's `AddAfter` promises "at least" the delay), the clock these
    /// times are taken on, so no key may come before `added + delay`, by any margin.
    fn lateness(keys: &[Key], added: &[Instant], got: &[(usize, Instant)], who: &str) -> Lateness {
        let index: HashMap<usize, usize> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (Arc::as_ptr(k) as *const u8 as usize, i))
            .collect();
        let mut seen = vec![false; keys.len()];
        let mut late: Vec<Duration> = got
            .iter()
            .map(|&(ptr, t)| {
                let i = index[&ptr];
                assert!(!seen[i], "{who}: W5 key {i} seen twice");
                seen[i] = true;
                let due = added[i] + delay(i);
                assert!(t >= due, "{who}: W5 key {i} came {:?} early", due - t);
                t.saturating_duration_since(due)
            })
            .collect();
        assert!(seen.iter().all(|&s| s), "{who}: W5 keys missing");
        late.sort_unstable();
        Lateness {
            p50: percentile(&late, 50.0),
            p99: percentile(&late, 99.0),
            max: *late.last().expect("keys"),
        }
    }

    fn addr(k: &Key) -> usize {
        Arc::as_ptr(k) as *const u8 as usize
    }

    /// Our blocking queue, one consumer thread.
    pub fn ours(keys: &[Key]) -> Lateness {
        let q = Ours::new();
        let n = keys.len();
        let mut added = Vec::with_capacity(n);
        let got = thread::scope(|s| {
            let consumer = s.spawn(|| {
                let mut got = Vec::with_capacity(n);
                while got.len() < n {
                    let lease = q.get().expect("not shut down");
                    got.push((addr(&lease), Instant::now()));
                    lease.done();
                }
                got
            });
            for (i, k) in keys.iter().enumerate() {
                added.push(Instant::now());
                q.add_after(k.clone(), delay(i));
            }
            consumer.join().expect("consumer")
        });
        q.shut_down();
        assert_ours_empty(&q);
        lateness(keys, &added, &got, "ours")
    }

    /// The client-go port: timer thread, then the queue's condition variable.
    pub fn naive(keys: &[Key]) -> Lateness {
        let q = naive::DelayingQueue::new();
        let n = keys.len();
        let mut added = Vec::with_capacity(n);
        let got = thread::scope(|s| {
            let consumer = s.spawn(|| {
                let mut got = Vec::with_capacity(n);
                while got.len() < n {
                    let k = q.get().expect("not shut down");
                    got.push((addr(&k), Instant::now()));
                    q.done(&k);
                }
                got
            });
            for (i, k) in keys.iter().enumerate() {
                added.push(Instant::now());
                q.add_after(k.clone(), delay(i));
            }
            consumer.join().expect("consumer")
        });
        assert_naive_empty(q.queue());
        q.shut_down();
        lateness(keys, &added, &got, "naive")
    }

    /// Floor: `tokio_util::time::DelayQueue` on a current-thread runtime (1 ms timer wheel).
    pub fn delay_queue(keys: &[Key]) -> Lateness {
        let rt = runtime(None);
        let n = keys.len();
        let (added, got) = rt.block_on(async {
            let mut dq = tokio_util::time::DelayQueue::new();
            let mut added = Vec::with_capacity(n);
            for (i, k) in keys.iter().enumerate() {
                added.push(Instant::now());
                dq.insert(k.clone(), delay(i));
            }
            let mut got = Vec::with_capacity(n);
            while let Some(expired) = poll_fn(|cx| dq.poll_expired(cx)).await {
                got.push((addr(expired.get_ref()), Instant::now()));
            }
            (added, got)
        });
        lateness(keys, &added, &got, "DelayQueue")
    }

    /// Floor of anything that waits on tokio's timer (informative, no target): one task per key,
    /// each awaiting a `tokio::time::sleep(delay)` created right after its add time is taken, on
    /// a current-thread runtime with real time. Tokio rounds a deadline up to its next 1 ms tick,
    /// and its driver parks for whole ticks counted from the truncated current tick, so expect
    /// 0–2 ms of lateness.
    pub fn tokio_sleep(keys: &[Key]) -> Lateness {
        let rt = runtime(None);
        let n = keys.len();
        let (added, got) = rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            let mut added = Vec::with_capacity(n);
            for (i, k) in keys.iter().enumerate() {
                added.push(Instant::now());
                let sleep = tokio::time::sleep(delay(i));
                let a = addr(k);
                tasks.spawn(async move {
                    sleep.await;
                    (a, Instant::now())
                });
            }
            let mut got = Vec::with_capacity(n);
            while let Some(r) = tasks.join_next().await {
                got.push(r.expect("sleep task"));
            }
            (added, got)
        });
        lateness(keys, &added, &got, "tokio sleep")
    }

    /// Our async queue (`workqueue_tokio::WorkQueue`) on a current-thread runtime with real
    /// (not paused) time: one consumer task runs `get().await` + `done` on a thread of its own,
    /// and the main thread adds, as in [`ours`] (adds are plain methods, as informer callbacks
    /// call them). Its timers are tokio's, on the runtime's 1 ms wheel, as `DelayQueue`'s are.
    pub fn ours_async(keys: &[Key]) -> Lateness {
        let rt = runtime(None);
        let q: OursAsync = {
            let _entered = rt.enter();
            OursAsync::new()
        };
        let n = keys.len();
        let mut added = Vec::with_capacity(n);
        let got = thread::scope(|s| {
            let consumer = s.spawn(|| {
                rt.block_on(async {
                    let mut got = Vec::with_capacity(n);
                    while got.len() < n {
                        let lease = q.get().await.expect("not shut down");
                        got.push((addr(&lease), Instant::now()));
                        lease.done();
                    }
                    got
                })
            });
            for (i, k) in keys.iter().enumerate() {
                added.push(Instant::now());
                q.add_after(k.clone(), delay(i));
            }
            consumer.join().expect("consumer")
        });
        q.shut_down();
        assert_ours_async_empty(&q);
        lateness(keys, &added, &got, "ours async")
    }
}

/// W6 limiter-exp: exponential limiter (5 ms, 1000 s), `when` on the keys round-robin, `calls`
/// calls in all, every key forgotten every 10 rounds.
pub mod w6 {
    use super::*;

    const BASE: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1000);

    /// The sum of all delays the workload must produce, in nanoseconds (wrapping).
    fn expected_sum(keys: usize, rounds: usize) -> u64 {
        let per_key: u64 = (0..rounds)
            .map(|r| (BASE.as_nanos() as u64) << (r % 10))
            .sum();
        per_key.wrapping_mul(keys as u64)
    }

    fn rounds(keys: &[Key], calls: usize) -> usize {
        assert!(
            calls.is_multiple_of(keys.len()),
            "calls must be whole rounds"
        );
        calls / keys.len()
    }

    /// Ours: `workqueue_ratelimit::ExponentialFailure` (sharded, foldhash).
    pub fn ours(keys: &[Key], calls: usize) -> Duration {
        let rounds = rounds(keys, calls);
        let l = ExponentialFailure::<Key>::new(BASE, MAX);
        let now = SystemClock.now(); // the exponential limiter does not use it
        let mut sum = 0u64;
        let t = Instant::now();
        for r in 0..rounds {
            for k in keys {
                sum = sum.wrapping_add(l.when(k, now).as_nanos() as u64);
            }
            if r % 10 == 9 {
                for k in keys {
                    RateLimiter::<Key>::forget(&l, k);
                }
            }
        }
        let d = t.elapsed();
        assert_eq!(sum, expected_sum(keys.len(), rounds), "ours: W6 delays");
        for k in keys {
            assert_eq!(
                RateLimiter::<Key>::num_requeues(&l, k) as usize,
                rounds % 10
            );
        }
        d
    }

    /// The client-go port: `Mutex<HashMap>` (SipHash), float backoff.
    pub fn naive(keys: &[Key], calls: usize) -> Duration {
        use naive::Limiter;
        let rounds = rounds(keys, calls);
        let l = naive::ItemExponentialFailure::<Key>::new(BASE, MAX);
        let mut sum = 0u64;
        let t = Instant::now();
        for r in 0..rounds {
            for k in keys {
                sum = sum.wrapping_add(l.when(k).as_nanos() as u64);
            }
            if r % 10 == 9 {
                for k in keys {
                    l.forget(k);
                }
            }
        }
        let d = t.elapsed();
        assert_eq!(sum, expected_sum(keys.len(), rounds), "naive: W6 delays");
        for k in keys {
            assert_eq!(l.num_requeues(k) as usize, rounds % 10);
        }
        d
    }
}

/// W7 limiter-bucket: token bucket (qps 1e9, burst 1e9), `calls` calls, each with one read of the
/// clock the limiter is used with.
pub mod w7 {
    use super::*;

    const QPS: f64 = 1e9;
    const BURST: u32 = 1_000_000_000;

    /// Ours: lock-free GCRA `TokenBucket`, `now` from the queue's `SystemClock`.
    pub fn ours(calls: usize) -> Duration {
        ours_with(SystemClock, calls)
    }

    /// Ours with `now` from any clock.
    pub fn ours_with(clock: impl Clock, calls: usize) -> Duration {
        let b = TokenBucket::new(QPS, BURST).expect("valid bucket");
        let mut sum = Duration::ZERO;
        let t = Instant::now();
        for _ in 0..calls {
            sum += RateLimiter::<()>::when(&b, &(), clock.now());
        }
        let d = t.elapsed();
        assert_eq!(sum, Duration::ZERO, "ours: W7 a call was delayed");
        d
    }

    /// The client-go port: `x/time/rate` under a mutex, reading `Instant::now()` itself.
    pub fn naive(calls: usize) -> Duration {
        use naive::Limiter;
        let b = naive::Bucket::new(QPS, BURST.into());
        let mut sum = Duration::ZERO;
        let t = Instant::now();
        for _ in 0..calls {
            sum += b.when(&());
        }
        let d = t.elapsed();
        assert_eq!(sum, Duration::ZERO, "naive: W7 a call was delayed");
        d
    }

    /// Floor: `governor`'s direct limiter, `check()` (reads its own quanta clock).
    pub fn governor(calls: usize) -> Duration {
        use std::num::NonZeroU32;
        let n = NonZeroU32::new(BURST).expect("non-zero");
        let g = governor::RateLimiter::direct(governor::Quota::per_second(n).allow_burst(n));
        let mut denied = 0usize;
        let t = Instant::now();
        for _ in 0..calls {
            denied += usize::from(g.check().is_err());
        }
        let d = t.elapsed();
        assert_eq!(denied, 0, "governor: W7 a call was denied");
        d
    }
}

/// W8 limiter-default: the default controller limiter, `calls` calls on the keys round-robin.
pub mod w8 {
    use super::*;

    fn rounds(keys: &[Key], calls: usize) -> usize {
        assert!(
            calls.is_multiple_of(keys.len()),
            "calls must be whole rounds"
        );
        calls / keys.len()
    }

    /// Ours, with one read of the queue's `SystemClock` per call (the port's bucket reads the
    /// clock inside every call too).
    pub fn ours(keys: &[Key], calls: usize) -> Duration {
        ours_with(SystemClock, keys, calls)
    }

    /// Ours with `now` from any clock, read on every call.
    pub fn ours_with(clock: impl Clock, keys: &[Key], calls: usize) -> Duration {
        let rounds = rounds(keys, calls);
        let l = default_controller_rate_limiter::<Key>();
        let mut last = Duration::ZERO;
        let t = Instant::now();
        for _ in 0..rounds {
            for k in keys {
                last = l.when(k, clock.now());
            }
        }
        let d = t.elapsed();
        check_ours(&l, keys, rounds, last);
        d
    }

    /// Ours, with `now` read once per round of keys: the limiter's own cost (in the queue, the
    /// clock read is shared with the deadline computation).
    pub fn ours_shared_now(keys: &[Key], calls: usize) -> Duration {
        let rounds = rounds(keys, calls);
        let l = default_controller_rate_limiter::<Key>();
        let clock = SystemClock;
        let mut last = Duration::ZERO;
        let t = Instant::now();
        for _ in 0..rounds {
            let now = clock.now();
            for k in keys {
                last = l.when(k, now);
            }
        }
        let d = t.elapsed();
        check_ours(&l, keys, rounds, last);
        d
    }

    fn check_ours(l: &impl RateLimiter<Key>, keys: &[Key], rounds: usize, last: Duration) {
        for k in keys {
            assert_eq!(l.num_requeues(k) as usize, rounds, "ours: W8 failures");
        }
        if rounds >= 19 {
            assert!(
                last >= Duration::from_secs(1000),
                "ours: W8 last delay {last:?}"
            );
        }
    }

    /// The client-go port: `MaxOf` over boxed limiters, each with its own mutex.
    pub fn naive(keys: &[Key], calls: usize) -> Duration {
        use naive::Limiter;
        let rounds = rounds(keys, calls);
        let l = naive::default_controller_rate_limiter::<Key>();
        let mut last = Duration::ZERO;
        let t = Instant::now();
        for _ in 0..rounds {
            for k in keys {
                last = l.when(k);
            }
        }
        let d = t.elapsed();
        for k in keys {
            assert_eq!(l.num_requeues(k) as usize, rounds, "naive: W8 failures");
        }
        if rounds >= 19 {
            assert!(
                last >= Duration::from_secs(1000),
                "naive: W8 last delay {last:?}"
            );
        }
        d
    }
}

/// W9 memory: N distinct keys added and left queued; heap bytes per item, keys excluded (the keys
/// are allocated before, and cloning an `Arc` allocates nothing).
///
/// Needs [`crate::alloc::CountingAlloc`] as the global allocator; panics otherwise.
pub mod w9 {
    use super::*;
    use crate::alloc;

    fn per_item(net: Option<isize>, n: usize, who: &str) -> f64 {
        let net = net.unwrap_or_else(|| {
            panic!("{who}: W9 needs workqueue_benches::alloc::CountingAlloc as global allocator")
        });
        net as f64 / n as f64
    }

    /// Our queue (default capacity: grows as keys come). Also checks that the queue's own
    /// `allocated_bytes()` accounts for what the allocator saw.
    pub fn ours(keys: &[Key]) -> f64 {
        let (q, net) = alloc::measure(|| {
            let q = Ours::new();
            for k in keys {
                q.add(k.clone());
            }
            q
        });
        assert_eq!(q.len(), keys.len(), "ours: W9 queued keys");
        let reported = q.allocated_bytes();
        let figure = per_item(net, keys.len(), "ours");
        // The allocator also sees the queue's fixed parts (the shared state, the limiter).
        assert!(
            reported as f64 <= figure * keys.len() as f64,
            "ours: allocated_bytes() {reported} exceeds what was allocated"
        );
        drop(q);
        figure
    }

    /// The client-go port's basic queue (`VecDeque` + `dirty` set).
    pub fn naive(keys: &[Key]) -> f64 {
        let (q, net) = alloc::measure(|| {
            let q = naive::Queue::new();
            for k in keys {
                q.add(k.clone());
            }
            q
        });
        assert_eq!(q.len(), keys.len(), "naive: W9 queued keys");
        drop(q);
        per_item(net, keys.len(), "naive")
    }

    /// Floor: an unbounded crossbeam channel holding the keys.
    pub fn crossbeam(keys: &[Key]) -> f64 {
        let ((tx, rx), net) = alloc::measure(|| {
            let (tx, rx) = crossbeam_channel::unbounded();
            for k in keys {
                tx.send(k.clone()).expect("receiver alive");
            }
            (tx, rx)
        });
        assert_eq!(rx.len(), keys.len(), "crossbeam: W9 queued keys");
        drop((tx, rx));
        per_item(net, keys.len(), "crossbeam")
    }
}

/// W10 ratelimited-cycle: `add_rate_limited` every key (default limiter with a qps 1e9 / burst
/// 1e9 bucket, so only the 5 ms backoff applies), then get + forget + done as they become ready.
/// Measures process CPU time (every thread, including timer threads).
pub mod w10 {
    use super::*;
    use cpu_time::ProcessTime;

    const BASE: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1000);

    /// Process CPU time and wall time of one run.
    #[derive(Debug, Clone, Copy)]
    pub struct Cost {
        /// CPU time of every thread of the process during the run.
        pub cpu: Duration,
        /// Wall-clock time of the run.
        pub wall: Duration,
    }

    fn measure(f: impl FnOnce()) -> Cost {
        let cpu = ProcessTime::now();
        let wall = Instant::now();
        f();
        Cost {
            cpu: cpu.elapsed(),
            wall: wall.elapsed(),
        }
    }

    /// Our blocking queue.
    pub fn ours(keys: &[Key]) -> Cost {
        let q: Ours = WorkQueue::builder()
            .rate_limiter(MaxPair::new(
                ExponentialFailure::new(BASE, MAX),
                TokenBucket::new(1e9, 1_000_000_000).expect("valid bucket"),
            ))
            .build();
        let expected = Fingerprint::of(keys);
        let mut seen = Fingerprint::default();
        let cost = measure(|| {
            for k in keys {
                q.add_rate_limited(k.clone());
            }
            while seen.count < keys.len() as u64 {
                let lease = q.get().expect("not shut down");
                seen.add(&lease);
                lease.finish(Outcome::forget());
            }
        });
        assert_eq!(seen, expected, "ours: W10 keys seen");
        assert_ours_empty(&q);
        assert_eq!(q.num_requeues(&keys[0]), 0, "ours: W10 forget");
        q.shut_down();
        cost
    }

    /// The client-go port: rate-limiting queue over the delaying queue and its timer thread.
    pub fn naive(keys: &[Key]) -> Cost {
        let q = naive::RateLimitingQueue::new(naive::controller_rate_limiter::<Key>(
            1e9,
            1_000_000_000,
        ));
        let expected = Fingerprint::of(keys);
        let mut seen = Fingerprint::default();
        let cost = measure(|| {
            for k in keys {
                q.add_rate_limited(k.clone());
            }
            while seen.count < keys.len() as u64 {
                let k = q.get().expect("not shut down");
                seen.add(&k);
                q.forget(&k);
                q.done(&k);
            }
        });
        assert_eq!(seen, expected, "naive: W10 keys seen");
        assert_naive_empty(q.delaying().queue());
        assert_eq!(q.num_requeues(&keys[0]), 0, "naive: W10 forget");
        q.shut_down();
        cost
    }

    /// Floor (informative, no target): `DelayQueue` with a fixed 5 ms delay, drained on a
    /// current-thread runtime; no de-duplication and no limiter.
    pub fn delay_queue(keys: &[Key]) -> Cost {
        let rt = runtime(None);
        let expected = Fingerprint::of(keys);
        let mut seen = Fingerprint::default();
        let cost = measure(|| {
            rt.block_on(async {
                let mut dq = tokio_util::time::DelayQueue::new();
                for k in keys {
                    dq.insert(k.clone(), BASE);
                }
                while let Some(expired) = poll_fn(|cx| dq.poll_expired(cx)).await {
                    seen.add(expired.get_ref());
                }
            })
        });
        assert_eq!(seen, expected, "DelayQueue: W10 keys seen");
        cost
    }

    /// Our async queue (`workqueue_tokio::WorkQueue`, same limiter as [`ours`]) on a
    /// current-thread runtime with real time: one task adds every key, then gets and forgets
    /// them as their timers fire. The runtime is built before the measurement, as for
    /// [`delay_queue`].
    pub fn ours_async(keys: &[Key]) -> Cost {
        let rt = runtime(None);
        let q: OursAsync = {
            let _entered = rt.enter();
            workqueue_tokio::WorkQueue::builder()
                .rate_limiter(MaxPair::new(
                    ExponentialFailure::new(BASE, MAX),
                    TokenBucket::new(1e9, 1_000_000_000).expect("valid bucket"),
                ))
                .build()
        };
        let expected = Fingerprint::of(keys);
        let mut seen = Fingerprint::default();
        let cost = measure(|| {
            rt.block_on(async {
                for k in keys {
                    q.add_rate_limited(k.clone());
                }
                while seen.count < keys.len() as u64 {
                    let lease = q.get().await.expect("not shut down");
                    seen.add(&lease);
                    lease.finish(Outcome::forget());
                }
            })
        });
        assert_eq!(seen, expected, "ours async: W10 keys seen");
        assert_ours_async_empty(&q);
        assert_eq!(q.num_requeues(&keys[0]), 0, "ours async: W10 forget");
        q.shut_down();
        cost
    }
}

/// W11 priority-cycle: W1 with the keys spread over 4 priorities (`i % 4`), added with
/// `add_with`. Its target is a ratio to our own W1 ([`w1::ours`]) in the same run: what serving
/// by priority costs over one FIFO.
pub mod w11 {
    use super::*;

    /// The options key `i` is added with: priority `i % 4`.
    #[inline]
    pub fn options(i: usize) -> AddOptions {
        AddOptions::new().priority((i % 4) as i32)
    }

    /// How long a key may stay ready in [`ours_aging`]: longer than a run, so that no key
    /// becomes overdue and the row measures what aging's bookkeeping costs (a read of the time
    /// per add and per get, the age order, the overdue check of every get), not a different
    /// order.
    pub const MAX_READY_WAIT: Duration = Duration::from_secs(3600);

    /// Our queue.
    pub fn ours(keys: &[Key]) -> Duration {
        ours_on(Ours::new(), keys)
    }

    /// Our queue with aging on (`Builder::max_ready_wait`, [`MAX_READY_WAIT`]).
    pub fn ours_aging(keys: &[Key]) -> Duration {
        ours_on(
            WorkQueue::builder().max_ready_wait(MAX_READY_WAIT).build(),
            keys,
        )
    }

    /// The system clock with no `recent` of its own: every read of the time is a read of the
    /// CPU's counter (`Clock::recent` defaults to `now`).
    #[derive(Debug)]
    pub struct ExactClock;

    impl Clock for ExactClock {
        fn now(&self) -> workqueue_core::Instant {
            SystemClock.now()
        }
    }

    /// [`ours_aging`] on [`ExactClock`]: what aging would cost if it read the counter at every
    /// add and get, the reads `Clock::recent` saves.
    pub fn ours_aging_exact_clock(keys: &[Key]) -> Duration {
        ours_on(
            WorkQueue::builder()
                .clock(ExactClock)
                .max_ready_wait(MAX_READY_WAIT)
                .build(),
            keys,
        )
    }

    fn ours_on(q: Ours, keys: &[Key]) -> Duration {
        let expected = Fingerprint::of(keys);
        let mut seen = Fingerprint::default();
        let t = Instant::now();
        for (i, k) in keys.iter().enumerate() {
            q.add_with(k.clone(), options(i));
        }
        for _ in 0..keys.len() {
            let lease = q.get().expect("a queued key");
            seen.add(&lease);
            lease.done();
        }
        let d = t.elapsed();
        assert_eq!(seen, expected, "ours: W11 keys seen");
        assert_ours_empty(&q);
        d
    }
}

/// W12 fair-cycle: W1 (the same keys, `add`, checks and drain) on a queue with fairness by
/// namespace (`Builder::fairness`), so the keys spread over 100 groups (`ns-{i % 100}`), served
/// round-robin across them. Its target is a ratio to our own W1 ([`w1::ours`]) in the same run:
/// what fairness costs over one FIFO.
pub mod w12 {
    use super::*;

    /// The fairness group of a key: its namespace `ns-{g}` as the number `g` (`i % 100` for key
    /// `i`, so 100 groups). Parsed rather than returned as a string, as the group function must
    /// return an owned value and an owned `String` would allocate on every add; and parsed by
    /// hand, as `split_once('/')` + `str::parse` cost about 130 instructions per key (callgrind),
    /// which would be measured as the queue's.
    #[inline]
    pub fn namespace(key: &Key) -> u32 {
        let b = key.as_bytes();
        assert!(
            b.starts_with(b"ns-"),
            "a key of the form ns-{{g}}/name: {key}"
        );
        let mut g = 0u32;
        for &c in &b[3..] {
            match c {
                b'/' => return g,
                b'0'..=b'9' => g = g * 10 + u32::from(c - b'0'),
                _ => break,
            }
        }
        panic!("a key of the form ns-{{g}}/name: {key}")
    }

    /// Our queue with fairness by [`namespace`].
    pub fn queue() -> Ours {
        WorkQueue::builder().fairness(namespace).build()
    }

    /// Our queue: W1's cycle on a fair queue.
    pub fn ours(keys: &[Key]) -> Duration {
        w1::ours_on(queue(), keys)
    }
}

/// R1 runner-cycle: `workqueue_tokio::runner::Runner` with 8 workers over N distinct keys, all
/// queued (and the queue shut down) before the run, with a reconcile that succeeds at once. Times
/// `Runner::run` from its start until it returns, the queue drained: per key, a `get`, a
/// reconcile (its span, context and future) and the finish that the reconcile's
/// [`action`](r1::action) maps to.
pub mod r1 {
    use std::convert::Infallible;
    use std::future::{Ready, ready};

    use tokio::runtime::Runtime;
    use workqueue_tokio::CancellationToken;
    use workqueue_tokio::runner::{Action, Context, Report, Runner};

    use super::*;

    /// The runner's workers (reconciles at once).
    pub const WORKERS: usize = 8;

    /// What every reconcile returns: success, nothing to do for the key until it changes.
    #[inline]
    pub fn action() -> Action {
        Action::await_change()
    }

    /// The reconcile: succeeds at once with [`action`].
    fn reconcile(_key: Key, _ctx: Context) -> Ready<Result<Action, Infallible>> {
        ready(Ok(action()))
    }

    /// On a current-thread runtime: every worker and the run itself on the calling thread
    /// (deterministic, for callgrind: `--toggle-collect='*r1*timed_run*'`).
    pub fn ours(keys: &[Key]) -> Duration {
        ours_on(&runtime(None), keys)
    }

    /// On a multi-thread runtime with 2 worker threads.
    pub fn ours_multi_thread(keys: &[Key]) -> Duration {
        ours_on(&runtime(Some(2)), keys)
    }

    fn ours_on(rt: &Runtime, keys: &[Key]) -> Duration {
        let q: OursAsync = {
            let _entered = rt.enter();
            OursAsync::new()
        };
        for k in keys {
            q.add(k.clone());
        }
        q.shut_down();
        let runner = Runner::new(q.clone(), reconcile).workers(WORKERS);
        let (d, report) = timed_run(rt, runner.run(CancellationToken::new()));
        let failed = report.errors + report.panics + report.timeouts + report.interrupted;
        assert_eq!(
            (report.processed, failed, report.still_queued),
            (keys.len() as u64, 0, 0),
            "ours: R1 keys reconciled, failed, left queued: {report:?}"
        );
        assert_ours_async_empty(&q);
        d
    }

    /// The timed region alone, out of line so that a profiler can collect exactly it.
    #[inline(never)]
    fn timed_run(rt: &Runtime, run: impl Future<Output = Report>) -> (Duration, Report) {
        let t = Instant::now();
        let report = rt.block_on(run);
        (t.elapsed(), report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;

    #[test]
    fn w11_spreads_the_keys_over_four_priorities_served_highest_first() {
        let k = keys(8);
        let q = Ours::new();
        for (i, key) in k.iter().enumerate() {
            q.add_with(key.clone(), w11::options(i));
        }
        let mut served = Vec::new();
        while let Some(lease) = q.try_get() {
            served.push((lease.priority(), lease.key().clone()));
            lease.done();
        }
        let want: Vec<(i32, Key)> = [3, 7, 2, 6, 1, 5, 0, 4]
            .into_iter()
            .map(|i| ((i % 4) as i32, k[i].clone()))
            .collect();
        assert_eq!(served, want);
    }

    #[test]
    fn w12_groups_the_keys_by_namespace_and_serves_them_round_robin() {
        let k = keys(300);
        assert_eq!(w12::namespace(&k[0]), 0);
        assert_eq!(w12::namespace(&k[199]), 99);
        let groups: std::collections::HashSet<u32> =
            keys(2_000).iter().map(w12::namespace).collect();
        assert_eq!(groups.len(), 100);
        // Added namespace by namespace (all of ns-0, then all of ns-1, ...), served round-robin
        // across the namespaces: back in key order.
        let mut by_group: Vec<usize> = (0..k.len()).collect();
        by_group.sort_by_key(|&i| (i % 100, i));
        let q = w12::queue();
        for &i in &by_group {
            q.add(k[i].clone());
        }
        let mut served = Vec::new();
        while let Some(lease) = q.try_get() {
            served.push(lease.key().clone());
            lease.done();
        }
        assert_eq!(served, k);
    }

    #[test]
    fn every_queue_workload_checks_out_on_small_inputs() {
        let k = keys(2_000);
        w1::ours(&k);
        w1::naive(&k);
        w1::crossbeam(&k);
        w11::ours(&k);
        w12::ours(&k);
        w2::ours(&k[..100], 5);
        w2::ours_add_ref(&k[..100], 5);
        w2::naive(&k[..100], 5);
        for (p, c) in [(1, 1), (2, 2), (3, 1)] {
            w3::ours(&k, p, c);
            w3::naive(&k, p, c);
            w3::crossbeam(&k, p, c);
        }
        let d = w4::delays(k.len());
        assert!(d.iter().all(|d| (3600..7200).contains(&d.as_secs())));
        w4::ours(&k, &d);
        w4::naive(&k, &d);
        w4::delay_queue(&k, &d);
    }

    #[test]
    fn delay_and_limiter_workloads_check_out_on_small_inputs() {
        let k = keys(1_000);
        for l in [
            w5::ours(&k[..50]),
            w5::naive(&k[..50]),
            w5::delay_queue(&k[..50]),
            w5::ours_async(&k[..50]),
            w5::tokio_sleep(&k[..50]),
        ] {
            assert!(l.p50 <= l.p99 && l.p99 <= l.max);
        }
        w6::ours(&k[..100], 3_000);
        w6::naive(&k[..100], 3_000);
        w7::ours(10_000);
        w7::naive(10_000);
        w7::governor(10_000);
        w8::ours(&k[..100], 2_000);
        w8::ours_shared_now(&k[..100], 2_000);
        w8::naive(&k[..100], 2_000);
        w10::ours(&k);
        w10::naive(&k);
        w10::delay_queue(&k);
        w10::ours_async(&k);
    }

    #[test]
    fn runner_workload_checks_out_on_small_inputs() {
        let k = keys(1_000);
        r1::ours(&k);
        r1::ours_multi_thread(&k);
    }
}

/// W13 named-cycle: W1 (the same keys, `add`, checks and drain) on a named queue with the
/// `metrics` feature on and a no-op recorder installed (for the thread, as a local recorder), so
/// that every operation emits client-go's metrics and keeps per-key timing. Its target is a ratio
/// to our own unnamed W1 ([`w1::ours`]) in the same run: what leaving metrics on costs.
#[cfg(feature = "metrics")]
pub mod w13 {
    use super::*;

    /// Our named queue, emitting to a no-op recorder.
    pub fn ours(keys: &[Key]) -> Duration {
        let recorder = metrics::NoopRecorder;
        metrics::with_local_recorder(&recorder, || {
            w1::ours_on(WorkQueue::builder().name("w13").build(), keys)
        })
    }
}
