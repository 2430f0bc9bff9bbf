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
use crate::metrics::PRIORITY_LABELS;

const NONE: u64 = u64::MAX;

/// Timing data for metrics, indexed by slot (see the module docs).
#[derive(Debug, Default)]
pub struct Timing {
    added: Vec<u64>,
    started: Vec<u64>,
    depth: u64,
    depths: PriorityDepths,
    adds: u64,
    queue_latencies: Vec<u64>,
    work_durations: Vec<u64>,
}

fn entry(v: &mut Vec<u64>, slot: SlotId) -> &mut u64 {
    let i = slot as usize;
    if i >= v.len() {
        v.resize(i + 1, NONE);
    }
    &mut v[i]
}

impl Timing {
    /// The key in `slot` became newly dirty (client-go's "counts as an add") at `priority`.
    #[inline]
    pub(crate) fn on_add(&mut self, slot: SlotId, now: u64, priority: i32) {
        self.adds += 1;
        self.depth += 1;
        *self.depths.count(priority) += 1;
        let added = entry(&mut self.added, slot);
        if *added == NONE {
            *added = now;
        }
    }

    /// The key in `slot`, dirty at `priority`, was handed out.
    #[inline]
    pub(crate) fn on_get(&mut self, slot: SlotId, now: u64, priority: i32) {
        self.depth = self.depth.saturating_sub(1);
        let count = self.depths.count(priority);
        *count = count.saturating_sub(1);
        *entry(&mut self.started, slot) = now;
        let added = entry(&mut self.added, slot);
        if *added != NONE {
            self.queue_latencies.push(now.saturating_sub(*added));
            *added = NONE;
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
        *entry(&mut self.started, slot) = NONE;
        match dirty_at {
            Some(from) => self.on_raise(from, priority),
            None => {
                self.depth += 1;
                *self.depths.count(priority) += 1;
                *entry(&mut self.added, slot) = now;
            }
        }
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
        let started = entry(&mut self.started, slot);
        if *started != NONE {
            self.work_durations.push(now.saturating_sub(*started));
            *started = NONE;
        }
    }

    /// client-go's depth: keys that are dirty (queued, or re-added while processing).
    pub fn depth(&self) -> u64 {
        self.depth
    }

    /// client-go's depth by priority: each priority seen so far with its number of dirty keys
    /// (0 once they are all handed out), in the order the priorities were first seen. After
    /// [`PRIORITY_LABELS`] distinct priorities, later ones are counted together under `None`.
    pub fn depth_by_priority(&self) -> impl Iterator<Item = (Option<i32>, u64)> + '_ {
        let overflow = self
            .depths
            .overflowed
            .then_some((None, self.depths.overflow));
        self.depths
            .labelled
            .iter()
            .map(|&(p, n)| (Some(p), n))
            .chain(overflow)
    }

    /// The number of adds since the last call.
    pub fn take_adds(&mut self) -> u64 {
        std::mem::take(&mut self.adds)
    }

    /// The queue latencies (first add since the last get, to get) observed since the last call.
    pub fn drain_queue_latencies(&mut self) -> impl Iterator<Item = Duration> + '_ {
        self.queue_latencies.drain(..).map(Duration::from_nanos)
    }

    /// The work durations (get to finish) observed since the last call.
    pub fn drain_work_durations(&mut self) -> impl Iterator<Item = Duration> + '_ {
        self.work_durations.drain(..).map(Duration::from_nanos)
    }

    /// The sum and the maximum of the ages of the keys being processed at `now`.
    pub fn unfinished_work(&self, now: Instant) -> (Duration, Duration) {
        let now = now.as_nanos();
        let (mut total, mut longest) = (0u64, 0u64);
        for &started in self.started.iter().filter(|&&s| s != NONE) {
            let age = now.saturating_sub(started);
            total = total.saturating_add(age);
            longest = longest.max(age);
        }
        (Duration::from_nanos(total), Duration::from_nanos(longest))
    }

    /// The longest time a key whose `is_ready(slot)` holds has been dirty at `now`: since its
    /// first add after it was last handed out. `None` when no such key is dirty.
    pub fn oldest_ready(
        &self,
        now: Instant,
        is_ready: impl Fn(SlotId) -> bool,
    ) -> Option<Duration> {
        let now = now.as_nanos();
        let mut oldest = None;
        for (slot, &added) in self.added.iter().enumerate() {
            if added != NONE && oldest.is_none_or(|o| added < o) && is_ready(slot as SlotId) {
                oldest = Some(added);
            }
        }
        oldest.map(|added| Duration::from_nanos(now.saturating_sub(added)))
    }

    /// Compaction: each moved slot's times move with it.
    pub(crate) fn remap(&mut self, remap: &Remap) {
        remap.side(&mut self.added, NONE);
        remap.side(&mut self.started, NONE);
    }

    /// Frees per-slot buffers larger than `above` entries; called when the state is empty, so no
    /// slot has timing data left.
    pub(crate) fn shrink_if_large(&mut self, above: usize) {
        for v in [&mut self.added, &mut self.started] {
            if v.capacity() > above {
                *v = Vec::new();
            }
        }
    }

    /// Heap bytes held.
    pub fn allocated_bytes(&self) -> usize {
        size_of::<Self>()
            + (self.added.capacity()
                + self.started.capacity()
                + self.queue_latencies.capacity()
                + self.work_durations.capacity())
                * size_of::<u64>()
            + self.depths.labelled.capacity() * size_of::<(i32, u64)>()
    }
}

/// Dirty keys per priority (see [`Timing::depth_by_priority`]).
///
/// Invariant: `labelled` holds at most [`PRIORITY_LABELS`] distinct priorities, 0 first (so a
/// queue's depth series exists before its first add), then in the order they were first seen.
/// Entries are never removed, so a label keeps its series once it has one. A priority first seen
/// after the limit is counted in `overflow` for good.
#[derive(Debug)]
struct PriorityDepths {
    labelled: Vec<(i32, u64)>,
    overflow: u64,
    overflowed: bool,
}

impl Default for PriorityDepths {
    fn default() -> Self {
        PriorityDepths {
            labelled: vec![(0, 0)],
            overflow: 0,
            overflowed: false,
        }
    }
}

impl PriorityDepths {
    /// The count for `priority`. The first entry is checked first: without priorities, every key
    /// is at 0 and this is one comparison.
    #[inline]
    fn count(&mut self, priority: i32) -> &mut u64 {
        if let Some(i) = self.labelled.iter().position(|e| e.0 == priority) {
            return &mut self.labelled[i].1;
        }
        self.count_new(priority)
    }

    #[cold]
    fn count_new(&mut self, priority: i32) -> &mut u64 {
        if self.labelled.len() < PRIORITY_LABELS {
            self.labelled.push((priority, 0));
            let last = self.labelled.len() - 1;
            return &mut self.labelled[last].1;
        }
        self.overflowed = true;
        &mut self.overflow
    }
}
