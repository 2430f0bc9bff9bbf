//! Benchmarks of the workqueue crates: workloads W1–W13 and R1 of `BENCHMARKS.md`, run side by
//! side with their peers.
//!
//! - [`naive`] is the in-run baseline: a faithful port of client-go's work queue, delaying queue and
//!   rate limiters (one `std` mutex, `VecDeque` + `HashSet`s, a timer thread).
//! - [`workloads`] holds one function per (workload, implementation). Each builds its subject,
//!   times the workload, checks the result (every key seen exactly once, nothing left behind) and
//!   returns the raw measurement. The criterion benches (`benches/*.rs`) and the report binary
//!   (`src/bin/report.rs`) both call these functions; nothing is written twice.
//! - [`report`] runs the catalog of workloads (one warm-up, then repeats; median, min, max) and
//!   prints the markdown tables with ratios and targets.
//! - [`alloc`] is the counting allocator W9 needs; a binary installs it with `#[global_allocator]`.
//!
//! Keys are `Arc<str>` of the Kubernetes form `ns-{i % 100}/object-{i}`, generated before timing
//! ([`keys`]).

pub mod alloc;
pub mod naive;
pub mod report;
pub mod workloads;

use std::sync::Arc;
use std::time::Duration;

/// The key type of every workload: cheap to clone, like a Go string.
pub type Key = Arc<str>;

/// `n` distinct keys `ns-{i % 100}/object-{i}`, `i` in `0..n`.
pub fn keys(n: usize) -> Vec<Key> {
    (0..n)
        .map(|i| Arc::from(format!("ns-{}/object-{i}", i % 100)))
        .collect()
}

/// The splitmix64 generator (W4's delays use seed 42).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
}

/// splitmix64's finalizer: a cheap, good 64-bit mix.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// An order-independent fingerprint of a multiset of keys, cheap enough to update inside a timed
/// loop (one mix and two adds per key): the count and the sum of mixed key addresses.
///
/// Two fingerprints are equal when the same keys (by allocation) were seen the same number of
/// times, except with negligible probability; a key seen twice and another never cannot cancel
/// out unless their mixed addresses collide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fingerprint {
    /// Keys seen.
    pub count: u64,
    /// Wrapping sum of the mixed addresses of the keys seen.
    pub sum: u64,
}

impl Fingerprint {
    /// Records one key.
    #[inline]
    pub fn add(&mut self, key: &Key) {
        self.count += 1;
        self.sum = self
            .sum
            .wrapping_add(mix64(Arc::as_ptr(key) as *const u8 as u64));
    }

    /// Merges another fingerprint (from another thread) into this one.
    pub fn merge(&mut self, other: Fingerprint) {
        self.count += other.count;
        self.sum = self.sum.wrapping_add(other.sum);
    }

    /// The fingerprint of seeing every key of `keys` once.
    pub fn of(keys: &[Key]) -> Fingerprint {
        let mut f = Fingerprint::default();
        keys.iter().for_each(|k| f.add(k));
        f
    }
}

/// Nearest-rank percentile `p` (in 0..=100) of `sorted` (ascending).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    assert!(!sorted.is_empty(), "percentile of nothing");
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_kubernetes_form() {
        let k = keys(102);
        assert_eq!(&*k[0], "ns-0/object-0");
        assert_eq!(&*k[101], "ns-1/object-101");
        let avg = k.iter().map(|k| k.len()).sum::<usize>() as f64 / k.len() as f64;
        assert!(avg > 12.0, "{avg}");
    }

    #[test]
    fn fingerprint_is_order_independent_and_catches_duplicates() {
        let k = keys(4);
        let mut a = Fingerprint::default();
        for i in [3, 1, 0, 2] {
            a.add(&k[i]);
        }
        assert_eq!(a, Fingerprint::of(&k));
        let mut b = Fingerprint::default();
        for i in [3, 1, 1, 2] {
            b.add(&k[i]);
        }
        assert_ne!(b, Fingerprint::of(&k));
    }

    #[test]
    fn percentiles() {
        let v: Vec<_> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_micros(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_micros(99));
        assert_eq!(percentile(&v, 100.0), Duration::from_micros(100));
        assert_eq!(percentile(&v, 0.0), Duration::from_micros(1));
    }

    #[test]
    fn splitmix_is_the_reference_sequence() {
        // First outputs of splitmix64 seeded with 0 (reference implementation by S. Vigna).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next(), 0x6e78_9e6a_a1b9_65f4);
    }
}
