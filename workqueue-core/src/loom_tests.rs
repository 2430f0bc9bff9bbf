//! Loom models of the blocking driver (`--cfg workqueue_loom`, see [`crate::sync`]).
//!
//! Every model runs on a [`ManualClock`] (loom has no time; waits on a virtual clock are untimed),
//! with at most three threads. Run them bounded:
//!
//! ```text
//! RUSTFLAGS="--cfg workqueue_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p workqueue-core --release --lib loom -- --nocapture --test-threads=1
//! ```
//!
//! Each model prints how many interleavings loom explored. A lost wake-up shows up as a loom
//! deadlock (every thread blocked), a double lease as a failed assertion.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use loom::sync::atomic::AtomicUsize;
use loom::thread;

use crate::ratelimit::RateLimiter;
use crate::state::AddStatus;
use crate::{Instant, ManualClock, Outcome, WorkQueue};

/// A limiter that needs no locks of its own: every retry is due at once.
struct NoDelay;

impl RateLimiter<&'static str> for NoDelay {
    fn when(&self, _: &&'static str, _: Instant) -> Duration {
        Duration::ZERO
    }
    fn forget(&self, _: &&'static str) {}
    fn num_requeues(&self, _: &&'static str) -> u32 {
        0
    }
}

fn queue(clock: &ManualClock) -> WorkQueue<&'static str> {
    WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(NoDelay)
        .build()
}

/// Runs `f` under loom with a preemption bound (2 unless `LOOM_MAX_PREEMPTIONS` says otherwise)
/// and reports the number of interleavings explored.
fn model<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let iterations = Arc::new(StdAtomicUsize::new(0));
    let counter = iterations.clone();
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(move || {
        counter.fetch_add(1, SeqCst);
        f();
    });
    println!(
        "loom model {name}: {} interleavings explored (preemption bound {:?})",
        iterations.load(SeqCst),
        builder.preemption_bound
    );
}

/// (a) Two workers and a producer: adds, re-adds while processing, gets and finishes never hand
/// one key to two leases, and every key ends processed.
#[test]
fn loom_one_key_is_never_leased_twice() {
    model("one_key_is_never_leased_twice", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        let busy = Arc::new(AtomicUsize::new(0));
        q.add("a");
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (q, busy) = (q.clone(), busy.clone());
                thread::spawn(move || {
                    let mut readded = false;
                    while let Some(lease) = q.get() {
                        assert_eq!(busy.fetch_add(1, SeqCst), 0, "{} leased twice", *lease);
                        if !readded {
                            // Re-added while processing: marked dirty, handed out after `done`.
                            q.add(*lease);
                            readded = true;
                        }
                        busy.fetch_sub(1, SeqCst);
                        lease.done();
                    }
                })
            })
            .collect();
        q.add("a");
        q.shut_down();
        for w in workers {
            w.join().unwrap();
        }
        let c = q.counts();
        assert_eq!((c.ready, c.processing, c.tracked), (0, 0, 0), "{c:?}");
    });
}

/// (b) A getter blocked in `get` is woken by `add`.
#[test]
fn loom_blocked_get_is_woken_by_add() {
    model("blocked_get_is_woken_by_add", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        let getter = {
            let q = q.clone();
            thread::spawn(move || {
                let lease = q.get().expect("a key was added");
                assert_eq!(*lease, "a");
            })
        };
        q.add("a");
        getter.join().unwrap();
    });
}

/// (b) Two getters blocked in `get`, one batch of two keys: the single notification is passed on,
/// so both wake (no lost wake-up with `notify_one`).
#[test]
fn loom_two_blocked_getters_are_woken_by_one_batch() {
    model("two_blocked_getters_are_woken_by_one_batch", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        let getters: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || {
                    let lease = q.get().expect("two keys for two getters");
                    // Keep the lease until the thread ends, so each getter takes its own key.
                    *lease
                })
            })
            .collect();
        q.add_batch(["a", "b"]);
        let mut got: Vec<_> = getters.into_iter().map(|g| g.join().unwrap()).collect();
        got.sort();
        assert_eq!(got, ["a", "b"]);
    });
}

/// (b) A getter blocked in `get` is woken by `shut_down` and returns `None`.
#[test]
fn loom_blocked_get_is_woken_by_shut_down() {
    model("blocked_get_is_woken_by_shut_down", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        let getter = {
            let q = q.clone();
            thread::spawn(move || q.get().map(|l| *l))
        };
        q.shut_down();
        assert_eq!(getter.join().unwrap(), None);
    });
}

/// (c) `shut_down_with_drain` returns once the last outstanding lease finishes, whichever way it
/// finishes, and not before.
#[test]
fn loom_drain_returns_after_the_last_lease() {
    model("drain_returns_after_the_last_lease", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        let finished = Arc::new(AtomicUsize::new(0));
        q.add("a");
        q.add("b");
        let a = q.try_get().unwrap();
        let b = q.try_get().unwrap();
        let worker = {
            let finished = finished.clone();
            thread::spawn(move || {
                finished.fetch_add(1, SeqCst);
                a.finish(Outcome::retry()); // dropped after shutdown: the lease still finishes
                finished.fetch_add(1, SeqCst);
                b.done();
            })
        };
        q.shut_down_with_drain();
        assert_eq!(finished.load(SeqCst), 2, "drain returned with a lease out");
        assert_eq!(q.counts().processing, 0);
        worker.join().unwrap();
    });
}

/// (c) Two drains from two threads both return once the lease held by a third finishes.
#[test]
fn loom_concurrent_drains_both_return() {
    model("concurrent_drains_both_return", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        q.add("a");
        let lease = q.try_get().unwrap();
        let drainer = {
            let q = q.clone();
            thread::spawn(move || q.shut_down_with_drain())
        };
        let worker = thread::spawn(move || lease.done());
        q.shut_down_with_drain();
        assert_eq!(q.counts().processing, 0);
        drainer.join().unwrap();
        worker.join().unwrap();
    });
}

/// (d) A key re-added while it is processed is not lost: it is queued again once the lease
/// finishes, whether the add lands before or after the finish.
#[test]
fn loom_readd_while_processing_is_not_lost() {
    model("readd_while_processing_is_not_lost", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        q.add("a");
        let lease = q.try_get().unwrap();
        let worker = thread::spawn(move || lease.done());
        let status = q.add("a");
        worker.join().unwrap();
        assert!(
            matches!(status, AddStatus::Dirty | AddStatus::Queued),
            "{status:?}"
        );
        assert_eq!(q.len(), 1, "re-add lost (status {status:?})");
        let c = q.counts();
        assert_eq!((c.ready, c.processing, c.tracked), (1, 0, 1), "{c:?}");
    });
}

/// (d) The same with a blocking getter that may also race the add.
#[test]
fn loom_readd_races_get_and_done() {
    model("readd_races_get_and_done", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        q.add("a");
        let worker = {
            let q = q.clone();
            thread::spawn(move || q.get().map(|l| l.done()).is_some())
        };
        let status = q.add("a");
        assert!(worker.join().unwrap());
        match status {
            AddStatus::AlreadyQueued => assert_eq!(q.len(), 0, "processed after the add"),
            AddStatus::Dirty | AddStatus::Queued => assert_eq!(q.len(), 1, "re-add lost"),
            other => panic!("unexpected status {other:?}"),
        }
    });
}

/// (e) A getter sleeping until a later deadline is woken by an earlier `add_after` plus a clock
/// advance, and takes the earlier key.
#[test]
fn loom_earlier_add_after_wakes_a_getter_waiting_for_a_later_deadline() {
    model("earlier_add_after_wakes_getter", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        q.add_after("late", Duration::from_secs(10));
        let getter = {
            let q = q.clone();
            thread::spawn(move || *q.get().expect("\"early\" becomes due"))
        };
        q.add_after("early", Duration::from_secs(1));
        clock.advance(Duration::from_secs(1));
        assert_eq!(getter.join().unwrap(), "early");
        assert_eq!(q.counts().waiting, 1, "\"late\" still waits");
    });
}

/// (e) The clock is advanced from a third thread while the getter waits and the producer adds
/// the earlier key: whatever the order, the getter ends with a due key.
#[test]
fn loom_advance_from_another_thread_wakes_the_getter() {
    model("advance_from_another_thread_wakes_getter", || {
        let clock = ManualClock::new();
        let q = queue(&clock);
        q.add_after("a", Duration::from_secs(1));
        let getter = {
            let q = q.clone();
            thread::spawn(move || *q.get().expect("\"a\" becomes due"))
        };
        let ticker = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(Duration::from_secs(1)))
        };
        ticker.join().unwrap();
        assert_eq!(getter.join().unwrap(), "a");
    });
}
