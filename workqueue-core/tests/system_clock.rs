//! `SystemClock` measures delays on `std::time::Instant`'s clock, the one its users (and tokio)
//! measure on: a delay that has passed on the queue's clock has passed on theirs, so a delayed key
//! never comes early (client-go's `AddAfter` promises "at least" the delay). A clock of its own
//! (the CPU's counter, scaled by a calibration) disagrees with std's on the length of a delay by
//! its calibration error and by the rate corrections NTP applies to std's, either way.

use std::time::{Duration, Instant};

use workqueue_core::{Clock, SystemClock, WorkQueue};

/// The interval the two clocks measure: long enough that a rate error of a fraction of a part
/// per million (a calibration's) is more than the gap between two readings of the two clocks.
const INTERVAL: Duration = Duration::from_millis(100);

/// The delays of keys.
const DELAY: Duration = Duration::from_millis(20);

/// `SystemClock` and std's clock measure the same intervals: an interval read on `SystemClock`
/// is no longer than one read on std's around it, and no shorter than one read on std's inside
/// it. (A clock of its own, running fast or slow by a few parts per million, fails one or the
/// other.)
#[test]
fn a_system_clock_interval_is_stds() {
    let clock = SystemClock;
    for _ in 0..3 {
        let outer_start = Instant::now();
        let start = clock.now();
        let inner_start = Instant::now();
        std::thread::sleep(INTERVAL);
        let inner_end = Instant::now();
        let end = clock.now();
        let outer_end = Instant::now();
        let interval = end.saturating_duration_since(start);
        let (outer, inner) = (outer_end - outer_start, inner_end - inner_start);
        assert!(
            inner <= interval && interval <= outer,
            "SystemClock counted {interval:?}, std's {inner:?} inside it and {outer:?} around it"
        );
    }
}

/// A delay read on `SystemClock` has passed on std's clock: spin until `SystemClock` says `DELAY`
/// has passed since a reading taken after std's, then read std's.
#[test]
fn a_delay_on_the_system_clock_has_passed_on_stds() {
    let clock = SystemClock;
    for _ in 0..3 {
        let start = Instant::now();
        let due = clock.now().saturating_add(DELAY);
        while clock.now() < due {
            std::thread::yield_now();
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed >= DELAY,
            "SystemClock counted {DELAY:?} where std's counted {elapsed:?}"
        );
    }
}

/// The blocking queue on `SystemClock` hands a key added with a delay out no earlier than the
/// delay after the add, by std's clock.
#[test]
fn a_delayed_key_never_comes_early_by_stds_clock() {
    let queue: WorkQueue<usize> = WorkQueue::builder().build();
    let delay = |i: usize| DELAY + Duration::from_millis(i as u64);
    let mut added = Vec::new();
    for i in 0..5 {
        added.push(Instant::now());
        queue.add_after(i, delay(i));
    }
    for _ in 0..5 {
        let lease = queue.get().expect("not shut down");
        let got = Instant::now();
        let i = *lease;
        let due = added[i] + delay(i);
        assert!(got >= due, "key {i} came {:?} early", due - got);
        lease.done();
    }
}
