//! The queue's semantics as a plain, single-threaded state machine.
//!
//! [`QueueState`] holds everything a work queue knows: the ready set (priority levels, each a
//! FIFO or, with fairness, round-robin across groups, and with aging an overdue level above
//! them), which keys are being processed and which were re-added meanwhile (dirty), the waiting
//! heap of delayed keys, and the shutdown bookkeeping. It takes no locks, starts no threads and
//! reads no clock: every operation that depends on time takes `now`. The blocking
//! [`WorkQueue`](crate::WorkQueue) and the tokio queue are thin drivers around it, and any other
//! runtime can drive it the same way.
//!
//! User code it calls (a key's `Clone`, `Hash` and `Eq`) runs before an operation changes
//! anything but the moves of time every operation makes first (due keys promoted, and in `get`
//! overdue keys moved): a panic there leaves the state as it was, with every invariant. Finishing,
//! shutting down and `len` call no user code. See the crate docs for the whole rule.
//!
//! # Memory follows the live size
//!
//! A burst (an initial list, an outage in which every key fails) grows every buffer; when it
//! passes, the state gives the memory back. Once the live keys have fallen below half of what the
//! buffers were last sized for, and have settled there, a [`QueueState::get`] compacts the state
//! to the live size: at most once per halving, at a cost of O(1) per get amortized. A key being
//! processed never moves (its [`Ticket`] names its slot), and a drain to empty never compacts (an
//! empty state frees its large buffers at once). Compacting hashes every live key before it
//! changes anything, so a `Hash` that panics leaves the state as it was; that is why it runs in
//! `get`, which may call user code, and never in `finish`, which calls none.
//! [`QueueState::set_shrink_memory`] turns compaction off.
//!
//! Priorities, aging and fairness cost nothing until they are used: until then the ready set is
//! one FIFO and no per-key bytes are kept for them.
//!
//! ```
//! use std::time::Duration;
//! use workqueue_core::state::{Get, QueueState};
//! use workqueue_core::{AddOptions, Instant, Outcome};
//!
//! let mut q: QueueState<&str> = QueueState::new();
//! let t0 = Instant::ZERO;
//! q.add("a", AddOptions::new(), t0);
//! q.add("a", AddOptions::new(), t0); // de-duplicated
//! q.add("b", AddOptions::new().after(Duration::from_secs(1)), t0);
//! assert_eq!(q.len(t0), 1);
//! assert_eq!(q.next_deadline(), Some(Instant::from_nanos(1_000_000_000)));
//!
//! let Get::Ready(ticket, key) = q.get(t0) else { panic!() };
//! assert_eq!(key, "a");
//! q.add("a", AddOptions::new(), t0); // re-added while processing: runs again after it finishes
//! assert_eq!(q.len(t0), 0);
//! let _ = q.finish(ticket, Outcome::done(), None, t0, |_| Duration::ZERO);
//! assert_eq!(q.len(t0), 1);
//!
//! // One second later "b" is due, behind "a".
//! let t1 = Instant::from_nanos(1_000_000_000);
//! assert_eq!(q.len(t1), 2);
//! ```

mod aging;
mod compaction;
mod holds;
mod index;
mod invariants;
mod parking;
mod priorities;
mod ready;
mod retain;
pub(crate) mod seam;
mod slots;
pub(crate) mod timing;
mod types;
mod waiting;

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hashbrown::{HashMap, HashTable};
use workqueue_ratelimit::Instant;

use crate::Outcome;
use crate::options::{AddOptions, WAIT_DEBOUNCE};
use crate::outcome::Op;
use aging::Aging;
use compaction::COMPACT_MIN;
pub use parking::OutageEvent;
use parking::{PARKED, Parking};
use priorities::Priorities;
use ready::{OVERDUE, ReadyQueue};
pub(crate) use slots::SlotId;
use slots::{MAX_SLOTS, NO_POS, Slots};
pub(crate) use timing::Timing;
pub use types::{AddStatus, Counts, DefaultHashBuilder, Finished, ForeignTicket, Get, Ticket};
use waiting::{Kind, Waiting, WaitingHeap};
#[cfg(doc)]
use workqueue_ratelimit::Signal;

/// The work queue's semantics, with no locks, threads or clock reads.
///
/// See the [module documentation](self) for an example and the crate's README for the semantics
/// table, which this type implements row by row.
///
/// Invariants (checked after every step of the tests and fuzz targets):
/// - the hash index holds exactly the live slots, each under its key's hash;
/// - a slot in the ready set is queued, not processing, appears once, at the level it records
///   (its priority, or the overdue level), and, with aging, a queued slot that is not overdue
///   has one entry in the age order;
/// - a dirty slot is processing; `processing` counts processing slots;
/// - the waiting heap holds at most one entry per slot, and none after shutdown;
/// - every live slot is queued, processing or waiting, and is freed when it is none of these.
///
/// Time: `now` values that go backwards are clamped to the latest one seen; deadlines are
/// saturating nanoseconds, and [`Instant::NEVER`] is never reached.
pub struct QueueState<T, S = DefaultHashBuilder> {
    index: HashTable<SlotId>,
    hasher: S,
    slots: Slots<T>,
    ready: ReadyQueue,
    waiting: WaitingHeap,
    processing: usize,
    shutting_down: bool,
    now: u64,
    seq: u64,
    id: NonZeroU32,
    /// Per-key timing for metrics; `None` (no per-key bytes) unless a driver enables it.
    timing: Option<Box<Timing>>,
    /// Per-key priorities; `None` (every key at 0, no per-key bytes) until a priority other than
    /// 0 is used.
    priorities: Option<Box<Priorities>>,
    /// When each queued key became ready; `None` unless aging is on.
    aging: Option<Box<Aging>>,
    /// Each slot's fairness group; `None` unless fairness is on.
    groups: Option<Vec<u64>>,
    /// The hashes of the live slots whose index bucket does not fit their slot word (only in
    /// tables of more than 2^27 buckets), so that freeing a slot never hashes its key: hashing is
    /// user code, and freeing happens in the middle of a change.
    unrecorded: HashMap<SlotId, u64>,
    /// Buckets at or above this are not recorded in slots (`NO_POS`; tests lower it).
    bucket_limit: u32,
    /// Outage detection (`parking.rs`); `None` (off) unless a driver enables it.
    parking: Option<Box<Parking>>,
    /// Whether an add leaves a key waiting on a rate-limited retry waiting (`set_keep_backoff`).
    keep_backoff: bool,
    /// `get` compacts when fewer keys than this are live (0: never; `usize::MAX`: a compaction
    /// left the slot arrays pinned by a processing slot, see `pin`). See the module docs.
    shrink_below: usize,
    /// The highest processing slot that kept the slot arrays above twice the live size at the
    /// last compaction, or `NO_POS`. While it is processing, `get` only checks it.
    pin: SlotId,
    /// Whether the state compacts (`set_shrink_memory`).
    shrink: bool,
    /// The fewest live keys at which a compaction is worth it (`COMPACT_MIN`; tests lower it).
    compact_min: usize,
    /// Compactions so far.
    compactions: u64,
    /// `get`s until the next compaction check (`check_shrink`); at least 1. The only field the
    /// hot path touches for compaction: one decrement and one branch.
    tick: usize,
    /// What `tick` was last set to: the gets from one check to the next.
    period: usize,
    /// The live keys when the current wait below `shrink_below` began (0: not waiting).
    settle_live: usize,
    /// The gets made since that wait began (as of the last check).
    settle_gets: usize,
    /// Whether `get` waits for the live count to settle before it compacts (`set_settle`; tests
    /// turn it off to compact at the first check below the threshold).
    settle: bool,
}

fn next_state_id() -> NonZeroU32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    // After 2^32 - 1 states the ids wrap; skip 0.
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    NonZeroU32::new(id).unwrap_or(NonZeroU32::MIN)
}

impl<T: Hash + Eq + Clone> QueueState<T> {
    /// An empty state with a randomly seeded default hasher.
    pub fn new() -> Self {
        Self::with_capacity_and_hasher(0, DefaultHashBuilder::default())
    }
}

impl<T: Hash + Eq + Clone> Default for QueueState<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, S> fmt::Debug for QueueState<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueState")
            .field("counts", &self.counts())
            .field("shutting_down", &self.shutting_down)
            .finish_non_exhaustive()
    }
}

impl<T, S> QueueState<T, S> {
    /// Whether [`QueueState::shut_down`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Whether a drain is complete: no key is processing, and, with `include_queued`, none is
    /// ready either.
    pub(crate) fn is_drained(&self, include_queued: bool) -> bool {
        self.processing == 0 && (!include_queued || self.ready.len() == 0)
    }

    /// Number of keys ready as of the last operation, without promoting due keys (the `ready`
    /// of [`QueueState::counts`]).
    #[inline]
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// When the earliest waiting key becomes due, if any key waits (with outage detection on,
    /// parked keys never become due on their own: only parked keys waiting is `None`).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting
            .peek()
            .filter(|w| w.deadline != PARKED || self.parking.is_none())
            .map(|w| Instant::from_nanos(w.deadline))
    }

    /// Whether an operation at `now` could promote a waiting key (parked keys included): the
    /// drivers skip reading the clock while nothing waits.
    #[inline]
    pub(crate) fn has_waiting(&self) -> bool {
        self.waiting.len() != 0
    }

    /// The latest `now` the state has seen.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    /// Starts keeping per-key timing for metrics (see [`Timing`]). Idempotent.
    pub(crate) fn enable_timing(&mut self) {
        self.timing.get_or_insert_with(Box::default);
    }

    /// The timing data, if [`QueueState::enable_timing`] was called.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn timing(&self) -> Option<&Timing> {
        self.timing.as_deref()
    }

    /// How long the longest-waiting queued key has waited at `now`, since its first add after it
    /// was last handed out; `None` without timing or when no key is queued. A scan of the timing
    /// data: for a refresher's period, not for every operation.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn oldest_ready(&self, now: Instant) -> Option<Duration> {
        let slots = &self.slots;
        self.timing()?
            .oldest_ready(now, |slot| slots.is_live(slot) && slots.is_queued(slot))
    }

    /// The timing data, mutably (drivers drain its observations).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn timing_mut(&mut self) -> Option<&mut Timing> {
        self.timing.as_deref_mut()
    }

    /// Counters for the current state.
    pub fn counts(&self) -> Counts {
        Counts {
            ready: self.ready.len(),
            processing: self.processing,
            waiting: self.waiting.len(),
            tracked: self.slots.live(),
        }
    }
}

impl<T: Hash + Eq + Clone, S: BuildHasher> QueueState<T, S> {
    /// An empty state with room for `capacity` keys before it reallocates, that hashes keys with
    /// `hasher`.
    pub fn with_capacity_and_hasher(capacity: usize, hasher: S) -> Self {
        let capacity = capacity.min(MAX_SLOTS);
        QueueState {
            index: HashTable::with_capacity(capacity),
            hasher,
            slots: Slots::with_capacity(capacity),
            ready: ReadyQueue::with_capacity(capacity),
            waiting: WaitingHeap::new(),
            processing: 0,
            shutting_down: false,
            now: 0,
            seq: 0,
            id: next_state_id(),
            timing: None,
            priorities: None,
            aging: None,
            groups: None,
            unrecorded: HashMap::new(),
            bucket_limit: NO_POS,
            parking: None,
            keep_backoff: false,
            shrink_below: 0,
            pin: NO_POS,
            shrink: true,
            compact_min: COMPACT_MIN,
            compactions: 0,
            tick: usize::MAX,
            period: usize::MAX,
            settle_live: 0,
            settle_gets: 0,
            settle: true,
        }
    }

    /// Turns aging on: a key that has been ready for strictly longer than `max_ready_wait` is
    /// served before every key that has not, oldest first, whatever its priority, so no priority
    /// starves. A key is ready from its add, from its deadline when it was delayed, or from the
    /// end of the lease during which it was re-added; a raise does not reset it. Keys already
    /// queued count as ready from the state's latest time. Every key is then served within
    /// `max_ready_wait` plus the time it takes to serve the overdue keys ahead of it; a queue
    /// that is always behind serves overdue keys oldest first, and priorities stop mattering
    /// until it catches up.
    ///
    /// A driver must then pass the time to every operation, adds included; a time a little old
    /// will do where no waiting key could be due (the blocking queue passes
    /// [`Clock::recent`](crate::Clock::recent), at most a few milliseconds old): aging's
    /// decisions are then early or late by as much. Called again, it starts over with the new
    /// `max_ready_wait`.
    pub fn enable_aging(&mut self, max_ready_wait: Duration) {
        let mut aging = Aging::new(duration_to_nanos(max_ready_wait));
        for (slot, _) in self.ready.iter() {
            // Nothing is stale yet: a prune it may ask for is left to the next push.
            aging.ready(slot, self.now);
        }
        self.ready.keep_positions();
        self.aging = Some(Box::new(aging));
    }

    /// Turns fairness on: within a level, keys are served round-robin across the groups that
    /// have ready keys there, FIFO within a group; a group that gains its first ready key joins
    /// the round at its end. The group of a key is given with each add
    /// ([`QueueState::add_or_return`]; the other adds put new keys in group 0) and kept while
    /// the state tracks the key. With aging, the overdue level is fair too.
    ///
    /// # Panics
    /// If a key is queued already: choose fairness before the first add.
    pub fn enable_fairness(&mut self) {
        assert_eq!(
            self.ready.len(),
            0,
            "fairness is chosen before the first add: queued keys have no group"
        );
        self.ready.set_fair();
        self.groups = Some(Vec::new());
    }

    /// Whether aging is on: every operation then needs the time, adds included (a reading a few
    /// milliseconds old will do; see [`QueueState::enable_aging`]).
    #[inline]
    pub(crate) fn has_aging(&self) -> bool {
        self.aging.is_some()
    }

    /// Records only index buckets below `limit` in the slots, as if the index were larger than a
    /// slot word can address (which takes over 117 million keys), so tests and fuzzers reach the
    /// path that such queues take with a handful of keys.
    pub(crate) fn limit_recorded_buckets(&mut self, limit: u32) {
        self.bucket_limit = limit.min(NO_POS);
    }

    // ---- adds ----------------------------------------------------------------------------------

    /// Adds `key` as `opts` say: queues it now or after `opts`' delay, at its priority, or
    /// de-duplicates it (see [`AddStatus`]). The add rule, with priorities and delays:
    ///
    /// - A key already queued keeps the highest priority asked for, and one whose priority is
    ///   raised moves to the tail of its new priority ([`AddStatus::Raised`]); a key re-added
    ///   while it is processed is queued when its lease ends, at the highest priority asked for
    ///   meanwhile.
    /// - With a delay, the key waits until `now + delay`. A waiting entry keeps the earliest
    ///   deadline and the highest priority asked for it; when it comes due it merges into the
    ///   key's state the same way. A waiting key is independent of the FIFO (client-go's
    ///   "reminder" semantics): adding a waiting key queues it now and its waiting entry stays.
    ///   A delay that saturates to [`Instant::NEVER`] stores nothing ([`AddStatus::Never`]).
    /// - A debounced delay ([`AddOptions::debounced`]) moves a waiting key to its own time,
    ///   later or earlier, and leaves a queued key queued.
    /// - While the outage detector is open, an add of a key that is parked (or waits to be the
    ///   probe) leaves it so, raising its priority for the release ([`AddStatus::Parked`]),
    ///   unless it asks to [`bypass_parking`](AddOptions::bypass_parking); an add without delay
    ///   of a parked key that is being processed (it ran through such a bypass) marks it dirty
    ///   as usual. See [`QueueState::enable_outage_detection`].
    /// - With [`QueueState::set_keep_backoff`], an add of a key waiting on a rate-limited
    ///   retry leaves it waiting, raising its priority ([`AddStatus::AlreadyWaiting`], or
    ///   [`AddStatus::Waiting`] when raised); a rate-limited add keeps the earliest deadline.
    /// - Ignored after shutdown.
    ///
    /// The state has no rate limiter: the queues ask theirs outside their lock and add with its
    /// delay in [`AddOptions::after`]; [`AddOptions::rate_limited`] then marks the wait as a
    /// rate-limited retry (it matters to [`QueueState::set_keep_backoff`] only).
    ///
    /// The key is dropped when it is not stored (a duplicate, or after shutdown); drivers that
    /// want to drop it elsewhere use [`QueueState::add_or_return`].
    #[inline]
    pub fn add(&mut self, key: T, opts: AddOptions, now: Instant) -> AddStatus {
        self.add_or_return(key, opts, None, now).0
    }

    /// [`QueueState::add`] that hands an unstored key back instead of dropping it (so a driver
    /// drops it after releasing its lock), for a key in fairness group `group` (see
    /// [`QueueState::enable_fairness`]; `None` is group 0, and without fairness it is ignored).
    /// A key the state tracks already keeps its group.
    #[inline]
    pub fn add_or_return(
        &mut self,
        key: T,
        opts: AddOptions,
        group: Option<u64>,
        now: Instant,
    ) -> (AddStatus, Option<T>) {
        self.promote(now);
        if self.shutting_down {
            return (AddStatus::ShutDown, Some(key));
        }
        let Ok(deadline) = self.deadline_after(opts.after) else {
            return (AddStatus::Never, Some(key));
        };
        let hash = self.hasher.hash_one(&key);
        match self.find(hash, &key) {
            Some(slot) => (
                self.add_tracked_out_of_line(slot, opts, deadline),
                Some(key),
            ),
            None => {
                let slot = self.insert_new(hash, key);
                if let Some(groups) = &mut self.groups {
                    set_group(groups, slot, group.unwrap_or(0));
                }
                let status = match deadline {
                    None => {
                        self.enqueue_new(slot, opts.priority);
                        AddStatus::Queued
                    }
                    Some(deadline) => self.schedule_bits(slot, deadline, opts.priority, opts.wait),
                };
                (status, None)
            }
        }
    }

    /// [`QueueState::add_or_return`] with the default options and no group, for a driver whose
    /// fairness is off: the hot path of a plain add, with no branch for options or groups.
    #[inline]
    pub(crate) fn add_plain_or_return(&mut self, key: T, now: Instant) -> (AddStatus, Option<T>) {
        debug_assert!(
            self.groups.is_none(),
            "a plain add without a group under fairness"
        );
        self.promote(now);
        if self.shutting_down {
            return (AddStatus::ShutDown, Some(key));
        }
        let hash = self.hasher.hash_one(&key);
        match self.find(hash, &key) {
            // Out of line, key and all: with a call that returns here, the path of a new key
            // kept one register fewer (a spill and a reload on every add of a new key).
            Some(slot) if self.holds() => self.add_plain_held(slot, key),
            Some(slot) => (self.enqueue(slot, 0), Some(key)),
            None => {
                let slot = self.insert_new(hash, key);
                self.enqueue_new(slot, 0);
                (AddStatus::Queued, None)
            }
        }
    }

    /// [`QueueState::add`] of the key `key` borrows, cloning it only when the state does not
    /// track it yet. A new key is in fairness group 0.
    ///
    /// Informers deliver many updates per object: most adds are duplicates, and this one costs no
    /// allocation or reference count for them.
    pub fn add_ref<Q>(&mut self, key: &Q, opts: AddOptions, now: Instant) -> AddStatus
    where
        T: Borrow<Q> + for<'a> From<&'a Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.promote(now);
        if self.shutting_down {
            return AddStatus::ShutDown;
        }
        let Ok(deadline) = self.deadline_after(opts.after) else {
            return AddStatus::Never;
        };
        let hash = self.hasher.hash_one(key);
        let slot = match self.find(hash, key) {
            Some(slot) => slot,
            None => {
                let slot = self.insert_new(hash, T::from(key));
                if let Some(groups) = &mut self.groups {
                    set_group(groups, slot, 0);
                }
                slot
            }
        };
        self.add_tracked(slot, opts, deadline)
    }

    /// The deadline of an add after `delay` (`None`: now), or `Err` for one never reached.
    #[inline(always)]
    fn deadline_after(&self, delay: Duration) -> Result<Option<u64>, ()> {
        if delay.is_zero() {
            return Ok(None);
        }
        match self.now.saturating_add(duration_to_nanos(delay)) {
            u64::MAX => Err(()),
            deadline => Ok(Some(deadline)),
        }
    }

    /// [`QueueState::add_plain_or_return`] of a tracked key when an add may be held.
    #[cold]
    #[inline(never)]
    fn add_plain_held(&mut self, slot: SlotId, key: T) -> (AddStatus, Option<T>) {
        (self.add_tracked(slot, AddOptions::new(), None), Some(key))
    }

    /// [`QueueState::add_tracked`] for the adds with options: out of line, so that the path of a
    /// new key (a delayed add's, the common case) keeps its registers.
    #[inline(never)]
    fn add_tracked_out_of_line(
        &mut self,
        slot: SlotId,
        opts: AddOptions,
        deadline: Option<u64>,
    ) -> AddStatus {
        self.add_tracked(slot, opts, deadline)
    }

    /// The add rule for a tracked slot: queued now (`deadline` `None`), or waiting, unless its
    /// waiting entry holds it (`holds.rs`).
    #[inline(always)]
    fn add_tracked(&mut self, slot: SlotId, opts: AddOptions, deadline: Option<u64>) -> AddStatus {
        if self.holds()
            && let Some(status) = self.held(slot, &opts, deadline.is_some())
        {
            return status;
        }
        match deadline {
            None => self.enqueue(slot, opts.priority),
            Some(deadline) => match opts.wait {
                WAIT_DEBOUNCE => self.debounce(slot, deadline, opts.priority),
                wait => self.schedule_bits(slot, deadline, opts.priority, wait),
            },
        }
    }

    // ---- gets ----------------------------------------------------------------------------------

    /// Hands out the key at the head of the ready FIFO and marks it processing.
    ///
    /// After shutdown it keeps handing out queued keys, and returns [`Get::ShutDown`] once the FIFO
    /// is empty: it never waits for a deadline then.
    ///
    /// When few keys are live it first compacts (see the [module documentation](self)), which
    /// hashes every live key: a `Hash` that panics then leaves the state as it was.
    pub fn get(&mut self, now: Instant) -> Get<T> {
        self.promote(now);
        // One decrement and one branch on the hot path: every few gets, `check_shrink` looks at
        // the live count (and compacts once it has settled below the threshold).
        self.tick -= 1;
        if self.tick == 0 {
            self.check_shrink();
        }
        let plain = self.ready.is_plain();
        let head = match plain {
            true => self.ready.plain_front(),
            false => {
                if let Some(a) = &self.aging
                    && a.may_be_overdue(self.now)
                {
                    self.move_overdue();
                }
                self.ready.peek()
            }
        };
        match head {
            Some(slot) => {
                // User code first: a `Clone` that panics leaves the key queued at the head.
                let key = self.slots.key(slot).clone();
                let priority = match plain {
                    true => {
                        self.ready.plain_pop_front();
                        0
                    }
                    false => {
                        self.ready.pop_peeked();
                        self.queued_priority(slot)
                    }
                };
                self.slots.start_processing(slot);
                self.processing += 1;
                if let Some(t) = &mut self.timing {
                    t.on_get(slot, self.now, priority);
                }
                let ticket = Ticket {
                    slot,
                    state: self.id,
                    priority,
                };
                Get::Ready(ticket, key)
            }
            None if self.shutting_down => Get::ShutDown,
            None => {
                // Nothing ready: a drain is over, the live count has settled (see the module
                // docs). Off the hot path: only a get that hands out nothing compares.
                if self.slots.live() < self.shrink_below {
                    self.compact_on_get();
                }
                Get::Empty {
                    next_deadline: self.next_deadline(),
                }
            }
        }
    }

    /// Undoes the [`get`](QueueState::get) that issued `ticket`: the key goes back to the head of
    /// the ready FIFO as if it had not been handed out (a re-add made meanwhile merges into it).
    ///
    /// For a driver whose hand-out fails after the get, under the same lock (a metrics recorder
    /// that panics): the state is then as it was before the get. A foreign ticket is ignored.
    pub(crate) fn unget(&mut self, ticket: Ticket) {
        let slot = ticket.slot;
        if ticket.state != self.id || !self.slots.is_live(slot) || !self.slots.is_processing(slot) {
            return;
        }
        self.processing -= 1;
        // A dirty key's re-add merges into the undone get, at the higher of the two priorities.
        let dirty_at = self
            .slots
            .stop_processing(slot)
            .then(|| self.queued_priority(slot));
        let priority = dirty_at.map_or(ticket.priority, |p| p.max(ticket.priority));
        self.slots.set_queued(slot);
        self.set_queued_priority(slot, priority);
        let (level, group) = (self.level_of(slot), self.group_of(slot));
        self.ready.push_front(slot, level, group);
        if let Some(t) = &mut self.timing {
            t.on_unget(slot, self.now, priority, dirty_at);
        }
    }

    /// The key a ticket was issued for, without finishing it.
    pub(crate) fn ticket_key(&self, ticket: &Ticket) -> Option<&T> {
        (ticket.state == self.id && self.slots.is_live(ticket.slot))
            .then(|| self.slots.key(ticket.slot))
    }

    /// Finishes a handed-out key: the one place where an [`Outcome`] becomes queue operations.
    ///
    /// Processing is cleared; a key re-added while processing goes to the FIFO tail; the re-add
    /// the outcome asks for is applied as an add after its delay, at the outcome's priority
    /// ([`Outcome::with_priority`]) or else the one the key was handed out at
    /// ([`Ticket::priority`]), and dropped after shutdown. Calls no user code but `pace`.
    ///
    /// - `limiter_delay` is the rate limiter's delay for a [`Outcome::retry`] (`None`: it is
    ///   not re-added), asked for by the driver outside its lock; ignored for other outcomes.
    /// - With outage detection on ([`QueueState::enable_outage_detection`]), the outcome's
    ///   signal ([`Outcome::with_signal`]; without one, [`Signal::Ignored`]: the state cannot
    ///   tell a first failure from another, the limiter can) goes to the detector, which may
    ///   park the key, and the detector's change is returned in [`Finished::outage`]. When a
    ///   probe succeeds, `pace` is called for each parked key it releases, in the order they
    ///   were parked, and returns the key's delay (the queues forget the key in the limiter and
    ///   take one reservation of its bucket). It must not panic: a driver catches the panics of
    ///   the user code it calls. Without outage detection it is never called.
    ///
    /// A ticket of another state is refused ([`ForeignTicket`]) and changes nothing.
    #[inline]
    pub fn finish(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
        mut pace: impl FnMut(&T) -> Duration,
    ) -> Result<Finished<T>, ForeignTicket> {
        if self.parking.is_some() {
            return self.finish_observed(ticket, outcome, limiter_delay, now, &mut pace);
        }
        self.finish_unobserved(ticket, outcome, limiter_delay, now)
    }

    /// [`QueueState::finish`] for a driver that checked that outage detection is off: the hot
    /// path, with no branch for it (a foreign ticket finishes nothing).
    #[inline]
    pub(crate) fn finish_fast(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
    ) -> Finished<T> {
        match self.finish_rule(ticket, outcome, limiter_delay, now) {
            Ok(f) => f,
            Err(ForeignTicket) => Finished::nothing(),
        }
    }

    /// [`QueueState::finish_rule`] out of line, for [`QueueState::finish`] and the outage
    /// detector's finish.
    fn finish_unobserved(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
    ) -> Result<Finished<T>, ForeignTicket> {
        self.finish_rule(ticket, outcome, limiter_delay, now)
    }

    /// The finish rule itself, without the outage detector. Inlined into the drivers' hot
    /// finish ([`QueueState::finish_fast`]): called, it takes the outcome and returns the
    /// result through memory, and since the keep-backoff rule it also spilled its arguments on
    /// every finish (callgrind: about 30 instructions per finish, W1 and R1).
    #[inline(always)]
    fn finish_rule(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
    ) -> Result<Finished<T>, ForeignTicket> {
        let slot = ticket.slot;
        if ticket.state != self.id || !self.slots.is_live(slot) || !self.slots.is_processing(slot) {
            return Err(ForeignTicket);
        }
        self.promote(now);
        if let Some(t) = &mut self.timing {
            t.on_finish(slot, self.now);
        }
        self.processing -= 1;
        let mut requeued = false;
        if self.slots.stop_processing(slot) {
            let priority = self.queued_priority(slot);
            if self.keep_backoff && self.retry_carries_dirty(outcome.op, limiter_delay) {
                return Ok(self.finish_carrying_dirty(ticket, outcome, limiter_delay, priority));
            }
            self.push_ready(slot, priority, self.now);
            requeued = true;
        }
        let readd = match outcome.op {
            Op::Done | Op::Forget => None,
            Op::Retry(min) => limiter_delay.map(|d| d.max(min)),
            Op::RetryAfter(d) | Op::RequeueAfter(d) => Some(d),
        };
        // A re-add keeps the priority the key was handed out at, unless the outcome names one.
        if let Some(delay) = readd
            && !self.shutting_down
        {
            let priority = outcome.priority.unwrap_or(ticket.priority);
            if delay.is_zero() {
                requeued |= self.enqueue(slot, priority) == AddStatus::Queued;
            } else {
                let deadline = self.now.saturating_add(duration_to_nanos(delay));
                if deadline != u64::MAX {
                    let kind = match outcome.op {
                        Op::Retry(_) => Kind::Retry,
                        _ => Kind::Reminder,
                    };
                    self.schedule(slot, deadline, priority, kind);
                }
            }
        }
        let waiting = self.slots.heap_pos(slot).is_some();
        let released = self.release_if_unreferenced(slot);
        Ok(Finished {
            requeued,
            waiting,
            released,
            outage: None,
        })
    }

    // ---- shutdown ------------------------------------------------------------------------------

    /// Stops intake: later adds are ignored and waiting keys are dropped (returned, so the driver can
    /// drop them outside its lock). Queued keys stay to be drained by `get`. Idempotent.
    pub fn shut_down(&mut self) -> Vec<T> {
        self.shutting_down = true;
        if let Some(p) = self.parking.as_deref_mut() {
            // The probe's waiting entry goes with the others; no probe runs after shutdown.
            p.forget_probe();
        }
        let slots = self.waiting.clear(&mut self.slots);
        let released: Vec<T> = slots
            .into_iter()
            .filter_map(|s| self.release_if_unreferenced(s))
            .collect();
        self.waiting.shrink();
        released
    }

    // ---- observation ---------------------------------------------------------------------------

    /// Number of keys ready to be handed out (not processing, not waiting), after promoting the
    /// keys due at `now`.
    pub fn len(&mut self, now: Instant) -> usize {
        self.promote(now);
        self.ready.len()
    }

    /// The deadline `key` waits for, if it waits.
    pub(crate) fn waiting_deadline<Q>(&self, key: &Q) -> Option<Instant>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.find(self.hasher.hash_one(key), key)?;
        let pos = self.slots.heap_pos(slot)?;
        Some(Instant::from_nanos(self.waiting.get(pos).deadline))
    }

    /// Whether `key` is in the ready FIFO.
    pub(crate) fn is_queued<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(self.hasher.hash_one(key), key)
            .is_some_and(|s| self.slots.is_queued(s))
    }

    /// Whether a lease for `key` is outstanding.
    pub(crate) fn is_processing<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(self.hasher.hash_one(key), key)
            .is_some_and(|s| self.slots.is_processing(s))
    }

    /// The keys being processed, in no particular order (cloned; for diagnostics such as a drain
    /// that timed out).
    pub fn processing_keys(&self) -> Vec<T> {
        self.index
            .iter()
            .filter(|&&s| self.slots.is_processing(s))
            .map(|&s| self.slots.key(s).clone())
            .collect()
    }

    /// The ready keys in FIFO order (cloned; for diagnostics and tests).
    pub(crate) fn ready_keys(&self) -> Vec<T> {
        self.ready
            .iter()
            .map(|(s, _)| self.slots.key(s).clone())
            .collect()
    }

    /// The priority `key` is queued at, or, while it is processed and was re-added, the priority
    /// it is queued at when its lease ends (for diagnostics and tests).
    pub(crate) fn queued_priority_of<Q>(&self, key: &Q) -> Option<i32>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.find(self.hasher.hash_one(key), key)?;
        (self.slots.is_queued(slot) || self.slots.is_dirty(slot))
            .then(|| self.queued_priority(slot))
    }

    /// The priority of `key`'s waiting entry, if it waits (for diagnostics and tests).
    pub(crate) fn waiting_priority_of<Q>(&self, key: &Q) -> Option<i32>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.find(self.hasher.hash_one(key), key)?;
        self.slots
            .heap_pos(slot)
            .map(|_| self.waiting_priority(slot))
    }

    /// Heap bytes held by the state's own structures (keys' own allocations excluded).
    pub fn allocated_bytes(&self) -> usize {
        self.index.allocation_size()
            + self.slots.allocated_bytes()
            + self.ready.allocated_bytes()
            + self.waiting.allocated_bytes()
            + self.timing.as_ref().map_or(0, |t| t.allocated_bytes())
            + self.unrecorded.allocation_size()
            + self.priorities.as_ref().map_or(0, |p| p.allocated_bytes())
            + self.aging.as_ref().map_or(0, |a| a.allocated_bytes())
            + self
                .groups
                .as_ref()
                .map_or(0, |g| g.capacity() * size_of::<u64>())
    }

    // ---- internals -----------------------------------------------------------------------------

    /// Clamps `now` to the latest seen and moves every waiting key due at `now` to the ready FIFO,
    /// in (deadline, sequence) order.
    #[inline]
    fn promote(&mut self, now: Instant) {
        self.now = self.now.max(now.as_nanos());
        if self.waiting.peek().is_some_and(|w| w.deadline <= self.now) {
            self.promote_due();
        }
    }

    /// The loop of [`QueueState::promote`], out of line: most operations find nothing due.
    #[inline(never)]
    fn promote_due(&mut self) {
        while let Some(w) = self.waiting.peek() {
            if w.deadline > self.now {
                break;
            }
            let w = self.waiting.pop(&mut self.slots).expect("peeked");
            let priority = self.waiting_priority(w.slot);
            // Ready from its deadline, not from when an operation noticed it.
            self.enqueue_at(w.slot, priority, w.deadline);
        }
    }

    /// The add rule for a tracked slot (`add`, re-add without delay), at `priority`.
    #[inline]
    fn enqueue(&mut self, slot: SlotId, priority: i32) -> AddStatus {
        self.enqueue_at(slot, priority, self.now)
    }

    /// The add rule for a slot just inserted (neither queued nor processing): it is queued.
    #[inline]
    fn enqueue_new(&mut self, slot: SlotId, priority: i32) {
        self.push_ready(slot, priority, self.now);
        self.timing_add(slot, priority);
    }

    /// The add rule, for a key that becomes ready (if it does) at `since`.
    #[inline]
    fn enqueue_at(&mut self, slot: SlotId, priority: i32, since: u64) -> AddStatus {
        if self.slots.is_queued(slot) {
            let current = self.queued_priority(slot);
            if priority <= current {
                return AddStatus::AlreadyQueued;
            }
            // Raised: to the tail of the new level (an overdue key stays overdue). Priorities
            // are in use: `priority` is above another priority, so one of them is not 0.
            self.use_priorities();
            if self.level_of(slot) != OVERDUE {
                let group = self.group_of(slot);
                self.ready.remove(slot, i64::from(current), group);
                self.ready.push(slot, i64::from(priority), group);
            }
            self.set_queued_priority(slot, priority);
            self.timing_raise(current, priority);
            AddStatus::Raised
        } else if self.slots.is_processing(slot) {
            if self.slots.is_dirty(slot) {
                let current = self.queued_priority(slot);
                if priority > current {
                    self.set_queued_priority(slot, priority);
                    self.timing_raise(current, priority);
                }
                AddStatus::AlreadyDirty
            } else {
                self.slots.set_dirty(slot);
                self.set_queued_priority(slot, priority);
                self.timing_add(slot, priority);
                AddStatus::Dirty
            }
        } else {
            self.push_ready(slot, priority, since);
            self.timing_add(slot, priority);
            AddStatus::Queued
        }
    }

    /// Inlined down to the `None` check: an unnamed queue (no timing) pays a branch, not a call.
    #[inline(always)]
    fn timing_add(&mut self, slot: SlotId, priority: i32) {
        if let Some(t) = &mut self.timing {
            t.on_add(slot, self.now, priority);
        }
    }

    #[inline(always)]
    fn timing_raise(&mut self, from: i32, to: i32) {
        if let Some(t) = &mut self.timing {
            t.on_raise(from, to);
        }
    }

    #[inline(always)]
    fn push_ready(&mut self, slot: SlotId, priority: i32, since: u64) {
        self.slots.set_queued(slot);
        if priority == 0 && self.ready.is_plain() {
            // No priority, aging or fairness in use: nothing else to keep.
            self.ready.plain_push_back(slot);
            return;
        }
        self.push_ready_levels(slot, priority, since);
    }

    #[inline(never)]
    fn push_ready_levels(&mut self, slot: SlotId, priority: i32, since: u64) {
        self.set_queued_priority(slot, priority);
        let group = self.group_of(slot);
        self.ready.push(slot, i64::from(priority), group);
        if let Some(a) = &mut self.aging
            && a.ready(slot, since)
        {
            a.prune_if_due(self.slots.live(), age_status(&self.slots));
        }
    }

    /// The level a queued slot is in: overdue, or its priority.
    #[inline(always)]
    fn level_of(&self, slot: SlotId) -> i64 {
        match &self.aging {
            Some(a) if a.is_overdue(slot) => OVERDUE,
            _ => i64::from(self.queued_priority(slot)),
        }
    }

    /// A slot's fairness group (0 without fairness).
    #[inline(always)]
    fn group_of(&self, slot: SlotId) -> u64 {
        self.groups
            .as_ref()
            .map_or(0, |g| g.get(slot as usize).copied().unwrap_or(0))
    }

    /// Moves every key ready for longer than the aging limit to the overdue level, in the order
    /// keys became ready.
    #[inline(never)]
    fn move_overdue(&mut self) {
        loop {
            let slots = &self.slots;
            let Some(aging) = self.aging.as_mut() else {
                return;
            };
            let next = aging.next_overdue(self.now, age_status(slots));
            let Some(slot) = next else { return };
            let group = self.group_of(slot);
            let priority = self.queued_priority(slot);
            self.ready.remove(slot, i64::from(priority), group);
            self.ready.push(slot, OVERDUE, group);
        }
    }

    /// The delayed-add rule: earliest deadline wins (and its `kind`), highest priority wins.
    #[inline(always)]
    fn schedule(&mut self, slot: SlotId, deadline: u64, priority: i32, kind: Kind) -> AddStatus {
        self.schedule_bits(slot, deadline, priority, kind as u8)
    }

    /// [`QueueState::schedule`] of a kind given as its bits (an add's `AddOptions::wait`).
    fn schedule_bits(&mut self, slot: SlotId, deadline: u64, priority: i32, kind: u8) -> AddStatus {
        let seq = Waiting::order_bits(self.seq, kind);
        self.seq += 1;
        match self.slots.heap_pos(slot) {
            Some(pos) => {
                let earlier = deadline < self.waiting.get(pos).deadline;
                let raised = priority > self.waiting_priority(slot);
                if earlier {
                    self.waiting.decrease(pos, deadline, seq, &mut self.slots);
                }
                if raised {
                    self.set_waiting_priority(slot, priority);
                }
                match earlier || raised {
                    true => AddStatus::Waiting,
                    false => AddStatus::AlreadyWaiting,
                }
            }
            None => {
                self.waiting.push(
                    Waiting {
                        deadline,
                        seq,
                        slot,
                        bucket: self.slots.bucket(slot),
                    },
                    &mut self.slots,
                );
                self.set_waiting_priority(slot, priority);
                AddStatus::Waiting
            }
        }
    }

    // ---- priorities: side arrays, allocated on first use --------------------------------------

    /// Starts keeping per-key priorities (and the ready set's positions). Idempotent.
    #[cold]
    fn use_priorities(&mut self) {
        if self.priorities.is_none() {
            self.priorities = Some(Box::default());
            self.ready.keep_positions();
        }
    }

    /// The priority of a queued slot's entry, or of a dirty slot's re-queue.
    #[inline(always)]
    fn queued_priority(&self, slot: SlotId) -> i32 {
        self.priorities.as_ref().map_or(0, |p| p.queued(slot))
    }

    #[inline(always)]
    fn set_queued_priority(&mut self, slot: SlotId, priority: i32) {
        if let Some(p) = self.priorities_for(priority) {
            p.set_queued(slot, priority);
        }
    }

    /// The priority of a waiting slot's entry.
    #[inline(always)]
    fn waiting_priority(&self, slot: SlotId) -> i32 {
        self.priorities.as_ref().map_or(0, |p| p.waiting(slot))
    }

    #[inline(always)]
    fn set_waiting_priority(&mut self, slot: SlotId, priority: i32) {
        if let Some(p) = self.priorities_for(priority) {
            p.set_waiting(slot, priority);
        }
    }

    /// The per-key priorities to record `priority` in: started for a priority other than 0;
    /// `None` while every key is at 0 (there is nothing to record).
    #[inline(always)]
    fn priorities_for(&mut self, priority: i32) -> Option<&mut Priorities> {
        if priority != 0 {
            self.use_priorities();
        }
        self.priorities.as_deref_mut()
    }
}

/// What the age order asks of a slot: whether it is queued, and whether it is processing.
fn age_status<T>(slots: &Slots<T>) -> impl Fn(SlotId) -> (bool, bool) + '_ {
    move |s| (slots.is_queued(s), slots.is_processing(s))
}

fn set_group(groups: &mut Vec<u64>, slot: SlotId, group: u64) {
    let i = slot as usize;
    if i >= groups.len() {
        groups.resize(i + 1, 0);
    }
    groups[i] = group;
}

/// `d` in nanoseconds, saturating at `u64::MAX` ([`Instant::NEVER`]'s).
#[inline]
pub(crate) const fn duration_to_nanos(d: Duration) -> u64 {
    Instant::from_duration(d).as_nanos()
}

#[cfg(test)]
mod tests;
