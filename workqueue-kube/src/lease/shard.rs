//! Which shard a key belongs to.

pub(super) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits, over bytes fed in pieces.
pub(super) fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(hash, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// MurmurHash3's 64-bit finalizer: every input bit moves every output bit.
pub(super) fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The shard of the object `namespace/name` among `shards`: a stable hash, the same in every
/// process, on every platform and with every Rust version.
///
/// The key is the UTF-8 bytes of `"{namespace}/{name}"`, or of `name` alone for a
/// cluster-scoped object (`namespace` `None`): client-go's cache key. The shard is
/// `fmix64(fnv1a64(key)) % shards`: FNV-1a (64 bits), then MurmurHash3's 64-bit finalizer,
/// which spreads names that differ only in their last characters (FNV-1a alone leaves its
/// high and low bits poorly mixed for them). A key mapped from an owned object is its owner's
/// key, so an object's family lands in one shard.
///
/// # Panics
///
/// If `shards` is 0.
///
/// ```
/// use workqueue_kube::lease::shard_of;
///
/// assert_eq!(shard_of(Some("default"), "web", 32), shard_of(Some("default"), "web", 32));
/// assert!(shard_of(None, "node-1", 32) < 32);
/// assert_eq!(shard_of(Some("default"), "web", 1), 0);
/// ```
pub fn shard_of(namespace: Option<&str>, name: &str, shards: u32) -> u32 {
    assert!(shards > 0, "shard_of needs at least one shard");
    let mut hash = FNV_OFFSET;
    if let Some(namespace) = namespace {
        hash = fnv1a(hash, namespace.as_bytes());
        hash = fnv1a(hash, b"/");
    }
    hash = fnv1a(hash, name.as_bytes());
    (fmix64(hash) % u64::from(shards)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
        // MurmurHash3's fmix64 of 0 is 0; of 1, the published constant.
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
    }

    /// Pinned values: a change here moves keys between shards across a rolling update, which
    /// breaks the protocol's guarantee. Never update them.
    #[test]
    fn shards_are_pinned() {
        let pinned: Vec<u32> = [
            (Some("default"), "web"),
            (Some("default"), "db"),
            (Some("kube-system"), "coredns"),
            (None, "node-1"),
            (Some("a"), "b/c"),
        ]
        .iter()
        .map(|&(ns, name)| shard_of(ns, name, 32))
        .collect();
        assert_eq!(pinned, PINNED);
        // Namespace and name are joined by '/', so ("a", "b/c") and ("a/b", "c") share a key,
        // as they share client-go's cache key (names cannot hold '/').
        assert_eq!(
            shard_of(Some("a/b"), "c", 32),
            shard_of(Some("a"), "b/c", 32)
        );
    }

    const PINNED: [u32; 5] = [2, 14, 11, 5, 6];

    #[test]
    fn typical_names_spread_evenly() {
        for shards in [2u32, 3, 7, 32, 100] {
            let mut counts = vec![0u32; shards as usize];
            let n = 50_000u32;
            for i in 0..n {
                counts[shard_of(Some("default"), &format!("object-{i}"), shards) as usize] += 1;
            }
            // As uniform as random: the chi-squared statistic within five standard deviations
            // of its mean (shards - 1), and no shard more than five sigmas off.
            let mean = f64::from(n) / f64::from(shards);
            let chi2: f64 = counts
                .iter()
                .map(|&c| (f64::from(c) - mean).powi(2) / mean)
                .sum();
            let dof = f64::from(shards - 1);
            assert!(
                chi2 < dof + 5.0 * (2.0 * dof).sqrt() + 1.0,
                "{shards} shards: chi2 {chi2}"
            );
            for (s, &c) in counts.iter().enumerate() {
                let sigmas = (f64::from(c) - mean).abs() / mean.sqrt();
                assert!(sigmas < 5.0, "shard {s} of {shards}: {c} keys, mean {mean}");
            }
        }
    }
}
