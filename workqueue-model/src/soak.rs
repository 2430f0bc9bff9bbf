//! What the two soak programs share (`workqueue-core/examples/soak.rs` for the blocking queue,
//! `workqueue-tokio/examples/soak_async.rs` for the async one): their common options, the keys
//! and the [`Ledger`] that checks them, operation counts, the check after each drain, and the
//! process's resident memory.
//!
//! Both programs keep one key processing ([`HELD`]) and one waiting ([`WAITING`]) throughout, so
//! that a drain leaves [`RESIDUAL`] keys and the queue must give the memory of its bursts of
//! fresh keys ([`BURST`]) back by compacting, not by emptying.

use std::sync::Arc;

use workqueue_core::__private::COMPACT_MIN;
use workqueue_core::Lease;
use workqueue_core::state::Counts;

use crate::Ledger;

/// The soaks' keys: `ns/obj-{i}`, cheap to clone.
pub type Key = Arc<str>;

/// Keys per burst of fresh keys (from a range of their own, after the `--keys` ones).
pub const BURST: usize = 4096;
/// Most leases one worker holds at once (`try_get_batch` takes up to this many).
pub const MAX_BATCH: usize = 8;
/// The key held processing throughout (outside the book).
pub const HELD: &str = "residual/held";
/// The key waiting throughout, an hour away (outside the book).
pub const WAITING: &str = "residual/waiting";
/// Keys a drain leaves: [`HELD`] and [`WAITING`].
pub const RESIDUAL: usize = 2;
/// After a drain the queue holds at most this many times a fresh queue's bytes.
pub const BOUND: usize = 4;

/// The options both soaks take (flattened into each one's own `Config`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Args {
    /// Seconds to run, all rounds together.
    #[arg(long, default_value_t = 10.0, value_parser = non_negative_seconds)]
    pub seconds: f64,
    /// Distinct keys (at least 1), besides bursts of fresh keys.
    #[arg(long, default_value_t = 256)]
    pub keys: usize,
    /// Seed of the random operations.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    /// Passed by `cargo bench`-style runners; ignored.
    #[arg(long, hide = true)]
    pub bench: bool,
}

impl Args {
    /// These options with a count of 0 taken as 1.
    #[must_use]
    pub fn normalized(mut self) -> Self {
        self.keys = self.keys.max(1);
        self
    }

    /// The seed of worker `worker` in round `round`: distinct for every pair.
    pub fn seed_of(&self, round: usize, worker: usize) -> u64 {
        self.seed ^ ((round as u64) << 32) ^ (worker as u64 + 1)
    }
}

/// Parses `--seconds`: a finite, non-negative number.
pub fn non_negative_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("not a non-negative number of seconds: {s}")),
    }
}

/// The keys (`ns/obj-{i}`, indexed by `i`: the `--keys` ones, then the [`BURST`] ones) and the
/// [`Ledger`] that checks them.
#[derive(Debug)]
pub struct Book {
    /// Key `i` is `names[i]`.
    pub names: Vec<Key>,
    /// The bookkeeping of every key's adds and leases.
    pub ledger: Ledger,
}

impl Book {
    /// `keys` keys plus [`BURST`] burst keys; `label` prefixes the violations printed.
    pub fn new(keys: usize, label: &'static str) -> Self {
        let n = keys + BURST;
        Book {
            names: (0..n).map(|i| Key::from(format!("ns/obj-{i}"))).collect(),
            ledger: Ledger::new(n, label),
        }
    }

    /// A lease was handed out: records it in the ledger; returns the key's index.
    ///
    /// # Panics
    ///
    /// If the lease's key is not one of the book's.
    pub fn leased(&self, lease: &Lease<Key>) -> usize {
        let i = lease
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .unwrap_or_else(|| panic!("not a key of the book: {:?}", &**lease));
        self.ledger.leased(i);
        i
    }

    /// Checks the queue once round `round` drained it: it tracks exactly the residual keys (one
    /// processing, one waiting, none ready), and its `allocated_bytes()` are at most `bound`
    /// ([`BOUND`] times a fresh queue's). Records a violation otherwise.
    pub fn check_drained(&self, round: usize, counts: Counts, bytes: usize, bound: usize) {
        let c = counts;
        if (c.tracked, c.processing, c.waiting, c.ready) != (RESIDUAL, 1, 1, 0) {
            self.ledger.violation(format_args!(
                "round {round}: after the drain the queue holds {c:?}, not the residual keys"
            ));
        }
        if bytes > bound {
            self.ledger.violation(format_args!(
                "round {round}: {bytes} bytes after the drain, above {BOUND}x a fresh queue with \
                 {COMPACT_MIN} keys ({bound})"
            ));
        }
    }
}

/// Operation counts of one worker, a round, or a whole run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Operations started.
    pub ops: u64,
    /// Leases taken.
    pub gets: u64,
    /// Keys added (a batch counts its keys).
    pub adds: u64,
    /// Gets cancelled before they took a key (the async soak's).
    pub cancelled: u64,
}

impl Tally {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: Tally) {
        self.ops += other.ops;
        self.gets += other.gets;
        self.adds += other.adds;
        self.cancelled += other.cancelled;
    }
}

/// The process's resident set size in KiB (`VmRSS` of `/proc/self/status`; Linux only).
pub fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A size from [`rss_kib`], for printing: `123 KiB`, or `?`.
pub fn show_kib(kib: Option<u64>) -> String {
    kib.map_or("?".into(), |v| format!("{v} KiB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_book_maps_its_keys_to_their_indices() {
        let book = Book::new(3, "test");
        assert_eq!(book.names.len(), 3 + BURST);
        assert_eq!(&*book.names[2], "ns/obj-2");
        assert_eq!(book.ledger.len(), 3 + BURST);
    }

    #[test]
    fn seconds_must_be_finite_and_non_negative() {
        assert_eq!(non_negative_seconds("2.5"), Ok(2.5));
        assert!(non_negative_seconds("-1").is_err());
        assert!(non_negative_seconds("inf").is_err());
        assert!(non_negative_seconds("ten").is_err());
    }

    #[test]
    fn tallies_merge() {
        let mut a = Tally {
            ops: 1,
            gets: 2,
            adds: 3,
            cancelled: 4,
        };
        a.merge(a);
        assert_eq!((a.ops, a.gets, a.adds, a.cancelled), (2, 4, 6, 8));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn rss_is_read_on_linux() {
        assert!(rss_kib().is_some_and(|k| k > 0));
    }

    #[test]
    fn sizes_print_in_kib() {
        assert_eq!(show_kib(None), "?");
        assert_eq!(show_kib(Some(7)), "7 KiB");
    }
}
