//! Aging: a key ready for longer than the limit moves to the overdue level, above every priority
//! (no starvation of low priorities). The overdue level is FIFO in age order, or, with fairness,
//! round-robin across groups like any level, so that overload does not turn fairness back into
//! one FIFO.

use super::slots::{Remap, SlotId};

/// Entries the order may hold beyond twice the live slots before it is pruned.
const PRUNE_SLACK: usize = 1024;

/// The queued keys in the order they became ready, each with the time it did.
///
/// A key becomes ready when it is queued from nothing: at its add, at its deadline when it was
/// delayed (promotion), or when the lease of a key re-added meanwhile ends. A raise does not
/// change it. Each time a slot becomes ready it takes a new generation and the order gains an
/// entry `(since, slot, generation)` at its back. The order is `entries[head..]`: the head
/// advances past dropped entries, and a prune moves the rest down.
///
/// An entry is *current* while its slot is queued or processing under the entry's generation;
/// any other entry is stale. Stale entries are not looked for when they arise (a get, a lease's
/// end and a raise touch nothing here): they are dropped when an overdue search meets them, and
/// all at once when the order outgrows twice the live slots. The entry of a slot being processed
/// stays current, so a get that is undone finds the key at its place in age order again.
///
/// Invariants:
/// - The order is sorted by `since`, stale entries included, and none is later than `last`. So the
///   head's `since` bounds every entry's from below, and `get` decides that no key is overdue
///   from the head alone, without looking at whether it is current.
/// - Every queued slot that is not overdue has exactly one current entry; an overdue slot has
///   none (it left the order when it moved).
/// - When `entries` reaches `prune_at` it is pruned if it holds more than `2 * live +
///   PRUNE_SLACK` entries, `live` being the state's live slots then, and `prune_at` moves to
///   that bound: a prune costs the entries it looks at, and at least `live + PRUNE_SLACK` pushes
///   come between two. Compaction prunes as well, so once the live count settles lower the
///   order follows it.
#[derive(Debug)]
pub(crate) struct Aging {
    /// Nanoseconds a key may be ready before it is overdue.
    pub(crate) max_wait: u64,
    /// Per slot: its generation and whether it is overdue.
    marks: Vec<Mark>,
    entries: Vec<Entry>,
    head: usize,
    last: u64,
    prune_at: usize,
}

/// A slot's mark in [`Aging`]: its generation in the low 31 bits (wrapping), and whether it is
/// overdue in the top bit. Four bytes a slot: the marks are written at every add.
#[derive(Debug, Clone, Copy, Default)]
struct Mark(u32);

impl Mark {
    const OVERDUE: u32 = 1 << 31;

    fn generation(self) -> u32 {
        self.0 & !Self::OVERDUE
    }

    fn is_overdue(self) -> bool {
        self.0 & Self::OVERDUE != 0
    }

    /// The next generation, not overdue.
    fn next(self) -> Mark {
        Mark(self.generation().wrapping_add(1) & !Self::OVERDUE)
    }
}

/// An entry of the age order.
#[derive(Debug, Clone, Copy)]
struct Entry {
    since: u64,
    slot: SlotId,
    generation: u32,
}

impl Aging {
    pub(crate) fn new(max_wait: u64) -> Self {
        Aging {
            max_wait,
            marks: Vec::new(),
            entries: Vec::new(),
            head: 0,
            last: 0,
            prune_at: PRUNE_SLACK,
        }
    }

    /// `slot` became ready at `since`. Returns whether the order is due to be pruned (see
    /// [`Aging::prune`]).
    #[inline]
    pub(crate) fn ready(&mut self, slot: SlotId, since: u64) -> bool {
        let i = slot as usize;
        if i >= self.marks.len() {
            self.grow(i);
        }
        let mark = self.marks[i].next();
        self.marks[i] = mark;
        // Time only moves forward in the state, so `since` is never below the last; the clamp
        // keeps the order sorted even if it were (the key would count as ready a little late).
        let since = since.max(self.last);
        self.last = since;
        self.entries.push(Entry {
            since,
            slot,
            generation: mark.generation(),
        });
        self.entries.len() >= self.prune_at
    }

    /// Makes room for slot `i`, doubling: slots are handed out from the bottom, so a growing
    /// queue asks for one more at each new key.
    #[cold]
    fn grow(&mut self, i: usize) {
        let len = (i + 1).max(self.marks.len() * 2).max(16);
        self.marks.resize(len, Mark::default());
    }

    /// Whether a key may be overdue at `now`: the oldest entry, current or not, has waited
    /// longer than the limit. When not, no key is overdue. The check every `get` makes.
    #[inline(always)]
    pub(crate) fn may_be_overdue(&self, now: u64) -> bool {
        self.entries
            .get(self.head)
            .is_some_and(|e| now.saturating_sub(e.since) > self.max_wait)
    }

    /// Whether `slot` moved to the overdue level (meaningful while it is queued, or processing
    /// after a get that may be undone).
    #[inline]
    pub(crate) fn is_overdue(&self, slot: SlotId) -> bool {
        self.marks
            .get(slot as usize)
            .is_some_and(|m| m.is_overdue())
    }

    /// The next queued slot that has been ready for longer than the limit at `now`, taken out of
    /// the age order and marked overdue. `status(slot)` says whether a slot is queued and whether
    /// it is processing.
    pub(crate) fn next_overdue(
        &mut self,
        now: u64,
        status: impl Fn(SlotId) -> (bool, bool),
    ) -> Option<SlotId> {
        let (i, entry) = self.oldest(status)?;
        if now.saturating_sub(entry.since) <= self.max_wait {
            return None;
        }
        self.remove(i);
        self.marks[entry.slot as usize].0 |= Mark::OVERDUE;
        Some(entry.slot)
    }

    /// The current entry of the queued slot that became ready first, and its position. Stale
    /// entries on the way are dropped; current entries of processing slots are skipped (there
    /// are at most as many as leases out, so dropping an entry behind them moves at most that
    /// many).
    fn oldest(&mut self, status: impl Fn(SlotId) -> (bool, bool)) -> Option<(usize, Entry)> {
        let mut i = self.head;
        while let Some(&entry) = self.entries.get(i) {
            match self.state_of(entry, &status) {
                Some(true) => return Some((i, entry)),
                Some(false) => i += 1,
                None => {
                    // The entries before it move up one: the next is at `i + 1`.
                    self.remove(i);
                    i += 1;
                }
            }
        }
        None
    }

    /// Drops the entry at `i`, moving the ones before it (processing slots' entries: as many
    /// as leases out at most) up by one.
    fn remove(&mut self, i: usize) {
        self.entries.copy_within(self.head..i, self.head + 1);
        self.head += 1;
    }

    /// Whether `entry` is current: `Some(true)` for a queued slot, `Some(false)` for a
    /// processing one, `None` when stale.
    #[inline]
    fn state_of(&self, entry: Entry, status: impl Fn(SlotId) -> (bool, bool)) -> Option<bool> {
        if self.marks[entry.slot as usize].generation() != entry.generation {
            return None;
        }
        match status(entry.slot) {
            (true, _) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        }
    }

    /// [`Aging::ready`] asked for a prune, `live` slots being live: drops every stale entry if
    /// the order holds more than twice as many entries (plus the slack), and sets the length of
    /// the next check. `status` as for [`Aging::next_overdue`].
    #[cold]
    #[inline(never)]
    pub(crate) fn prune_if_due(&mut self, live: usize, status: impl Fn(SlotId) -> (bool, bool)) {
        self.prune_at = 2 * live + PRUNE_SLACK;
        if self.entries.len() >= self.prune_at {
            self.prune(status);
        }
    }

    /// Drops every stale entry. `status` as for [`Aging::next_overdue`].
    pub(crate) fn prune(&mut self, status: impl Fn(SlotId) -> (bool, bool)) {
        let mut entries = std::mem::take(&mut self.entries);
        let mut kept = 0;
        for i in self.head..entries.len() {
            let entry = entries[i];
            if self.state_of(entry, &status).is_some() {
                entries[kept] = entry;
                kept += 1;
            }
        }
        entries.truncate(kept);
        // A burst's buffer goes once it is mostly empty.
        if entries.capacity() > 4 * (kept + PRUNE_SLACK) {
            entries.shrink_to(2 * kept + PRUNE_SLACK);
        }
        self.entries = entries;
        self.head = 0;
    }

    /// The slots of the current entries of queued slots, in order, with their times (for
    /// `check_invariants`).
    pub(crate) fn live(&self, status: impl Fn(SlotId) -> (bool, bool)) -> Vec<(SlotId, u64)> {
        self.entries[self.head..]
            .iter()
            .filter(|&&e| self.state_of(e, &status) == Some(true))
            .map(|e| (e.slot, e.since))
            .collect()
    }

    /// Checks the invariants that need only the order (for `check_invariants`).
    pub(crate) fn check(&self) {
        let order = &self.entries[self.head..];
        assert!(
            order.windows(2).all(|w| w[0].since <= w[1].since),
            "the age order is not sorted by ready time"
        );
        assert!(
            order.last().is_none_or(|e| e.since <= self.last),
            "an entry is later than the latest ready time"
        );
    }

    /// Compaction, after [`Aging::prune`] (so every entry names a live slot): each moved slot's
    /// mark moves with it, and the entries are renamed.
    pub(crate) fn remap(&mut self, remap: &Remap) {
        for entry in &mut self.entries[self.head..] {
            entry.slot = remap.slot(entry.slot);
        }
        remap.side(&mut self.marks, Mark::default());
    }

    /// Forgets every entry (no key is queued or processing).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.head = 0;
        self.prune_at = PRUNE_SLACK;
    }

    /// Frees buffers larger than `above` entries; called when the state is empty.
    pub(crate) fn shrink_if_large(&mut self, above: usize) {
        if self.marks.capacity() > above {
            self.marks = Vec::new();
        }
        if self.entries.capacity() > above {
            self.entries = Vec::new();
        }
    }

    /// Entries in the order, stale ones included (for tests).
    #[cfg(test)]
    pub(crate) fn order_len(&self) -> usize {
        self.entries.len() - self.head
    }

    pub(crate) fn allocated_bytes(&self) -> usize {
        size_of::<Self>()
            + self.marks.capacity() * size_of::<Mark>()
            + self.entries.capacity() * size_of::<Entry>()
    }
}
