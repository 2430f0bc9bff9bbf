//! Memory follows the live size: compaction, and giving buffers back when the state empties.
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
//! (distinct keys in, then get and done until empty) reaches empty, where everything is
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
//! [`COMPACT_MIN`] live keys do not compact; an empty one frees its large buffers at once.
//! [`QueueState::set_shrink_memory`] turns compaction off.
//!
//! Compacting hashes every live key (the index's buckets depend on its size, and the index keeps
//! no hashes), which is user code: it runs before the compaction changes anything, so a `Hash`
//! that panics leaves the state as it was. That is why compaction runs in `get` (which may call
//! user code) and never in `finish`, which calls none.

use std::hash::{BuildHasher, Hash};

use hashbrown::{HashMap, HashTable};

use super::index::stored_bucket;
use super::slots::{NO_POS, SlotId};
use super::{QueueState, age_status};

/// States with fewer live keys than this do not compact: their buffers are small, and an empty
/// state frees its large ones anyway.
pub const COMPACT_MIN: usize = 512;

/// Buffers at least this large are freed when the state becomes empty; smaller ones are kept, so
/// an idle queue that sees one key at a time does not allocate on every add.
pub(super) const SHRINK_ABOVE: usize = 1024;

impl<T: Hash + Eq + Clone, S: BuildHasher> QueueState<T, S> {
    /// Whether the state gives memory back when its live keys fall well below the size its
    /// buffers grew to (see the [state documentation](super#memory-follows-the-live-size)).
    /// Default: on. Off keeps the peak
    /// until the state is empty.
    pub fn set_shrink_memory(&mut self, enabled: bool) {
        self.shrink = enabled;
        if !enabled {
            self.shrink_below = 0;
            self.pin = NO_POS;
            self.settle_live = 0;
        }
    }

    /// How many times the state compacted.
    pub(crate) fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Compacts from `min` live keys instead of [`COMPACT_MIN`], so tests and fuzzers reach
    /// compaction with a handful of keys.
    pub(crate) fn set_compact_min(&mut self, min: usize) {
        self.compact_min = min.max(1);
        // Check at the next get, at the new scale.
        self.schedule_check(1);
    }

    /// `false` compacts at the first get below the threshold, without waiting for the live count
    /// to settle there, so that tests and fuzzers whose operations rarely settle still compact
    /// often. Default: `true`.
    pub(crate) fn set_settle(&mut self, enabled: bool) {
        self.settle = enabled;
        self.schedule_check(1);
    }

    /// The check `get` makes every `period` gets (see the module docs): whether the live count
    /// has settled below the compaction threshold, and if so, the compaction. Out of line.
    #[cold]
    #[inline(never)]
    pub(super) fn check_shrink(&mut self) {
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
    pub(super) fn check_period(&self, live: usize) -> usize {
        match self.shrink_below {
            0 => usize::MAX,
            _ if !self.settle => 1,
            _ => (live / 8).max(self.compact_min / 8).max(1),
        }
    }

    /// The next compaction check in `gets` gets (at least 1).
    pub(super) fn schedule_check(&mut self, gets: usize) {
        self.tick = gets;
        self.period = gets;
    }

    /// The compaction `get` makes once few keys are live and settled (see the module docs).
    #[cold]
    #[inline(never)]
    pub(super) fn compact_on_get(&mut self) {
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
    /// arrays at the live size. `get` does this on its own when few keys are live and settled.
    ///
    /// It hashes every live key (user code) before it changes anything: a `Hash` that panics
    /// leaves the state as it was.
    pub(crate) fn compact(&mut self) {
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
    pub(super) fn threshold(&self, n: usize) -> usize {
        match self.shrink && n >= self.compact_min {
            true => n / 2,
            false => 0,
        }
    }

    /// Gives a burst's memory back once the state is empty. Out of line: `finish` calls it on
    /// every last key, and inlined it costs `finish` registers on every key.
    #[inline(never)]
    pub(super) fn shrink_if_large(&mut self) {
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
