//! Per-key timing for queue metrics, kept only by states whose driver enables it.
//!
//! An unnamed queue never allocates this: [`QueueState`](super::QueueState) holds an
//! `Option<Box<Timing>>` that stays `None`, so keys cost no extra bytes. A named queue with
//! metrics keeps, per slot, the time of the first add since the last get and the time processing
//! started (client-go's `addTimes` / `processingStartTimes`), plus what happened since the driver
//! last emitted.

use std::time::Duration;

use workqueue_ratelimit::Instant;

use super::slots::SlotId;

const NONE: u64 = u64::MAX;

/// Timing data for metrics, indexed by slot (see the module docs).
#[derive(Debug, Default)]
pub struct Timing {
    added: Vec<u64>,
    started: Vec<u64>,
    depth: u64,
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
    /// The key in `slot` became newly dirty (client-go's "counts as an add").
    #[inline]
    pub(crate) fn on_add(&mut self, slot: SlotId, now: u64) {
        self.adds += 1;
        self.depth += 1;
        let added = entry(&mut self.added, slot);
        if *added == NONE {
            *added = now;
        }
    }

    /// The key in `slot` was handed out.
    #[inline]
    pub(crate) fn on_get(&mut self, slot: SlotId, now: u64) {
        self.depth = self.depth.saturating_sub(1);
        *entry(&mut self.started, slot) = now;
        let added = entry(&mut self.added, slot);
        if *added != NONE {
            self.queue_latencies.push(now.saturating_sub(*added));
            *added = NONE;
        }
    }

    /// The get of the key in `slot` was undone (see `QueueState::unget`): it is queued again, and
    /// its queue latency counts from `now` (the first one was already observed).
    pub(crate) fn on_unget(&mut self, slot: SlotId, now: u64, dirty: bool) {
        *entry(&mut self.started, slot) = NONE;
        if !dirty {
            self.depth += 1;
            *entry(&mut self.added, slot) = now;
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
    }
}
