//! The state's invariant checker: a walk over every slot, for tests, fuzzing and debugging.

use std::hash::{BuildHasher, Hash};

use super::ready::OVERDUE;
use super::slots::NO_POS;
use super::timing::Timing;
use super::{QueueState, age_status};

impl<T: Hash + Eq + Clone, S: BuildHasher> QueueState<T, S> {
    /// Panics if an invariant of the state is broken. For tests, fuzzing and debugging: it walks
    /// every slot.
    pub(crate) fn check_invariants(&self) {
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
}
