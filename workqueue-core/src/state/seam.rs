//! What tests, fuzzers and the reference model reach inside a state. Re-exported by the crate's
//! unstable `__private` module: not a stable API.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

pub use super::compaction::COMPACT_MIN;
use super::{Finished, QueueState, Ticket};

/// Whether a finish put the key back in the ready FIFO, and whether the key now waits: what
/// [`Finished`] records for the differential tests.
pub fn finished_flags<T>(finished: &Finished<T>) -> (bool, bool) {
    (finished.requeued, finished.waiting)
}

/// Introspection and test switches of a [`QueueState`], for the workspace's tests, fuzz targets
/// and reference model (`workqueue-model`). Not a stable API.
pub trait StateTesting<T> {
    /// Panics if an invariant of the state is broken. It walks every slot.
    fn check_invariants(&self);
    /// How many times the state compacted.
    fn compactions(&self) -> u64;
    /// Compacts now (see `QueueState::get`'s compaction): hashes every live key first, so a
    /// `Hash` that panics leaves the state as it was.
    fn compact(&mut self);
    /// Starts keeping per-key timing for metrics, as a named queue does (`check_invariants`
    /// then also recounts the depth per priority). Idempotent.
    fn enable_timing(&mut self);
    /// Compacts from `min` live keys instead of [`COMPACT_MIN`], so that `get` compacts on its
    /// own with a handful of keys.
    fn set_compact_min(&mut self, min: usize);
    /// `false`: compacts at the first get below the threshold, without waiting for the live
    /// count to settle there. Default: `true`.
    fn set_settle(&mut self, enabled: bool);
    /// Records only index buckets below `limit` in the slots, as if the index were larger than a
    /// slot word can address, so that a handful of keys take the path of huge queues.
    fn limit_recorded_buckets(&mut self, limit: u32);
    /// The key a ticket was issued for, without finishing it (`None` for a foreign ticket).
    fn ticket_key(&self, ticket: &Ticket) -> Option<&T>;
    /// The ready keys in the order they are served (cloned).
    fn ready_keys(&self) -> Vec<T>;
    /// Whether `key` is in the ready FIFO.
    fn is_queued<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized;
    /// The deadline `key` waits for, if it waits.
    fn waiting_deadline<Q>(&self, key: &Q) -> Option<crate::Instant>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized;
    /// Whether `key` is parked by the outage detector (the key waiting to be the probe is not).
    fn is_parked<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized;
    /// Whether a lease for `key` is outstanding.
    fn is_processing<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized;
    /// The priority `key` is queued at, or, while it is processed and was re-added, the priority
    /// it is queued at when its lease ends.
    fn queued_priority_of<Q>(&self, key: &Q) -> Option<i32>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized;
    /// The priority of `key`'s waiting entry, if it waits.
    fn waiting_priority_of<Q>(&self, key: &Q) -> Option<i32>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized;
}

impl<T: Hash + Eq + Clone, S: BuildHasher> StateTesting<T> for QueueState<T, S> {
    fn check_invariants(&self) {
        QueueState::check_invariants(self)
    }

    fn compactions(&self) -> u64 {
        QueueState::compactions(self)
    }

    fn compact(&mut self) {
        QueueState::compact(self)
    }

    fn enable_timing(&mut self) {
        QueueState::enable_timing(self)
    }

    fn set_compact_min(&mut self, min: usize) {
        QueueState::set_compact_min(self, min)
    }

    fn set_settle(&mut self, enabled: bool) {
        QueueState::set_settle(self, enabled)
    }

    fn limit_recorded_buckets(&mut self, limit: u32) {
        QueueState::limit_recorded_buckets(self, limit)
    }

    fn ticket_key(&self, ticket: &Ticket) -> Option<&T> {
        QueueState::ticket_key(self, ticket)
    }

    fn ready_keys(&self) -> Vec<T> {
        QueueState::ready_keys(self)
    }

    fn is_queued<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        QueueState::is_queued(self, key)
    }

    fn waiting_deadline<Q>(&self, key: &Q) -> Option<crate::Instant>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        QueueState::waiting_deadline(self, key)
    }

    fn is_parked<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        QueueState::is_parked(self, key)
    }

    fn is_processing<Q>(&self, key: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        QueueState::is_processing(self, key)
    }

    fn queued_priority_of<Q>(&self, key: &Q) -> Option<i32>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        QueueState::queued_priority_of(self, key)
    }

    fn waiting_priority_of<Q>(&self, key: &Q) -> Option<i32>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        QueueState::waiting_priority_of(self, key)
    }
}
