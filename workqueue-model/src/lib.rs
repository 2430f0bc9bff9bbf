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
//! exclusive leases and "every add is processed afterwards" under concurrency; and, with the
//! `soak` feature, the rest of what the two soak examples share (`soak`).
//!
//! [`QueueState`]: workqueue_core::state::QueueState

pub mod differential;
pub mod faults;
mod ledger;
mod parking;
mod ready;
mod rng;
#[cfg(feature = "soak")]
pub mod soak;

pub use ledger::Ledger;
pub use parking::{ModelEvent, PARKED};
pub use rng::SplitMix64;

use std::collections::{BTreeMap, BTreeSet};

use ready::ModelReady;
use std::time::Duration;

pub use workqueue_core::Instant;
pub use workqueue_core::state::{AddStatus, Counts};

/// How a lease ends, as the model matches on it: the operations of the queue's
/// [`Outcome`](workqueue_core::Outcome), which is opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `Outcome::done()`.
    Done,
    /// `Outcome::forget()`.
    Forget,
    /// `Outcome::retry()`.
    Retry,
    /// `Outcome::retry_after(d)`.
    RetryAfter(Duration),
    /// `Outcome::requeue_after(d)`.
    RequeueAfter(Duration),
}

impl Outcome {
    /// The queue's outcome with this operation.
    pub fn to_queue(self) -> workqueue_core::Outcome {
        use workqueue_core::Outcome as Q;
        match self {
            Outcome::Done => Q::done(),
            Outcome::Forget => Q::forget(),
            Outcome::Retry => Q::retry(),
            Outcome::RetryAfter(d) => Q::retry_after(d),
            Outcome::RequeueAfter(d) => Q::requeue_after(d),
        }
    }
}

/// One add's options, as the model reads them (the queue's
/// [`AddOptions`](workqueue_core::AddOptions) is opaque).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelAdd {
    /// `AddOptions::priority`.
    pub priority: i32,
    /// `AddOptions::after`.
    pub delay: Duration,
    /// `AddOptions::rate_limited`: the delay is a rate-limited retry's (the state has no limiter).
    pub rate_limited: bool,
    /// `AddOptions::debounced`.
    pub debounced: bool,
    /// `AddOptions::bypass_parking`.
    pub bypass_parking: bool,
}

impl ModelAdd {
    /// The queue's options with these values.
    pub fn to_queue(self) -> workqueue_core::AddOptions {
        workqueue_core::AddOptions::new()
            .priority(self.priority)
            .after(self.delay)
            .rate_limited(self.rate_limited)
            .debounced(self.debounced)
            .bypass_parking(self.bypass_parking)
    }

    /// Why a key added with these options after a delay waits.
    fn kind(self) -> Kind {
        if self.rate_limited {
            Kind::Retry
        } else if self.debounced {
            Kind::Debounce
        } else {
            Kind::Reminder
        }
    }
}

/// Why a key waits: what its entry was last set by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A plain delayed add: a reminder.
    Reminder,
    /// The rate limiter's delay.
    Retry,
    /// A debounced add.
    Debounce,
    /// Parked, or waiting to be the probe.
    Parked,
}

/// A waiting key's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) deadline: u64,
    pub(crate) seq: u64,
    pub(crate) priority: i32,
    pub(crate) kind: Kind,
}

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
/// - `ready`: the ready keys, with priorities, aging and fairness (see `ready.rs`: levels by
///   priority, FIFO within a level or round-robin by group with fairness, and overdue keys in a
///   level above all, moved there at each `get`);
/// - `processing`: keys handed out and not finished, with the priority they were handed out at;
///   `dirty`: those re-added meanwhile, with the priority they are queued at when finished;
/// - `waiting`: each delayed key with its deadline, sequence, priority and why it waits;
/// - `now`: the latest time seen (earlier `now`s are clamped to it).
#[derive(Debug, Clone)]
pub struct Model<K> {
    ready: ModelReady<K>,
    max_ready_wait: Option<u64>,
    group: Option<fn(&K) -> u64>,
    processing: BTreeMap<K, i32>,
    dirty: BTreeMap<K, i32>,
    waiting: BTreeMap<K, Entry>,
    shutting_down: bool,
    /// `QueueState::set_keep_backoff`.
    keep_backoff: bool,
    now: u64,
    seq: u64,
    /// Outage detection (`parking.rs`), when on.
    parking: Option<parking::ModelParking<K>>,
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
            ready: ModelReady::new(),
            max_ready_wait: None,
            group: None,
            processing: BTreeMap::new(),
            dirty: BTreeMap::new(),
            waiting: BTreeMap::new(),
            shutting_down: false,
            keep_backoff: false,
            now: 0,
            seq: 0,
            parking: None,
        }
    }

    /// Turns aging on (`QueueState::enable_aging`): keys already ready count as ready from
    /// the latest time seen, in the order they are served.
    pub fn with_max_ready_wait(mut self, max_wait: Duration) -> Self {
        self.ready.restart_ages(self.now);
        self.max_ready_wait = Some(nanos(max_wait));
        self
    }

    /// Turns fairness on, with `group` giving each key's group (on an empty model).
    pub fn with_fairness(mut self, group: fn(&K) -> u64) -> Self {
        assert!(
            self.ready.is_empty(),
            "fairness is chosen before the first add"
        );
        self.ready.set_fair();
        self.group = Some(group);
        self
    }

    /// Turns `QueueState::set_keep_backoff` on.
    pub fn with_keep_backoff(mut self) -> Self {
        self.keep_backoff = true;
        self
    }

    fn group_of(&self, key: &K) -> u64 {
        self.group.map_or(0, |g| g(key))
    }

    // ---- the rules -----------------------------------------------------------------------------

    /// Clamps `now` and moves every due waiting key to the FIFO, earliest `(deadline, seq)` first.
    fn promote(&mut self, now: Instant) {
        self.now = self.now.max(now.as_nanos());
        loop {
            let due = self
                .waiting
                .iter()
                .filter(|&(_, e)| e.deadline <= self.now)
                .min_by_key(|&(_, e)| (e.deadline, e.seq))
                .map(|(k, e)| (k.clone(), e.priority));
            let Some((key, priority)) = due else { break };
            let deadline = self.waiting.remove(&key).expect("found").deadline;
            self.enqueue_at(key, priority, deadline);
        }
    }

    /// The add rule for a key that is not shut out: the highest priority asked for wins, and a
    /// raised key re-enters at the end.
    fn enqueue(&mut self, key: K, priority: i32) -> AddStatus {
        self.enqueue_at(key, priority, self.now)
    }

    /// The add rule for a key that becomes ready (if it does) at `since`. A raise keeps when the
    /// key became ready.
    fn enqueue_at(&mut self, key: K, priority: i32, since: u64) -> AddStatus {
        if let Some(e) = self.ready.find(&key) {
            if priority <= e.priority {
                return AddStatus::AlreadyQueued;
            }
            self.ready.raise(&key, priority);
            AddStatus::Raised
        } else if self.processing.contains_key(&key) {
            match self.dirty.get_mut(&key) {
                Some(p) => {
                    *p = (*p).max(priority);
                    AddStatus::AlreadyDirty
                }
                None => {
                    self.dirty.insert(key, priority);
                    AddStatus::Dirty
                }
            }
        } else {
            self.push_ready(key, priority, since);
            AddStatus::Queued
        }
    }

    fn push_ready(&mut self, key: K, priority: i32, since: u64) {
        let group = self.group_of(&key);
        self.ready.push(key, priority, since, group);
    }

    /// The delayed-add rule: the earlier deadline wins (and takes a new sequence and its
    /// `kind`), and so does the higher priority.
    pub(crate) fn schedule(
        &mut self,
        key: K,
        deadline: u64,
        priority: i32,
        kind: Kind,
    ) -> AddStatus {
        match self.waiting.get_mut(&key) {
            Some(entry) => {
                let (earlier, raised) = (deadline < entry.deadline, priority > entry.priority);
                if earlier {
                    self.seq += 1;
                    (entry.deadline, entry.seq, entry.kind) = (deadline, self.seq, kind);
                }
                if raised {
                    entry.priority = priority;
                }
                match earlier || raised {
                    true => AddStatus::Waiting,
                    false => AddStatus::AlreadyWaiting,
                }
            }
            None => {
                self.seq += 1;
                let entry = Entry {
                    deadline,
                    seq: self.seq,
                    priority,
                    kind,
                };
                self.waiting.insert(key, entry);
                AddStatus::Waiting
            }
        }
    }

    /// Raises `key`'s waiting entry to `priority` if that is higher; whether it did.
    pub(crate) fn raise_waiting(&mut self, key: &K, priority: i32) -> bool {
        let entry = self.waiting.get_mut(key).expect("waits");
        let raised = priority > entry.priority;
        entry.priority = entry.priority.max(priority);
        raised
    }

    // ---- operations ----------------------------------------------------------------------------

    /// `add(k)`: ignored after shutdown, de-duplicated, or marked dirty while processing.
    pub fn add(&mut self, key: K, now: Instant) -> AddStatus {
        self.add_with(key, 0, Duration::ZERO, now)
    }

    /// `add_after(k, d)`: `add` when `d` is zero; else waits until `now + d` (earliest wins).
    pub fn add_after(&mut self, key: K, delay: Duration, now: Instant) -> AddStatus {
        self.add_with(key, 0, delay, now)
    }

    /// `add_with(k, priority, d)`: `add` at `priority` when `d` is zero; else waits until
    /// `now + d` (earliest deadline and highest priority win).
    pub fn add_with(&mut self, key: K, priority: i32, delay: Duration, now: Instant) -> AddStatus {
        let add = ModelAdd {
            priority,
            delay,
            ..ModelAdd::default()
        };
        self.add_options(key, add, now)
    }

    /// An add with every option (`QueueState::add_or_return`):
    ///
    /// 1. ignored after shutdown; a delay that never ends stores nothing;
    /// 2. a key whose waiting entry the add would touch (any add with a delay, except a
    ///    debounced add of a queued key; an add without delay of a key that only waits) is
    ///    held, changing nothing but the entry's priority, when the entry is parked (or the
    ///    probe's) while the detector is open and the add does not bypass parking, or when it is
    ///    a rate-limited retry, `keep_backoff` is on and the add is not rate-limited;
    /// 3. without delay: the add rule (`enqueue`);
    /// 4. debounced: a queued key keeps its place (the add rule); a waiting key waits until
    ///    `now + d` instead, a new entry; else it waits until `now + d`;
    /// 5. else the delayed-add rule (`schedule`).
    pub fn add_options(&mut self, key: K, add: ModelAdd, now: Instant) -> AddStatus {
        self.promote(now);
        if self.shutting_down {
            return AddStatus::ShutDown;
        }
        let delayed = !add.delay.is_zero();
        let deadline = self.now.saturating_add(nanos(add.delay));
        if delayed && deadline == u64::MAX {
            return AddStatus::Never;
        }
        let kind = add.kind();
        let queued = self.is_queued(&key);
        let processing = self.processing.contains_key(&key);
        if let Some(entry) = self.waiting.get(&key).copied() {
            let touches = match delayed {
                false => !queued && !processing,
                true => !(queued && kind == Kind::Debounce),
            };
            if touches && entry.kind == Kind::Parked && !add.bypass_parking && self.is_outage_open()
            {
                self.raise_waiting(&key, add.priority);
                return AddStatus::Parked;
            }
            if touches && entry.kind == Kind::Retry && self.keep_backoff && !add.rate_limited {
                return match self.raise_waiting(&key, add.priority) {
                    true => AddStatus::Waiting,
                    false => AddStatus::AlreadyWaiting,
                };
            }
        }
        if !delayed {
            return self.enqueue(key, add.priority);
        }
        if kind == Kind::Debounce {
            if queued {
                return self.enqueue(key, add.priority);
            }
            if let Some(entry) = self.waiting.get_mut(&key) {
                self.seq += 1;
                *entry = Entry {
                    deadline,
                    seq: self.seq,
                    priority: entry.priority.max(add.priority),
                    kind,
                };
                return AddStatus::Waiting;
            }
        }
        self.schedule(key, deadline, add.priority, kind)
    }

    /// What an add or a `get` that user code interrupted leaves behind (a key's `Clone`, `Hash` or
    /// `Eq` that panicked): the promotion of the keys due at `now`, which every operation makes
    /// before it looks at a key, and nothing else. The rule the state follows (DESIGN.md 3.6):
    /// user code runs before the operation changes anything, so a panic leaves the state as it
    /// was. Finishing, shutting down and `len` call no user code, so nothing interrupts them.
    pub fn interrupted(&mut self, now: Instant) {
        self.promote(now);
    }

    /// What a `get` that user code interrupted leaves behind (a key's `Clone` that panicked):
    /// as [`Model::interrupted`], plus the moves of overdue keys to the overdue level (aging),
    /// which a `get` makes before it looks at a key, as the moves of time any get would make.
    pub fn interrupted_get(&mut self, now: Instant) {
        self.promote(now);
        if let Some(max) = self.max_ready_wait {
            self.ready.age(self.now, max);
        }
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
        if let Some(max) = self.max_ready_wait {
            self.ready.age(self.now, max);
        }
        let e = self.ready.pop().expect("not empty");
        let (key, priority) = (e.key, e.priority);
        self.processing.insert(key.clone(), priority);
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
        let leased_at = *self.processing.get(key)?;
        self.finish_at(key, outcome, limiter_delay, leased_at, now)
    }

    /// [`Model::finish`] whose re-add is at `priority` (`Outcome::with_priority`), not the
    /// priority the key was handed out at.
    ///
    /// With outage detection on, it is [`Model::finish_signalled`] with `Signal::Ignored`.
    pub fn finish_at(
        &mut self,
        key: &K,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        priority: i32,
        now: Instant,
    ) -> Option<ModelFinished> {
        if self.parking.is_some() {
            let ignored = workqueue_core::ratelimit::Signal::Ignored;
            return self
                .finish_signalled(
                    key,
                    outcome,
                    limiter_delay,
                    priority,
                    ignored,
                    now,
                    &mut |_| Duration::ZERO,
                )
                .map(|(f, _)| f);
        }
        self.finish_unobserved(key, outcome, limiter_delay, priority, now)
    }

    /// The finish rule itself, without the outage detector.
    fn finish_unobserved(
        &mut self,
        key: &K,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        priority: i32,
        now: Instant,
    ) -> Option<ModelFinished> {
        self.processing.get(key)?;
        let leased_at = priority;
        self.promote(now);
        self.processing.remove(key);
        // A re-add keeps the priority the key was handed out at.
        let readd = match outcome {
            Outcome::Retry => limiter_delay,
            Outcome::RetryAfter(d) | Outcome::RequeueAfter(d) => Some(d),
            _ => None,
        };
        // With `keep_backoff`, a rate-limited retry that is stored carries a re-add made during
        // the run instead of queueing the key now.
        let stored_retry = outcome == Outcome::Retry
            && !self.shutting_down
            && readd.is_some_and(|d| !d.is_zero() && self.now.saturating_add(nanos(d)) != u64::MAX);
        let mut requeued = false;
        let mut carried = None;
        if let Some(priority) = self.dirty.remove(key) {
            if self.keep_backoff && stored_retry {
                carried = Some(priority);
            } else {
                self.push_ready(key.clone(), priority, self.now);
                requeued = true;
            }
        }
        if let Some(delay) = readd
            && !self.shutting_down
        {
            let priority = carried.map_or(leased_at, |p| p.max(leased_at));
            if delay.is_zero() {
                requeued |= self.enqueue(key.clone(), priority) == AddStatus::Queued;
            } else {
                let deadline = self.now.saturating_add(nanos(delay));
                if deadline != u64::MAX {
                    let kind = match outcome {
                        Outcome::Retry => Kind::Retry,
                        _ => Kind::Reminder,
                    };
                    self.schedule(key.clone(), deadline, priority, kind);
                }
            }
        }
        let released = !self.is_tracked(key);
        Some(ModelFinished {
            requeued,
            waiting: self.waiting.contains_key(key),
            released,
        })
    }

    /// `shut_down()`: stops intake and drops the waiting entries. Returns the keys no longer
    /// tracked because of it, sorted.
    pub fn shut_down(&mut self) -> Vec<K> {
        self.shutting_down = true;
        let dropped = std::mem::take(&mut self.waiting);
        let released: Vec<K> = dropped
            .into_keys()
            .filter(|k| !self.is_tracked(k))
            .collect();
        if let Some(p) = &mut self.parking {
            // The probe's waiting entry goes with the others; no probe runs after shutdown.
            p.probe = None;
        }
        released
    }

    /// `retain(keep)`: every tracked key for which `keep` is false leaves the ready set, its
    /// dirty mark and its waiting entry are dropped; the keys no longer tracked are returned,
    /// sorted (one being processed stays until its lease ends). `keep` is asked about every
    /// tracked key first; if it panics, nothing changed. A removed probe is replaced by the next
    /// parked key.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) -> Vec<K> {
        let dropped: Vec<K> = self
            .tracked_keys()
            .into_iter()
            .filter(|k| !keep(k))
            .collect();
        let mut removed = Vec::new();
        let mut probe_removed = false;
        for key in dropped {
            self.ready.remove(&key);
            self.dirty.remove(&key);
            self.waiting.remove(&key);
            if self.processing.contains_key(&key) {
                continue;
            }
            if let Some(p) = &mut self.parking
                && p.probe.as_ref() == Some(&key)
            {
                p.probe = None;
                probe_removed = true;
            }
            removed.push(key);
        }
        if probe_removed {
            self.next_probe();
        }
        removed
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
            .map(|e| e.deadline)
            .min()
            .filter(|&d| d != parking::PARKED || self.parking.is_none())
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

    /// Ready keys in the order `get` hands them out: highest priority first, then the order in
    /// which they entered their priority.
    pub fn ready_keys(&self) -> Vec<K> {
        self.ready.order()
    }

    /// Keys being processed, sorted.
    pub fn processing_keys(&self) -> Vec<K> {
        self.processing.keys().cloned().collect()
    }

    /// Every key the queue has to remember: ready, processing or waiting.
    pub fn tracked_keys(&self) -> BTreeSet<K> {
        let mut all: BTreeSet<K> = self.ready.keys().cloned().collect();
        all.extend(self.processing.keys().cloned());
        all.extend(self.waiting.keys().cloned());
        all
    }

    /// Whether the queue has to remember `key`.
    pub fn is_tracked(&self, key: &K) -> bool {
        self.is_queued(key) || self.processing.contains_key(key) || self.waiting.contains_key(key)
    }

    /// The priority `key` is queued at, or (re-added while processing) is queued at when its
    /// lease ends.
    pub fn queued_priority(&self, key: &K) -> Option<i32> {
        self.ready
            .find(key)
            .map(|e| e.priority)
            .or_else(|| self.dirty.get(key).copied())
    }

    /// The priority of `key`'s waiting entry.
    pub fn waiting_priority(&self, key: &K) -> Option<i32> {
        self.waiting.get(key).map(|e| e.priority)
    }

    /// The priority `key` was handed out at, while it is processed.
    pub fn processing_priority(&self, key: &K) -> Option<i32> {
        self.processing.get(key).copied()
    }

    /// Whether `key` is in the ready FIFO.
    pub fn is_queued(&self, key: &K) -> bool {
        self.ready.find(key).is_some()
    }

    /// Whether `key` is being processed.
    pub fn is_processing(&self, key: &K) -> bool {
        self.processing.contains_key(key)
    }

    /// Whether `key` is processing and was re-added meanwhile.
    pub fn is_dirty(&self, key: &K) -> bool {
        self.dirty.contains_key(key)
    }

    /// The deadline `key` waits for.
    pub fn waiting_deadline(&self, key: &K) -> Option<Instant> {
        self.waiting
            .get(key)
            .map(|e| Instant::from_nanos(e.deadline))
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
