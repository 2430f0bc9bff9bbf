//! What a run did.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a [`Runner::run`](super::Runner::run), returned when it ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Reconciles that finished successfully (`Ok`).
    pub processed: u64,
    /// Failed reconciles that were retried (with backoff or a fixed delay).
    pub retried: u64,
    /// Failed reconciles that were given up.
    pub given_up: u64,
    /// Reconciles that returned an error.
    pub errors: u64,
    /// Reconciles that panicked.
    pub panics: u64,
    /// Reconciles that timed out.
    pub timeouts: u64,
    /// Reconciles dropped at shutdown because they outlived the grace periods (their keys were
    /// retried, so they are not lost if the queue lives on).
    pub interrupted: u64,
    /// Keys still ready in the queue when the run ended.
    pub still_queued: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) processed: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) given_up: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) panics: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) interrupted: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn report(&self, still_queued: usize) -> Report {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Report {
            processed: get(&self.processed),
            retried: get(&self.retried),
            given_up: get(&self.given_up),
            errors: get(&self.errors),
            panics: get(&self.panics),
            timeouts: get(&self.timeouts),
            interrupted: get(&self.interrupted),
            still_queued,
        }
    }
}
