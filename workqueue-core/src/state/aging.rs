//! Aging: a key ready for longer than the limit moves to the overdue level, above every priority
//! (no starvation of low priorities). The overdue level is FIFO in age order, or, with fairness,
//! round-robin across groups like any level, so that overload does not turn fairness back into
//! one FIFO.

use std::collections::VecDeque;

use super::slots::{Remap, SlotId};

/// When each queued key became ready, and the queued keys in that order.
///
/// A key becomes ready when it is queued from nothing: at its add, at its deadline when it was
/// delayed (promotion), or when the lease of a key re-added meanwhile ends. A raise does not
/// change it. Each time a slot becomes ready it takes a new generation; `order` holds
/// `(slot, generation)` in the order slots became ready, which is also ready-time order (time
/// only moves forward in the state, and a due key is promoted before any later operation), and
/// entries whose slot is no longer queued under that generation are dropped lazily. The entry of
/// a slot being processed is kept (skipped, not dropped) while its generation is current, so a get
/// that is undone finds the key at its place in age order again.
///
/// Invariants: every queued slot that is not overdue has exactly one entry of its current
/// generation in `order`; an overdue slot has none (it left `order` when it moved); a slot that is
/// neither queued nor processing has none (its generation moved on when its lease ended).
#[derive(Debug)]
pub(crate) struct Aging {
    /// Nanoseconds a key may be ready before it is overdue.
    pub(crate) max_wait: u64,
    /// Per slot, in one array so that a key's age is one cache line: at 100k keys, three arrays
    /// cost W11 a third more time than one.
    ages: Vec<Age>,
    order: VecDeque<(SlotId, u32)>,
}

/// A slot's entry in [`Aging`].
#[derive(Debug, Clone, Copy, Default)]
struct Age {
    since: u64,
    generation: u32,
    overdue: bool,
}

impl Aging {
    pub(crate) fn new(max_wait: u64) -> Self {
        Aging {
            max_wait,
            ages: Vec::new(),
            order: VecDeque::new(),
        }
    }

    /// `slot` became ready at `since`.
    #[inline]
    pub(crate) fn ready(&mut self, slot: SlotId, since: u64) {
        let i = slot as usize;
        if i >= self.ages.len() {
            self.grow(i);
        }
        let age = &mut self.ages[i];
        age.since = since;
        age.overdue = false;
        age.generation = age.generation.wrapping_add(1);
        self.order.push_back((slot, age.generation));
    }

    /// Makes room for slot `i`, doubling: slots are handed out from the bottom, so a growing
    /// queue asks for one more at each new key.
    #[cold]
    fn grow(&mut self, i: usize) {
        let len = (i + 1).max(self.ages.len() * 2).max(16);
        self.ages.resize(len, Age::default());
    }

    /// `slot`'s lease ended: its entry in the order (kept while it was processing, for a get that
    /// is undone) is stale from now on. So a current entry always belongs to a queued or
    /// processing slot, which is what lets [`Aging::next_overdue`] decide from the head alone.
    #[inline]
    pub(crate) fn retire(&mut self, slot: SlotId) {
        if let Some(age) = self.ages.get_mut(slot as usize) {
            age.generation = age.generation.wrapping_add(1);
        }
    }

    /// When `slot` became ready (meaningful while it is queued).
    pub(crate) fn since(&self, slot: SlotId) -> u64 {
        self.ages[slot as usize].since
    }

    /// Whether `slot` moved to the overdue level (meaningful while it is queued, or processing
    /// after a get that may be undone).
    #[inline]
    pub(crate) fn is_overdue(&self, slot: SlotId) -> bool {
        self.ages.get(slot as usize).is_some_and(|a| a.overdue)
    }

    /// The next queued slot that has been ready for longer than the limit at `now`, taken out of
    /// the age order and marked overdue. `status(slot)` says whether a slot is queued and whether
    /// it is processing.
    pub(crate) fn next_overdue(
        &mut self,
        now: u64,
        status: impl Fn(SlotId) -> (bool, bool),
    ) -> Option<SlotId> {
        // The common case, in one look: the head entry is current (its slot is queued or
        // processing) and not overdue, so no entry is: the order is ready-time order.
        let &(head, generation) = self.order.front()?;
        let age = self.ages[head as usize];
        if age.generation == generation && now.saturating_sub(age.since) <= self.max_wait {
            return None;
        }
        let (i, slot) = self.oldest(status)?;
        if now.saturating_sub(self.ages[slot as usize].since) <= self.max_wait {
            return None;
        }
        self.order.remove(i);
        self.ages[slot as usize].overdue = true;
        Some(slot)
    }

    /// The queued slot that became ready first. `status(slot)` says whether a slot is queued
    /// and whether it is processing. Stale entries at the head are dropped; current entries of
    /// processing slots are skipped (there are at most as many as leases out).
    fn oldest(&mut self, status: impl Fn(SlotId) -> (bool, bool)) -> Option<(usize, SlotId)> {
        let mut i = 0;
        while let Some(&(slot, generation)) = self.order.get(i) {
            let current = self.ages[slot as usize].generation == generation;
            match (current, status(slot)) {
                (true, (true, _)) => return Some((i, slot)),
                (true, (false, true)) => i += 1,
                _ if i == 0 => {
                    self.order.pop_front();
                }
                _ => i += 1,
            }
        }
        None
    }

    /// The live entries in order (for `check_invariants`).
    pub(crate) fn live(&self, is_queued: impl Fn(SlotId) -> bool) -> Vec<SlotId> {
        self.order
            .iter()
            .filter(|&&(slot, generation)| {
                is_queued(slot) && self.ages[slot as usize].generation == generation
            })
            .map(|&(slot, _)| slot)
            .collect()
    }

    /// The slots of the current entries (for `check_invariants`).
    pub(crate) fn current(&self) -> impl Iterator<Item = SlotId> + '_ {
        self.order
            .iter()
            .filter(|&&(slot, generation)| self.ages[slot as usize].generation == generation)
            .map(|&(slot, _)| slot)
    }

    /// Compaction: each moved slot's age moves with it, and the order keeps only its current
    /// entries, renamed (a stale entry could name a slot that a moved key now holds, under the
    /// same generation, and would then pass for current).
    pub(crate) fn remap(&mut self, remap: &Remap) {
        let ages = &self.ages;
        self.order.retain(|&(slot, generation)| {
            ages.get(slot as usize)
                .is_some_and(|a| a.generation == generation)
        });
        for entry in &mut self.order {
            entry.0 = remap.slot(entry.0);
        }
        self.order.shrink_to_fit();
        remap.side(&mut self.ages, Age::default());
    }

    /// Forgets every entry (no key is queued).
    pub(crate) fn clear(&mut self) {
        self.order.clear();
    }

    /// Frees buffers larger than `above` entries; called when the state is empty.
    pub(crate) fn shrink_if_large(&mut self, above: usize) {
        if self.ages.capacity() > above {
            self.ages = Vec::new();
        }
        if self.order.capacity() > above {
            self.order = VecDeque::new();
        }
    }

    pub(crate) fn allocated_bytes(&self) -> usize {
        size_of::<Self>()
            + self.ages.capacity() * size_of::<Age>()
            + self.order.capacity() * size_of::<(SlotId, u32)>()
    }
}
