//! The add rules that look at why a key waits (its entry's [`Kind`]), beyond earliest-wins.
//!
//! - **Parked** (outage detection, `parking.rs`): while the detector is open, an add of a key
//!   that is parked, or waits to be the probe, leaves it so: only the probe and the release run
//!   it. Its priority is raised for the release. [`AddOptions::bypass_parking`] skips the rule.
//! - **Backoff** ([`QueueState::set_keep_backoff`], off by default): an add of a key waiting on
//!   a rate-limited retry leaves it waiting until the retry's time, and a retry that fails
//!   a key re-added during its run carries that re-add instead of queueing it at once.
//! - **Debounce** ([`AddOptions::debounced`]): a debounced add moves a waiting key to its own
//!   time, later or earlier.
//!
//! An add without delay of a key that is queued or being processed does not look at its waiting
//! entry (it is de-duplicated, or marks the key dirty), as without these rules.

use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use super::waiting::{Kind, Waiting};
use super::{AddStatus, Finished, QueueState, SlotId, Ticket, duration_to_nanos};
use crate::options::AddOptions;
use crate::outcome::{Op, Outcome};

impl<T: Hash + Eq + Clone, S: BuildHasher> QueueState<T, S> {
    /// Whether an add leaves a key that waits on a rate-limited retry waiting until the retry's
    /// time (default: `false`, client-go's rule: an add makes a waiting key ready at once).
    ///
    /// With it on, events for a failing key do not defeat its backoff:
    /// - an add of a key whose waiting entry is a rate-limited retry ([`AddOptions::rate_limited`],
    ///   or a `retry()` of its lease; not a delay such as `retry_after(d)`) changes nothing but
    ///   the entry's priority, raised if the add asks for a higher one; a key that is also
    ///   queued or processing is added as usual (an add without delay de-duplicates or marks
    ///   it dirty);
    /// - a rate-limited add keeps the earliest deadline, as without the option;
    /// - a lease that finishes with a rate-limited retry while its key was re-added during the
    ///   run is not queued again at once: the retry carries the re-add, at the higher of the two
    ///   priorities.
    ///
    /// The key runs when its backoff ends; a success then resets it.
    pub fn set_keep_backoff(&mut self, enabled: bool) {
        self.keep_backoff = enabled;
    }

    /// Whether an add of a tracked key may be held: by the outage detector's parking, or by
    /// `keep_backoff`.
    #[inline(always)]
    pub(crate) fn holds(&self) -> bool {
        self.parking.is_some() || self.keep_backoff
    }

    /// The held-add rule for a tracked slot (see the module docs): `Some(status)` when the
    /// slot's waiting entry holds the add, which then changes nothing but the entry's priority.
    #[cold]
    #[inline(never)]
    pub(super) fn held(
        &mut self,
        slot: SlotId,
        opts: &AddOptions,
        delayed: bool,
    ) -> Option<AddStatus> {
        let pos = self.slots.heap_pos(slot)?;
        let queued = self.slots.is_queued(slot);
        let debounced = opts.debounced && !opts.rate_limited;
        if ((queued || self.slots.is_processing(slot)) && !delayed) || (queued && debounced) {
            // De-duplicated, dirty, or a debounced add of a queued key: the entry is not touched.
            return None;
        }
        match self.waiting.get(pos).kind() {
            Kind::Parked if !opts.bypass_parking && self.is_outage_open() => {
                self.raise_waiting(slot, opts.priority);
                Some(AddStatus::Parked)
            }
            Kind::Retry if self.keep_backoff && !opts.rate_limited => {
                Some(match self.raise_waiting(slot, opts.priority) {
                    true => AddStatus::Waiting,
                    false => AddStatus::AlreadyWaiting,
                })
            }
            _ => None,
        }
    }

    /// The debounced-add rule for a tracked slot: queued, nothing changes but the priority;
    /// waiting, it waits until `deadline` instead (a new sequence), at the higher priority;
    /// else it waits until `deadline`.
    #[inline(never)]
    pub(super) fn debounce(&mut self, slot: SlotId, deadline: u64, priority: i32) -> AddStatus {
        if self.slots.is_queued(slot) {
            return self.enqueue(slot, priority);
        }
        let Some(pos) = self.slots.heap_pos(slot) else {
            return self.schedule(slot, deadline, priority, Kind::Debounce);
        };
        let seq = Waiting::order(self.seq, Kind::Debounce);
        self.seq += 1;
        self.waiting.reschedule(pos, deadline, seq, &mut self.slots);
        self.raise_waiting(slot, priority);
        AddStatus::Waiting
    }

    /// Raises the priority of `slot`'s waiting entry to `priority` if that is higher; returns
    /// whether it did.
    pub(super) fn raise_waiting(&mut self, slot: SlotId, priority: i32) -> bool {
        let raised = priority > self.waiting_priority(slot);
        if raised {
            self.set_waiting_priority(slot, priority);
        }
        raised
    }

    /// Whether the outage detector is on and open.
    pub(super) fn is_outage_open(&self) -> bool {
        self.outage_detector().is_some_and(|d| d.is_open())
    }

    /// With `keep_backoff`: whether a finish with `op` and the limiter's delay `limiter_delay`
    /// is a retry that carries a re-add made during the run (one that is stored: not after
    /// shutdown, not zero, not never).
    #[cold]
    pub(super) fn retry_carries_dirty(&self, op: Op, limiter_delay: Option<Duration>) -> bool {
        let Op::Retry(min) = op else {
            return false;
        };
        !self.shutting_down
            && limiter_delay.map(|d| d.max(min)).is_some_and(|d| {
                !d.is_zero() && self.now.saturating_add(duration_to_nanos(d)) != u64::MAX
            })
    }

    /// The rest of a finish (processing already cleared) whose rate-limited retry carries the
    /// re-add made during the run, at `dirty` (see [`QueueState::retry_carries_dirty`]): the key
    /// waits for the retry, at the higher of the two priorities.
    #[cold]
    #[inline(never)]
    pub(super) fn finish_carrying_dirty(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        dirty: i32,
    ) -> Finished<T> {
        let slot = ticket.slot;
        self.withdraw_dirty(slot, dirty);
        let (Op::Retry(min), Some(delay)) = (outcome.op, limiter_delay) else {
            unreachable!("only a stored retry carries a re-add");
        };
        let deadline = self.now.saturating_add(duration_to_nanos(delay.max(min)));
        let priority = outcome.priority.unwrap_or(ticket.priority).max(dirty);
        self.schedule(slot, deadline, priority, Kind::Retry);
        Finished {
            requeued: false,
            waiting: true,
            released: None,
            outage: None,
        }
    }

    /// A re-add made while `slot` was processing (its dirty mark, at `priority`, already
    /// cleared) is carried by a waiting entry instead of queueing the key: the metrics' depth
    /// no longer counts it.
    pub(super) fn withdraw_dirty(&mut self, slot: SlotId, priority: i32) {
        if let Some(t) = &mut self.timing {
            t.on_withdraw(slot, priority);
        }
    }
}
