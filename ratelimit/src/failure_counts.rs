//! Per-key failure counters, shared by the per-key limiters.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashTable;
use parking_lot::Mutex;

/// Number of shards: a power of two, enough that two to a few dozen threads rarely meet on one
/// lock, small enough that an idle limiter costs 2 KiB.
const SHARDS: usize = 16;

/// The shard index is taken from hash bits hashbrown does not use for tables under 2^32
/// buckets: it probes with the low bits and tags with the top seven. Taking either would leave
/// every key of a shard with the same probe start or tag bits.
const SHARD_SHIFT: u32 = 32;

/// Shards with fewer keys than this do not shrink: their tables are small.
const SHRINK_MIN: usize = 64;

/// One shard, on its own cache lines (128 bytes: adjacent-line prefetch pairs 64-byte lines), so
/// threads working on different shards do not share a line.
#[repr(align(128))]
struct Shard<K>(Mutex<Table<K>>);

/// A shard's table and its shrink threshold.
///
/// Memory follows the live size, under the queue's rule (`workqueue_core::state`): a table
/// grown for `2m` keys (at `m` keys) shrinks once fewer than `m / 2` are tracked, and a table
/// rebuilt at `n` keys shrinks again below `n / 2`, so at most one rebuild per halving of the
/// shard's keys, and a shard swinging around a size does not rebuild on every swing. Tables of
/// fewer than [`SHRINK_MIN`] keys keep their room.
struct Table<K> {
    entries: HashTable<(K, u32)>,
    /// Rebuild before a removal that would leave fewer keys than this (0: never).
    shrink_below: usize,
}

impl<K> Table<K> {
    fn new() -> Self {
        Table {
            entries: HashTable::new(),
            shrink_below: 0,
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The threshold of a table sized at `n` keys: half of it, or never below [`SHRINK_MIN`].
fn threshold(n: usize) -> usize {
    if n >= SHRINK_MIN { n / 2 } else { 0 }
}

/// Failure counts per key, for [`ExponentialFailure`](crate::ExponentialFailure) and
/// [`FastSlow`](crate::FastSlow).
///
/// Invariants:
/// - A key is stored in shard `(hash >> SHARD_SHIFT) % SHARDS` of its hash under `hasher`, at
///   most once, with a count of at least 1 (forgetting removes the entry).
/// - When `limit` is `Some(n)`, `tracked` equals the number of stored keys (it is only changed
///   under the lock of the shard being changed), and a new key is only stored while it is below
///   `n`. Unbounded counts do not maintain it: the hot path then touches no shared counter.
///
/// Panic safety: the key's `Hash`, `Eq`, `Clone` (`to_owned`) and `Drop` are user code. They run
/// before anything changes (a new key is cloned before the bound is charged for it), and a shard
/// grows by hashing every key before it switches tables, never through hashbrown's own growth,
/// which hashes while it moves entries (and, rehashing in place, drops entries when a hash
/// panics). A panic leaves the counts as they were and propagates to the limiter's caller.
pub(crate) struct FailureCounts<K, S> {
    shards: Box<[Shard<K>; SHARDS]>,
    hasher: S,
    limit: Option<usize>,
    tracked: AtomicUsize,
    /// Shrinking rebuilds so far (tests count them).
    rebuilds: AtomicUsize,
}

impl<K, S> FailureCounts<K, S> {
    pub(crate) fn with_hasher(hasher: S) -> Self {
        FailureCounts {
            shards: Box::new(std::array::from_fn(|_| Shard(Mutex::new(Table::new())))),
            hasher,
            limit: None,
            tracked: AtomicUsize::new(0),
            rebuilds: AtomicUsize::new(0),
        }
    }

    /// Bounds the number of tracked keys. Keys already tracked stay, even beyond the bound.
    pub(crate) fn set_limit(&mut self, limit: usize) {
        let stored = self
            .shards
            .iter_mut()
            .map(|shard| shard.0.get_mut().len())
            .sum();
        *self.tracked.get_mut() = stored;
        self.limit = Some(limit);
    }

    /// The number of tracked keys; exact when no other thread changes the counts meanwhile.
    pub(crate) fn len(&self) -> usize {
        match self.limit {
            Some(_) => self.tracked.load(Ordering::Relaxed),
            None => self.shards.iter().map(|shard| shard.0.lock().len()).sum(),
        }
    }

    /// Takes a slot for a new key; `false` when the bound is reached.
    fn admit(&self) -> bool {
        self.limit.is_none_or(|limit| {
            self.tracked
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < limit).then_some(n + 1)
                })
                .is_ok()
        })
    }

    /// Gives back the slot of a key that is no longer tracked.
    fn release(&self) {
        if self.limit.is_some() {
            self.tracked.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// How many times a shard shrank.
    #[cfg(test)]
    pub(crate) fn rebuilds(&self) -> usize {
        self.rebuilds.load(Ordering::Relaxed)
    }

    fn shard(&self, hash: u64) -> &Mutex<Table<K>> {
        // Truncation is the point: the low bits of the shifted hash pick the shard.
        &self.shards[(hash >> SHARD_SHIFT) as usize % SHARDS].0
    }
}

impl<K, S: BuildHasher> FailureCounts<K, S> {
    /// Records one failure of `key` and returns its count, or `None` when `key` is not tracked
    /// and cannot be because the bound is reached.
    ///
    /// One hash, one lock, one probe for a tracked key; a second probe for a new one.
    pub(crate) fn record<Q>(&self, key: &Q) -> Option<u32>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash).lock();
        let table = &mut *shard;
        if let Some((_, count)) = table.entries.find_mut(hash, |(k, _)| k.borrow() == key) {
            *count = count.saturating_add(1);
            return Some(*count);
        }
        let owned = key.to_owned();
        if !self.admit() {
            drop(shard);
            drop(owned);
            return None;
        }
        if table.entries.len() == table.entries.capacity() {
            // Hashing may panic: give the slot back if it does (the table is unchanged).
            let len = table.entries.len();
            let grown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                rebuild(&mut table.entries, (2 * len).max(4), |k: &K| {
                    self.hasher.hash_one(k.borrow())
                })
            }));
            if let Err(panic) = grown {
                self.release();
                std::panic::resume_unwind(panic);
            }
            // Room for twice the keys: shrink once fewer than half of them are left.
            table.shrink_below = table.shrink_below.max(threshold(len));
        }
        table.entries.insert_unique(hash, (owned, 1), |_| {
            unreachable!("the table has room: it was grown before the insert")
        });
        Some(1)
    }

    /// Failures recorded for `key`; 0 when it is not tracked.
    pub(crate) fn get<Q>(&self, key: &Q) -> u32
    where
        Q: ?Sized + Hash + Eq,
        K: Borrow<Q>,
    {
        let hash = self.hasher.hash_one(key);
        self.shard(hash)
            .lock()
            .entries
            .find(hash, |(k, _)| k.borrow() == key)
            .map_or(0, |&(_, count)| count)
    }

    /// Stops tracking `key`.
    pub(crate) fn remove<Q>(&self, key: &Q)
    where
        Q: ?Sized + Hash + Eq,
        K: Borrow<Q>,
    {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash).lock();
        let table = &mut *shard;
        if table.len() <= table.shrink_below {
            // Memory follows the live size (see `Table`). Hashing is user code: the rebuild
            // hashes every key before it changes anything, and runs before the removal, so a
            // panic leaves the counts as they were. Room for the keys there are now.
            let len = table.len();
            rebuild(&mut table.entries, len, |k: &K| {
                self.hasher.hash_one(k.borrow())
            });
            table.shrink_below = threshold(len);
            self.rebuilds.fetch_add(1, Ordering::Relaxed);
        }
        let removed = match table.entries.find_entry(hash, |(k, _)| k.borrow() == key) {
            Ok(occupied) => occupied.remove().0,
            Err(_) => return,
        };
        self.release();
        // The key's `Drop` runs after the shard is unlocked.
        drop(shard);
        drop(removed);
    }
}

/// Replaces a table with one of room for `capacity` entries (at least its length): twice the
/// room when it is full, the room of its length when it shrinks. Every key is hashed first, so a
/// `hash` that panics leaves the table untouched; the moves after that call no user code.
fn rebuild<K>(table: &mut HashTable<(K, u32)>, capacity: usize, hash: impl Fn(&K) -> u64) {
    let hashes: Vec<u64> = table.iter().map(|(k, _)| hash(k)).collect();
    let mut grown = HashTable::with_capacity(capacity.max(table.len()));
    // `into_iter` visits the entries in the order `iter` did: the table is unchanged in between.
    for (entry, hash) in std::mem::take(table).into_iter().zip(hashes) {
        grown.insert_unique(hash, entry, |_| {
            unreachable!("the new table was sized for every entry")
        });
    }
    *table = grown;
}

impl<K, S> fmt::Debug for FailureCounts<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailureCounts")
            .field("tracked_keys", &self.len())
            .field("max_tracked_keys", &self.limit)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foldhash::fast::FixedState;

    fn counts() -> FailureCounts<String, FixedState> {
        FailureCounts::with_hasher(FixedState::with_seed(7))
    }

    #[test]
    fn counts_per_key_and_forgets() {
        let c = counts();
        assert_eq!(c.record("a"), Some(1));
        assert_eq!(c.record("a"), Some(2));
        assert_eq!(c.record(&"b".to_owned()), Some(1));
        assert_eq!((c.get("a"), c.get("b"), c.get("c")), (2, 1, 0));
        assert_eq!(c.len(), 2);
        c.remove("a");
        c.remove("never seen");
        assert_eq!((c.get("a"), c.len()), (0, 1));
        assert_eq!(c.record("a"), Some(1));
    }

    #[test]
    fn many_keys_spread_over_shards_and_survive_growth() {
        let c = counts();
        for i in 0..10_000 {
            assert_eq!(c.record(&i.to_string()), Some(1));
        }
        assert_eq!(c.len(), 10_000);
        assert!(c.shards.iter().all(|s| s.0.lock().len() > 400));
        for i in 0..10_000 {
            assert_eq!(c.get(&i.to_string()), 1);
        }
    }

    #[test]
    fn bound_refuses_new_keys_but_keeps_tracked_ones() {
        let mut c = counts();
        c.set_limit(2);
        assert_eq!(c.record("a"), Some(1));
        assert_eq!(c.record("b"), Some(1));
        assert_eq!(c.record("c"), None);
        assert_eq!(c.get("c"), 0);
        assert_eq!(c.record("a"), Some(2));
        assert_eq!(c.len(), 2);
        c.remove("b");
        c.remove("b");
        assert_eq!(c.len(), 1);
        assert_eq!(c.record("c"), Some(1));
        assert_eq!(c.record("d"), None);
    }

    #[test]
    fn bound_set_late_counts_keys_already_tracked() {
        let mut c = counts();
        c.record("a");
        c.record("b");
        c.set_limit(1);
        assert_eq!((c.len(), c.record("c")), (2, None));
        assert_eq!(c.record("a"), Some(2));
        c.remove("a");
        assert_eq!(c.record("c"), None);
        c.remove("b");
        assert_eq!(c.record("c"), Some(1));
    }

    fn capacity(c: &FailureCounts<String, FixedState>) -> usize {
        c.shards.iter().map(|s| s.0.lock().entries.capacity()).sum()
    }

    #[test]
    fn forgetting_shrinks_once_per_halving() {
        let c = counts();
        let n: usize = 64_000;
        for i in 0..n {
            c.record(&i.to_string());
        }
        let peak = capacity(&c);
        let mut live = n;
        for i in 0..n - 100 {
            c.remove(&i.to_string());
            live -= 1;
            // Fresh, a shard holds its keys in at most twice their number (growth doubles);
            // retained room stays within 4x of that however far the counts fell.
            if live.is_multiple_of(1000) && live >= 16 * 2 * SHRINK_MIN {
                assert!(
                    capacity(&c) <= 8 * live,
                    "{live} keys in {} room",
                    capacity(&c)
                );
            }
        }
        assert!(capacity(&c) * 20 < peak);
        // Each shard went from 4,000 keys to under 128: five halvings, at most one rebuild each.
        let rebuilds = c.rebuilds();
        assert!(rebuilds <= 16 * 6, "{rebuilds} rebuilds");
        assert!(rebuilds >= 16 * 3, "{rebuilds} rebuilds");
        for i in n - 100..n {
            assert_eq!(c.get(&i.to_string()), 1);
        }
    }

    #[test]
    fn counts_swinging_around_a_size_do_not_rebuild_on_every_swing() {
        let c = counts();
        for i in 0..16_000 {
            c.record(&i.to_string());
        }
        for i in 0..12_000 {
            c.remove(&i.to_string());
        }
        let settled = c.rebuilds();
        for round in 0..20 {
            let base = 100_000 * (round + 1);
            for i in base..base + 3_000 {
                c.record(&i.to_string());
            }
            for i in base..base + 3_000 {
                c.remove(&i.to_string());
            }
        }
        assert_eq!(c.len(), 4_000);
        assert!(
            c.rebuilds() - settled <= 16,
            "swings under a halving rebuilt {} times",
            c.rebuilds() - settled
        );
    }

    #[test]
    fn count_saturates() {
        let c = counts();
        c.record("a");
        c.shards.iter().for_each(|s| {
            s.0.lock()
                .entries
                .iter_mut()
                .for_each(|(_, n)| *n = u32::MAX - 1)
        });
        assert_eq!(c.record("a"), Some(u32::MAX));
        assert_eq!(c.record("a"), Some(u32::MAX));
    }
}
