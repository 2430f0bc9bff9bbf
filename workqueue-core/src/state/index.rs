//! The hash index from keys to slots: lookups, inserts, growth, and erasing a freed slot by
//! its recorded bucket (no hashing, so no user code, when a key is freed).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

use super::QueueState;
use super::slots::{NO_POS, SlotId};

impl<T: Hash + Eq + Clone, S: BuildHasher> QueueState<T, S> {
    #[inline]
    pub(super) fn find<Q>(&self, hash: u64, key: &Q) -> Option<SlotId>
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
    pub(super) fn insert_new(&mut self, hash: u64, key: T) -> SlotId {
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
    /// each moved entry then costs a cache miss on its slot and another on its key's bytes (at a
    /// million keys, a large share of an add/get/done cycle's misses: ARCHITECTURE.md). Walking
    /// the slots reads the keys sequentially; only the writes into the new table are random, and
    /// they do not depend on each other, so they overlap. The old and new tables are briefly both
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
    pub(super) fn grow_index(&mut self) {
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
    pub(super) fn rebuild_index(&mut self, capacity: usize, mut hash: impl FnMut(SlotId) -> u64) {
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

    /// Frees `slot` if nothing refers to it, returning its key.
    #[inline]
    pub(super) fn release_if_unreferenced(&mut self, slot: SlotId) -> Option<T> {
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
}

/// A bucket index as a slot records it: `NO_POS` when it is not below `limit` (which is at most
/// `NO_POS`, the largest value the slot word's field holds).
#[inline]
pub(super) fn stored_bucket(bucket: usize, limit: u32) -> u32 {
    if bucket < limit as usize {
        bucket as u32
    } else {
        NO_POS
    }
}
