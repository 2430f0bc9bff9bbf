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
//! passes, the state gives the memory back. When the number of live keys has fallen below half
//! of what it was when the buffers were last sized (at a growth of the hash index, or at the
//! last compaction) **and has settled there**, a [`QueueState::get`] compacts: every live slot
//! that is **not being processed** moves to the lowest free slot, the slot arrays are cut after
//! the last slot still in use, and the hash index, the ready set, the waiting heap and every
//! per-slot side array (timing, priorities, ages, groups, positions, parked keys) are renamed
//! and rebuilt at the live size.
//!
//! Settled means: since the live count was last seen below the threshold at `n` keys, it has
//! not fallen below `3n / 4`, and at least half as many `get`s as there are live keys have been
//! made. A compaction costs O(live keys), so waiting that many gets amortizes it to O(1) per
//! get. A drain under way keeps falling, which restarts the wait every quarter: a pure drain
//! (W1: distinct keys in, then get and done until empty) reaches empty, where everything is
//! freed anyway, without compacting once; a drain that stops at a size (a controller's resync
//! settling to its steady state) compacts within about that many gets. `get` checks the live
//! count only every `max(live / 8, 64)` gets (a countdown: the hot path is one decrement and one
//! branch), so the wait is seen to begin up to that many gets late. A `get` that finds nothing
//! ready does not wait: the drain is over, and the keys still live are waiting or processing
//! (a controller after its initial list, one key waiting an hour); below the threshold it
//! compacts at once. Either way a compaction at `n` live keys follows at least `n` finished keys
//! (each after a get) or `n / 2` gets, so its cost is O(1) per get.
//!
//! The rule: **a processing slot never moves.** A [`Ticket`] names its slot from outside the
//! lock, so it must stay where it is until the lease ends. Queued and waiting slots move; the
//! slot arrays end after the highest processing slot if it is above the live count. When that
//! leaves them more than twice the live size (workers hold keys from the top of a FIFO that
//! drained from the bottom), the compaction still moves every other key down and rebuilds
//! everything else; the next `get` after the last such lease ends finishes the job (a scan of
//! the slot words, then one more compaction).
//!
//! Hysteresis: after a compaction at `n` live keys the next one waits until fewer than `n / 2`
//! are live, and a growth of the index to room for `m` keys only raises that threshold to
//! `m / 4`, so a queue that swings around a size does not rebuild on every swing: at most one
//! rebuild per halving of the live size (and one to finish a pinned one, which is checked at
//! every get and does not wait to settle: its lease has ended). States under
//! [`COMPACT_MIN`] live keys do not compact; an empty one frees its large buffers at once, as
//! before. [`QueueState::set_shrink`] turns compaction off.
//!
//! Compacting hashes every live key (the index's buckets depend on its size, and the index keeps
//! no hashes), which is user code: it runs before the compaction changes anything, so a `Hash`
//! that panics leaves the state as it was. That is why compaction runs in `get` (which may call
//! user code) and never in `finish`, which calls none.
//!
//! Priorities, aging and fairness cost nothing until they are used: until then the ready set is
//! one FIFO and no per-key bytes are kept for them (`priorities.rs`, `aging.rs` and the slots'
//! groups are side arrays allocated on first use).
//!
//! ```
//! use std::time::Duration;
//! use workqueue_core::state::{Get, QueueState};
//! use workqueue_core::{Instant, Outcome};
//!
//! let mut q: QueueState<&str> = QueueState::new();
//! let t0 = Instant::ZERO;
//! q.add("a", t0);
//! q.add("a", t0); // de-duplicated
//! q.add_after("b", Duration::from_secs(1), t0);
//! assert_eq!(q.len(t0), 1);
//! assert_eq!(q.next_deadline(), Some(Instant::from_nanos(1_000_000_000)));
//!
//! let Get::Ready(ticket, key) = q.get(t0) else { panic!() };
//! assert_eq!(key, "a");
//! q.add("a", t0); // re-added while processing: runs again after it finishes
//! assert_eq!(q.len(t0), 0);
//! q.finish(ticket, Outcome::Done, None, t0);
//! assert_eq!(q.len(t0), 1);
//!
//! // One second later "b" is due, behind "a".
//! let t1 = Instant::from_nanos(1_000_000_000);
//! assert_eq!(q.len(t1), 2);
//! ```

mod aging;
mod parking;
mod priorities;
mod ready;
mod slots;
mod timing;
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
use aging::Aging;
pub use parking::OutageEvent;
use parking::{PARKED, Parking};
use priorities::Priorities;
use ready::{OVERDUE, ReadyQueue};
pub(crate) use slots::SlotId;
use slots::{MAX_SLOTS, NO_POS, Slots};
pub use timing::Timing;
use waiting::{Waiting, WaitingHeap};

/// The default hasher: foldhash, randomly seeded per queue.
///
/// Fast, with minimal resistance to hash flooding. Keys that tenants control (object names) can be
/// chosen to collide for a known hasher, but not for a random seed they cannot observe; where that
/// is not enough, use `std::hash::RandomState` (SipHash) as the hasher type parameter.
pub type DefaultHashBuilder = foldhash::fast::RandomState;

/// What [`QueueState::add`] and its relatives did with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddStatus {
    /// The key was pushed to the tail of the ready FIFO.
    Queued,
    /// The key was already in the ready FIFO: nothing changed.
    AlreadyQueued,
    /// The key is being processed: it was marked dirty and is queued again when its lease finishes.
    Dirty,
    /// The key is being processed and was already marked dirty: nothing changed.
    AlreadyDirty,
    /// The key now waits for its deadline (a new waiting entry, or an earlier deadline for an
    /// existing one).
    Waiting,
    /// The key already waits for an earlier (or equal) deadline, at a higher (or equal)
    /// priority: nothing changed.
    AlreadyWaiting,
    /// The key was queued at a lower priority: it moved to the tail of the new priority's FIFO.
    Raised,
    /// The deadline is never reached (a delay of about 584 years or more): nothing was stored.
    Never,
    /// The queue is shutting down: the add was ignored.
    ShutDown,
}

impl AddStatus {
    /// Whether the add counts as an add in client-go's metrics: the key became newly dirty
    /// (queued, or marked to be queued again after processing).
    pub fn is_new_add(self) -> bool {
        matches!(self, AddStatus::Queued | AddStatus::Dirty)
    }
}

/// The result of [`QueueState::get`].
#[derive(Debug)]
pub enum Get<T> {
    /// A key was handed out; finish it with its ticket.
    Ready(Ticket, T),
    /// Nothing is ready. A key becomes due at `next_deadline`, if it is `Some`.
    Empty {
        /// When the earliest waiting key becomes due.
        next_deadline: Option<Instant>,
    },
    /// The queue is shutting down and nothing is ready: the getter should stop.
    ShutDown,
}

/// Proof that a key was handed out: finishing it requires giving the ticket back.
///
/// A ticket is neither `Copy` nor `Clone`, so a key cannot be finished twice (client-go's
/// "spurious Done" that let two workers hold one key). It only fits the state that issued it.
#[must_use = "a ticket that is never finished keeps its key in flight forever"]
pub struct Ticket {
    slot: SlotId,
    /// Never zero, so `Option<Ticket>` (in every lease) is no larger than a ticket.
    state: NonZeroU32,
    priority: i32,
}

impl Ticket {
    /// The priority of the handed-out key: the priority it was handed out at, unless
    /// [`Ticket::set_priority`] changed it. Re-adds that finishing asks for use it.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Sets the priority at which re-adds that finishing asks for (a retry, a requeue) queue the
    /// key. By default they keep the priority it was handed out at (controller-runtime #3157).
    pub fn set_priority(&mut self, priority: i32) {
        self.priority = priority;
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("slot", &self.slot)
            .field("priority", &self.priority)
            .finish()
    }
}

/// A [`Ticket`] was given to a state that did not issue it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this ticket was issued by another queue state; finish each ticket on the state it came from"
)]
pub struct ForeignTicket;

/// What [`QueueState::finish`] did.
#[derive(Debug)]
#[must_use = "the freed key should be dropped outside any lock"]
pub struct Finished<T> {
    /// Whether the key went back to the ready FIFO (it was dirty, or re-added without delay).
    pub requeued: bool,
    /// Whether the key now waits for a deadline.
    pub waiting: bool,
    /// The key, when the state no longer tracks it. Drivers drop it after releasing their lock,
    /// so user `Drop` code does not run under it.
    pub released: Option<T>,
}

impl<T> Finished<T> {
    /// What finishing a foreign ticket did: nothing.
    fn nothing() -> Self {
        Finished {
            requeued: false,
            waiting: false,
            released: None,
        }
    }
}

/// Counters that describe the state at a glance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Keys in the ready FIFO.
    pub ready: usize,
    /// Keys handed out and not finished.
    pub processing: usize,
    /// Keys waiting for a deadline.
    pub waiting: usize,
    /// Keys the state tracks (each counted once, whatever it is doing).
    pub tracked: usize,
}

/// The work queue's semantics, with no locks, threads or clock reads.
///
/// See the [module documentation](self) for an example and the crate's README for the semantics
/// table, which this type implements row by row.
///
/// Invariants (checked by [`QueueState::check_invariants`] in tests):
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
    /// `get` compacts when fewer keys than this are live (0: never; `usize::MAX`: a compaction
    /// left the slot arrays pinned by a processing slot, see `pin`). See the module docs.
    shrink_below: usize,
    /// The highest processing slot that kept the slot arrays above twice the live size at the
    /// last compaction, or `NO_POS`. While it is processing, `get` only checks it.
    pin: SlotId,
    /// Whether the state compacts (`set_shrink`).
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

/// States with fewer live keys than this do not compact: their buffers are small, and an empty
/// state frees its large ones anyway.
pub const COMPACT_MIN: usize = 512;

/// Buffers at least this large are freed when the state becomes empty; smaller ones are kept, so
/// an idle queue that sees one key at a time does not allocate on every add.
const SHRINK_ABOVE: usize = 1024;

fn next_state_id() -> NonZeroU32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    // After 2^32 - 1 states the ids wrap; skip 0.
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    NonZeroU32::new(id).unwrap_or(NonZeroU32::MIN)
}

impl<T: Hash + Eq + Clone> QueueState<T> {
    /// An empty state with a randomly seeded default hasher.
    pub fn new() -> Self {
        Self::with_hasher(DefaultHashBuilder::default())
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
    pub fn is_drained(&self, include_queued: bool) -> bool {
        self.processing == 0 && (!include_queued || self.ready.len() == 0)
    }

    /// Number of keys ready as of the last operation, without promoting due keys.
    pub fn ready_len(&self) -> usize {
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

    /// Whether an operation at `now` would promote a waiting key.
    ///
    /// Drivers use it to skip reading the clock while nothing waits.
    pub fn has_waiting(&self) -> bool {
        self.waiting.len() != 0
    }

    /// The latest `now` the state has seen.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    /// Starts keeping per-key timing for metrics (see [`Timing`]). Idempotent.
    pub fn enable_timing(&mut self) {
        self.timing.get_or_insert_with(Box::default);
    }

    /// The timing data, if [`QueueState::enable_timing`] was called.
    pub fn timing(&self) -> Option<&Timing> {
        self.timing.as_deref()
    }

    /// How long the longest-waiting queued key has waited at `now`, since its first add after it
    /// was last handed out; `None` without timing or when no key is queued. A scan of the timing
    /// data: for a refresher's period, not for every operation.
    pub fn oldest_ready(&self, now: Instant) -> Option<Duration> {
        let slots = &self.slots;
        self.timing()?
            .oldest_ready(now, |slot| slots.is_live(slot) && slots.is_queued(slot))
    }

    /// The timing data, mutably (drivers drain its observations).
    pub fn timing_mut(&mut self) -> Option<&mut Timing> {
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
    /// An empty state that hashes keys with `hasher`.
    pub fn with_hasher(hasher: S) -> Self {
        Self::with_capacity_and_hasher(0, hasher)
    }

    /// An empty state with room for `capacity` keys before it reallocates.
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

    /// The hasher keys are hashed with.
    pub fn hasher(&self) -> &S {
        &self.hasher
    }

    /// Turns aging on: a key that has been ready for strictly longer than `max_wait` is served
    /// before every key that has not, oldest first, whatever its priority, so no priority
    /// starves. A key is ready from its add, from its deadline when it was delayed, or from the
    /// end of the lease during which it was re-added; a raise does not reset it. Keys already
    /// queued count as ready from the state's latest time. Every key is then served within
    /// `max_wait` plus the time it takes to serve the overdue keys ahead of it; a queue that is
    /// always behind serves overdue keys oldest first, and priorities stop mattering until it
    /// catches up.
    ///
    /// Drivers must pass the time to every operation while aging is on (see
    /// [`QueueState::has_aging`]); a time a little old will do where no waiting key could be
    /// due (the blocking driver passes [`Clock::recent`](crate::Clock::recent), at most a
    /// few milliseconds old): aging's decisions are then early or late by as much.
    pub fn set_max_ready_wait(&mut self, max_wait: Duration) {
        let mut aging = Aging::new(duration_to_nanos(max_wait));
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
    /// ([`QueueState::add_in_group_or_return`]; the other adds put new keys in group 0) and kept
    /// while the state tracks the key. With aging, the overdue level is fair too.
    ///
    /// # Panics
    /// If a key is queued already: choose fairness before the first add.
    pub fn set_fair(&mut self) {
        assert_eq!(
            self.ready.len(),
            0,
            "fairness is chosen before the first add: queued keys have no group"
        );
        self.ready.set_fair();
        self.groups = Some(Vec::new());
    }

    /// Whether fairness is on.
    pub fn is_fair(&self) -> bool {
        self.groups.is_some()
    }

    /// Whether aging is on: every operation then needs the time, adds included (a reading a few
    /// milliseconds old will do; see [`QueueState::set_max_ready_wait`]).
    #[inline]
    pub fn has_aging(&self) -> bool {
        self.aging.is_some()
    }

    /// Whether the state gives memory back when its live keys fall well below the size its
    /// buffers grew to (see the [module documentation](self)). Default: on. Off keeps the peak
    /// until the state is empty, as a state that never compacts; [`QueueState::compact`] still
    /// compacts when asked.
    pub fn set_shrink(&mut self, on: bool) {
        self.shrink = on;
        if !on {
            self.shrink_below = 0;
            self.pin = NO_POS;
            self.settle_live = 0;
        }
    }

    /// How many times the state compacted (see the [module documentation](self)).
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Testing seam, not a stable API: compacts from `min` live keys instead of
    /// [`COMPACT_MIN`], so tests and fuzzers reach compaction with a handful of keys.
    #[doc(hidden)]
    pub fn set_compact_min(&mut self, min: usize) {
        self.compact_min = min.max(1);
        // Check at the next get, at the new scale.
        self.schedule_check(1);
    }

    /// Testing seam, not a stable API: `false` compacts at the first get below the threshold,
    /// without waiting for the live count to settle there, so that tests and fuzzers whose
    /// operations rarely settle still compact often. Default: `true`.
    #[doc(hidden)]
    pub fn set_settle(&mut self, on: bool) {
        self.settle = on;
        self.schedule_check(1);
    }

    /// Testing seam, not a stable API: records only index buckets below `limit` in the slots, as
    /// if the index were larger than a slot word can address (which takes over 117 million keys),
    /// so tests and fuzzers reach the path that such queues take with a handful of keys.
    #[doc(hidden)]
    pub fn limit_recorded_buckets(&mut self, limit: u32) {
        self.bucket_limit = limit.min(NO_POS);
    }

    // ---- adds ----------------------------------------------------------------------------------

    /// Adds `key`: queues it, or de-duplicates it (see [`AddStatus`]).
    ///
    /// The key is dropped when it is not stored (a duplicate, or after shutdown); drivers that want
    /// to drop it elsewhere use [`QueueState::add_or_return`].
    pub fn add(&mut self, key: T, now: Instant) -> AddStatus {
        self.add_or_return(key, now).0
    }

    /// [`QueueState::add`] that hands an unstored key back instead of dropping it.
    pub fn add_or_return(&mut self, key: T, now: Instant) -> (AddStatus, Option<T>) {
        self.promote(now);
        if self.shutting_down {
            return (AddStatus::ShutDown, Some(key));
        }
        let hash = self.hasher.hash_one(&key);
        match self.find(hash, &key) {
            Some(slot) => (self.enqueue(slot, 0), Some(key)),
            None => {
                let slot = self.insert_new(hash, key);
                self.enqueue_new(slot, 0);
                (AddStatus::Queued, None)
            }
        }
    }

    /// Adds the key `key` borrows, cloning it only when the state does not track it yet.
    ///
    /// Informers deliver many updates per object: most adds are duplicates, and this one costs no
    /// allocation or reference count for them.
    pub fn add_ref<Q>(&mut self, key: &Q, now: Instant) -> AddStatus
    where
        T: Borrow<Q> + for<'a> From<&'a Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.promote(now);
        if self.shutting_down {
            return AddStatus::ShutDown;
        }
        let hash = self.hasher.hash_one(key);
        let slot = match self.find(hash, key) {
            Some(slot) => slot,
            None => self.insert_new(hash, T::from(key)),
        };
        self.enqueue(slot, 0)
    }

    /// Adds `key` once `delay` has passed: `add_after(k, 0)` is `add(k)`.
    ///
    /// A key already waiting keeps the earlier of its two deadlines. A waiting key is independent
    /// of the FIFO (client-go's "reminder" semantics): adding a waiting key queues it now and its
    /// waiting entry stays. Ignored after shutdown; a delay that saturates to [`Instant::NEVER`]
    /// stores nothing.
    pub fn add_after(&mut self, key: T, delay: Duration, now: Instant) -> AddStatus {
        self.add_after_or_return(key, delay, now).0
    }

    /// [`QueueState::add_after`] that hands an unstored key back instead of dropping it.
    pub fn add_after_or_return(
        &mut self,
        key: T,
        delay: Duration,
        now: Instant,
    ) -> (AddStatus, Option<T>) {
        if delay.is_zero() {
            return self.add_or_return(key, now);
        }
        self.add_with_or_return(key, 0, delay, now)
    }

    /// Adds `key` at `priority` once `delay` has passed (now if it is zero): the add rule with
    /// priorities.
    ///
    /// Higher priorities are served first; within a priority, keys are served in the order they
    /// entered it. A queued key keeps the highest priority asked for, and one whose priority is
    /// raised moves to the tail of its new priority ([`AddStatus::Raised`]). A key re-added while
    /// it is processed is queued when its lease ends, at the highest priority asked for meanwhile.
    /// A waiting entry keeps the earliest deadline and the highest priority asked for it; when it
    /// comes due it merges into the key's state the same way. `add` is `add_with(key, 0, 0)`.
    pub fn add_with(&mut self, key: T, priority: i32, delay: Duration, now: Instant) -> AddStatus {
        self.add_with_or_return(key, priority, delay, now).0
    }

    /// [`QueueState::add_with`] that hands an unstored key back instead of dropping it.
    pub fn add_with_or_return(
        &mut self,
        key: T,
        priority: i32,
        delay: Duration,
        now: Instant,
    ) -> (AddStatus, Option<T>) {
        self.add_in_group_or_return(key, 0, priority, delay, now)
    }

    /// [`QueueState::add_with_or_return`] for a key in fairness group `group` (see
    /// [`QueueState::set_fair`]; ignored without fairness). A key the state tracks already keeps
    /// its group.
    pub fn add_in_group_or_return(
        &mut self,
        key: T,
        group: u64,
        priority: i32,
        delay: Duration,
        now: Instant,
    ) -> (AddStatus, Option<T>) {
        self.promote(now);
        if self.shutting_down {
            return (AddStatus::ShutDown, Some(key));
        }
        let deadline = match delay.is_zero() {
            true => None,
            false => match self.now.saturating_add(duration_to_nanos(delay)) {
                u64::MAX => return (AddStatus::Never, Some(key)),
                deadline => Some(deadline),
            },
        };
        let hash = self.hasher.hash_one(&key);
        let (slot, unused) = match self.find(hash, &key) {
            Some(slot) => (slot, Some(key)),
            None => {
                let slot = self.insert_new(hash, key);
                if let Some(groups) = &mut self.groups {
                    set_group(groups, slot, group);
                }
                (slot, None)
            }
        };
        let status = match deadline {
            None => self.enqueue(slot, priority),
            Some(deadline) => self.schedule(slot, deadline, priority),
        };
        (status, unused)
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

    /// The check `get` makes every `period` gets (see the module docs): whether the live count
    /// has settled below the compaction threshold, and if so, the compaction. Out of line.
    #[cold]
    #[inline(never)]
    fn check_shrink(&mut self) {
        let elapsed = self.period;
        let live = self.slots.live();
        // The next check at the next get, unless rescheduled below: a compaction whose `Hash`
        // panics is tried again there.
        self.schedule_check(1);
        if self.shrink_below == usize::MAX {
            // A pinned compaction: check every get, finish at the first after the lease ends.
            self.compact_on_get();
            return;
        }
        if live >= self.shrink_below {
            self.settle_live = 0;
        } else if self.settle_live == 0 || live < self.settle_live - self.settle_live / 4 {
            // Crossed the threshold, or fell a quarter further since the wait began (a drain
            // under way): wait from here. A pure drain restarts every quarter and never compacts.
            self.settle_live = live.max(1);
            self.settle_gets = 0;
            if !self.settle {
                self.compact_on_get();
                return;
            }
        } else {
            self.settle_gets = self.settle_gets.saturating_add(elapsed);
            if self.settle_gets >= live / 2 {
                // Settled for half as many gets as there are live keys: the compaction's
                // O(live) cost is amortized over them.
                self.compact_on_get();
                return;
            }
        }
        let mut next = self.check_period(live);
        if self.settle_live != 0 {
            next = next.min((live / 2 - self.settle_gets).max(1));
        }
        self.schedule_check(next);
    }

    /// The gets between two checks at `live` keys: an eighth of them, so a crossing is seen
    /// within a small share of the wait, and at least an eighth of the smallest compacting
    /// size, so a small queue hovering at a threshold pays a check only every few dozen gets.
    /// Without a threshold, never (whatever sets one schedules a check).
    fn check_period(&self, live: usize) -> usize {
        match self.shrink_below {
            0 => usize::MAX,
            _ if !self.settle => 1,
            _ => (live / 8).max(self.compact_min / 8).max(1),
        }
    }

    /// The next compaction check in `gets` gets (at least 1).
    fn schedule_check(&mut self, gets: usize) {
        self.tick = gets;
        self.period = gets;
    }

    /// The compaction `get` makes once few keys are live and settled (see the module docs).
    #[cold]
    #[inline(never)]
    fn compact_on_get(&mut self) {
        // The moves of time this get makes anyway, first: a `Hash` that panics below leaves the
        // state as a `get` interrupted by user code does.
        if self.aging.is_some() {
            self.move_overdue();
        }
        if self.pin != NO_POS {
            if self.slots.is_live(self.pin) && self.slots.is_processing(self.pin) {
                return;
            }
            // That lease ended: is another one still above twice the live size?
            if let Some(pin) = self.slots.highest_processing_from(2 * self.slots.live()) {
                self.pin = pin;
                return;
            }
        }
        self.compact();
    }

    /// Gives memory back now: moves every live slot that is not being processed to the lowest
    /// free slots and rebuilds the index, the ready set, the waiting heap and the per-slot side
    /// arrays at the live size (see the [module documentation](self)). `get` does this on its
    /// own when few keys are live; call it after a burst to do it at a time of your choosing.
    ///
    /// It hashes every live key (user code) before it changes anything: a `Hash` that panics
    /// leaves the state as it was.
    pub fn compact(&mut self) {
        let live = self.slots.live();
        // User code first, in slot order: every live key's hash.
        let hashes: Vec<(SlotId, u64)> = self
            .slots
            .iter_live()
            .map(|(slot, key)| (slot, self.hasher.hash_one(key)))
            .collect();
        // A processing slot stays where it is: the arrays end after it.
        let top = self
            .slots
            .highest_processing_from(live)
            .map_or(live, |s| s as usize + 1);
        self.prune_parking();
        if let Some(a) = &mut self.aging {
            a.prune(age_status(&self.slots));
        }
        let remap = self.slots.compact(top);
        self.ready.remap(&remap);
        if let Some(p) = &mut self.parking {
            p.remap(&remap);
        }
        self.waiting.remap(&remap);
        if let Some(t) = &mut self.timing {
            t.remap(&remap);
        }
        if let Some(p) = &mut self.priorities {
            p.remap(&remap);
        }
        if let Some(a) = &mut self.aging {
            a.remap(&remap);
        }
        if let Some(g) = &mut self.groups {
            remap.side(g, 0);
        }
        // The index at the live size, from the hashes taken above, in the old slot order: the
        // slots that stayed, then the moved ones in the order of their new ids.
        self.unrecorded = HashMap::new();
        let mut index = HashTable::with_capacity(live);
        for (old, hash) in hashes {
            let slot = remap.slot(old);
            // Sized for every live key: never grows, never calls the re-hash function.
            let bucket = index
                .insert_unique(hash, slot, |_| {
                    unreachable!("the new index was sized for every live key")
                })
                .bucket_index();
            let stored = stored_bucket(bucket, self.bucket_limit);
            if stored == NO_POS {
                self.unrecorded.insert(slot, hash);
            }
            match self.slots.heap_pos(slot) {
                Some(pos) => self.waiting.set_bucket(pos, stored),
                None => self.slots.set_bucket(slot, stored),
            }
        }
        self.index = index;
        self.compactions += 1;
        self.pin = NO_POS;
        self.settle_live = 0;
        self.shrink_below = self.threshold(live);
        let next = self.check_period(live);
        self.schedule_check(next);
        if top > 2 * live && self.shrink {
            // Pinned by a lease (see the module docs): finish once it ends. (With compaction
            // off, an explicit `compact` is not followed up.)
            self.pin = (top - 1) as SlotId;
            self.shrink_below = usize::MAX;
            self.schedule_check(1);
        }
    }

    /// The compaction threshold for buffers sized for `n` live keys: half of it (so at most one
    /// compaction per halving), or 0 below [`COMPACT_MIN`] or with compaction off.
    fn threshold(&self, n: usize) -> usize {
        match self.shrink && n >= self.compact_min {
            true => n / 2,
            false => 0,
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
    pub fn ticket_key(&self, ticket: &Ticket) -> Option<&T> {
        (ticket.state == self.id && self.slots.is_live(ticket.slot))
            .then(|| self.slots.key(ticket.slot))
    }

    /// Finishes a handed-out key: the one place where an [`Outcome`] becomes queue operations.
    ///
    /// `limiter_delay` is what [`Outcome::consult_limiter`] returned for this outcome (the driver
    /// calls the limiter outside its lock): the delay of a [`Outcome::Retry`]. Processing is
    /// cleared; a key re-added while processing goes to the FIFO tail; the re-add the outcome asks
    /// for is applied as `add_after`, and dropped after shutdown.
    pub fn finish(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
    ) -> Finished<T> {
        match self.try_finish(ticket, outcome, limiter_delay, now) {
            Ok(f) => f,
            Err(ForeignTicket) => Finished::nothing(),
        }
    }

    /// [`QueueState::finish`] that reports a ticket from another state instead of ignoring it.
    ///
    /// With outage detection on, it is [`QueueState::finish_signalled`] with
    /// [`Signal::Ignored`](workqueue_ratelimit::Signal::Ignored): the outcome says nothing
    /// about an outage, but a finished probe is noticed.
    pub fn try_finish(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
    ) -> Result<Finished<T>, ForeignTicket> {
        if self.parking.is_some() {
            let ignored = workqueue_ratelimit::Signal::Ignored;
            // An ignored signal never closes the detector: nothing is released, paced.
            let mut pace = |_: &T| Duration::ZERO;
            return self
                .finish_signalled(ticket, outcome, limiter_delay, ignored, now, &mut pace)
                .map(|(f, _)| f);
        }
        self.finish_unobserved(ticket, outcome, limiter_delay, now)
    }

    /// [`QueueState::finish`] for a driver that checked that outage detection is off (or that
    /// finishes through [`QueueState::finish_signalled`] otherwise): the hot path, with no
    /// branch for it.
    #[inline]
    pub(crate) fn finish_fast(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
    ) -> Finished<T> {
        match self.finish_unobserved(ticket, outcome, limiter_delay, now) {
            Ok(f) => f,
            Err(ForeignTicket) => Finished::nothing(),
        }
    }

    /// The finish rule itself, without the outage detector.
    fn finish_unobserved(
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
            self.push_ready(slot, priority, self.now);
            requeued = true;
        }
        let readd = match outcome {
            Outcome::Done | Outcome::Forget => None,
            Outcome::Retry => limiter_delay,
            Outcome::RetryAfter(d) | Outcome::RequeueAfter(d) => Some(d),
        };
        // A re-add keeps the priority the key was handed out at.
        if let Some(delay) = readd
            && !self.shutting_down
        {
            if delay.is_zero() {
                requeued |= self.enqueue(slot, ticket.priority) == AddStatus::Queued;
            } else {
                let deadline = self.now.saturating_add(duration_to_nanos(delay));
                if deadline != u64::MAX {
                    self.schedule(slot, deadline, ticket.priority);
                }
            }
        }
        let waiting = self.slots.heap_pos(slot).is_some();
        let released = self.release_if_unreferenced(slot);
        Ok(Finished {
            requeued,
            waiting,
            released,
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

    /// Whether no key is ready at `now`.
    pub fn is_empty(&mut self, now: Instant) -> bool {
        self.len(now) == 0
    }

    /// The deadline `key` waits for, if it waits.
    pub fn waiting_deadline<Q>(&self, key: &Q) -> Option<Instant>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.find(self.hasher.hash_one(key), key)?;
        let pos = self.slots.heap_pos(slot)?;
        Some(Instant::from_nanos(self.waiting.get(pos).deadline))
    }

    /// Whether `key` is in the ready FIFO.
    pub fn is_queued<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(self.hasher.hash_one(key), key)
            .is_some_and(|s| self.slots.is_queued(s))
    }

    /// Whether a lease for `key` is outstanding.
    pub fn is_processing<Q>(&self, key: &Q) -> bool
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
    pub fn ready_keys(&self) -> Vec<T> {
        self.ready
            .iter()
            .map(|(s, _)| self.slots.key(s).clone())
            .collect()
    }

    /// The priority `key` is queued at, or, while it is processed and was re-added, the priority
    /// it is queued at when its lease ends (for diagnostics and tests).
    pub fn queued_priority_of<Q>(&self, key: &Q) -> Option<i32>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.find(self.hasher.hash_one(key), key)?;
        (self.slots.is_queued(slot) || self.slots.is_dirty(slot))
            .then(|| self.queued_priority(slot))
    }

    /// The priority of `key`'s waiting entry, if it waits (for diagnostics and tests).
    pub fn waiting_priority_of<Q>(&self, key: &Q) -> Option<i32>
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

    /// Panics if an invariant of the state is broken. For tests, fuzzing and debugging: it walks
    /// every slot.
    pub fn check_invariants(&self) {
        let mut queued = 0;
        let mut processing = 0;
        let mut waiting = 0;
        let mut unrecorded = 0;
        assert_eq!(
            self.index.len(),
            self.slots.live(),
            "index and slots disagree"
        );
        for &slot in self.index.iter() {
            assert!(self.slots.is_live(slot), "index points at a free slot");
            let key = self.slots.key(slot);
            let hash = self.hasher.hash_one(key);
            assert_eq!(
                self.find(hash, key),
                Some(slot),
                "key not found under its hash"
            );
            let bucket = match self.slots.heap_pos(slot) {
                Some(pos) => self.waiting.get(pos).bucket,
                None => self.slots.bucket(slot),
            };
            let actual = self.index.find_bucket_index(hash, |&s| s == slot);
            if bucket == NO_POS {
                assert_eq!(
                    self.unrecorded.get(&slot),
                    Some(&hash),
                    "a slot without a recorded bucket has no stored hash"
                );
                unrecorded += 1;
            } else {
                assert_eq!(
                    Some(bucket as usize),
                    actual,
                    "a slot's recorded bucket is stale"
                );
            }
            let q = self.slots.is_queued(slot);
            let p = self.slots.is_processing(slot);
            let w = self.slots.heap_pos(slot).is_some();
            assert!(!(q && p), "a slot is both queued and processing");
            assert!(
                !self.slots.is_dirty(slot) || p,
                "a dirty slot is not processing"
            );
            assert!(q || p || w, "a live slot is referenced by nothing");
            queued += q as usize;
            processing += p as usize;
            waiting += w as usize;
        }
        assert_eq!(
            queued,
            self.ready.len(),
            "FIFO length and queued slots disagree"
        );
        let mut seen = std::collections::HashSet::new();
        let mut overdue = 0;
        for (slot, level) in self.ready.iter() {
            assert!(
                self.slots.is_queued(slot),
                "FIFO holds a slot that is not queued"
            );
            assert!(seen.insert(slot), "FIFO holds a slot twice");
            assert_eq!(
                level,
                self.level_of(slot),
                "a slot is queued at another level than it records"
            );
            overdue += usize::from(level == OVERDUE);
        }
        self.ready.check();
        if let Some(a) = &self.aging {
            let live = a.live(age_status(&self.slots));
            assert_eq!(
                live.len() + overdue,
                queued,
                "a queued key is missing from the age order, or twice"
            );
            assert!(
                live.iter().all(|&(s, _)| !a.is_overdue(s)),
                "an overdue key is still in the age order"
            );
            assert!(
                live.iter().all(|&(_, since)| since <= self.now),
                "a key became ready after the state's time"
            );
            a.check();
            assert!(
                self.ready.has_positions(),
                "aging without the ready set's positions"
            );
        }
        assert!(
            self.priorities.is_none() || self.ready.has_positions(),
            "priorities are kept without the ready set's positions"
        );
        assert_eq!(processing, self.processing, "processing count is off");
        assert_eq!(
            unrecorded,
            self.unrecorded.len(),
            "hashes stored for slots that record their bucket"
        );
        assert_eq!(
            waiting,
            self.waiting.len(),
            "waiting heap and slots disagree"
        );
        assert!(
            !self.shutting_down || waiting == 0,
            "waiting keys after shutdown"
        );
        if let Some(w) = self.waiting.peek() {
            assert!(w.deadline > self.now, "a due key was not promoted");
        }
        self.waiting.check(&self.slots);
        self.check_parking();
        if let Some(t) = &self.timing {
            self.check_depths(t);
        }
        self.slots.check();
        assert_eq!(
            self.pin != NO_POS,
            self.shrink_below == usize::MAX,
            "a pinned compaction without its pin, or the reverse"
        );
        if self.pin != NO_POS {
            assert!(
                (self.pin as usize) < self.slots.len(),
                "the pin is past the slot arrays"
            );
        }
        assert!(
            self.shrink || self.shrink_below == 0,
            "compaction is off but armed"
        );
        assert!(
            1 <= self.tick && self.tick <= self.period,
            "the next compaction check is not scheduled"
        );
        assert!(
            self.settle_live == 0 || (self.shrink_below != 0 && self.shrink_below != usize::MAX),
            "waiting to compact without a threshold, or while pinned"
        );
    }

    /// The depth per priority kept for metrics matches a recount of the dirty keys.
    fn check_depths(&self, timing: &Timing) {
        let mut expected = std::collections::HashMap::<i32, u64>::new();
        for &slot in self.index.iter() {
            let dirty = self.slots.is_queued(slot)
                || (self.slots.is_processing(slot) && self.slots.is_dirty(slot));
            if dirty {
                *expected.entry(self.queued_priority(slot)).or_default() += 1;
            }
        }
        assert_eq!(
            timing.depth(),
            expected.values().sum::<u64>(),
            "the metrics depth is off"
        );
        let mut overflow = None;
        for (priority, depth) in timing.depth_by_priority() {
            match priority {
                Some(p) => assert_eq!(
                    expected.remove(&p).unwrap_or(0),
                    depth,
                    "the metrics depth of priority {p} is off"
                ),
                None => overflow = Some(depth),
            }
        }
        assert_eq!(
            expected.values().sum::<u64>(),
            overflow.unwrap_or(0),
            "the metrics depth of the priorities beyond the label limit is off"
        );
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

    #[inline]
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<SlotId>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slots = &self.slots;
        self.index
            .find(hash, |&s| slots.key(s).borrow() == key)
            .copied()
    }

    #[inline]
    fn insert_new(&mut self, hash: u64, key: T) -> SlotId {
        if self.index.len() == self.index.capacity() {
            self.grow_index();
        }
        let slot = self.slots.insert(key);
        let (slots, hasher) = (&self.slots, &self.hasher);
        let bucket = self
            .index
            .insert_unique(hash, slot, |&s| hasher.hash_one(slots.key(s)))
            .bucket_index();
        let stored = stored_bucket(bucket, self.bucket_limit);
        if stored == NO_POS {
            self.unrecorded.insert(slot, hash);
        }
        self.slots.set_bucket(slot, stored);
        slot
    }

    /// Replaces a full index with one of twice the room, filled by walking the slots in order.
    ///
    /// hashbrown would grow by walking its own buckets, which visits the keys in random order:
    /// each moved entry then costs a cache miss on its slot and another on its key's bytes, and at
    /// a million keys that was a third of all misses of an add/get/done cycle. Walking the slots
    /// reads the keys sequentially; only the writes into the new table are random, and they do
    /// not depend on each other, so they overlap. The old and new tables are briefly both
    /// allocated, as in hashbrown's own resize.
    ///
    /// Panic safety: hashing is user code, so every key is hashed first, into a vector, before
    /// anything changes. A `Hash` that panics leaves the old index and every recorded bucket as
    /// they were; the build after it calls no user code.
    ///
    /// The new table holds twice the live keys: with no tombstones that doubles the bucket count,
    /// as hashbrown does; with many (erased entries in full groups use up room), it shrinks.
    #[cold]
    #[inline(never)]
    fn grow_index(&mut self) {
        let live = self.index.len();
        let mut hashes = Vec::with_capacity(live);
        hashes.extend(
            self.slots
                .iter_live()
                .map(|(_, key)| self.hasher.hash_one(key)),
        );
        let mut hashes = hashes.into_iter();
        self.rebuild_index((2 * live).max(live + 1), |_| {
            hashes.next().expect("one hash per live slot")
        });
        // Room for twice the live keys: compact once fewer than half of them are live (and
        // settled there). Check at the next get: the threshold may be new.
        self.shrink_below = self.shrink_below.max(self.threshold(live));
        self.settle_live = 0;
        self.schedule_check(1);
    }

    /// Replaces the index with one of room for `capacity` keys, filled by walking the live slots
    /// in order; `hash(slot)` is each one's hash, computed beforehand (no user code runs here).
    fn rebuild_index(&mut self, capacity: usize, mut hash: impl FnMut(SlotId) -> u64) {
        let mut index = HashTable::with_capacity(capacity);
        let (limit, unrecorded, waiting) =
            (self.bucket_limit, &mut self.unrecorded, &mut self.waiting);
        unrecorded.clear();
        self.slots.reindex(
            |slot| {
                let hash = hash(slot);
                // The table has room for every live key, so it never grows here and never
                // calls the re-hash function.
                let bucket = index
                    .insert_unique(hash, slot, |_| {
                        unreachable!("the new index was sized for every live key")
                    })
                    .bucket_index();
                let stored = stored_bucket(bucket, limit);
                if stored == NO_POS {
                    unrecorded.insert(slot, hash);
                }
                stored
            },
            |pos, bucket| waiting.set_bucket(pos, bucket),
        );
        self.index = index;
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

    /// The delayed-add rule: earliest deadline wins, highest priority wins.
    fn schedule(&mut self, slot: SlotId, deadline: u64, priority: i32) -> AddStatus {
        let seq = self.seq;
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

    /// Frees `slot` if nothing refers to it, returning its key.
    #[inline]
    fn release_if_unreferenced(&mut self, slot: SlotId) -> Option<T> {
        if !self.slots.is_unreferenced(slot) {
            return None;
        }
        let bucket = self.slots.bucket(slot);
        // No user code here: the slot is already unreferenced, and a panic now would leave it
        // live with nothing pointing at it. A slot without a recorded bucket has its hash stored.
        let entry = if bucket != NO_POS {
            self.index.get_bucket_entry(bucket as usize).ok()
        } else {
            let hash = self.unrecorded.remove(&slot);
            debug_assert!(hash.is_some(), "a slot without a bucket has no stored hash");
            hash.and_then(|hash| self.index.find_entry(hash, |&s| s == slot).ok())
        };
        if let Some(entry) = entry {
            debug_assert_eq!(
                *entry.get(),
                slot,
                "a slot's recorded bucket holds another slot"
            );
            // Only the control byte is touched: the entry's own value is never read.
            entry.remove();
        }
        let key = self.slots.remove(slot);
        if self.slots.live() == 0 {
            self.shrink_if_large();
        }
        Some(key)
    }

    /// Gives a burst's memory back once the state is empty. Out of line: `finish` calls it on
    /// every last key, and inlined it costs `finish` registers on every key.
    #[inline(never)]
    fn shrink_if_large(&mut self) {
        // No lease is out: nothing pins the slot arrays.
        self.pin = NO_POS;
        if self.index.capacity() > SHRINK_ABOVE {
            self.index = HashTable::new();
            // Nothing left to compact: the next growth sets the threshold again.
            self.shrink_below = 0;
            self.settle_live = 0;
        }
        if self.shrink_below == usize::MAX {
            self.shrink_below = 0;
            self.settle_live = 0;
        }
        if self.unrecorded.capacity() > SHRINK_ABOVE {
            self.unrecorded = HashMap::new();
        }
        if self.slots.allocated_bytes() > SHRINK_ABOVE * size_of::<T>() {
            self.slots.reset();
        }
        if self.ready.allocated_bytes() > SHRINK_ABOVE * size_of::<SlotId>() {
            self.ready.shrink();
        }
        if self.waiting.len() == 0 && self.waiting.allocated_bytes() > SHRINK_ABOVE * 24 {
            self.waiting.shrink();
        }
        if let Some(t) = &mut self.timing {
            t.shrink_if_large(SHRINK_ABOVE);
        }
        if let Some(p) = &mut self.priorities {
            p.shrink_if_large(SHRINK_ABOVE);
        }
        if let Some(a) = &mut self.aging {
            // No key is queued: every entry is stale, and slot ids may be reused from 0.
            a.clear();
            a.shrink_if_large(SHRINK_ABOVE);
        }
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

/// A bucket index as a slot records it: `NO_POS` when it is not below `limit` (which is at most
/// `NO_POS`, the largest value the slot word's field holds).
#[inline]
fn stored_bucket(bucket: usize, limit: u32) -> u32 {
    if bucket < limit as usize {
        bucket as u32
    } else {
        NO_POS
    }
}

#[cfg(test)]
mod tests;
