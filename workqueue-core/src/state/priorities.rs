//! Per-key priorities, kept by a state only once a priority other than 0 is used.
//!
//! Until then every key is at priority 0 and [`QueueState`](super::QueueState) holds `None`
//! instead, so a queue that never uses priorities pays no bytes per key for them.

use super::slots::{Remap, SlotId};

/// Priorities indexed by slot.
///
/// A value is meaningful only while its slot is in the matching state: `queued` for a queued slot
/// (the priority of its ready entry) or a dirty one (the priority it is queued at when its lease
/// ends); `waiting` for a slot in the waiting heap. Other values are stale and never read.
#[derive(Debug, Default)]
pub(crate) struct Priorities {
    queued: Vec<i32>,
    waiting: Vec<i32>,
}

fn get(v: &[i32], slot: SlotId) -> i32 {
    v.get(slot as usize).copied().unwrap_or(0)
}

fn set(v: &mut Vec<i32>, slot: SlotId, priority: i32) {
    let i = slot as usize;
    if i >= v.len() {
        v.resize(i + 1, 0);
    }
    v[i] = priority;
}

impl Priorities {
    #[inline]
    pub(crate) fn queued(&self, slot: SlotId) -> i32 {
        get(&self.queued, slot)
    }

    #[inline]
    pub(crate) fn set_queued(&mut self, slot: SlotId, priority: i32) {
        set(&mut self.queued, slot, priority)
    }

    #[inline]
    pub(crate) fn waiting(&self, slot: SlotId) -> i32 {
        get(&self.waiting, slot)
    }

    #[inline]
    pub(crate) fn set_waiting(&mut self, slot: SlotId, priority: i32) {
        set(&mut self.waiting, slot, priority)
    }

    /// Compaction: each moved slot's priorities move with it.
    pub(crate) fn remap(&mut self, remap: &Remap) {
        remap.side(&mut self.queued, 0);
        remap.side(&mut self.waiting, 0);
    }

    /// Frees buffers larger than `above` entries; called when the state is empty.
    pub(crate) fn shrink_if_large(&mut self, above: usize) {
        for v in [&mut self.queued, &mut self.waiting] {
            if v.capacity() > above {
                *v = Vec::new();
            }
        }
    }

    pub(crate) fn allocated_bytes(&self) -> usize {
        size_of::<Self>() + (self.queued.capacity() + self.waiting.capacity()) * size_of::<i32>()
    }
}
