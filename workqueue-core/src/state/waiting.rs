//! The waiting heap: keys delayed by `add_after`, earliest deadline first.

use super::slots::{Remap, SlotId, Slots};

/// Why a key waits: what its entry was last set by. The add rules that do not simply keep the
/// earliest deadline look at it (see `QueueState::add_or_return`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A plain delayed add (`add_after`, `retry_after`, `requeue_after`): a reminder.
    Reminder = 0,
    /// The rate limiter's delay (a rate-limited add, `retry()`, a release's pacing).
    Retry = 1,
    /// A debounced add: a later debounced add moves it to its own time.
    Debounce = 2,
    /// Parked by the outage detector, or moved out of the parked round to be its probe.
    Parked = 3,
}

/// The low bits of [`Waiting::seq`] that hold the entry's [`Kind`].
const KIND_BITS: u32 = 2;

// An add's options carry the kind of their wait as these bits (`AddOptions::wait`).
const _: () = {
    use crate::options::{WAIT_DEBOUNCE, WAIT_REMINDER, WAIT_RETRY};
    assert!(Kind::Reminder as u8 == WAIT_REMINDER);
    assert!(Kind::Retry as u8 == WAIT_RETRY);
    assert!(Kind::Debounce as u8 == WAIT_DEBOUNCE);
};

/// One waiting key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiting {
    /// Nanoseconds on the state's timeline; never `u64::MAX` (a "never" deadline is not stored).
    pub(crate) deadline: u64,
    /// Insertion order, assigned at each (re)insert, shifted left by two bits, with the entry's
    /// [`Kind`] in those low bits (built by [`Waiting::order`]): equal deadlines leave FIFO, as
    /// sequences are unique, and the kind costs no byte (an entry stays 24 bytes).
    pub(crate) seq: u64,
    pub(crate) slot: SlotId,
    /// The slot's bucket in the hash index while it waits (the slot's own word holds the heap
    /// position meanwhile). It fills what would be padding: an entry stays 24 bytes.
    pub(crate) bucket: u32,
}

impl Waiting {
    /// The `seq` of an entry inserted as the `seq`-th, of kind `kind`.
    #[inline(always)]
    pub(crate) const fn order(seq: u64, kind: Kind) -> u64 {
        Self::order_bits(seq, kind as u8)
    }

    /// [`Waiting::order`] of a kind given as its bits (`kind as u8`, or an add's wait).
    #[inline(always)]
    pub(crate) const fn order_bits(seq: u64, kind: u8) -> u64 {
        (seq << KIND_BITS) | (kind & 3) as u64
    }

    /// Why the key waits.
    #[inline]
    pub(crate) fn kind(&self) -> Kind {
        match self.seq & ((1 << KIND_BITS) - 1) {
            0 => Kind::Reminder,
            1 => Kind::Retry,
            2 => Kind::Debounce,
            _ => Kind::Parked,
        }
    }

    #[inline]
    fn before(&self, other: &Waiting) -> bool {
        (self.deadline, self.seq) < (other.deadline, other.seq)
    }
}

/// A binary min-heap on `(deadline, seq)` whose entries know their position.
///
/// Invariant: for every entry at position `p`, `slots.heap_pos(entry.slot) == Some(p)`. That
/// index makes earliest-wins a decrease-key. An entry
/// carries its slot's index bucket and hands it back when it leaves.
#[derive(Debug, Default)]
pub(crate) struct WaitingHeap {
    heap: Vec<Waiting>,
}

impl WaitingHeap {
    pub(crate) const fn new() -> Self {
        WaitingHeap { heap: Vec::new() }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    #[inline]
    pub(crate) fn peek(&self) -> Option<&Waiting> {
        self.heap.first()
    }

    #[inline]
    pub(crate) fn get(&self, pos: u32) -> &Waiting {
        &self.heap[pos as usize]
    }

    pub(crate) fn push<T>(&mut self, entry: Waiting, slots: &mut Slots<T>) {
        let pos = self.heap.len();
        self.heap.push(entry);
        self.sift_up(pos, slots);
    }

    /// Moves the entry at `pos` to an earlier `(deadline, seq)`.
    pub(crate) fn decrease<T>(&mut self, pos: u32, deadline: u64, seq: u64, slots: &mut Slots<T>) {
        let e = &mut self.heap[pos as usize];
        debug_assert!((deadline, seq) <= (e.deadline, e.seq));
        e.deadline = deadline;
        e.seq = seq;
        self.sift_up(pos as usize, slots);
    }

    /// Moves the entry at `pos` to `(deadline, seq)`, earlier or later.
    pub(crate) fn reschedule<T>(
        &mut self,
        pos: u32,
        deadline: u64,
        seq: u64,
        slots: &mut Slots<T>,
    ) {
        let e = &mut self.heap[pos as usize];
        let later = (deadline, seq) > (e.deadline, e.seq);
        e.deadline = deadline;
        e.seq = seq;
        match later {
            true => self.sift_down(pos as usize, slots),
            false => {
                self.sift_up(pos as usize, slots);
            }
        }
    }

    /// Removes the entry at `pos` and returns it; its slot leaves the heap (its position is
    /// cleared and its bucket handed back).
    pub(crate) fn remove<T>(&mut self, pos: u32, slots: &mut Slots<T>) -> Waiting {
        let pos = pos as usize;
        let last = self.heap.pop().expect("an entry at `pos`");
        if pos == self.heap.len() {
            slots.leave_heap(last.slot, last.bucket);
            return last;
        }
        let removed = self.heap[pos];
        slots.leave_heap(removed.slot, removed.bucket);
        self.heap[pos] = last;
        let up = self.sift_up(pos, slots);
        if up == pos {
            self.sift_down(pos, slots);
        }
        removed
    }

    /// Removes and returns the earliest entry; its slot's position is cleared.
    ///
    /// The last entry replaces the root and usually belongs near the bottom, so the hole is moved
    /// down to a leaf first (one comparison per level, between the children) and the entry sifted
    /// up from there, instead of comparing it at every level on the way down (two per level).
    pub(crate) fn pop<T>(&mut self, slots: &mut Slots<T>) -> Option<Waiting> {
        let last = self.heap.pop()?;
        let Some(&root) = self.heap.first() else {
            slots.leave_heap(last.slot, last.bucket);
            return Some(last);
        };
        slots.leave_heap(root.slot, root.bucket);
        let n = self.heap.len();
        let mut hole = 0;
        loop {
            let left = 2 * hole + 1;
            if left >= n {
                break;
            }
            let child = self.earlier_child(left, n);
            self.heap[hole] = self.heap[child];
            slots.set_heap_pos(self.heap[hole].slot, hole as u32);
            hole = child;
        }
        self.heap[hole] = last;
        self.sift_up(hole, slots);
        Some(root)
    }

    /// Removes every entry, yielding their slots (positions cleared).
    pub(crate) fn clear<T>(&mut self, slots: &mut Slots<T>) -> Vec<SlotId> {
        self.heap
            .drain(..)
            .map(|e| {
                slots.leave_heap(e.slot, e.bucket);
                e.slot
            })
            .collect()
    }

    /// Changes the kind of the entry at `pos`, keeping its place (its sequence is unique, so the
    /// order does not change).
    pub(crate) fn set_kind(&mut self, pos: u32, kind: Kind) {
        let e = &mut self.heap[pos as usize];
        e.seq = Waiting::order(e.seq >> KIND_BITS, kind);
    }

    /// Records a new index bucket for the entry at `pos` (the index was rebuilt).
    #[inline]
    pub(crate) fn set_bucket(&mut self, pos: u32, bucket: u32) {
        self.heap[pos as usize].bucket = bucket;
    }

    /// Compaction: renames the slots `remap` moved (an entry keeps its position, so the slots'
    /// recorded positions stay right) and frees the room the heap does not use.
    pub(crate) fn remap(&mut self, remap: &Remap) {
        for e in &mut self.heap {
            e.slot = remap.slot(e.slot);
        }
        self.heap.shrink_to_fit();
    }

    pub(crate) fn shrink(&mut self) {
        self.heap = Vec::new();
    }

    pub(crate) fn allocated_bytes(&self) -> usize {
        self.heap.capacity() * size_of::<Waiting>()
    }

    /// Of the children at `left` and `left + 1` (if within the first `n` entries), the one that
    /// leaves first.
    #[inline(always)]
    fn earlier_child(&self, left: usize, n: usize) -> usize {
        let right = left + 1;
        if right < n && self.heap[right].before(&self.heap[left]) {
            right
        } else {
            left
        }
    }

    fn sift_up<T>(&mut self, mut pos: usize, slots: &mut Slots<T>) -> usize {
        let entry = self.heap[pos];
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if !entry.before(&self.heap[parent]) {
                break;
            }
            self.heap[pos] = self.heap[parent];
            slots.set_heap_pos(self.heap[pos].slot, pos as u32);
            pos = parent;
        }
        self.heap[pos] = entry;
        slots.set_heap_pos(entry.slot, pos as u32);
        pos
    }

    fn sift_down<T>(&mut self, mut pos: usize, slots: &mut Slots<T>) {
        let entry = self.heap[pos];
        let n = self.heap.len();
        loop {
            let left = 2 * pos + 1;
            if left >= n {
                break;
            }
            let child = self.earlier_child(left, n);
            if !self.heap[child].before(&entry) {
                break;
            }
            self.heap[pos] = self.heap[child];
            slots.set_heap_pos(self.heap[pos].slot, pos as u32);
            pos = child;
        }
        self.heap[pos] = entry;
        slots.set_heap_pos(entry.slot, pos as u32);
    }

    /// Checks the heap order and the position index (for `check_invariants`).
    pub(crate) fn check<T>(&self, slots: &Slots<T>) {
        for (i, e) in self.heap.iter().enumerate() {
            assert_eq!(slots.heap_pos(e.slot), Some(i as u32));
            if i > 0 {
                assert!(!e.before(&self.heap[(i - 1) / 2]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_deadline_then_sequence_order_and_keeps_index() {
        let mut slots = Slots::new();
        let mut heap = WaitingHeap::new();
        let deadlines = [50u64, 10, 30, 10, 70, 20, 30];
        for (seq, &d) in deadlines.iter().enumerate() {
            let slot = slots.insert(seq);
            heap.push(
                Waiting {
                    deadline: d,
                    seq: seq as u64,
                    slot,
                    bucket: 0,
                },
                &mut slots,
            );
            heap.check(&slots);
        }
        // Move the 70 to 5.
        let last = *heap.get(slots.heap_pos(4).unwrap());
        heap.decrease(slots.heap_pos(last.slot).unwrap(), 5, 100, &mut slots);
        heap.check(&slots);
        let mut out = Vec::new();
        while let Some(e) = heap.pop(&mut slots) {
            heap.check(&slots);
            out.push((e.deadline, e.seq));
        }
        let mut expected: Vec<(u64, u64)> = deadlines
            .iter()
            .enumerate()
            .map(|(s, &d)| if s == 4 { (5, 100) } else { (d, s as u64) })
            .collect();
        expected.sort();
        assert_eq!(out, expected);
    }

    #[test]
    fn kinds_ride_in_the_sequence_without_changing_the_order() {
        for kind in [Kind::Reminder, Kind::Retry, Kind::Debounce, Kind::Parked] {
            let w = Waiting {
                deadline: 1,
                seq: Waiting::order(7, kind),
                slot: 0,
                bucket: 0,
            };
            assert_eq!(w.kind(), kind);
            let later = Waiting {
                seq: Waiting::order(8, Kind::Reminder),
                ..w
            };
            assert!(w.before(&later));
        }
        let mut slots = Slots::new();
        let mut heap = WaitingHeap::new();
        let slot = slots.insert(0);
        let entry = Waiting {
            deadline: 5,
            seq: Waiting::order(3, Kind::Parked),
            slot,
            bucket: 0,
        };
        heap.push(entry, &mut slots);
        heap.set_kind(0, Kind::Retry);
        assert_eq!((heap.get(0).kind(), heap.get(0).seq >> 2), (Kind::Retry, 3));
    }

    #[test]
    fn a_large_heap_pops_in_order_through_pushes_and_decreases() {
        // A deterministic stream of operations on up to a few thousand entries, with many equal
        // deadlines (FIFO by sequence among them), checked against a sorted reference.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut slots = Slots::new();
        let mut heap = WaitingHeap::new();
        let mut reference: Vec<(u64, u64, SlotId)> = Vec::new();
        let mut seq = 0;
        for step in 0..20_000 {
            match next() % 10 {
                0..=3 => {
                    let slot = slots.insert(step);
                    let deadline = next() % 500;
                    heap.push(
                        Waiting {
                            deadline,
                            seq,
                            slot,
                            bucket: slot,
                        },
                        &mut slots,
                    );
                    reference.push((deadline, seq, slot));
                    seq += 1;
                }
                4 if !reference.is_empty() => {
                    let i = (next() % reference.len() as u64) as usize;
                    let (d, _, slot) = reference[i];
                    let deadline = d.saturating_sub(1 + next() % 50);
                    if deadline == d {
                        continue; // already 0: the state only moves strictly earlier
                    }
                    heap.decrease(slots.heap_pos(slot).unwrap(), deadline, seq, &mut slots);
                    reference[i] = (deadline, seq, slot);
                    seq += 1;
                }
                5 if !reference.is_empty() => {
                    // Any direction: a debounce moves an entry later too.
                    let i = (next() % reference.len() as u64) as usize;
                    let (_, _, slot) = reference[i];
                    let deadline = next() % 500;
                    heap.reschedule(slots.heap_pos(slot).unwrap(), deadline, seq, &mut slots);
                    reference[i] = (deadline, seq, slot);
                    seq += 1;
                }
                6 if !reference.is_empty() => {
                    let i = (next() % reference.len() as u64) as usize;
                    let (d, s, slot) = reference.swap_remove(i);
                    let got = heap.remove(slots.heap_pos(slot).unwrap(), &mut slots);
                    assert_eq!((got.deadline, got.seq, got.slot), (d, s, slot));
                    assert_eq!(slots.heap_pos(slot), None);
                    assert_eq!(slots.bucket(slot), slot, "the bucket came back");
                }
                _ => {
                    let min = (0..reference.len()).min_by_key(|&i| reference[i]);
                    let expected = min.map(|i| reference.swap_remove(i));
                    let got = heap.pop(&mut slots).map(|w| (w.deadline, w.seq, w.slot));
                    assert_eq!(got, expected);
                    if let Some((_, _, slot)) = got {
                        assert_eq!(slots.bucket(slot), slot, "the bucket came back");
                    }
                }
            }
            if step % 97 == 0 {
                heap.check(&slots);
            }
        }
        heap.check(&slots);
        reference.sort_unstable();
        for expected in reference {
            let got = heap.pop(&mut slots).map(|w| (w.deadline, w.seq, w.slot));
            assert_eq!(got, Some(expected));
        }
        assert!(heap.pop(&mut slots).is_none());
    }
}
