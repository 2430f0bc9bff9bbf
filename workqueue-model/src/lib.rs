//! An obviously correct reference model of the work queue's semantics.
//!
//! [`Model`] implements the semantics table of the design (section 4) with plain ordered
//! collections and linear scans: no slots, no hashing, no heap, no index. It is slow on purpose
//! and small enough to check by reading. Property tests (`workqueue-core/tests/state_model.rs`) and
//! the fuzzer (`fuzz/`) drive it in lock step with [`QueueState`] and the blocking `WorkQueue`,
//! and compare every observable result.
//!
//! Keys are identified by value: a key is handed out at most once at a time, so "finish the lease
//! of key `k`" names a lease as well as a ticket does.
//!
//! ```
//! use std::time::Duration;
//! use workqueue_model::{AddStatus, Instant, Model, ModelGet, Outcome};
//!
//! let mut m: Model<&str> = Model::new();
//! let t0 = Instant::ZERO;
//! assert_eq!(m.add("a", t0), AddStatus::Queued);
//! assert_eq!(m.add("a", t0), AddStatus::AlreadyQueued);
//! assert_eq!(m.add_after("b", Duration::from_secs(1), t0), AddStatus::Waiting);
//! assert_eq!(m.get(t0), ModelGet::Ready("a"));
//! assert_eq!(m.add("a", t0), AddStatus::Dirty);
//! let f = m.finish(&"a", Outcome::Done, None, t0).unwrap();
//! assert!(f.requeued);
//! assert_eq!(m.len(Instant::from_nanos(1_000_000_000)), 2);
//! ```
//!
//! The crate also holds the small helpers that the stress tests and the soak examples share:
//! [`SplitMix64`], a seeded generator, and [`Ledger`], the per-key bookkeeping that checks
//! exclusive leases and "every add is processed afterwards" under concurrency.
//!
//! [`QueueState`]: workqueue_core::state::QueueState

pub mod differential;
pub mod faults;
mod ledger;
mod rng;

pub use ledger::Ledger;
pub use rng::SplitMix64;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

pub use workqueue_core::state::{AddStatus, Counts};
pub use workqueue_core::{Instant, Outcome};

/// What [`Model::get`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelGet<K> {
    /// This key was handed out and is now processing.
    Ready(K),
    /// Nothing is ready; the earliest waiting key is due at `next_deadline`.
    Empty {
        /// The earliest deadline of a waiting key, if any.
        next_deadline: Option<Instant>,
    },
    /// Shutting down and nothing is ready.
    ShutDown,
}

/// What [`Model::finish`] did (the model's `Finished`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFinished {
    /// The key went back to the ready FIFO.
    pub requeued: bool,
    /// The key now waits for a deadline.
    pub waiting: bool,
    /// The key is no longer tracked at all.
    pub released: bool,
}

/// The queue's semantics in the most direct form.
///
/// - `ready`: the FIFO, head first;
/// - `processing`: keys handed out and not finished; `dirty`: those re-added meanwhile;
/// - `waiting`: each delayed key with its `(deadline, sequence)`;
/// - `now`: the latest time seen (earlier `now`s are clamped to it).
#[derive(Debug, Clone)]
pub struct Model<K> {
    ready: Vec<K>,
    processing: BTreeSet<K>,
    dirty: BTreeSet<K>,
    waiting: BTreeMap<K, (u64, u64)>,
    shutting_down: bool,
    now: u64,
    seq: u64,
}

impl<K: Ord + Clone> Default for Model<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX`.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<K: Ord + Clone> Model<K> {
    /// An empty model at time zero.
    pub fn new() -> Self {
        Model {
            ready: Vec::new(),
            processing: BTreeSet::new(),
            dirty: BTreeSet::new(),
            waiting: BTreeMap::new(),
            shutting_down: false,
            now: 0,
            seq: 0,
        }
    }

    // ---- the rules -----------------------------------------------------------------------------

    /// Clamps `now` and moves every due waiting key to the FIFO, earliest `(deadline, seq)` first.
    fn promote(&mut self, now: Instant) {
        self.now = self.now.max(now.as_nanos());
        loop {
            let due = self
                .waiting
                .iter()
                .filter(|&(_, &(deadline, _))| deadline <= self.now)
                .min_by_key(|&(_, &when)| when)
                .map(|(k, _)| k.clone());
            let Some(key) = due else { break };
            self.waiting.remove(&key);
            self.enqueue(key);
        }
    }

    /// The add rule for a key that is not shut out.
    fn enqueue(&mut self, key: K) -> AddStatus {
        if self.ready.contains(&key) {
            AddStatus::AlreadyQueued
        } else if self.processing.contains(&key) {
            if self.dirty.insert(key) {
                AddStatus::Dirty
            } else {
                AddStatus::AlreadyDirty
            }
        } else {
            self.ready.push(key);
            AddStatus::Queued
        }
    }

    /// The delayed-add rule: the earlier deadline wins; each (re)insert takes a new sequence.
    fn schedule(&mut self, key: K, deadline: u64) -> AddStatus {
        match self.waiting.get(&key) {
            Some(&(current, _)) if current <= deadline => AddStatus::AlreadyWaiting,
            _ => {
                self.seq += 1;
                self.waiting.insert(key, (deadline, self.seq));
                AddStatus::Waiting
            }
        }
    }

    // ---- operations ----------------------------------------------------------------------------

    /// `add(k)`: ignored after shutdown, de-duplicated, or marked dirty while processing.
    pub fn add(&mut self, key: K, now: Instant) -> AddStatus {
        self.promote(now);
        if self.shutting_down {
            return AddStatus::ShutDown;
        }
        self.enqueue(key)
    }

    /// `add_after(k, d)`: `add` when `d` is zero; else waits until `now + d` (earliest wins).
    pub fn add_after(&mut self, key: K, delay: Duration, now: Instant) -> AddStatus {
        if delay.is_zero() {
            return self.add(key, now);
        }
        self.promote(now);
        if self.shutting_down {
            return AddStatus::ShutDown;
        }
        let deadline = self.now.saturating_add(nanos(delay));
        if deadline == u64::MAX {
            return AddStatus::Never;
        }
        self.schedule(key, deadline)
    }

    /// What an add or a `get` that user code interrupted leaves behind (a key's `Clone`, `Hash` or
    /// `Eq` that panicked): the promotion of the keys due at `now`, which every operation makes
    /// before it looks at a key, and nothing else. The rule the state follows (DESIGN.md 3.6):
    /// user code runs before the operation changes anything, so a panic leaves the state as it
    /// was. Finishing, shutting down and `len` call no user code, so nothing interrupts them.
    pub fn interrupted(&mut self, now: Instant) {
        self.promote(now);
    }

    /// `get()` without blocking: the FIFO head, or why there is none.
    pub fn get(&mut self, now: Instant) -> ModelGet<K> {
        self.promote(now);
        if self.ready.is_empty() {
            return if self.shutting_down {
                ModelGet::ShutDown
            } else {
                ModelGet::Empty {
                    next_deadline: self.next_deadline(),
                }
            };
        }
        let key = self.ready.remove(0);
        self.processing.insert(key.clone());
        ModelGet::Ready(key)
    }

    /// Finishes the lease of `key` with `outcome`; `limiter_delay` is the limiter's answer for a
    /// `Retry`. `None` when `key` is not being processed (the model's "foreign ticket").
    pub fn finish(
        &mut self,
        key: &K,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
    ) -> Option<ModelFinished> {
        if !self.processing.contains(key) {
            return None;
        }
        self.promote(now);
        self.processing.remove(key);
        let mut requeued = false;
        if self.dirty.remove(key) {
            self.ready.push(key.clone());
            requeued = true;
        }
        let readd = match outcome {
            Outcome::Retry => limiter_delay,
            Outcome::RetryAfter(d) | Outcome::RequeueAfter(d) => Some(d),
            _ => None,
        };
        if let Some(delay) = readd
            && !self.shutting_down
        {
            if delay.is_zero() {
                requeued |= self.enqueue(key.clone()) == AddStatus::Queued;
            } else {
                let deadline = self.now.saturating_add(nanos(delay));
                if deadline != u64::MAX {
                    self.schedule(key.clone(), deadline);
                }
            }
        }
        Some(ModelFinished {
            requeued,
            waiting: self.waiting.contains_key(key),
            released: !self.is_tracked(key),
        })
    }

    /// `shut_down()`: stops intake and drops the waiting entries. Returns the keys no longer
    /// tracked because of it, sorted.
    pub fn shut_down(&mut self) -> Vec<K> {
        self.shutting_down = true;
        let dropped = std::mem::take(&mut self.waiting);
        dropped
            .into_keys()
            .filter(|k| !self.is_tracked(k))
            .collect()
    }

    /// `len()`: keys ready at `now`.
    pub fn len(&mut self, now: Instant) -> usize {
        self.promote(now);
        self.ready.len()
    }

    /// Whether no key is ready at `now`.
    pub fn is_empty(&mut self, now: Instant) -> bool {
        self.len(now) == 0
    }

    // ---- observation (no promotion) ------------------------------------------------------------

    /// The latest time seen.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    /// Whether `shut_down` was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// No key processing and, with `include_queued`, none ready.
    pub fn is_drained(&self, include_queued: bool) -> bool {
        self.processing.is_empty() && (!include_queued || self.ready.is_empty())
    }

    /// The earliest waiting deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting
            .values()
            .map(|&(deadline, _)| deadline)
            .min()
            .map(Instant::from_nanos)
    }

    /// Counters, as `QueueState::counts` reports them.
    pub fn counts(&self) -> Counts {
        Counts {
            ready: self.ready.len(),
            processing: self.processing.len(),
            waiting: self.waiting.len(),
            tracked: self.tracked_keys().len(),
        }
    }

    /// Ready keys in FIFO order.
    pub fn ready_keys(&self) -> Vec<K> {
        self.ready.clone()
    }

    /// Keys being processed, sorted.
    pub fn processing_keys(&self) -> Vec<K> {
        self.processing.iter().cloned().collect()
    }

    /// Every key the queue has to remember: ready, processing or waiting.
    pub fn tracked_keys(&self) -> BTreeSet<K> {
        let mut all: BTreeSet<K> = self.ready.iter().cloned().collect();
        all.extend(self.processing.iter().cloned());
        all.extend(self.waiting.keys().cloned());
        all
    }

    /// Whether the queue has to remember `key`.
    pub fn is_tracked(&self, key: &K) -> bool {
        self.ready.contains(key) || self.processing.contains(key) || self.waiting.contains_key(key)
    }

    /// Whether `key` is in the ready FIFO.
    pub fn is_queued(&self, key: &K) -> bool {
        self.ready.contains(key)
    }

    /// Whether `key` is being processed.
    pub fn is_processing(&self, key: &K) -> bool {
        self.processing.contains(key)
    }

    /// Whether `key` is processing and was re-added meanwhile.
    pub fn is_dirty(&self, key: &K) -> bool {
        self.dirty.contains(key)
    }

    /// The deadline `key` waits for.
    pub fn waiting_deadline(&self, key: &K) -> Option<Instant> {
        self.waiting
            .get(key)
            .map(|&(deadline, _)| Instant::from_nanos(deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Instant = Instant::ZERO;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn at(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    #[test]
    fn the_semantics_table_row_by_row() {
        let mut m: Model<u8> = Model::new();
        // add: tail, dedup, dirty while processing.
        assert_eq!(m.add(1, T0), AddStatus::Queued);
        assert_eq!(m.add(2, T0), AddStatus::Queued);
        assert_eq!(m.add(1, T0), AddStatus::AlreadyQueued);
        assert_eq!(m.get(T0), ModelGet::Ready(1));
        assert_eq!(m.add(1, T0), AddStatus::Dirty);
        assert_eq!(m.add(1, T0), AddStatus::AlreadyDirty);
        assert_eq!(m.len(T0), 1);
        let f = m.finish(&1, Outcome::Done, None, T0).unwrap();
        assert_eq!(
            f,
            ModelFinished {
                requeued: true,
                waiting: false,
                released: false
            }
        );
        assert_eq!(m.ready_keys(), [2, 1]);
        assert_eq!(m.finish(&1, Outcome::Done, None, T0), None);

        // add_after: earliest wins, ready-time order, FIFO among equal times.
        assert_eq!(m.add_after(3, ms(10), T0), AddStatus::Waiting);
        assert_eq!(m.add_after(4, ms(5), T0), AddStatus::Waiting);
        assert_eq!(m.add_after(5, ms(5), T0), AddStatus::Waiting);
        assert_eq!(m.add_after(3, ms(20), T0), AddStatus::AlreadyWaiting);
        assert_eq!(m.add_after(3, ms(5), T0), AddStatus::Waiting);
        assert_eq!(m.add_after(6, Duration::MAX, T0), AddStatus::Never);
        assert_eq!(m.next_deadline(), Some(at(5)));
        assert_eq!(m.len(at(5)), 5);
        assert_eq!(m.ready_keys(), [2, 1, 4, 5, 3]);

        // add while waiting: queued now, the reminder stays.
        assert_eq!(m.add_after(7, ms(10), at(5)), AddStatus::Waiting);
        assert_eq!(m.add(7, at(5)), AddStatus::Queued);
        assert_eq!(m.waiting_deadline(&7), Some(at(15)));

        // shutdown drops waiting entries, keeps the queued ones, finishing still works.
        assert_eq!(m.get(at(5)), ModelGet::Ready(2));
        assert_eq!(m.add_after(8, ms(1), at(5)), AddStatus::Waiting);
        assert_eq!(m.shut_down(), [8]);
        assert_eq!(m.add(9, at(5)), AddStatus::ShutDown);
        let f = m
            .finish(&2, Outcome::RetryAfter(ms(1)), None, at(5))
            .unwrap();
        assert!(f.released && !f.waiting && !f.requeued);
        for k in [1, 4, 5, 3, 7] {
            assert_eq!(m.get(at(100)), ModelGet::Ready(k));
        }
        assert_eq!(m.get(at(100)), ModelGet::ShutDown);
        assert_eq!(m.counts().processing, 5);
        assert!(!m.is_drained(false));
    }

    #[test]
    fn time_is_clamped_and_retries_follow_the_outcome() {
        let mut m: Model<u8> = Model::new();
        m.add(1, at(10));
        assert_eq!(m.get(at(3)), ModelGet::Ready(1));
        assert_eq!(m.now(), at(10));
        let f = m.finish(&1, Outcome::Retry, Some(ms(2)), at(0)).unwrap();
        assert!(f.waiting && !f.released);
        assert_eq!(m.waiting_deadline(&1), Some(at(12)));
        assert_eq!(
            m.get(at(11)),
            ModelGet::Empty {
                next_deadline: Some(at(12))
            }
        );
        assert_eq!(m.get(at(12)), ModelGet::Ready(1));
        let f = m.finish(&1, Outcome::Retry, None, at(12)).unwrap();
        assert!(f.released);
        assert_eq!(m.counts(), Counts::default());
    }
}
