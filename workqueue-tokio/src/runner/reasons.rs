//! Why keys were queued: a set of reasons per key, collapsed across de-duplicated adds, for the
//! reconcile's tracing span. Never given to the reconcile (see [`Context`](super::Context)).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use workqueue_core::state::DefaultHashBuilder;

/// A reason bit: a requeue the reconcile asked for.
pub(super) const REQUEUE: u64 = 1;
/// A reason bit: a retry after a failure (or after a reconcile interrupted at shutdown).
pub(super) const RETRY: u64 = 1 << 1;
/// The first source's bit; sources from [`SHARED_SOURCE_BIT`] on share the last bit.
const FIRST_SOURCE_BIT: u32 = 2;
const SHARED_SOURCE_BIT: u32 = 63;

/// The reason bit of the source at `index`.
pub(super) fn source_bit(index: usize) -> u64 {
    let bit = u32::try_from(index)
        .unwrap_or(u32::MAX)
        .saturating_add(FIRST_SOURCE_BIT)
        .min(SHARED_SOURCE_BIT);
    1 << bit
}

/// A map with more room than this many entries gives its memory back once it is empty (a
/// backlog that drained), rather than keep the room of its largest backlog for good.
const KEEP_ROOM: usize = 1024;

/// Drops `map`'s table if it is empty and larger than [`KEEP_ROOM`].
pub(super) fn release_if_large<K, V, S: Default>(map: &mut HashMap<K, V, S>) {
    if map.is_empty() && map.capacity() > KEEP_ROOM {
        *map = HashMap::default();
    }
}

/// The pending reasons of each key that was queued by the runner and not handed out since.
///
/// Invariant: a key has an entry only from a `mark` to the next `take`, and its bits are the
/// union of what was marked in between, so memory is bounded by the keys the queue holds (the
/// table's room too, once it empties: [`release_if_large`]) (plus
/// keys whose add the queue ignored at shutdown, until the run ends). A reason is marked before
/// the add it explains, so the lease that the add causes finds it; it may be found by an earlier
/// lease of the same key (a delayed add explained before its time): reasons are a log aid, not
/// an exact account.
///
/// Keys are held as 64-bit hashes, not clones, so that a queued key costs no allocation here.
/// Two keys whose hashes collide share one entry: a lease of one may show the other's reasons
/// too, or none (`direct`); a drained stream then keeps both keys (a shared entry has more bits,
/// never fewer), never drops one it should run.
pub(super) struct Reasons<T> {
    pending: Mutex<HashMap<u64, u64, DefaultHashBuilder>>,
    hasher: DefaultHashBuilder,
    key: PhantomData<fn(&T)>,
    /// Whether `pending` may hold entries: false only while it is empty (written under its
    /// lock). A runner without sources and without retries then takes no lock per lease. A mark
    /// is made before the add it explains, and the queue's lock orders that add before the lease
    /// that takes it, so the lease's `take` sees the flag the mark set.
    any: AtomicBool,
    /// The sources' names, by index.
    names: Arc<[Arc<str>]>,
}

impl<T: Hash> Reasons<T> {
    pub(super) fn new(names: Arc<[Arc<str>]>) -> Self {
        Reasons {
            pending: Mutex::new(HashMap::default()),
            hasher: DefaultHashBuilder::default(),
            key: PhantomData,
            any: AtomicBool::new(false),
            names,
        }
    }

    /// Adds `bit` to the reasons of every key.
    pub(super) fn mark<'a>(&self, keys: impl IntoIterator<Item = &'a T>, bit: u64)
    where
        T: 'a,
    {
        // A panic in a key's Hash leaves the map valid (std's map is panic-safe) and is the
        // caller's to catch; so is poisoning ignored.
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        self.any.store(true, Ordering::Release);
        for key in keys {
            *pending.entry(self.hasher.hash_one(key)).or_default() |= bit;
        }
    }

    /// Takes the reasons of a key that was just handed out.
    pub(super) fn take(&self, key: &T) -> ReasonSet {
        let bits = if self.any.load(Ordering::Acquire) {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let bits = pending.remove(&self.hasher.hash_one(key)).unwrap_or(0);
            if pending.is_empty() {
                self.any.store(false, Ordering::Release);
                release_if_large(&mut pending);
            }
            bits
        } else {
            0
        };
        ReasonSet {
            bits: Some(bits),
            names: self.names.clone(),
        }
    }

    /// Whether `key` waits only for re-adds the runner made (a requeue, a retry): no source and
    /// no direct add queued it since it was last handed out.
    pub(super) fn readds_only(&self, key: &T) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending
            .get(&self.hasher.hash_one(key))
            .is_some_and(|&bits| bits != 0 && bits & !(REQUEUE | RETRY) == 0)
    }

    /// The reasons of a key whose `take` panicked (its `Hash` or `Eq`).
    pub(super) fn unknown(&self) -> ReasonSet {
        ReasonSet {
            bits: None,
            names: self.names.clone(),
        }
    }
}

/// The reasons of one lease, shown as `source:NAME,requeue,retry` in the reconcile's span
/// (`direct`: added to the queue directly, not through the runner; `unknown`: the key panicked).
pub(super) struct ReasonSet {
    bits: Option<u64>,
    names: Arc<[Arc<str>]>,
}

/// One reason of a [`ReasonSet`], for metrics.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))] // only metrics read it
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Label {
    Direct,
    Unknown,
    Requeue,
    Retry,
    /// The source at this index (the last index stands for every source from it on).
    Source(usize),
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))] // only metrics read it
impl ReasonSet {
    /// Calls `f` with each reason in the set (`Direct` or `Unknown` alone when it has none).
    pub(super) fn for_each_label(&self, mut f: impl FnMut(Label)) {
        let bits = match self.bits {
            None => return f(Label::Unknown),
            Some(0) => return f(Label::Direct),
            Some(bits) => bits,
        };
        for bit in 0..64u32 {
            if bits & (1 << bit) == 0 {
                continue;
            }
            f(match bit {
                0 => Label::Requeue,
                1 => Label::Retry,
                source => Label::Source((source - FIRST_SOURCE_BIT) as usize),
            });
        }
    }
}

impl fmt::Display for ReasonSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = match self.bits {
            None => return f.write_str("unknown"),
            Some(0) => return f.write_str("direct"),
            Some(bits) => bits,
        };
        let mut sep = "";
        for (index, name) in self.names.iter().enumerate() {
            let bit = source_bit(index);
            if bits & bit != 0 {
                write!(f, "{sep}source:{name}")?;
                sep = ",";
            }
            if bit == 1 << SHARED_SOURCE_BIT {
                if bits & bit != 0 && index + 1 < self.names.len() {
                    f.write_str("+others")?;
                }
                break;
            }
        }
        for (bit, label) in [(REQUEUE, "requeue"), (RETRY, "retry")] {
            if bits & bit != 0 {
                write!(f, "{sep}{label}")?;
                sep = ",";
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ReasonSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Arc<[Arc<str>]> {
        (0..n).map(|i| Arc::from(format!("s{i}"))).collect()
    }

    #[test]
    fn marks_collapse_until_taken() {
        let reasons = Reasons::new(names(2));
        reasons.mark([&"a", &"b"], source_bit(1));
        reasons.mark([&"a"], source_bit(0));
        reasons.mark([&"a"], RETRY);
        reasons.mark([&"a"], source_bit(1));
        assert_eq!(reasons.take(&"a").to_string(), "source:s0,source:s1,retry");
        assert_eq!(reasons.take(&"a").to_string(), "direct");
        assert_eq!(reasons.take(&"b").to_string(), "source:s1");
        assert!(reasons.pending.lock().unwrap().is_empty());
        assert!(
            !reasons.any.load(Ordering::Relaxed),
            "no lock on the next take"
        );
        reasons.mark([&"c"], REQUEUE);
        assert_eq!(reasons.take(&"c").to_string(), "requeue");
    }

    #[test]
    fn a_drained_backlog_gives_its_room_back() {
        let reasons = Reasons::new(names(1));
        let keys: Vec<u32> = (0..10_000).collect();
        reasons.mark(&keys, source_bit(0));
        for key in &keys[..9_999] {
            reasons.take(key);
        }
        assert!(
            reasons.pending.lock().unwrap().capacity() >= 10_000,
            "kept while not empty"
        );
        reasons.take(&9_999);
        assert_eq!(reasons.pending.lock().unwrap().capacity(), 0);
    }

    #[test]
    fn labels_name_each_reason() {
        let reasons = Reasons::new(names(3));
        reasons.mark([&"a"], source_bit(2));
        reasons.mark([&"a"], RETRY);
        let mut labels = Vec::new();
        reasons.take(&"a").for_each_label(|l| labels.push(l));
        assert_eq!(labels, [Label::Retry, Label::Source(2)]);
        labels.clear();
        reasons.take(&"a").for_each_label(|l| labels.push(l));
        reasons.unknown().for_each_label(|l| labels.push(l));
        assert_eq!(labels, [Label::Direct, Label::Unknown]);
    }

    #[test]
    fn sources_past_the_bits_share_the_last() {
        let reasons = Reasons::new(names(70));
        assert_eq!(source_bit(61), 1 << 63);
        assert_eq!(source_bit(usize::MAX), 1 << 63);
        reasons.mark([&"a"], source_bit(65));
        reasons.mark([&"a"], REQUEUE);
        assert_eq!(reasons.take(&"a").to_string(), "source:s61+others,requeue");
    }
}
