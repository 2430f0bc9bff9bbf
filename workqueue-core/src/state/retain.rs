//! Removing keys by a predicate: what a replica does with the keys of a shard it gives away.

use std::hash::{BuildHasher, Hash};

use super::{QueueState, SlotId};

impl<T: Hash + Eq + Clone, S: BuildHasher> QueueState<T, S> {
    /// Keeps only the keys for which `keep` returns `true`: every other key that is queued or
    /// waiting (delayed, debounced, in backoff, parked, waiting to be the probe) is removed, and
    /// returned (in no particular order), so that a driver forgets each in its rate limiter and
    /// drops it outside its lock. A key that is being processed stays until its lease finishes:
    /// its re-add made meanwhile (dirty) and its waiting entry are dropped, so that the finish
    /// does not queue it again, but a re-add the finish itself asks for (a retry, a requeue) is
    /// applied as usual: a caller that gives such a key away finishes its lease without one
    /// (`Outcome::done()` or `Outcome::forget()`).
    ///
    /// `keep` is called once for every key the state tracks, before anything changes: if it
    /// panics, the state is as it was. It is the only user code called (no `Hash`, `Eq` or
    /// `Clone`). No time passes: due keys are not promoted. Works after shutdown too.
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_core::state::{Get, QueueState};
    /// use workqueue_core::{AddOptions, Instant};
    ///
    /// let mut q: QueueState<u32> = QueueState::new();
    /// let t0 = Instant::ZERO;
    /// for k in 0..6 {
    ///     q.add(k, AddOptions::new(), t0);
    /// }
    /// q.add(7, AddOptions::new().after(Duration::from_secs(1)), t0);
    /// let Get::Ready(ticket, 0) = q.get(t0) else { panic!() };
    /// q.add(0, AddOptions::new(), t0); // dirty
    /// // Give the odd keys and key 0 away.
    /// let mut removed = q.retain(|k| k % 2 == 0 && *k != 0);
    /// removed.sort();
    /// assert_eq!(removed, [1, 3, 5, 7]);
    /// assert_eq!(q.len(t0), 2); // 2 and 4
    /// // Key 0 is still processing; its finish does not queue it again.
    /// let _ = q.finish(ticket, workqueue_core::Outcome::done(), None, t0, |_| Duration::ZERO);
    /// assert_eq!(q.counts().tracked, 2);
    /// ```
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> Vec<T> {
        // User code first, and only there: nothing changes until every key has been asked.
        let dropped: Vec<SlotId> = self
            .slots
            .iter_live()
            .filter(|(_, key)| !keep(key))
            .map(|(slot, _)| slot)
            .collect();
        if dropped.is_empty() {
            return Vec::new();
        }
        let plain = self.ready.is_plain();
        let mut dequeued = false;
        for &slot in &dropped {
            if self.slots.is_queued(slot) {
                let priority = self.queued_priority(slot);
                if !plain {
                    self.ready
                        .remove(slot, self.level_of(slot), self.group_of(slot));
                }
                self.slots.clear_queued(slot);
                self.withdraw_dirty(slot, priority);
                dequeued = true;
            } else if self.slots.is_dirty(slot) {
                let priority = self.queued_priority(slot);
                self.slots.clear_dirty(slot);
                self.withdraw_dirty(slot, priority);
            }
            if let Some(pos) = self.slots.heap_pos(slot) {
                self.waiting.remove(pos, &mut self.slots);
            }
        }
        if plain && dequeued {
            let slots = &self.slots;
            self.ready.plain_retain(|&s| slots.is_queued(s));
        }
        let probe_removed = self.forget_removed_probe();
        let removed: Vec<T> = dropped
            .into_iter()
            .filter_map(|slot| self.release_if_unreferenced(slot))
            .collect();
        if probe_removed {
            self.schedule_probe();
        }
        removed
    }
}
