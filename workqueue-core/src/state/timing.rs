//! Per-key timing for queue metrics, kept only by states whose driver enables it.
//!
//! An unnamed queue never allocates this: [`QueueState`](super::QueueState) holds an
//! `Option<Box<Timing>>` that stays `None`, so keys cost no extra bytes. A named queue with
//! metrics keeps, per slot, the time of the first add since the last get and the time processing
//! started (client-go's `addTimes` / `processingStartTimes`), the depth per priority, plus what
//! happened since the driver last emitted.

use std::time::Duration;

use workqueue_ratelimit::Instant;

use super::slots::{Remap, SlotId};

/// How many distinct priorities get a [`PRIORITY_LABEL`](crate::metrics::PRIORITY_LABEL) value
/// of their own (controller-runtime's limit).
pub(crate) const PRIORITY_LABELS: usize = 25;

const NONE: u64 = u64::MAX;

/// Timing data for metrics, indexed by slot (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Timing {
    /// Per slot: the first add since the last get, and when processing started (`NONE` when
    /// unset). One array, so a key's times share a cache line.
    times: Vec<Times>,
    depths: PriorityDepths,
    /// Operations since the driver last sent its metrics.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) unflushed: u32,
    /// The waiting depth the driver last emitted.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) last_waiting: Option<usize>,
    adds: u64,
    queue_latencies: Vec<u64>,
    work_durations: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Times {
    added: u64,
    started: u64,
}

const UNSET: Times = Times {
    added: NONE,
    started: NONE,
};

#[inline]
fn entry(v: &mut Vec<Times>, slot: SlotId) -> &mut Times {
    let i = slot as usize;
    // Indexed inside the check: indexed after it, the index was checked again (the compiler
    // cannot see that `grow` made room), on every add, get and finish.
    if i < v.len() {
        return &mut v[i];
    }
    grow(v, i)
}

/// Makes room for slot `i`, doubling: a growing queue asks for one more slot at each new key.
#[cold]
fn grow(v: &mut Vec<Times>, i: usize) -> &mut Times {
    let len = (i + 1).max(v.len() * 2).max(16);
    v.resize(len, UNSET);
    &mut v[i]
}

impl Timing {
    /// The key in `slot` became newly dirty (client-go's "counts as an add") at `priority`.
    #[inline]
    pub(crate) fn on_add(&mut self, slot: SlotId, now: u64, priority: i32) {
        self.adds += 1;
        *self.depths.count(priority) += 1;
        let times = entry(&mut self.times, slot);
        if times.added == NONE {
            times.added = now;
        }
    }

    /// The key in `slot`, dirty at `priority`, was handed out.
    #[inline]
    pub(crate) fn on_get(&mut self, slot: SlotId, now: u64, priority: i32) {
        let count = self.depths.count(priority);
        *count = count.saturating_sub(1);
        let times = entry(&mut self.times, slot);
        times.started = now;
        if times.added != NONE {
            self.queue_latencies.push(now.saturating_sub(times.added));
            times.added = NONE;
        }
    }

    /// The get of the key in `slot` was undone (see `QueueState::unget`): it is queued again at
    /// `priority`, and its queue latency counts from `now` (the first one was already observed).
    /// `dirty_at` is the priority of the re-add made while it was handed out, if there was one:
    /// that re-add is already counted in the depth.
    pub(crate) fn on_unget(
        &mut self,
        slot: SlotId,
        now: u64,
        priority: i32,
        dirty_at: Option<i32>,
    ) {
        entry(&mut self.times, slot).started = NONE;
        match dirty_at {
            Some(from) => self.on_raise(from, priority),
            None => {
                *self.depths.count(priority) += 1;
                entry(&mut self.times, slot).added = now;
            }
        }
    }

    /// The key in `slot`, dirty at `priority`, stopped being dirty without being handed out (it
    /// was removed, or its re-add is carried by a waiting entry).
    pub(crate) fn on_withdraw(&mut self, slot: SlotId, priority: i32) {
        let count = self.depths.count(priority);
        *count = count.saturating_sub(1);
        entry(&mut self.times, slot).added = NONE;
    }

    /// A dirty key's priority went from `from` to `to`: its depth moves to the new label.
    #[inline]
    pub(crate) fn on_raise(&mut self, from: i32, to: i32) {
        if from != to {
            let count = self.depths.count(from);
            *count = count.saturating_sub(1);
            *self.depths.count(to) += 1;
        }
    }

    /// The key in `slot` was finished.
    #[inline]
    pub(crate) fn on_finish(&mut self, slot: SlotId, now: u64) {
        let times = entry(&mut self.times, slot);
        if times.started != NONE {
            self.work_durations.push(now.saturating_sub(times.started));
            times.started = NONE;
        }
    }

    /// client-go's depth: keys that are dirty (queued, or re-added while processing).
    pub(crate) fn depth(&self) -> u64 {
        self.depths.entries.iter().map(|e| e.count).sum()
    }

    /// client-go's depth by priority: each priority seen so far with its number of dirty keys
    /// (0 once they are all handed out), in the order the priorities were first seen. After
    /// [`PRIORITY_LABELS`] distinct priorities, later ones are counted together under `None`.
    pub(crate) fn depth_by_priority(&self) -> impl Iterator<Item = (Option<i32>, u64)> + '_ {
        self.depths.entries.iter().map(|e| (e.label, e.count))
    }

    /// Calls `f` with each priority's depth that changed since the last call (every one with
    /// `all`), as [`Timing::depth_by_priority`] gives them.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn take_changed_depths(&mut self, all: bool, mut f: impl FnMut(Option<i32>, u64)) {
        for e in &mut self.depths.entries {
            if e.changed || all {
                e.changed = false;
                f(e.label, e.count);
            }
        }
    }

    /// The number of adds since the last call.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn take_adds(&mut self) -> u64 {
        std::mem::take(&mut self.adds)
    }

    /// The queue latencies (first add since the last get, to get) observed since the last call.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn drain_queue_latencies(&mut self) -> impl Iterator<Item = Duration> + '_ {
        self.queue_latencies.drain(..).map(Duration::from_nanos)
    }

    /// The work durations (get to finish) observed since the last call.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn drain_work_durations(&mut self) -> impl Iterator<Item = Duration> + '_ {
        self.work_durations.drain(..).map(Duration::from_nanos)
    }

    /// The sum and the maximum of the ages of the keys being processed at `now`.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn unfinished_work(&self, now: Instant) -> (Duration, Duration) {
        let now = now.as_nanos();
        let (mut total, mut longest) = (0u64, 0u64);
        for started in self.times.iter().map(|t| t.started).filter(|&s| s != NONE) {
            let age = now.saturating_sub(started);
            total = total.saturating_add(age);
            longest = longest.max(age);
        }
        (Duration::from_nanos(total), Duration::from_nanos(longest))
    }

    /// The longest time a key whose `is_ready(slot)` holds has been dirty at `now`: since its
    /// first add after it was last handed out. `None` when no such key is dirty.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn oldest_ready(
        &self,
        now: Instant,
        is_ready: impl Fn(SlotId) -> bool,
    ) -> Option<Duration> {
        let now = now.as_nanos();
        let mut oldest = None;
        for (slot, added) in self.times.iter().map(|t| t.added).enumerate() {
            if added != NONE && oldest.is_none_or(|o| added < o) && is_ready(slot as SlotId) {
                oldest = Some(added);
            }
        }
        oldest.map(|added| Duration::from_nanos(now.saturating_sub(added)))
    }

    /// Compaction: each moved slot's times move with it.
    pub(crate) fn remap(&mut self, remap: &Remap) {
        remap.side(&mut self.times, UNSET);
    }

    /// Frees per-slot buffers larger than `above` entries; called when the state is empty, so no
    /// slot has timing data left.
    pub(crate) fn shrink_if_large(&mut self, above: usize) {
        if self.times.capacity() > above {
            self.times = Vec::new();
        }
    }

    /// Heap bytes held.
    pub(crate) fn allocated_bytes(&self) -> usize {
        size_of::<Self>()
            + self.times.capacity() * size_of::<Times>()
            + (self.queue_latencies.capacity() + self.work_durations.capacity()) * size_of::<u64>()
            + self.depths.entries.capacity() * size_of::<Depth>()
    }
}

/// Dirty keys per priority (see [`Timing::depth_by_priority`]).
///
/// Invariant: `entries` holds at most [`PRIORITY_LABELS`] entries labelled by a priority, 0 first
/// (so a queue's depth series exists before its first add), then in the order they were first
/// seen, and at most one overflow entry (label `None`): a priority first seen after the limit is
/// counted there for good. Entries are never removed, so a label keeps its series once it has
/// one. `changed` marks the entries whose count changed since the driver last took them.
#[derive(Debug)]
struct PriorityDepths {
    entries: Vec<Depth>,
}

#[derive(Debug, Clone, Copy)]
struct Depth {
    label: Option<i32>,
    count: u64,
    changed: bool,
}

impl Default for PriorityDepths {
    fn default() -> Self {
        PriorityDepths {
            entries: vec![Depth {
                label: Some(0),
                count: 0,
                changed: true,
            }],
        }
    }
}

impl PriorityDepths {
    /// The count for `priority`, marked changed. The first entry is checked first, inline:
    /// without priorities, every key is at 0 and this is one comparison (a search through
    /// `position` cost about 9 instructions per add and per get even then).
    #[inline]
    fn count(&mut self, priority: i32) -> &mut u64 {
        let e = match self.entries.first() {
            Some(e) if e.label == Some(priority) => &mut self.entries[0],
            _ => self.entry_other(priority),
        };
        e.changed = true;
        &mut e.count
    }

    /// [`PriorityDepths::count`]'s entry for a priority other than the first entry's label.
    fn entry_other(&mut self, priority: i32) -> &mut Depth {
        let found = self
            .entries
            .iter()
            .skip(1)
            .position(|e| e.label == Some(priority));
        let i = match found {
            Some(i) => i + 1,
            None => self.entry_new(priority),
        };
        &mut self.entries[i]
    }

    #[cold]
    fn entry_new(&mut self, priority: i32) -> usize {
        let labelled = self.entries.iter().filter(|e| e.label.is_some()).count();
        let label = (labelled < PRIORITY_LABELS).then_some(priority);
        if label.is_none()
            && let Some(i) = self.entries.iter().position(|e| e.label.is_none())
        {
            return i;
        }
        self.entries.push(Depth {
            label,
            count: 0,
            changed: true,
        });
        self.entries.len() - 1
    }
}
