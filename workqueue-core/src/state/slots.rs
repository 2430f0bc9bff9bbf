//! Slot storage: one slot per key the queue tracks.

/// Index of a slot. Slots are addressed by `u32` to keep the FIFO, the heap and the hash index small.
pub(crate) type SlotId = u32;

/// The slot is in the ready FIFO. Implies neither `PROCESSING` nor `DIRTY`.
const QUEUED: u32 = 1 << 31;
/// A lease for the slot's key is outstanding.
const PROCESSING: u32 = 1 << 30;
/// The key was added while processing: it goes to the FIFO tail when its lease finishes.
/// Only set together with `PROCESSING`.
const DIRTY: u32 = 1 << 29;
/// The slot is in the waiting heap, and the low bits are its heap position.
const WAITING: u32 = 1 << 28;
/// Low bits: the heap position of a waiting slot; the slot's bucket in the hash index for a live
/// slot that does not wait (its heap entry keeps the bucket meanwhile); the next free slot for a
/// free one.
const FIELD: u32 = (1 << 28) - 1;
/// "None" in the low bits: the end of the free list, or a bucket not recorded (a bucket index
/// too large for the field, or a slot not in the index yet).
pub(crate) const NO_POS: u32 = FIELD;

/// The most slots a state can hold at once (and the most waiting entries).
pub(crate) const MAX_SLOTS: usize = NO_POS as usize;

/// The moves of a compaction ([`Slots::compact`]): slots below `len` stay, live slots at or
/// above it moved below it.
#[derive(Debug)]
pub(crate) struct Remap {
    /// The new number of slots.
    pub(crate) len: usize,
    /// The new id of each old slot at or above `len` (`NO_POS`: it was free).
    to: Vec<SlotId>,
    /// `(old, new)` for every moved slot, in ascending order of both.
    pub(crate) moves: Vec<(SlotId, SlotId)>,
}

impl Remap {
    /// The new id of a slot that was live.
    #[inline]
    pub(crate) fn slot(&self, old: SlotId) -> SlotId {
        match (old as usize).checked_sub(self.len) {
            None => old,
            Some(i) => {
                let new = self.to[i];
                debug_assert_ne!(new, NO_POS, "remapping a slot that was free");
                new
            }
        }
    }

    /// Moves the per-slot values of a side array along with their slots (a value past the end
    /// of `v` is `absent`), then truncates it to the new number of slots and frees the rest.
    pub(crate) fn side<V: Copy>(&self, v: &mut Vec<V>, absent: V) {
        for &(old, new) in &self.moves {
            let value = v.get(old as usize).copied().unwrap_or(absent);
            if let Some(slot) = v.get_mut(new as usize) {
                *slot = value;
            }
        }
        v.truncate(self.len);
        v.shrink_to_fit();
    }
}

/// Keys and a packed state word per slot, in two parallel vectors (struct of arrays).
///
/// Invariants:
/// - `keys[i].is_none()` exactly when slot `i` is free; a free slot's `meta` has no flags and its
///   low bits link the free list (`free_head` is its start, `NO_POS` its end).
/// - A live slot is referenced: it is queued, processing, or waiting. The state frees a slot as
///   soon as it stops being referenced.
/// - A live slot that does not wait records its bucket in the state's hash index, or `NO_POS`;
///   the state keeps it current when the index is rebuilt. Finishing a key erases its index
///   entry through that bucket, with no hashing and no probe (and no read of the entry's line).
/// - `live` counts live slots.
///
/// Keeping the state word apart from the key keeps it at four bytes a slot: with an `Arc<str>` key
/// a slot costs 20 bytes, where a struct would be padded to 24.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    keys: Vec<Option<T>>,
    meta: Vec<u32>,
    free_head: u32,
    live: usize,
}

impl<T> Slots<T> {
    #[cfg(test)]
    pub(crate) const fn new() -> Self {
        Slots {
            keys: Vec::new(),
            meta: Vec::new(),
            free_head: NO_POS,
            live: 0,
        }
    }

    pub(crate) fn with_capacity(n: usize) -> Self {
        Slots {
            keys: Vec::with_capacity(n),
            meta: Vec::with_capacity(n),
            free_head: NO_POS,
            live: 0,
        }
    }

    #[inline]
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Stores `key` in a free slot (reusing the most recently freed one) with no flags set.
    ///
    /// # Panics
    /// When `MAX_SLOTS` keys are tracked at once.
    #[inline]
    pub(crate) fn insert(&mut self, key: T) -> SlotId {
        self.live += 1;
        if self.free_head != NO_POS {
            let id = self.free_head;
            let i = id as usize;
            self.free_head = self.meta[i] & FIELD;
            self.meta[i] = NO_POS;
            self.keys[i] = Some(key);
            id
        } else {
            let i = self.keys.len();
            assert!(
                i < MAX_SLOTS,
                "work queue capacity exceeded: at most {MAX_SLOTS} keys can be queued, processing or waiting at once"
            );
            self.keys.push(Some(key));
            self.meta.push(NO_POS);
            i as SlotId
        }
    }

    /// Frees a slot and hands its key back, so the caller can drop it where it chooses.
    #[inline]
    pub(crate) fn remove(&mut self, id: SlotId) -> T {
        let i = id as usize;
        debug_assert!(self.is_unreferenced(id), "freeing a referenced slot");
        self.live -= 1;
        self.meta[i] = self.free_head;
        self.free_head = id;
        self.keys[i].take().expect("freeing a free slot")
    }

    /// Drops all storage once no slot is live, giving a burst's memory back.
    pub(crate) fn reset(&mut self) {
        debug_assert_eq!(self.live, 0);
        self.keys = Vec::new();
        self.meta = Vec::new();
        self.free_head = NO_POS;
    }

    #[inline]
    pub(crate) fn key(&self, id: SlotId) -> &T {
        self.keys[id as usize]
            .as_ref()
            .expect("slot id refers to a free slot")
    }

    /// Whether `id` names a live slot (for validating ids that come from outside).
    #[inline]
    pub(crate) fn is_live(&self, id: SlotId) -> bool {
        self.keys.get(id as usize).is_some_and(Option::is_some)
    }

    #[inline]
    pub(crate) fn is_queued(&self, id: SlotId) -> bool {
        self.meta[id as usize] & QUEUED != 0
    }

    #[inline]
    pub(crate) fn is_processing(&self, id: SlotId) -> bool {
        self.meta[id as usize] & PROCESSING != 0
    }

    #[inline]
    pub(crate) fn is_dirty(&self, id: SlotId) -> bool {
        self.meta[id as usize] & DIRTY != 0
    }

    #[inline]
    pub(crate) fn heap_pos(&self, id: SlotId) -> Option<u32> {
        let m = self.meta[id as usize];
        (m & WAITING != 0).then_some(m & FIELD)
    }

    /// Whether nothing refers to the slot any more, so it must be freed.
    #[inline]
    pub(crate) fn is_unreferenced(&self, id: SlotId) -> bool {
        self.meta[id as usize] & (QUEUED | PROCESSING | WAITING) == 0
    }

    /// The slot's bucket in the hash index (`NO_POS`: not recorded). Only for a slot that does
    /// not wait: a waiting slot's bucket is in its heap entry.
    #[inline]
    pub(crate) fn bucket(&self, id: SlotId) -> u32 {
        let m = self.meta[id as usize];
        debug_assert!(
            m & WAITING == 0,
            "a waiting slot's bucket is in its heap entry"
        );
        m & FIELD
    }

    /// Records the bucket of a slot that does not wait.
    #[inline]
    pub(crate) fn set_bucket(&mut self, id: SlotId, bucket: u32) {
        let m = &mut self.meta[id as usize];
        debug_assert!(
            *m & WAITING == 0,
            "a waiting slot's bucket is in its heap entry"
        );
        *m = (*m & !FIELD) | bucket;
    }

    /// Records the heap position of a waiting slot (entering the heap, or moving in it). The
    /// heap entry must already hold the slot's bucket.
    #[inline]
    pub(crate) fn set_heap_pos(&mut self, id: SlotId, pos: u32) {
        debug_assert!(pos < NO_POS);
        let m = &mut self.meta[id as usize];
        *m = (*m & !FIELD) | WAITING | pos;
    }

    /// The slot left the heap: it records its bucket again, handed back by its heap entry.
    #[inline]
    pub(crate) fn leave_heap(&mut self, id: SlotId, bucket: u32) {
        let m = &mut self.meta[id as usize];
        *m = (*m & !(FIELD | WAITING)) | bucket;
    }

    /// The live slots and their keys, in slot order.
    pub(crate) fn iter_live(&self) -> impl Iterator<Item = (SlotId, &T)> + '_ {
        self.keys
            .iter()
            .enumerate()
            .filter_map(|(i, key)| Some((i as SlotId, key.as_ref()?)))
    }

    /// Visits every live slot in slot order (as [`Slots::iter_live`]): `place` puts it in a new
    /// hash index and returns the bucket to record (`NO_POS` for none), which is recorded in the
    /// slot, or, for a waiting slot, through `record_waiting(heap_pos, bucket)`.
    pub(crate) fn reindex(
        &mut self,
        mut place: impl FnMut(SlotId) -> u32,
        mut record_waiting: impl FnMut(u32, u32),
    ) {
        for (i, (key, meta)) in self.keys.iter().zip(self.meta.iter_mut()).enumerate() {
            if key.is_none() {
                continue;
            }
            let bucket = place(i as SlotId);
            if *meta & WAITING != 0 {
                record_waiting(*meta & FIELD, bucket);
            } else {
                *meta = (*meta & !FIELD) | bucket;
            }
        }
    }

    #[inline]
    pub(crate) fn set_queued(&mut self, id: SlotId) {
        self.meta[id as usize] |= QUEUED;
    }

    /// The slot leaves the ready set without being handed out (a removal).
    #[inline]
    pub(crate) fn clear_queued(&mut self, id: SlotId) {
        self.meta[id as usize] &= !QUEUED;
    }

    /// A re-add made while processing is dropped (a removal): the slot is no longer dirty.
    #[inline]
    pub(crate) fn clear_dirty(&mut self, id: SlotId) {
        self.meta[id as usize] &= !DIRTY;
    }

    /// Queued -> processing (a `get`).
    #[inline]
    pub(crate) fn start_processing(&mut self, id: SlotId) {
        let m = &mut self.meta[id as usize];
        debug_assert!(*m & QUEUED != 0);
        *m = (*m & !QUEUED) | PROCESSING;
    }

    #[inline]
    pub(crate) fn set_dirty(&mut self, id: SlotId) {
        self.meta[id as usize] |= DIRTY;
    }

    /// Clears processing and dirty; returns whether the slot was dirty.
    #[inline]
    pub(crate) fn stop_processing(&mut self, id: SlotId) -> bool {
        let m = &mut self.meta[id as usize];
        let dirty = *m & DIRTY != 0;
        *m &= !(PROCESSING | DIRTY);
        dirty
    }

    /// Number of slots, live or free (the length of the slot arrays).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The highest processing slot at or above `from`, if any (a scan of the state words).
    pub(crate) fn highest_processing_from(&self, from: usize) -> Option<SlotId> {
        let from = from.min(self.meta.len());
        self.meta[from..]
            .iter()
            .rposition(|&m| m & PROCESSING != 0)
            .map(|i| (from + i) as SlotId)
    }

    /// Compaction: moves every live slot at or above `new_len` to the lowest free slot below it,
    /// truncates both arrays to `new_len` (their capacity too), and rebuilds the free list in
    /// ascending order, so new keys fill the lowest slots first. Returns the moves.
    ///
    /// The caller chooses `new_len` so that it is at least the live count and no processing slot
    /// is at or above it: a processing slot never moves (a ticket names it). Moving a slot moves
    /// its key and its state word unchanged; the caller remaps every reference to it.
    pub(crate) fn compact(&mut self, new_len: usize) -> Remap {
        debug_assert!(new_len >= self.live && new_len <= self.keys.len());
        let mut moves = Vec::new();
        let mut to = vec![NO_POS; self.keys.len() - new_len];
        let mut hole = 0;
        for old in new_len..self.keys.len() {
            if self.keys[old].is_none() {
                continue;
            }
            debug_assert!(self.meta[old] & PROCESSING == 0, "moving a processing slot");
            while self.keys[hole].is_some() {
                hole += 1;
            }
            // `hole < new_len`: below `new_len` there are `new_len - live_below` free slots,
            // at least as many as the live slots above it (`live - live_below`).
            self.keys[hole] = self.keys[old].take();
            self.meta[hole] = self.meta[old];
            moves.push((old as SlotId, hole as SlotId));
            to[old - new_len] = hole as SlotId;
        }
        self.keys.truncate(new_len);
        self.meta.truncate(new_len);
        self.keys.shrink_to_fit();
        self.meta.shrink_to_fit();
        self.free_head = NO_POS;
        for i in (0..new_len).rev() {
            if self.keys[i].is_none() {
                self.meta[i] = self.free_head;
                self.free_head = i as SlotId;
            }
        }
        Remap {
            len: new_len,
            to,
            moves,
        }
    }

    /// Checks the free list and the live count (for `check_invariants`).
    pub(crate) fn check(&self) {
        assert_eq!(self.keys.len(), self.meta.len(), "slot arrays disagree");
        let live = self.keys.iter().filter(|k| k.is_some()).count();
        assert_eq!(live, self.live, "the live slot count is off");
        let mut free = 0;
        let mut next = self.free_head;
        while next != NO_POS {
            let i = next as usize;
            assert!(self.keys[i].is_none(), "the free list holds a live slot");
            assert_eq!(self.meta[i] & !FIELD, 0, "a free slot has flags");
            free += 1;
            assert!(free <= self.keys.len(), "the free list has a cycle");
            next = self.meta[i] & FIELD;
        }
        assert_eq!(
            free + live,
            self.keys.len(),
            "a free slot is not in the free list"
        );
    }

    /// Heap bytes held, for memory accounting.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.keys.capacity() * size_of::<Option<T>>() + self.meta.capacity() * size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_slots_are_reused_most_recent_first() {
        let mut s = Slots::new();
        let a = s.insert("a");
        let b = s.insert("b");
        assert_eq!(s.remove(a), "a");
        assert_eq!(s.remove(b), "b");
        assert_eq!(s.insert("c"), b);
        assert_eq!(s.insert("d"), a);
        assert_eq!(s.live(), 2);
    }

    #[test]
    fn compaction_moves_live_slots_down_and_keeps_processing_ones() {
        let mut s = Slots::new();
        let ids: Vec<SlotId> = (0..8).map(|i| s.insert(i)).collect();
        for &i in &ids {
            s.set_queued(i);
        }
        s.start_processing(ids[5]);
        for &i in &[0, 1, 2, 3, 6] {
            s.meta[i] &= !QUEUED;
            s.remove(i as SlotId);
        }
        // Live: 4 (queued), 5 (processing), 7 (queued). New length 6 keeps 5 in place.
        assert_eq!(s.highest_processing_from(0), Some(5));
        assert_eq!(s.highest_processing_from(6), None);
        let remap = s.compact(6);
        assert_eq!(remap.moves, vec![(7, 0)]);
        assert_eq!((remap.slot(7), remap.slot(5), remap.slot(4)), (0, 5, 4));
        let mut side = vec![70, 71, 72, 73, 74, 75, 76, 77];
        remap.side(&mut side, 0);
        assert_eq!(side, [77, 71, 72, 73, 74, 75]);
        s.check();
        assert_eq!((s.len(), s.live()), (6, 3));
        assert_eq!((*s.key(0), *s.key(4), *s.key(5)), (7, 4, 5));
        assert!(s.is_queued(0) && s.is_processing(5));
        // The lowest free slots are reused first.
        assert_eq!((s.insert(10), s.insert(11), s.insert(12)), (1, 2, 3));
        s.check();
    }

    #[test]
    fn flags_and_position_are_independent() {
        let mut s = Slots::new();
        let a = s.insert(1);
        s.set_bucket(a, 5);
        assert_eq!(s.bucket(a), 5);
        s.set_heap_pos(a, 7);
        s.set_queued(a);
        assert!(s.is_queued(a));
        assert_eq!(s.heap_pos(a), Some(7));
        s.start_processing(a);
        s.set_dirty(a);
        assert!(s.is_processing(a) && s.is_dirty(a) && !s.is_queued(a));
        assert!(s.stop_processing(a));
        assert!(!s.is_unreferenced(a));
        s.leave_heap(a, 5);
        assert!(s.is_unreferenced(a));
        assert_eq!((s.heap_pos(a), s.bucket(a)), (None, 5));
    }
}
