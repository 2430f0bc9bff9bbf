//! Only one idle getter sleeps until the earliest deadline; the others wait for a notification.
//! When the timing getter leaves (with a key, or empty-handed) while keys still wait, it must wake
//! another to take the timer over, or the next delayed key would wait forever.
//!
//! The time is a [`ManualClock`] that the queue is not told about ([`Silent`]): moving it wakes
//! nobody, as real time wakes nobody, so only the getter that times the queue notices a deadline
//! (it re-reads the clock whenever its timed wait ends). A queue on a plain `ManualClock` would
//! not show a lost hand-off: every move of that clock wakes every getter. Every outcome here
//! depends on the manual time alone; the wall clock only paces the timing getter's re-reads, and
//! [`GUARD`] turns a hang (a lost hand-off) into a failure.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::{ProbeClock, ms};
use workqueue_core::{Clock, Instant, ManualClock, WorkQueue};

/// How long a test waits for a key a correct queue delivers at once: only a lost hand-off
/// exhausts it.
const GUARD: Duration = Duration::from_secs(60);

/// A [`ManualClock`] whose moves the queue is not told about: not virtual (a getter that times a
/// deadline waits on its condition variable for the time left, as on the system clock) and
/// registering no waker (advancing it wakes no getter).
#[derive(Clone, Debug, Default)]
struct Silent(ManualClock);

impl Clock for Silent {
    fn now(&self) -> Instant {
        self.0.now()
    }
}

/// A queue on a silent manual clock, behind a probe that records which threads read it.
fn silent_queue() -> (WorkQueue<u32>, ProbeClock<Silent>) {
    let clock = ProbeClock::new(Silent::default());
    let queue = WorkQueue::builder().clock(clock.clone()).build();
    (queue, clock)
}

/// How many times a getter has read the clock once it has looked at the queue under its lock: a
/// `get` reads it there first; a `get_timeout` reads it once before, for its own deadline.
const GET_READS: usize = 1;
const GET_TIMEOUT_READS: usize = 2;

/// Returns once the getter on `thread` waits in the queue: it has read the clock `reads` times,
/// the last under the queue's lock, which it holds from there until it waits, and the lock was
/// taken since.
fn wait_until_idle(
    queue: &WorkQueue<u32>,
    clock: &ProbeClock<Silent>,
    thread: thread::ThreadId,
    reads: usize,
) {
    clock.wait_for_reads(thread, reads);
    let _ = queue.len();
}

#[test]
fn getters_that_leave_with_a_key_hand_the_timer_over() {
    let (queue, clock) = silent_queue();
    for i in 0..4u32 {
        queue.add_after(i, ms(u64::from(i) + 1));
    }
    let (tx, rx) = mpsc::channel();
    // Each getter takes one key and never comes back, so every later deadline needs a hand-off.
    let getters: Vec<_> = (0..4)
        .map(|_| {
            let queue = queue.clone();
            let tx = tx.clone();
            thread::spawn(move || {
                // An untimed get: once another getter times the queue, only a hand-off wakes it
                // for a deadline.
                let key = queue.get().map(|lease| *lease);
                let _ = tx.send(key);
            })
        })
        .collect();
    for g in &getters {
        wait_until_idle(&queue, &clock, g.thread().id(), GET_READS);
    }
    // One deadline at a time: key `i` is due only once key `i - 1` was delivered, so the getter
    // that times key `i` took the timer over from the one that left with key `i - 1`.
    for i in 0..4u32 {
        clock
            .inner()
            .0
            .advance_to(Instant::ZERO.saturating_add(ms(u64::from(i) + 1)));
        match rx.recv_timeout(GUARD) {
            Ok(key) => assert_eq!(key, Some(i)),
            Err(_) => {
                queue.shut_down();
                panic!("key {i} was never delivered: the timer was not handed over");
            }
        }
    }
    for g in getters {
        g.join().unwrap();
    }
    assert!(queue.is_empty());
}

#[test]
fn a_getter_that_gives_up_hands_the_timer_over() {
    let (queue, clock) = silent_queue();
    let key_due = Instant::ZERO.saturating_add(ms(10));
    queue.add_after(1, ms(10));
    // A short-lived getter comes first, so it times the key's deadline; it gives up at 1 ms.
    let first = {
        let queue = queue.clone();
        thread::spawn(move || queue.get_timeout(ms(1)).map(|l| *l))
    };
    wait_until_idle(&queue, &clock, first.thread().id(), GET_TIMEOUT_READS);
    // A long-lived getter then waits for a notification only, since the first times the queue.
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let queue = queue.clone();
        thread::spawn(move || {
            let _ = tx.send(queue.get().map(|l| *l));
        })
    };
    wait_until_idle(&queue, &clock, waiter.thread().id(), GET_READS);
    clock.inner().0.advance(ms(1));
    assert_eq!(
        first.join().unwrap(),
        None,
        "the first getter gives up at 1 ms"
    );
    // More short-lived getters come and go while the long-lived one waits.
    for _ in 0..4 {
        let short = {
            let queue = queue.clone();
            thread::spawn(move || queue.get_timeout(ms(1)).map(|l| *l))
        };
        wait_until_idle(&queue, &clock, short.thread().id(), GET_TIMEOUT_READS);
        clock.inner().0.advance(ms(1));
        assert_eq!(short.join().unwrap(), None, "a short-lived getter gives up");
    }
    assert!(clock.now() < key_due);
    clock.inner().0.advance_to(key_due);
    match rx.recv_timeout(GUARD) {
        Ok(key) => assert_eq!(key, Some(1)),
        Err(_) => {
            queue.shut_down();
            panic!("the key was never delivered: the timer was not handed over");
        }
    }
    waiter.join().unwrap();
}
