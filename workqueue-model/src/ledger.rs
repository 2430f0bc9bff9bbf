//! [`Ledger`]: per-key bookkeeping that checks a queue's two basic promises under concurrency.
//!
//! Shared by the soak examples (`workqueue-core/examples/soak.rs`,
//! `workqueue-tokio/examples/soak_async.rs`) and the multi-threaded stress tests. Keys are
//! indexed `0..len`; each user maps its own keys to indices.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

/// How many violations [`Ledger::violation`] prints before it only counts them.
const PRINTED: u64 = 10;

/// Thread-safe bookkeeping of adds and leases, for keys indexed `0..len`.
///
/// It checks the two invariants every work queue must keep, whatever the interleaving:
///
/// - **exclusivity**: a key is never held by two leases at once. [`leased`](Ledger::leased)
///   sets the key's "held" flag and [`releasing`](Ledger::releasing) clears it (call it just
///   before finishing the lease); finding the flag already in the state it is set to is a
///   violation.
/// - **no lost add**: every key added is processed at least once after its last add. A global
///   tick clock stamps each add ([`adding`](Ledger::adding), called *before* the queue
///   operation) and each lease; once the queue is drained, [`check_processed`] finds every key
///   whose last lease is older than its last add.
///
/// Violations are counted ([`violations`](Ledger::violations)) and the first few are printed to
/// stderr as `{label}: VIOLATION: …`; callers can record their own checks with
/// [`violation`](Ledger::violation).
///
/// ```
/// use workqueue_model::Ledger;
///
/// let ledger = Ledger::new(2, "doc");
/// ledger.adding(1);
/// assert_eq!(ledger.check_processed(""), 1); // key 1 added, never leased
/// ledger.leased(1);
/// ledger.releasing(1);
/// assert_eq!(ledger.check_processed(""), 0);
/// assert_eq!(ledger.check_released(""), 0);
/// assert_eq!(ledger.violations(), 1);
/// ```
///
/// [`check_processed`]: Ledger::check_processed
#[derive(Debug)]
pub struct Ledger {
    label: &'static str,
    held: Vec<AtomicBool>,
    last_add: Vec<AtomicU64>,
    last_lease: Vec<AtomicU64>,
    clock: AtomicU64,
    violations: AtomicU64,
}

impl Ledger {
    /// A ledger for keys `0..keys`, nothing added or held; `label` prefixes printed violations.
    pub fn new(keys: usize, label: &'static str) -> Self {
        Ledger {
            label,
            held: (0..keys).map(|_| AtomicBool::new(false)).collect(),
            last_add: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            last_lease: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            clock: AtomicU64::new(1),
            violations: AtomicU64::new(0),
        }
    }

    /// How many keys the ledger tracks.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether the ledger tracks no keys at all.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The next stamp of the clock (stamps start at 1; 0 means "never").
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, SeqCst)
    }

    /// Call before an add of key `i` (any kind of add, re-adds and retries included): the add
    /// happens after this stamp.
    pub fn adding(&self, i: usize) {
        self.last_add[i].fetch_max(self.tick(), SeqCst);
    }

    /// A lease of key `i` was handed out: takes the key's flag (a violation if another lease
    /// holds it) and stamps the lease.
    pub fn leased(&self, i: usize) {
        if self.held[i].swap(true, SeqCst) {
            self.violation(format_args!("key {i} held by two leases"));
        }
        self.last_lease[i].fetch_max(self.tick(), SeqCst);
    }

    /// About to finish the lease of key `i`: clears the key's flag (a violation if it was not
    /// set).
    pub fn releasing(&self, i: usize) {
        if !self.held[i].swap(false, SeqCst) {
            self.violation(format_args!("key {i} released but not held"));
        }
    }

    /// Whether key `i` has been added at least once.
    pub fn was_added(&self, i: usize) -> bool {
        self.last_add[i].load(SeqCst) != 0
    }

    /// Once the queue is drained (no add or lease in flight): records a violation for every key
    /// added and not leased after its last add, each message prefixed with `context`. Returns how
    /// many keys failed.
    pub fn check_processed(&self, context: impl fmt::Display) -> u64 {
        let mut failed = 0;
        for i in 0..self.len() {
            let (a, l) = (
                self.last_add[i].load(SeqCst),
                self.last_lease[i].load(SeqCst),
            );
            if a != 0 && l < a {
                failed += 1;
                self.violation(format_args!(
                    "{context}key {i}: last added at stamp {a}, last processed at {l}"
                ));
            }
        }
        failed
    }

    /// Once no lease is outstanding: records a violation for every key still held, each message
    /// prefixed with `context`. Returns how many keys failed.
    pub fn check_released(&self, context: impl fmt::Display) -> u64 {
        let mut failed = 0;
        for (i, held) in self.held.iter().enumerate() {
            if held.load(SeqCst) {
                failed += 1;
                self.violation(format_args!("{context}key {i} still held after drain"));
            }
        }
        failed
    }

    /// Records a violation of any check; the first few are printed to stderr.
    pub fn violation(&self, what: fmt::Arguments<'_>) {
        if self.violations.fetch_add(1, SeqCst) < PRINTED {
            eprintln!("{}: VIOLATION: {what}", self.label);
        }
    }

    /// How many violations were recorded so far.
    pub fn violations(&self) -> u64 {
        self.violations.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::Ledger;

    #[test]
    fn clean_run_has_no_violations() {
        let l = Ledger::new(3, "test");
        l.adding(0);
        l.adding(2);
        l.leased(0);
        l.adding(0); // re-added while held
        l.releasing(0);
        l.leased(0);
        l.releasing(0);
        l.leased(2);
        l.releasing(2);
        assert_eq!(l.check_processed(""), 0);
        assert_eq!(l.check_released(""), 0);
        assert!(l.was_added(0) && !l.was_added(1) && l.was_added(2));
        assert_eq!(l.violations(), 0);
    }

    #[test]
    fn each_broken_invariant_is_a_violation() {
        let l = Ledger::new(2, "test");
        l.leased(0);
        l.leased(0); // held twice
        assert_eq!(l.violations(), 1);
        l.releasing(1); // never held
        assert_eq!(l.violations(), 2);
        assert_eq!(l.check_released("round 0: "), 1); // key 0 still held
        l.adding(1); // added after its last lease (none)
        assert_eq!(l.check_processed("round 0: "), 1);
        assert_eq!(l.violations(), 4);
    }
}
