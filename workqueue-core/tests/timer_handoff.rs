//! Only one idle getter sleeps until the earliest deadline; the others wait for a notification.
//! When the timing getter leaves (with a key, or empty-handed), another must take the timer over,
//! or the next delayed key would wait forever. The generous timeouts turn such a hang into a
//! failure; they do not measure speed.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use workqueue_core::WorkQueue;

const GUARD: Duration = Duration::from_secs(20);

#[test]
fn getters_that_leave_with_a_key_hand_the_timer_over() {
    let queue: WorkQueue<u32> = WorkQueue::new();
    let (tx, rx) = mpsc::channel();
    // Each getter takes one key and never comes back, so every later deadline needs a hand-off.
    let getters: Vec<_> = (0..4)
        .map(|_| {
            let queue = queue.clone();
            let tx = tx.clone();
            thread::spawn(move || {
                // An untimed get: only a hand-off wakes it for a deadline.
                let key = queue.get().map(|lease| *lease);
                let _ = tx.send(key);
            })
        })
        .collect();
    for i in 0..4 {
        queue.add_after(i, Duration::from_millis(5 * (u64::from(i) + 1)));
    }
    let mut got = Vec::new();
    for _ in 0..4 {
        match rx.recv_timeout(GUARD) {
            Ok(key) => got.push(key),
            Err(_) => {
                queue.shut_down();
                panic!("a delayed key was never delivered: the timer was not handed over");
            }
        }
    }
    got.sort();
    assert_eq!(got, [Some(0), Some(1), Some(2), Some(3)]);
    for g in getters {
        g.join().unwrap();
    }
}

#[test]
fn a_getter_that_gives_up_hands_the_timer_over() {
    let queue: WorkQueue<u32> = WorkQueue::new();
    queue.add_after(1, Duration::from_millis(50));
    // Several short-lived getters come and go while one long-lived getter waits.
    let waiter = {
        let queue = queue.clone();
        thread::spawn(move || queue.get_timeout(GUARD).map(|l| *l))
    };
    for _ in 0..5 {
        assert!(queue.get_timeout(Duration::from_millis(1)).is_none());
    }
    assert_eq!(waiter.join().unwrap(), Some(1));
}
