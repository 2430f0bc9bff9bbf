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
pub(crate) enum SlotPhase {
    #[default]
    Idle,
    Draining,
    Giving {
        rv: Rv,
    },
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Slot {
    pub(crate) epoch: Option<u64>,
    pub(crate) phase: SlotPhase,
    /// The last write of this shard's Lease: the resourceVersion it was under (`None`: a
    /// create), and when another may be sent regardless of the view.
    pub(crate) wrote: Option<(Option<Rv>, LocalInstant)>,
}

impl Slot {
    /// Whether the shard's Lease may be written now, given its resourceVersion in the view
    /// (`None`: absent).
    pub(crate) fn may_write(&self, seen: Option<&Rv>, now: LocalInstant) -> bool {
        match &self.wrote {
            None => true,
            Some((under, retry_at)) => now >= *retry_at || under.as_ref() != seen,
        }
    }

    /// The next instant a write may be retried by time alone.
    pub(crate) fn retry_at(&self) -> Option<LocalInstant> {
        self.wrote.as_ref().map(|(_, t)| *t)
    }
}
