//! The runner's own count of failures in a row, per key ([`Context::failures_in_a_row`]).
//!
//! The rate limiter's `num_requeues` counts only rate-limited retries, so a policy that answers
//! `Action::requeue(d)` would never see it grow; this count sees every failure.
//!
//! [`Context::failures_in_a_row`]: super::Context::failures_in_a_row

use std::collections::HashMap;

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use workqueue_core::state::DefaultHashBuilder;

use super::action::Reconciled;
use super::reasons::release_if_large;

/// Invariant: a key has an entry exactly while its last verdict was a failure that was not given
/// up, and the entry is the number of such failures in a row. Memory is bounded by the keys that
/// are failing now (the table's room too, once none is: [`release_if_large`]). A key is handed
/// to one worker at a time, so a read at the start of its reconcile and the update at its end
/// never race for one key.
#[derive(Debug)]
pub(super) struct FailureCounts<T> {
    counts: Mutex<HashMap<T, u32, DefaultHashBuilder>>,
    /// Whether `counts` may hold entries: false only while it is empty (written under its lock),
    /// so that while no key is failing, a reconcile takes no lock here. A key's entry is written
    /// at the end of one lease and read at the start of its next; the queue's lock orders the
    /// two, so the read sees the flag the write set.
    any: AtomicBool,
}

impl<T: Hash + Eq + Clone> FailureCounts<T> {
    pub(super) fn new() -> Self {
        FailureCounts {
            counts: Mutex::new(HashMap::default()),
            any: AtomicBool::new(false),
        }
    }

    /// Failures in a row of `key` so far.
    pub(super) fn get(&self, key: &T) -> u32 {
        if !self.any.load(Ordering::Acquire) {
            return 0;
        }
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.get(key).copied().unwrap_or(0)
    }

    /// Records `key`'s verdict: a success or a give-up resets, any other failure counts, an
    /// interrupted reconcile changes nothing.
    pub(super) fn record<E>(&self, key: &T, verdict: &Reconciled<E>) {
        match verdict {
            Reconciled::Ok(_) => self.reset(key),
            Reconciled::Failed(..) if verdict.given_up() => self.reset(key),
            Reconciled::Failed(..) => {
                let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
                self.any.store(true, Ordering::Release);
                match counts.get_mut(key) {
                    Some(n) => *n = n.saturating_add(1),
                    None => {
                        counts.insert(key.clone(), 1);
                    }
                }
            }
            Reconciled::Interrupted => {}
        }
    }

    /// Forgets `key`'s failures (a success or a give-up).
    fn reset(&self, key: &T) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.remove(key);
        if counts.is_empty() {
            self.any.store(false, Ordering::Release);
            release_if_large(&mut counts);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::runner::{Action, Failure};

    #[test]
    fn every_failure_counts_and_success_or_give_up_resets() {
        let counts = FailureCounts::new();
        let after = Action::requeue(Duration::from_secs(30));
        for expected in 1..=3 {
            counts.record(&"a", &Reconciled::<()>::Failed(Failure::Timeout, after));
            assert_eq!(counts.get(&"a"), expected);
        }
        counts.record(&"a", &Reconciled::<()>::Interrupted);
        assert_eq!(counts.get(&"a"), 3);
        counts.record(&"a", &Reconciled::<()>::Ok(Action::backoff()));
        assert_eq!(counts.get(&"a"), 0);
        counts.record(
            &"b",
            &Reconciled::<()>::Failed(Failure::Error(()), Action::backoff()),
        );
        counts.record(
            &"b",
            &Reconciled::<()>::Failed(Failure::Error(()), Action::await_change()),
        );
        assert_eq!(counts.get(&"b"), 0);
        assert!(
            counts.counts.lock().unwrap().is_empty(),
            "no memory for healthy keys"
        );
    }
}
