//! The figures of the measurements on a real API server: percentiles, reconcile lag matched by
//! object and resourceVersion, a process's peak memory.

use std::collections::HashMap;
use std::io;

/// The `p`-th percentile (0 to 100) of `values` by the nearest-rank method; `None` when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of `values`.
pub fn median(values: &[f64]) -> Option<f64> {
    percentile(values, 50.0)
}

/// An event about one version of one object: an update the server accepted (its answer's
/// resourceVersion), or a reconcile that started with the object at a resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The object (`namespace/name`).
    pub object: String,
    /// Its resourceVersion: the etcd revision kube-apiserver writes, a number that grows with
    /// every write.
    pub version: u64,
    /// When, in ns on one clock.
    pub at_ns: u128,
}

/// Reconcile lag: for each update, from its acceptance to the start of the first reconcile of
/// the same object that saw it (a resourceVersion at least the update's), in ms. A reconcile may
/// start before the updater saw the answer (the watch was faster): that lag is negative.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lags {
    /// One lag per matched update, in ms.
    pub lags_ms: Vec<f64>,
    /// Updates no reconcile saw.
    pub unmatched: usize,
}

/// Matches each of `updates` with the first of `starts` (by time) of the same object whose
/// version is at least the update's.
pub fn reconcile_lags(updates: &[Versioned], starts: &[Versioned]) -> Lags {
    let mut by_object: HashMap<&str, Vec<&Versioned>> = HashMap::new();
    for start in starts {
        by_object.entry(&start.object).or_default().push(start);
    }
    for starts in by_object.values_mut() {
        starts.sort_by_key(|s| s.at_ns);
    }
    let mut lags = Lags::default();
    for update in updates {
        let seen = by_object
            .get(update.object.as_str())
            .and_then(|starts| starts.iter().find(|s| s.version >= update.version));
        match seen {
            Some(start) => {
                let lag = start.at_ns as f64 - update.at_ns as f64;
                lags.lags_ms.push(lag / 1e6);
            }
            None => lags.unmatched += 1,
        }
    }
    lags
}

/// The peak resident set (`VmHWM`) in KiB from the text of `/proc/<pid>/status`.
pub fn vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The peak resident set of the process `pid` in KiB (`/proc/<pid>/status`; Linux).
pub fn peak_rss_kib(pid: u32) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    vm_hwm_kib(&status)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no VmHWM in the status"))
}

/// This process's peak resident set in KiB.
pub fn own_peak_rss_kib() -> io::Result<u64> {
    peak_rss_kib(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    fn v(object: &str, version: u64, at_ms: u128) -> Versioned {
        Versioned {
            object: object.into(),
            version,
            at_ns: at_ms * 1_000_000,
        }
    }

    #[test]
    fn a_lag_ends_at_the_first_reconcile_that_saw_the_update() {
        let updates = [
            v("a", 10, 100),
            v("a", 12, 105),
            v("b", 11, 100),
            v("c", 1, 0),
        ];
        let starts = [
            // Started before the update: it saw an older version.
            v("a", 9, 101),
            // Saw both of a's updates at once (merged).
            v("a", 12, 130),
            v("a", 13, 200),
            // b's reconcile started before the updater had the answer.
            v("b", 11, 99),
        ];
        let lags = reconcile_lags(&updates, &starts);
        assert_eq!(lags.lags_ms, vec![30.0, 25.0, -1.0]);
        assert_eq!(lags.unmatched, 1);
    }

    #[test]
    fn peak_rss_from_proc() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    4242 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(vm_hwm_kib(status), Some(4242));
        assert_eq!(vm_hwm_kib("Name: x\n"), None);
        assert!(own_peak_rss_kib().unwrap() > 0);
    }
}
