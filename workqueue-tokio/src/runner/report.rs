//! What a run did.

use std::sync::atomic::{AtomicU64, Ordering};

use super::action::{Failure, Reconciled};

/// Counters of a [`Runner::run`](super::Runner::run), returned when it ends (see `run` for when).
///
/// Each lease a worker took is counted once: as `processed`, as `interrupted`, or as a failure
/// (`errors`, `panics` or `timeouts`) that was then `retried` or `given_up`. `get_panics` and
/// `worker_panics` count what went wrong outside any lease; both are 0 in a healthy run. The
/// `source_*` counters and `sources_ended` count what the runner read from its sources
/// ([`Runner::source`](super::Runner::source)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Reconciles that finished successfully (`Ok`, whatever [`Action`](super::Action) they
    /// returned).
    pub processed: u64,
    /// Failed reconciles that were retried (with backoff or a fixed delay).
    pub retried: u64,
    /// Failed reconciles that were given up.
    pub given_up: u64,
    /// Reconciles that returned an error.
    pub errors: u64,
    /// Keys whose handling panicked: in the reconcile, or in code the runner called for them (the
    /// key's `Clone` or `Debug`, the limiter's `num_requeues`, a metrics recorder).
    pub panics: u64,
    /// Reconciles that timed out.
    pub timeouts: u64,
    /// Reconciles dropped at shutdown because they outlived the grace periods (their keys were
    /// retried, so they are not lost if the queue lives on).
    pub interrupted: u64,
    /// Panics that escaped the queue's `get` (a key's `Clone` or a metrics recorder inside the
    /// queue). No key was leased, so no other counter saw them; after each, the worker paused
    /// briefly (100 ms) before it asked for a key again.
    pub get_panics: u64,
    /// Worker tasks that ended with a panic the runner did not catch (a tracing subscriber that
    /// panics as a worker enters a reconcile's span; otherwise none should: this is defence in
    /// depth). The key is retried, and another worker is started whenever reconciles under way
    /// outnumber the workers left.
    pub worker_panics: u64,
    /// Keys still ready in the queue when the run ended.
    pub still_queued: usize,
    /// Keys read from the runner's sources and added to the queue (each one, de-duplicated or
    /// not; errors are counted in `source_errors`).
    pub source_items: u64,
    /// Errors the sources yielded; each was logged and skipped.
    pub source_errors: u64,
    /// Sources whose stream ended (or panicked) while the runner ran; the runner went on
    /// without them. Sources still open at shutdown are not counted: the runner stopped reading
    /// them.
    pub sources_ended: u64,
    /// Sources that panicked while they were polled (counted in `sources_ended` too: a source
    /// that panicked is not polled again; what it yielded before was added).
    pub source_panics: u64,
    /// With outage detection ([`Builder::outage_detection`](crate::Builder::outage_detection)):
    /// keys still parked in the queue when the run ended (the queue lives on: they stay parked
    /// until a probe succeeds).
    pub parked: usize,
    /// With outage detection: parked keys that the queue's shutdown dropped (parked keys are
    /// waiting keys, and a shutdown drops waiting keys; drains do not wait for them).
    pub parked_dropped: usize,
    /// With outage detection: how many times the detector opened during the queue's life.
    pub outage_openings: u64,
}

/// The [`Report`]'s counters while the run goes on (the jobs, the dispatcher and the sources'
/// readers count concurrently).
#[derive(Debug, Default)]
pub(super) struct Counters {
    processed: AtomicU64,
    retried: AtomicU64,
    given_up: AtomicU64,
    errors: AtomicU64,
    panics: AtomicU64,
    timeouts: AtomicU64,
    interrupted: AtomicU64,
    get_panics: AtomicU64,
    source_items: AtomicU64,
    source_errors: AtomicU64,
    sources_ended: AtomicU64,
    source_panics: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A panic escaped the queue's `get`.
    pub(super) fn get_panicked(&self) {
        Self::bump(&self.get_panics);
    }

    /// A source added `n` keys.
    pub(super) fn source_items(&self, n: usize) {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        self.source_items.fetch_add(n, Ordering::Relaxed);
    }

    /// A source yielded an error.
    pub(super) fn source_error(&self) {
        Self::bump(&self.source_errors);
    }

    /// A source ended; `panicked`: by a panic.
    pub(super) fn source_ended(&self, panicked: bool) {
        Self::bump(&self.sources_ended);
        if panicked {
            Self::bump(&self.source_panics);
        }
    }

    /// Counts one lease's verdict: exactly one of processed, interrupted, or a failure (error,
    /// panic or timeout) with its decision (retried or given up).
    pub(super) fn count<E>(&self, verdict: &Reconciled<E>) {
        match verdict {
            Reconciled::Ok(_) => Self::bump(&self.processed),
            Reconciled::Interrupted => Self::bump(&self.interrupted),
            Reconciled::Failed(failure, _) => {
                Self::bump(match failure {
                    Failure::Error(_) => &self.errors,
                    Failure::Panic(_) => &self.panics,
                    Failure::Timeout => &self.timeouts,
                });
                Self::bump(if verdict.given_up() {
                    &self.given_up
                } else {
                    &self.retried
                });
            }
        }
    }

    pub(super) fn report(
        &self,
        still_queued: usize,
        worker_panics: u64,
        (parked, parked_dropped, outage_openings): (usize, usize, u64),
    ) -> Report {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Report {
            processed: get(&self.processed),
            retried: get(&self.retried),
            given_up: get(&self.given_up),
            errors: get(&self.errors),
            panics: get(&self.panics),
            timeouts: get(&self.timeouts),
            interrupted: get(&self.interrupted),
            get_panics: get(&self.get_panics),
            worker_panics,
            still_queued,
            source_items: get(&self.source_items),
            source_errors: get(&self.source_errors),
            sources_ended: get(&self.sources_ended),
            source_panics: get(&self.source_panics),
            parked,
            parked_dropped,
            outage_openings,
        }
    }
}
