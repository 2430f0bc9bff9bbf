//! [`SystemClock::recent`](super::SystemClock): the system clock's time as of at most about
//! [`RESOLUTION`] ago, read with one atomic load.
//!
//! Reading the system clock is slow next to an atomic load (even through the vDSO, it reads the
//! CPU's timestamp counter, whose instruction stalls the pipeline around it, and scales it), and
//! an aging queue reads the time at every add and every get. Aging needs no more than millisecond precision, so those reads take this one
//! instead.
//!
//! One thread per process, the ticker, stores the time every [`RESOLUTION`]. It is started by
//! [`start`] (a queue with aging reads `recent` when it is built, outside any lock) and parks
//! after [`IDLE_TICKS`] ticks in which nobody read; a reader that finds it parked reads the
//! clock itself and wakes it. So an idle process has no ticking thread, and a busy one pays
//! about 250 wake-ups a second on one thread (why 4 ms: ARCHITECTURE.md). Where the thread
//! cannot be started, every read falls back to the clock.

#[cfg(not(all(test, workqueue_loom)))]
use std::sync::OnceLock;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
#[cfg(not(all(test, workqueue_loom)))]
use std::thread::Thread;
use std::time::Duration;

use crate::sync::{AtomicBool, AtomicU64};

/// How often the ticker stores the time: a reading is at most this old, plus however late the
/// ticker's thread is scheduled.
#[cfg_attr(all(test, workqueue_loom), allow(dead_code))]
pub(crate) const RESOLUTION: Duration = Duration::from_millis(4);

/// Ticks in a row without a read after which the ticker parks (100 ms).
pub(crate) const IDLE_TICKS: u32 = 25;

/// What readers and the ticker share.
///
/// Invariants: `value` is 0, or one plus the time the ticker read at its latest tick (so the
/// epoch, time 0, is representable). It is 0 before the first tick and from the moment the
/// ticker decides to park until it resumes, so a value a reader takes is at most one
/// [`RESOLUTION`] old, plus however late the ticker was scheduled. `waking` is set by the first
/// reader that finds the ticker parked (that reader unparks it) and cleared by the ticker once
/// it has resumed and stored a fresh value.
#[derive(Debug)]
pub(crate) struct Recent {
    value: AtomicU64,
    read: AtomicBool,
    waking: AtomicBool,
}

/// What the ticker does after a tick.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Sleep for [`RESOLUTION`], then tick again.
    Sleep,
    /// Park until a reader wakes it ([`Recent::park`]).
    Park,
}

impl Recent {
    #[cfg(not(all(test, workqueue_loom)))]
    pub(crate) const fn new() -> Self {
        Recent {
            value: AtomicU64::new(0),
            read: AtomicBool::new(false),
            waking: AtomicBool::new(false),
        }
    }

    #[cfg(all(test, workqueue_loom))]
    pub(crate) fn new() -> Self {
        Recent {
            value: AtomicU64::new(0),
            read: AtomicBool::new(false),
            waking: AtomicBool::new(false),
        }
    }

    /// The time at the ticker's latest tick, or `None` when it is parked or not started: the
    /// caller then reads the clock itself and calls [`Recent::wake`].
    #[inline]
    pub(crate) fn get(&self) -> Option<u64> {
        let value = self.value.load(Relaxed);
        if value == 0 {
            return None;
        }
        // Written once a tick, not at every read: the line stays shared between readers.
        if !self.read.load(Relaxed) {
            self.read.store(true, Relaxed);
        }
        Some(value - 1)
    }

    /// Asks a parked ticker to resume. True for the first caller since it parked, which must
    /// unpark its thread; false for the others (one unpark is enough).
    pub(crate) fn wake(&self) -> bool {
        !self.waking.swap(true, SeqCst)
    }

    /// A tick at `now` (nanoseconds on the clock's timeline). `idle` counts the ticks in a row
    /// without a read, and is the ticker's own.
    pub(crate) fn tick(&self, now: u64, idle: &mut u32) -> Next {
        if self.read.swap(false, Relaxed) {
            *idle = 0;
        } else {
            *idle += 1;
        }
        if *idle >= IDLE_TICKS {
            *idle = 0;
            // From here readers read the clock themselves, and the first of them wakes us.
            self.value.store(0, SeqCst);
            return Next::Park;
        }
        self.value.store(now + 1, Relaxed);
        Next::Sleep
    }

    /// Parks until a reader calls [`Recent::wake`], then stores `now()` and lets readers take
    /// values again. `park` blocks the ticker's thread until unparked (or spuriously).
    pub(crate) fn park(&self, park: impl Fn(), now: impl Fn() -> u64) {
        // No lost wake-up: a reader that saw `value == 0` sets `waking` before it unparks, and
        // an unpark that comes before `park` makes `park` return at once.
        while !self.waking.load(SeqCst) {
            park();
        }
        // The fresh value first: readers arriving now take it instead of waking again.
        self.value.store(now() + 1, Relaxed);
        self.waking.store(false, SeqCst);
    }
}

/// The process's ticker, for [`SystemClock`](super::SystemClock).
#[cfg(not(all(test, workqueue_loom)))]
pub(crate) static RECENT: Recent = Recent::new();

/// The ticker's thread, once started (`None`: it could not be).
#[cfg(not(all(test, workqueue_loom)))]
static TICKER: OnceLock<Option<Thread>> = OnceLock::new();

/// Starts the ticker if it is not running yet, storing the first value before it returns.
#[cfg(not(all(test, workqueue_loom)))]
pub(crate) fn start(now: fn() -> u64) {
    TICKER.get_or_init(|| {
        RECENT.value.store(now() + 1, SeqCst);
        std::thread::Builder::new()
            .name("workqueue-clock".into())
            .spawn(move || {
                let mut idle = 0;
                loop {
                    std::thread::sleep(RESOLUTION);
                    if RECENT.tick(now(), &mut idle) == Next::Park {
                        RECENT.park(std::thread::park, now);
                    }
                }
            })
            .map(|handle| handle.thread().clone())
            .map_err(|_| RECENT.value.store(0, SeqCst))
            .ok()
    });
}

/// A reader found the ticker parked (or not started): starts or wakes it.
#[cfg(not(all(test, workqueue_loom)))]
pub(crate) fn wake(now: fn() -> u64) {
    match TICKER.get() {
        None => start(now),
        Some(Some(thread)) => {
            if RECENT.wake() {
                thread.unpark();
            }
        }
        Some(None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recent() -> Recent {
        Recent::new()
    }

    #[test]
    fn nothing_before_the_first_tick_then_the_latest_tick() {
        let r = recent();
        assert_eq!(r.get(), None);
        let mut idle = 0;
        assert_eq!(r.tick(0, &mut idle), Next::Sleep);
        assert_eq!(r.get(), Some(0), "the epoch itself is a value");
        assert_eq!(r.tick(42, &mut idle), Next::Sleep);
        assert_eq!(r.get(), Some(42));
    }

    #[test]
    fn parks_after_idle_ticks_without_a_read_and_readers_then_fall_back() {
        let r = recent();
        let mut idle = 0;
        // A tick with no read since the previous one is idle; the IDLE_TICKS-th in a row parks.
        for t in 1..IDLE_TICKS as u64 {
            assert_eq!(r.tick(t, &mut idle), Next::Sleep, "tick {t}");
        }
        assert_eq!(r.get(), Some(IDLE_TICKS as u64 - 1));
        // That read makes the next tick a busy one: a hundred idle ticks after it again.
        assert_eq!(r.tick(1000, &mut idle), Next::Sleep);
        for t in 1..IDLE_TICKS as u64 {
            assert_eq!(
                r.tick(1000 + t, &mut idle),
                Next::Sleep,
                "tick {t} after the read"
            );
        }
        assert_eq!(r.tick(2000, &mut idle), Next::Park);
        assert_eq!(r.get(), None, "a parked ticker's last value is not offered");
        assert!(r.wake(), "the first reader unparks");
        assert!(!r.wake(), "the others do not");
        r.park(|| panic!("woken before parking: must not park"), || 3000);
        assert_eq!(r.get(), Some(3000), "resumed with a fresh value");
        assert!(
            r.wake(),
            "after resuming, the next parking needs a new wake-up"
        );
    }

    #[test]
    fn reads_every_tick_keep_it_ticking() {
        let r = recent();
        let mut idle = 0;
        for t in 0..10 * IDLE_TICKS as u64 {
            assert_eq!(r.tick(t, &mut idle), Next::Sleep);
            assert_eq!(r.get(), Some(t));
        }
    }
}

/// The race that matters: the ticker decides to park while readers that found it parked wake
/// it, one of them perhaps after it has already resumed. A lost wake-up is a loom deadlock (the
/// ticker parked for good).
#[cfg(all(test, workqueue_loom))]
mod loom_model {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn loom_a_reader_that_finds_the_ticker_parked_always_wakes_it() {
        loom::model(|| {
            let recent = Arc::new(Recent::new());
            let mut idle = IDLE_TICKS - 1;
            let ticker = {
                let recent = recent.clone();
                loom::thread::spawn(move || {
                    assert_eq!(recent.tick(5, &mut idle), Next::Park);
                    recent.park(loom::thread::park, || 7);
                })
            };
            let handle = ticker.thread().clone();
            let reader = {
                let recent = recent.clone();
                let handle = handle.clone();
                loom::thread::spawn(move || {
                    if recent.get().is_none() && recent.wake() {
                        handle.unpark();
                    }
                })
            };
            // The main thread is a reader that has already seen the ticker parked.
            if recent.wake() {
                handle.unpark();
            }
            reader.join().unwrap();
            ticker.join().unwrap();
            assert_eq!(recent.get(), Some(7), "resumed with a fresh value");
        });
    }
}
