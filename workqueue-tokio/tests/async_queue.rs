//! The async driver itself: cancel safety of `get`, wake-ups, shutdown and drains, leases, and
//! a multi-thread stress test.
//!
//! Time-dependent tests run on tokio's paused clock (`start_paused = true`), so delays take no real
//! time; the queue's state is exact, and a blocked `get` wakes at tokio's next 1 ms timer tick at
//! or after a deadline. The multi-thread tests make no timing assertions; their only timeout is a
//! generous watchdog that turns a hang (a lost wake-up) into a failure.

mod common;

use std::collections::HashSet;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use common::{ms, ns, secs, within};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};
use workqueue_core::state::{AddStatus, Counts};
use workqueue_core::{DrainIncomplete, DrainStop};
use workqueue_model::{Ledger, SplitMix64};
use workqueue_ratelimit::ExponentialFailure;
use workqueue_tokio::{Lease, Outcome, WorkQueue};

/// Polls `fut` once with the current task's waker.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    poll_fn(|cx| Poll::Ready(Pin::new(&mut *fut).poll(cx))).await
}

/// A getter task that reports what it got and when.
fn spawn_getter(
    queue: &WorkQueue<&'static str>,
) -> tokio::task::JoinHandle<(Option<Lease<&'static str>>, Instant)> {
    let q = queue.clone();
    tokio::spawn(async move {
        let lease = within(q.get()).await;
        (lease, Instant::now())
    })
}

// ---- cancel safety ------------------------------------------------------------------------------

/// A `get` dropped by `timeout` holds nothing, and a key added afterwards is not lost.
#[tokio::test(start_paused = true)]
async fn get_dropped_by_timeout_neither_loses_nor_holds() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let start = Instant::now();
    assert!(timeout(ms(10), queue.get()).await.is_err());
    assert_eq!(start.elapsed(), ms(10));
    assert_eq!(queue.counts(), Counts::default());

    queue.add("a");
    let lease = timeout(ms(10), queue.get()).await.unwrap().unwrap();
    assert_eq!(*lease, "a");
    assert_eq!(start.elapsed(), ms(10), "a ready key is handed out at once");
    lease.done();

    // A get waiting for a deadline, dropped before it: the key still fires on time.
    queue.add_after("b", ms(50));
    assert!(timeout(ms(20), queue.get()).await.is_err());
    assert_eq!(queue.counts().waiting, 1);
    assert_eq!(queue.counts().processing, 0);
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, "b");
    assert_eq!(start.elapsed(), ms(60));
    lease.done();
    assert_eq!(queue.counts(), Counts::default());
}

/// A `get` that was woken for a key and dropped before it ran passes the wake-up on: the other
/// waiting `get` takes the key. With nobody else waiting, the key stays queued.
#[tokio::test(start_paused = true)]
async fn woken_get_dropped_passes_the_wake_up_on() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();

    let mut first = Box::pin(queue.get());
    let mut second = Box::pin(queue.get());
    assert!(poll_once(&mut first).await.is_pending());
    assert!(poll_once(&mut second).await.is_pending());
    assert_eq!(queue.add("a"), AddStatus::Queued); // wakes the longest waiter, `first`
    drop(first);
    assert_eq!(queue.counts().processing, 0, "a dropped get holds a key");
    match poll_once(&mut second).await {
        Poll::Ready(Some(lease)) => {
            assert_eq!(*lease, "a");
            lease.done();
        }
        Poll::Ready(None) => panic!("get returned None on a live queue"),
        Poll::Pending => {
            // Not handed over at once: it must still arrive without any other event.
            let lease = timeout(secs(3600), second)
                .await
                .expect("the wake-up of the dropped get was lost")
                .unwrap();
            assert_eq!(*lease, "a");
            lease.done();
        }
    }

    // Alone: woken, dropped, the key is still there.
    let mut only = Box::pin(queue.get());
    assert!(poll_once(&mut only).await.is_pending());
    queue.add("b");
    drop(only);
    assert_eq!(queue.len(), 1);
    let lease = queue
        .try_get()
        .expect("the key of a dropped get is still queued");
    assert_eq!(*lease, "b");
    lease.done();
    assert_eq!(queue.counts(), Counts::default());
}

/// `select!` between a `get` and a timer that fire at the same virtual instant: whichever branch
/// wins, the key is handed out exactly once and nothing is left held.
#[tokio::test(start_paused = true)]
async fn get_in_select_racing_a_timer_never_loses_the_key() {
    for biased_to_timer in [true, false] {
        for delayed in [false, true] {
            let queue: WorkQueue<&'static str> = WorkQueue::new();
            if delayed {
                queue.add_after("k", ms(10));
            } else {
                let q = queue.clone();
                tokio::spawn(async move {
                    sleep(ms(10)).await;
                    q.add("k");
                });
            }
            let got = if biased_to_timer {
                tokio::select! {
                    biased;
                    () = sleep(ms(10)) => None,
                    lease = queue.get() => lease,
                }
            } else {
                tokio::select! {
                    biased;
                    lease = queue.get() => lease,
                    () = sleep(ms(10)) => None,
                }
            };
            let lease = match got {
                Some(lease) => lease,
                None => {
                    assert_eq!(queue.counts().processing, 0, "the dropped get holds a key");
                    timeout(ms(1), queue.get())
                        .await
                        .expect("the key was lost when the get was dropped")
                        .unwrap()
                }
            };
            assert_eq!(*lease, "k");
            lease.done();
            assert!(queue.try_get().is_none(), "the key was handed out twice");
            assert_eq!(queue.counts(), Counts::default());
        }
    }
}

/// Many getters, each cancelling its `get` at random (timeouts, `select!` against yields) or
/// waiting plainly; keys arrive by `add`, `add_after` and `add_batch` at random times. Every key
/// is handed out exactly once, and none is lost (a lost wake-up leaves every getter waiting
/// plainly with no timer, which trips the watchdog).
#[tokio::test(start_paused = true)]
async fn many_getters_with_random_cancellation_never_lose_keys() {
    const KEYS: u32 = 400;
    const GETTERS: u64 = 16;
    let queue: WorkQueue<u32> = WorkQueue::new();
    let got: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let total = Arc::new(AtomicU32::new(0));
    let all_in = Arc::new(tokio::sync::Notify::new());

    let mut getters = JoinSet::new();
    for id in 0..GETTERS {
        let (q, got, total, all_in) = (queue.clone(), got.clone(), total.clone(), all_in.clone());
        getters.spawn(async move {
            let mut rng = SplitMix64::new(0x5eed ^ id);
            loop {
                let lease = match rng.below(4) {
                    0 => q.get().await,
                    1 => match timeout(ms(rng.below(3)), q.get()).await {
                        Ok(lease) => lease,
                        Err(_) => continue,
                    },
                    _ => {
                        let yields = rng.below(4);
                        tokio::select! {
                            lease = q.get() => lease,
                            () = async {
                                for _ in 0..yields {
                                    tokio::task::yield_now().await;
                                }
                            } => continue,
                        }
                    }
                };
                let Some(lease) = lease else { return };
                got[*lease as usize].fetch_add(1, SeqCst);
                if rng.below(2) == 0 {
                    tokio::task::yield_now().await;
                }
                lease.done();
                if total.fetch_add(1, SeqCst) + 1 == KEYS {
                    all_in.notify_one();
                }
            }
        });
    }

    let mut rng = SplitMix64::new(42);
    let mut key = 0;
    while key < KEYS {
        match rng.below(4) {
            0 => {
                queue.add_after(key, ms(rng.below(5)));
                key += 1;
            }
            1 => {
                let n = (rng.below(4) as u32 + 1).min(KEYS - key);
                queue.add_batch(key..key + n);
                key += n;
            }
            _ => {
                queue.add(key);
                key += 1;
            }
        }
        match rng.below(3) {
            0 => sleep(ms(rng.below(3))).await,
            1 => tokio::task::yield_now().await,
            _ => {}
        }
    }

    let all_handed_out = all_in.notified();
    if total.load(SeqCst) < KEYS {
        timeout(secs(3600), all_handed_out)
            .await
            .unwrap_or_else(|_| panic!("keys lost: {} of {KEYS} handed out", total.load(SeqCst)));
    }
    queue.shut_down();
    within(getters.join_all()).await;
    for (key, n) in got.iter().enumerate() {
        assert_eq!(n.load(SeqCst), 1, "key {key} handed out {n:?} times");
    }
    assert_eq!(queue.counts(), Counts::default());
}

// ---- wake-ups -----------------------------------------------------------------------------------

/// A waiting `get` is woken by `add`, `add_ref` and `add_batch`, at the instant of the add; a
/// batch wakes as many waiting getters as it has keys.
#[tokio::test(start_paused = true)]
async fn waiting_get_is_woken_by_adds() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let getter = spawn_getter(&queue);
    sleep(secs(1)).await;
    assert!(!getter.is_finished());
    let added_at = Instant::now();
    queue.add("a");
    let (lease, at) = within(getter).await.unwrap();
    assert_eq!(*lease.unwrap(), "a");
    assert_eq!(at, added_at);

    let strings: WorkQueue<String> = WorkQueue::new();
    let q = strings.clone();
    let getter = tokio::spawn(async move { (within(q.get()).await, Instant::now()) });
    sleep(secs(1)).await;
    let added_at = Instant::now();
    assert_eq!(strings.add_ref("default/web"), AddStatus::Queued);
    let (lease, at) = within(getter).await.unwrap();
    let lease = lease.unwrap();
    assert_eq!(lease.as_str(), "default/web");
    assert_eq!(at, added_at);
    assert_eq!(strings.add_ref("default/web"), AddStatus::Dirty);
    lease.done();
    let lease = strings
        .try_get()
        .expect("the add_ref while processing re-queued it");
    lease.done();
    strings.shut_down();
    assert_eq!(strings.add_ref("default/db"), AddStatus::ShutDown);

    let getters: Vec<_> = (0..3).map(|_| spawn_getter(&queue)).collect();
    sleep(secs(1)).await;
    let added_at = Instant::now();
    queue.add_batch(["x", "y", "z", "x"]);
    let mut got = HashSet::new();
    let mut leases = Vec::new();
    for getter in getters {
        let (lease, at) = timeout(secs(3600), getter)
            .await
            .expect("a batch did not wake every waiting getter")
            .unwrap();
        let lease = lease.unwrap();
        assert_eq!(at, added_at);
        got.insert(*lease);
        leases.push(lease);
    }
    assert_eq!(got, HashSet::from(["x", "y", "z"]));
    drop(leases);
    assert_eq!(queue.counts(), Counts::default());
}

/// A waiting `get` is woken by an `add_after` whose deadline is earlier than the one it sleeps
/// until (or when it sleeps without one), and returns at exactly that deadline.
#[tokio::test(start_paused = true)]
async fn waiting_get_is_woken_by_an_earlier_add_after() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let start = Instant::now();

    // No deadline at all: woken to sleep until the new one.
    let getter = spawn_getter(&queue);
    sleep(secs(1)).await;
    queue.add_after("x", ms(5));
    let (lease, at) = within(getter).await.unwrap();
    assert_eq!(*lease.unwrap(), "x");
    assert_eq!(at - start, secs(1) + ms(5));

    // Sleeping until 10 s: an add_after for 2 s from t = 1 s moves it to t = 3 s.
    let start = Instant::now();
    queue.add_after("late", secs(10));
    let getter = spawn_getter(&queue);
    sleep(secs(1)).await;
    assert_eq!(queue.add_after("early", secs(2)), AddStatus::Waiting);
    let (lease, at) = within(getter).await.unwrap();
    assert_eq!(*lease.unwrap(), "early");
    assert_eq!(
        at - start,
        secs(3),
        "the getter slept past the earlier deadline"
    );

    // A later add_after (t = 3 s + 20 s) does not disturb it; the 10 s key still fires on time.
    let getter = spawn_getter(&queue);
    queue.add_after("later", secs(20));
    let (lease, at) = within(getter).await.unwrap();
    assert_eq!(*lease.unwrap(), "late");
    assert_eq!(at - start, secs(10));
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(*lease, "later");
    assert_eq!(start.elapsed(), secs(23));
    lease.done();
    assert_eq!(queue.counts(), Counts::default());
}

/// Only some waiting getters need to sleep until the earliest deadline; whichever does, the
/// deadline must not be lost when it stops waiting: cancelled, or returning with a key added
/// meanwhile. Every delayed key is handed out at exactly its deadline.
#[tokio::test(start_paused = true)]
async fn deadline_is_kept_when_the_getter_timing_it_leaves() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();

    // The first getter (the only one when the deadline is set) is cancelled before it.
    let start = Instant::now();
    queue.add_after("later", ms(50));
    let mut first = Box::pin(queue.get());
    assert!(poll_once(&mut first).await.is_pending());
    let second = spawn_getter(&queue);
    sleep(ms(20)).await;
    drop(first);
    let (lease, at) = within(second).await.unwrap();
    assert_eq!(*lease.unwrap(), "later");
    assert_eq!(
        at - start,
        ms(50),
        "the deadline was lost with the cancelled getter"
    );

    // Two getters wait for a deadline; one returns with a key added meanwhile.
    let start = Instant::now();
    queue.add_after("later", ms(50));
    let getters = [spawn_getter(&queue), spawn_getter(&queue)];
    sleep(ms(10)).await;
    queue.add("now");
    let mut got = Vec::new();
    for getter in getters {
        let (lease, at) = within(getter).await.unwrap();
        got.push((*lease.unwrap(), at - start));
    }
    got.sort_unstable_by_key(|&(_, at)| at);
    assert_eq!(got, [("now", ms(10)), ("later", ms(50))]);

    // Four getters, four deadlines: each key at exactly its own.
    let start = Instant::now();
    let getters: Vec<_> = (0..4).map(|_| spawn_getter(&queue)).collect();
    sleep(ms(1)).await;
    for (key, delay) in [("d40", 40), ("d10", 10), ("d30", 30), ("d20", 20)] {
        queue.add_after(key, ms(delay));
    }
    let mut got = Vec::new();
    for getter in getters {
        let (lease, at) = within(getter).await.unwrap();
        got.push((*lease.unwrap(), at - start));
    }
    got.sort_unstable_by_key(|&(_, at)| at);
    assert_eq!(
        got,
        [
            ("d10", ms(11)),
            ("d20", ms(21)),
            ("d30", ms(31)),
            ("d40", ms(41))
        ]
    );
    assert_eq!(queue.counts(), Counts::default());
}

/// Paused time is exact for the queue's state but not for tokio's timer, which fires on whole
/// milliseconds: `len` sees a key due at 1.5 ms at exactly 1.5 ms, while a blocked `get` sleeping
/// until then returns at the first 1 ms tick at or after it, 2 ms. (Another operation that finds
/// the key due, `len` included, wakes the getter at once.)
#[tokio::test(start_paused = true)]
async fn delays_on_paused_time_are_exact_for_len_and_rounded_up_to_a_tick_for_a_blocked_get() {
    let us = Duration::from_micros;

    // A blocked get alone: it returns at the 2 ms tick.
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let start = Instant::now();
    queue.add_after("k", us(1500));
    let getter = spawn_getter(&queue);
    tokio::task::yield_now().await; // the getter blocks
    tokio::time::advance(us(1500)).await;
    tokio::task::yield_now().await;
    assert!(
        !getter.is_finished(),
        "the get returned before a timer tick"
    );
    tokio::time::advance(us(500)).await;
    let (lease, at) = within(getter).await.unwrap();
    assert_eq!(*lease.unwrap(), "k");
    assert_eq!(at - start, ms(2));

    // `len` at exactly 1.5 ms sees the key, before the getter's timer has fired; it wakes the
    // getter, which then takes the key at 1.5 ms.
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let start = Instant::now();
    queue.add_after("k", us(1500));
    let getter = spawn_getter(&queue);
    tokio::task::yield_now().await;
    tokio::time::advance(us(1499)).await;
    assert_eq!(queue.len(), 0);
    tokio::time::advance(us(1)).await;
    tokio::task::yield_now().await;
    assert!(
        !getter.is_finished(),
        "the get returned before a timer tick"
    );
    assert_eq!(queue.len(), 1, "len sees the key at its exact instant");
    let (lease, at) = within(getter).await.unwrap();
    assert_eq!(*lease.unwrap(), "k");
    assert_eq!(at - start, us(1500));
}

/// `shut_down` wakes every waiting `get` at once, including one sleeping until a deadline; they
/// return `None`.
#[tokio::test(start_paused = true)]
async fn waiting_gets_are_woken_by_shut_down() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let plain: Vec<_> = (0..3).map(|_| spawn_getter(&queue)).collect();
    sleep(secs(1)).await;
    queue.add_after("far", secs(3600));
    let sleeping = spawn_getter(&queue);
    sleep(secs(1)).await;

    let shut_at = Instant::now();
    queue.shut_down();
    for getter in plain.into_iter().chain([sleeping]) {
        let (lease, at) = within(getter).await.unwrap();
        assert!(lease.is_none());
        assert_eq!(at, shut_at);
    }
    assert_eq!(
        queue.counts(),
        Counts::default(),
        "shutdown drops waiting keys"
    );
}

/// After `shut_down`, `get` hands out the keys already queued, then returns `None` at once: it
/// never waits for a deadline (delayed keys were dropped). Adds of every kind are ignored, and a
/// rate-limited add records no failure.
#[tokio::test(start_paused = true)]
async fn get_after_shut_down_drains_queued_keys_then_returns_none() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("a");
    queue.add("b");
    queue.add_after("c", secs(1));
    queue.add_after("a", ms(10)); // a reminder for a queued key
    let start = Instant::now();
    queue.shut_down();
    queue.shut_down(); // idempotent

    assert_eq!(queue.add("d"), AddStatus::ShutDown);
    assert_eq!(queue.add_after("d", ms(1)), AddStatus::ShutDown);
    assert_eq!(queue.add_rate_limited("d"), AddStatus::ShutDown);
    assert_eq!(queue.num_requeues(&"d"), 0);
    queue.add_batch(["d", "e"]);

    let mut order = Vec::new();
    while let Some(lease) = within(queue.get()).await {
        order.push(*lease);
        lease.done();
    }
    assert_eq!(order, ["a", "b"]);
    assert_eq!(start.elapsed(), Duration::ZERO, "get waited after shutdown");
    assert!(within(queue.get()).await.is_none());
    sleep(secs(2)).await;
    assert!(
        queue.try_get().is_none(),
        "a delayed key fired after shutdown"
    );
    assert_eq!(queue.counts(), Counts::default());
}

// ---- drains -------------------------------------------------------------------------------------

/// The timed drain returns at exactly its timeout and reports the keys still in flight (and the
/// number still queued); it returns `Ok` as soon as the last lease finishes.
#[tokio::test(start_paused = true)]
async fn timed_drain_reports_in_flight_keys() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add_batch(["a", "b", "c"]);
    let a = queue.try_get().unwrap();
    let b = queue.try_get().unwrap();
    let start = Instant::now();
    let err = queue
        .shut_down_with_drain_timeout(secs(5))
        .await
        .expect_err("two leases are outstanding");
    assert_eq!(start.elapsed(), secs(5));
    assert_eq!(err.stop, DrainStop::TimedOut);
    assert_eq!(
        err.in_flight.iter().copied().collect::<HashSet<_>>(),
        HashSet::from(["a", "b"])
    );
    assert_eq!(err.in_flight.len(), 2);
    assert_eq!(err.queued, 1);
    assert!(queue.is_shutting_down());

    // The leases finish 2 s into a second drain: it returns then.
    let start = Instant::now();
    tokio::spawn(async move {
        sleep(ms(500)).await;
        a.done();
        sleep(ms(1500)).await;
        b.finish(Outcome::retry()); // dropped after shutdown; the lease still finishes
    });
    queue
        .shut_down_with_drain_timeout(secs(5))
        .await
        .expect("every lease finished");
    assert_eq!(start.elapsed(), secs(2));
    assert_eq!(queue.counts().processing, 0);
    assert_eq!(queue.counts().waiting, 0);
}

/// A lease passed to `mem::forget` is never finished: the timed drain reports it.
#[tokio::test(start_paused = true)]
async fn timed_drain_reports_a_forgotten_lease() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("leaked");
    std::mem::forget(queue.try_get().unwrap());
    let err = queue
        .shut_down_with_drain_timeout(ms(100))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        DrainIncomplete {
            stop: DrainStop::TimedOut,
            in_flight: vec!["leaked"],
            queued: 0,
        }
    );
}

/// `shut_down` releases a drain in progress, untimed or timed; the timed one reports
/// `Released` and what was in flight.
#[tokio::test(start_paused = true)]
async fn drain_is_released_by_shut_down() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("a");
    let lease = queue.try_get().unwrap();

    let q = queue.clone();
    let untimed = tokio::spawn(async move {
        q.shut_down_with_drain().await;
        Instant::now()
    });
    let q = queue.clone();
    let timed = tokio::spawn(async move {
        let r = q.shut_down_with_drain_timeout(secs(3600)).await;
        (r, Instant::now())
    });
    sleep(secs(1)).await;
    assert!(!untimed.is_finished());
    assert!(!timed.is_finished());

    let released_at = Instant::now();
    queue.shut_down();
    assert_eq!(within(untimed).await.unwrap(), released_at);
    let (r, at) = within(timed).await.unwrap();
    assert_eq!(at, released_at);
    let err = r.unwrap_err();
    assert_eq!(err.stop, DrainStop::Released);
    assert_eq!(err.in_flight, ["a"]);
    lease.done();
}

/// A drain with `drain_includes_queued(true)` also waits for the ready FIFO to empty.
#[tokio::test(start_paused = true)]
async fn drain_including_queued_waits_for_queued_keys() {
    let queue: WorkQueue<&'static str> = WorkQueue::builder().drain_includes_queued(true).build();
    queue.add_batch(["a", "b"]);
    let a = queue.try_get().unwrap();
    let q = queue.clone();
    let drain = tokio::spawn(async move {
        q.shut_down_with_drain().await;
        Instant::now()
    });
    sleep(secs(1)).await;
    a.done();
    sleep(secs(1)).await;
    assert!(!drain.is_finished(), "b is still queued");
    let b = within(queue.get()).await.unwrap();
    sleep(secs(1)).await;
    assert!(!drain.is_finished(), "b is still in flight");
    let done_at = Instant::now();
    b.done();
    assert_eq!(within(drain).await.unwrap(), done_at);

    // The timed variant reports the queued count.
    let queue: WorkQueue<&'static str> = WorkQueue::builder().drain_includes_queued(true).build();
    queue.add_batch(["a", "b"]);
    let err = queue
        .shut_down_with_drain_timeout(ms(10))
        .await
        .unwrap_err();
    assert_eq!(err.stop, DrainStop::TimedOut);
    assert!(err.in_flight.is_empty());
    assert_eq!(err.queued, 2);
}

// ---- leases -------------------------------------------------------------------------------------

/// A dropped lease is `done`: the key is finished (re-queued if it was re-added meanwhile), and
/// the limiter's count is untouched.
#[tokio::test(start_paused = true)]
async fn dropped_lease_is_done() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("a");
    let lease = within(queue.get()).await.unwrap();
    assert_eq!(queue.counts().processing, 1);
    drop(lease);
    assert_eq!(queue.counts(), Counts::default());
    assert_eq!(queue.num_requeues(&"a"), 0);
    assert!(queue.try_get().is_none());

    queue.add("a");
    let lease = within(queue.get()).await.unwrap();
    queue.add("a");
    drop(lease);
    let lease = queue
        .try_get()
        .expect("a dropped lease re-queues a dirty key");
    assert_eq!(*lease, "a");
    lease.done();
    assert_eq!(queue.counts(), Counts::default());
}

/// A lease dropped while its task panics is a rate-limited retry (DESIGN 3.3), whether it lives
/// on the stack of the panicking poll or across an await in the task's state.
#[tokio::test(start_paused = true)]
async fn lease_dropped_by_a_panicking_task_is_retried() {
    for across_await in [false, true] {
        let queue: WorkQueue<&'static str> = WorkQueue::builder()
            .rate_limiter(ExponentialFailure::new(ms(5), secs(1000)))
            .build();
        queue.add("a");
        let q = queue.clone();
        let task = tokio::spawn(async move {
            let lease = within(q.get()).await.unwrap();
            if across_await {
                tokio::task::yield_now().await;
            }
            if *lease == "a" {
                panic!("reconcile of {} failed (expected by this test)", *lease);
            }
            lease.done();
        });
        assert!(task.await.unwrap_err().is_panic());
        assert_eq!(queue.counts().processing, 0);
        assert_eq!(
            queue.num_requeues(&"a"),
            1,
            "lease dropped while panicking (across_await: {across_await}) was not a retry"
        );
        tokio::time::advance(ms(5) - ns(1)).await;
        assert!(queue.try_get().is_none());
        tokio::time::advance(ns(1)).await;
        queue
            .try_get()
            .expect("retried after 5 ms")
            .finish(Outcome::forget());
    }
}

/// Each consuming method of a lease, on the paused clock, with `ExponentialFailure(5 ms, 1000 s)`.
#[tokio::test(start_paused = true)]
async fn lease_outcomes_on_the_paused_clock() {
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(ms(5), secs(1000)))
        .build();
    queue.add("k");
    let mut start = Instant::now();
    let mut lease = within(queue.get()).await.unwrap();

    // retry: 5 ms, then 10 ms.
    for (n, delay) in [(1, ms(5)), (2, ms(10))] {
        lease.finish(Outcome::retry());
        assert_eq!(queue.num_requeues(&"k"), n);
        lease = within(queue.get()).await.unwrap();
        assert_eq!(start.elapsed(), delay);
        start = Instant::now();
    }
    // retry_after: a fixed delay, the limiter is not consulted.
    lease.finish(Outcome::retry_after(secs(7)));
    assert_eq!(queue.num_requeues(&"k"), 2);
    lease = within(queue.get()).await.unwrap();
    assert_eq!(start.elapsed(), secs(7));
    start = Instant::now();
    // requeue_after: forget, then a fixed delay.
    lease.finish(Outcome::requeue_after(secs(30)));
    assert_eq!(queue.num_requeues(&"k"), 0);
    lease = within(queue.get()).await.unwrap();
    assert_eq!(start.elapsed(), secs(30));
    // done keeps the count; forget clears it; neither re-adds.
    lease.finish(Outcome::retry());
    lease = within(queue.get()).await.unwrap();
    lease.done();
    assert_eq!(queue.num_requeues(&"k"), 1);
    queue.add("k");
    within(queue.get()).await.unwrap().finish(Outcome::forget());
    assert_eq!(queue.num_requeues(&"k"), 0);
    assert!(timeout(secs(3600), queue.get()).await.is_err());
    assert_eq!(queue.counts(), Counts::default());
}

/// A `get` that finds a key ready takes part in tokio's cooperative budget, as tokio's channels
/// do: in a task that keeps taking ready keys without yielding, a `get` returns `Pending` once the
/// budget is spent (and takes nothing), so the task yields to the runtime.
#[tokio::test(start_paused = true)]
async fn ready_gets_take_part_in_the_cooperative_budget() {
    const KEYS: usize = 1_000;
    let queue: WorkQueue<usize> = WorkQueue::new();
    for key in 0..KEYS {
        queue.add(key);
    }
    let mut taken = 0;
    loop {
        let mut get = Box::pin(queue.get());
        match poll_once(&mut get).await {
            Poll::Ready(lease) => {
                lease.unwrap().done();
                taken += 1;
            }
            Poll::Pending => break,
        }
        assert!(taken < KEYS, "every ready get returned at once: no budget");
    }
    assert!(taken > 0);
    assert_eq!(queue.len(), KEYS - taken, "the pending get took nothing");
    assert_eq!(queue.counts().processing, 0);
    // After yielding, the task has a fresh budget.
    tokio::task::yield_now().await;
    within(queue.get()).await.unwrap().done();
}

/// `get`'s future is `Send`, so it can be awaited in a task on a multi-thread runtime (checked at
/// compile time).
#[tokio::test]
async fn get_future_is_send() {
    fn assert_send<F: Future + Send>(f: F) -> F {
        f
    }
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    queue.add("a");
    let q = queue.clone();
    let lease = tokio::spawn(async move { assert_send(q.get()).await.map(|l| *l) })
        .await
        .unwrap();
    assert_eq!(lease, Some("a"));
}

/// `try_get_batch` takes up to `max` ready keys in FIFO order.
#[tokio::test]
async fn try_get_batch_takes_in_fifo_order() {
    let queue: WorkQueue<u32> = WorkQueue::builder().capacity(16).name("batch").build();
    assert_eq!(queue.name(), Some("batch"));
    queue.add_batch([3, 1, 2, 3, 1]);
    assert_eq!(queue.len(), 3);
    let batch = queue.try_get_batch(2);
    assert_eq!(batch.iter().map(|l| **l).collect::<Vec<_>>(), [3, 1]);
    let rest = queue.try_get_batch(10);
    assert_eq!(rest.iter().map(|l| **l).collect::<Vec<_>>(), [2]);
    assert!(queue.try_get_batch(10).is_empty());
    assert_eq!(queue.counts().processing, 3);
    drop((batch, rest));
    assert_eq!(queue.counts(), Counts::default());
}

// ---- multi-thread stress ------------------------------------------------------------------------

/// Producers add keys (re-adding them while they are processed), getters cancel at random; on a
/// real multi-thread runtime. A key is never held by two leases at once, and every key is handed
/// out at least once after its last add. No timing assertions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_thread_stress_exclusive_leases_and_no_lost_adds() {
    const KEYS: usize = 64;
    const PRODUCERS: u64 = 4;
    const ADDS_PER_PRODUCER: usize = 2_000;
    const GETTERS: u64 = 8;

    let queue: WorkQueue<usize> = WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(Duration::from_micros(1), ms(1)))
        .build();
    // Held flags per key, and stamps of each key's last add (taken before the add) and last lease.
    let ledger = Arc::new(Ledger::new(KEYS, "async_queue"));
    let handed_out = Arc::new(AtomicUsize::new(0));

    let mut getters = JoinSet::new();
    for id in 0..GETTERS {
        let (q, ledger, handed_out) = (queue.clone(), ledger.clone(), handed_out.clone());
        getters.spawn(async move {
            let mut rng = SplitMix64::new(0xabcd ^ id);
            loop {
                let lease = if rng.below(3) == 0 {
                    let yields = rng.below(3);
                    tokio::select! {
                        lease = q.get() => lease,
                        () = async {
                            for _ in 0..yields {
                                tokio::task::yield_now().await;
                            }
                        } => continue,
                    }
                } else {
                    q.get().await
                };
                let Some(lease) = lease else { return };
                let key = *lease;
                ledger.leased(key);
                handed_out.fetch_add(1, SeqCst);
                for _ in 0..rng.below(3) {
                    tokio::task::yield_now().await;
                }
                ledger.releasing(key);
                match rng.below(8) {
                    0 => lease.finish(Outcome::retry()),
                    1 => lease.finish(Outcome::retry_after(Duration::ZERO)),
                    _ => lease.finish(Outcome::forget()),
                }
            }
        });
    }

    let mut producers = JoinSet::new();
    for id in 0..PRODUCERS {
        let (q, ledger) = (queue.clone(), ledger.clone());
        producers.spawn(async move {
            let mut rng = SplitMix64::new(0x1234 ^ id);
            for _ in 0..ADDS_PER_PRODUCER {
                let key = rng.below(KEYS as u64) as usize;
                ledger.adding(key);
                match rng.below(4) {
                    0 => {
                        q.add_batch([key]);
                    }
                    1 => {
                        q.add_after(key, Duration::ZERO);
                    }
                    _ => {
                        q.add(key);
                    }
                }
                if rng.below(4) == 0 {
                    tokio::task::yield_now().await;
                }
            }
        });
    }

    let watchdog = timeout(secs(30), async {
        producers.join_all().await;
        queue.shut_down();
        getters.join_all().await;
    });
    watchdog
        .await
        .expect("the stress test hung (lost wake-up or a drain that never ends)");

    assert_eq!(
        ledger.check_processed(""),
        0,
        "keys not handed out after their last add (see stderr)"
    );
    assert_eq!(
        ledger.violations(),
        0,
        "a key was held by two leases at once (see stderr)"
    );
    assert!(handed_out.load(SeqCst) >= KEYS);
    let counts = queue.counts();
    assert_eq!((counts.ready, counts.processing, counts.waiting), (0, 0, 0));
}

/// Getters that cancel at random on a multi-thread runtime, each key added once: every key is
/// handed out exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_thread_random_cancellation_hands_out_each_key_once() {
    const KEYS: usize = 5_000;
    let queue: WorkQueue<usize> = WorkQueue::new();
    let got: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let seen = Arc::new(Mutex::new(0usize));

    let mut getters = JoinSet::new();
    for id in 0..8u64 {
        let (q, got, seen) = (queue.clone(), got.clone(), seen.clone());
        getters.spawn(async move {
            let mut rng = SplitMix64::new(0x77 ^ id);
            let mut mine = 0;
            loop {
                let yields = rng.below(3);
                let lease = tokio::select! {
                    lease = q.get() => lease,
                    () = async {
                        for _ in 0..yields {
                            tokio::task::yield_now().await;
                        }
                        if yields == 2 {
                            std::future::pending::<()>().await;
                        }
                    } => continue,
                };
                let Some(lease) = lease else { break };
                got[*lease].fetch_add(1, SeqCst);
                mine += 1;
                lease.done();
            }
            *seen.lock().unwrap() += mine;
        });
    }
    let q = queue.clone();
    let producer = tokio::spawn(async move {
        for key in 0..KEYS {
            q.add(key);
            if key % 7 == 0 {
                tokio::task::yield_now().await;
            }
        }
    });
    let watchdog = timeout(secs(30), async {
        producer.await.unwrap();
        // Wait until every key was handed out before shutting down, so a lost wake-up is not
        // hidden by the shutdown's broadcast.
        while got.iter().map(|n| n.load(SeqCst) as usize).sum::<usize>() < KEYS {
            tokio::task::yield_now().await;
        }
        queue.shut_down();
        getters.join_all().await;
    });
    watchdog
        .await
        .expect("keys were lost (a getter never woke)");
    for (key, n) in got.iter().enumerate() {
        assert_eq!(n.load(SeqCst), 1, "key {key}");
    }
    assert_eq!(*seen.lock().unwrap(), KEYS);
    assert_eq!(queue.counts(), Counts::default());
}

/// `retain` while workers run: the keys given away that are queued or waiting are removed; those
/// being processed finish without being queued again; the kept keys all run; a getter waiting
/// for a removed key's deadline does not hang.
#[tokio::test(start_paused = true)]
async fn retain_removes_keys_while_workers_run() {
    let queue: WorkQueue<u32> = WorkQueue::builder().build();
    queue.add_batch(0..20);
    queue.add_after(21, secs(5));
    let ran: Arc<Mutex<Vec<u32>>> = Arc::default();
    let mut workers = JoinSet::new();
    for _ in 0..4 {
        let (queue, ran) = (queue.clone(), ran.clone());
        workers.spawn(async move {
            while let Some(lease) = queue.get().await {
                ran.lock().unwrap().push(*lease);
                sleep(ms(100)).await;
                lease.done();
            }
        });
    }
    sleep(ms(50)).await;
    // 0..4 are processing; re-added meanwhile, the odd ones would run again.
    queue.add_batch(0..4);
    let removed = queue.retain(|k| k.is_multiple_of(2));
    assert_eq!(removed, 8 + 1, "5, 7, ..., 19 and 21");
    sleep(secs(10)).await;
    queue.shut_down();
    within(async { while workers.join_next().await.is_some() {} }).await;
    let mut ran = ran.lock().unwrap().clone();
    ran.sort_unstable();
    let mut expected: Vec<u32> = (0..4).chain((0..20).step_by(2)).collect();
    expected.sort_unstable();
    assert_eq!(ran, expected);
}
