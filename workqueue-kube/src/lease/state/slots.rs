//! What this replica does with each shard besides believing it holds it.
//!
//! Invariants:
//! - `epoch` is `Some` exactly while the replica believes it holds the shard (the three
//!   conditions of the [state machine](super)), a new number for each belief.
//! - `Draining` only with an epoch: the controller was asked to stop the shard's work.
//! - `Giving` only without one: the shard was drained and its Lease, at `rv` and naming this
//!   replica, is being written to its target; the replica does not believe it again until its
//!   view shows the Lease changed (the write may land late, or not at all).
//! - A shard Lease is written again only once the view shows it changed since the last write,
//!   or a retry period after that write: an answer that outruns the watch sends no duplicate.

use super::super::clock::LocalInstant;
use super::record::Rv;

#[derive(Clone, Debug, Default)]
enum SlotPhase {
    #[default]
    Idle,
    Draining,
    Giving {
        rv: Rv,
    },
}

/// One shard's slot; its methods keep the invariants above.
#[derive(Clone, Debug, Default)]
pub(super) struct Slot {
    epoch: Option<u64>,
    phase: SlotPhase,
    /// The last write of this shard's Lease: the resourceVersion it was under (`None`: a
    /// create), and when another may be sent regardless of the view.
    wrote: Option<(Option<Rv>, LocalInstant)>,
}

impl Slot {
    /// The number of the current belief (`None`: not believed).
    pub(super) fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// Neither draining nor being given away.
    pub(super) fn idle(&self) -> bool {
        matches!(self.phase, SlotPhase::Idle)
    }

    /// Being given away: the resourceVersion of its Lease naming this replica.
    pub(super) fn giving(&self) -> Option<&Rv> {
        match &self.phase {
            SlotPhase::Giving { rv } => Some(rv),
            _ => None,
        }
    }

    /// A belief began, numbered `epoch`.
    pub(super) fn believe(&mut self, epoch: u64) {
        self.epoch = Some(epoch);
    }

    /// The belief ended without a hand-over: a drain under way is moot.
    pub(super) fn lose(&mut self) {
        self.epoch = None;
        if matches!(self.phase, SlotPhase::Draining) {
            self.phase = SlotPhase::Idle;
        }
    }

    /// Asks for a drain if believed and idle: the belief's epoch, or `None` (nothing changed).
    pub(super) fn drain(&mut self) -> Option<u64> {
        let (Some(epoch), SlotPhase::Idle) = (self.epoch, &self.phase) else {
            return None;
        };
        self.phase = SlotPhase::Draining;
        Some(epoch)
    }

    /// The controller drained it: the belief ends, and the shard is given away from its Lease
    /// at `rv` (the view shows it naming this replica; `None`: nothing to give). The belief's
    /// epoch, or `None` (nothing changed) if it was not draining.
    pub(super) fn drained(&mut self, rv: Option<Rv>) -> Option<u64> {
        let (SlotPhase::Draining, Some(epoch)) = (&self.phase, self.epoch) else {
            return None;
        };
        self.epoch = None;
        self.phase = match rv {
            Some(rv) => SlotPhase::Giving { rv },
            None => SlotPhase::Idle,
        };
        Some(epoch)
    }

    /// No longer being given away: its Lease changed, or it is taken back.
    pub(super) fn stop_giving(&mut self) {
        self.phase = SlotPhase::Idle;
    }

    /// A write of the shard's Lease was sent under `under`; another may go at `retry_at`
    /// regardless of the view.
    pub(super) fn sent(&mut self, under: Option<Rv>, retry_at: LocalInstant) {
        self.wrote = Some((under, retry_at));
    }

    /// Whether the last write was sent under `rv`.
    pub(super) fn sent_under(&self, rv: &Rv) -> bool {
        self.wrote
            .as_ref()
            .is_some_and(|(under, _)| under.as_ref() == Some(rv))
    }

    /// Whether the shard's Lease may be written now, given its resourceVersion in the view
    /// (`None`: absent).
    pub(super) fn may_write(&self, seen: Option<&Rv>, now: LocalInstant) -> bool {
        match &self.wrote {
            None => true,
            Some((under, retry_at)) => now >= *retry_at || under.as_ref() != seen,
        }
    }

    /// The next instant a write may be retried by time alone.
    pub(super) fn retry_at(&self) -> Option<LocalInstant> {
        self.wrote.as_ref().map(|(_, t)| *t)
    }
}
