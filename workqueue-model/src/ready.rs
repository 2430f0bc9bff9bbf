//! The model's ready set: which ready key `get` hands out next, with priorities, aging and
//! fairness, in the most direct form (linear scans over one list).

use std::collections::{BTreeMap, VecDeque};

/// The level of overdue keys (aging): above every priority.
const OVERDUE: i64 = i64::MAX;

/// One ready key.
#[derive(Debug, Clone)]
pub(crate) struct Entry<K> {
    pub(crate) key: K,
    pub(crate) priority: i32,
    /// When it became ready (aging).
    pub(crate) since: u64,
    /// Order of becoming ready.
    seq: u64,
    /// Moved to the overdue level.
    overdue: bool,
    /// Order of entering its current level.
    level_seq: u64,
    group: u64,
}

impl<K> Entry<K> {
    fn level(&self) -> i64 {
        if self.overdue {
            OVERDUE
        } else {
            i64::from(self.priority)
        }
    }
}

/// The ready keys and, with fairness, each level's ring of groups.
///
/// Rules:
/// - `get` serves the highest level: the overdue level (aging), else the highest priority;
/// - within a level, without fairness, the key that entered the level first; with fairness, the
///   first key of the group at the head of the level's ring, and that group then moves to the
///   ring's tail (or leaves it, with no key left in the level);
/// - a group joins a level's ring at the tail when it gains its first key there, and leaves it
///   when it has none left;
/// - a raised key leaves its level and enters the new one at the tail, keeping when it became
///   ready; an overdue key stays overdue;
/// - aging: at each `get`, every key ready for longer than the limit moves to the overdue level,
///   in the order keys became ready.
#[derive(Debug, Clone)]
pub(crate) struct ModelReady<K> {
    entries: Vec<Entry<K>>,
    rings: BTreeMap<i64, VecDeque<u64>>,
    fair: bool,
    counter: u64,
}

impl<K: Clone + PartialEq> ModelReady<K> {
    pub(crate) fn new() -> Self {
        ModelReady {
            entries: Vec::new(),
            rings: BTreeMap::new(),
            fair: false,
            counter: 0,
        }
    }

    pub(crate) fn set_fair(&mut self) {
        self.fair = true;
    }

    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn find(&self, key: &K) -> Option<&Entry<K>> {
        self.entries.iter().find(|e| e.key == *key)
    }

    fn enter(&mut self, level: i64, group: u64) {
        if self.fair {
            let ring = self.rings.entry(level).or_default();
            if !ring.contains(&group) {
                ring.push_back(group);
            }
        }
    }

    fn leave(&mut self, level: i64, group: u64) {
        if self.fair
            && !self
                .entries
                .iter()
                .any(|e| e.level() == level && e.group == group)
        {
            let ring = self
                .rings
                .get_mut(&level)
                .expect("a level with keys has a ring");
            ring.retain(|&g| g != group);
            if ring.is_empty() {
                self.rings.remove(&level);
            }
        }
    }

    /// A key becomes ready at `since`, in `group`, at `priority`.
    pub(crate) fn push(&mut self, key: K, priority: i32, since: u64, group: u64) {
        let (seq, level_seq) = (self.next(), self.next());
        self.entries.push(Entry {
            key,
            priority,
            since,
            seq,
            overdue: false,
            level_seq,
            group,
        });
        self.enter(i64::from(priority), group);
    }

    /// Raises a ready key: to the tail of its new level (an overdue key stays overdue).
    pub(crate) fn raise(&mut self, key: &K, priority: i32) {
        let i = self
            .entries
            .iter()
            .position(|e| e.key == *key)
            .expect("ready");
        let (old, group, overdue) = {
            let e = &self.entries[i];
            (e.level(), e.group, e.overdue)
        };
        self.entries[i].priority = priority;
        if overdue {
            return;
        }
        self.entries[i].level_seq = self.next();
        self.leave(old, group);
        self.enter(i64::from(priority), group);
    }

    /// Takes `key` out of the ready set (a removal); whether it was there.
    pub(crate) fn remove(&mut self, key: &K) -> bool {
        let Some(i) = self.entries.iter().position(|e| e.key == *key) else {
            return false;
        };
        let e = self.entries.remove(i);
        self.leave(e.level(), e.group);
        true
    }

    /// Moves every key ready for longer than `max_wait` at `now` to the overdue level, in the
    /// order keys became ready.
    pub(crate) fn age(&mut self, now: u64, max_wait: u64) {
        let mut due: Vec<usize> = (0..self.entries.len())
            .filter(|&i| {
                !self.entries[i].overdue && now.saturating_sub(self.entries[i].since) > max_wait
            })
            .collect();
        due.sort_by_key(|&i| self.entries[i].seq);
        for i in due {
            let (old, group) = (self.entries[i].level(), self.entries[i].group);
            let level_seq = self.next();
            let e = &mut self.entries[i];
            e.overdue = true;
            e.level_seq = level_seq;
            self.leave(old, group);
            self.enter(OVERDUE, group);
        }
    }

    /// Takes the key `get` hands out next.
    pub(crate) fn pop(&mut self) -> Option<Entry<K>> {
        let top = self.entries.iter().map(Entry::level).max()?;
        let group = match self.fair {
            true => Some(self.rings[&top][0]),
            false => None,
        };
        let i = (0..self.entries.len())
            .filter(|&i| {
                self.entries[i].level() == top && group.is_none_or(|g| self.entries[i].group == g)
            })
            .min_by_key(|&i| self.entries[i].level_seq)
            .expect("the top level has a key");
        let e = self.entries.remove(i);
        if let Some(g) = group {
            let ring = self.rings.get_mut(&top).expect("ring");
            ring.pop_front();
            if self
                .entries
                .iter()
                .any(|x| x.level() == top && x.group == g)
            {
                ring.push_back(g);
            } else if ring.is_empty() {
                self.rings.remove(&top);
            }
        }
        Some(e)
    }

    /// The keys in the order `get` would hand them out if nothing changed meanwhile (without
    /// aging moves): for diagnostics and comparisons.
    pub(crate) fn order(&self) -> Vec<K> {
        let mut copy = self.clone();
        std::iter::from_fn(|| copy.pop().map(|e| e.key)).collect()
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.iter().map(|e| &e.key)
    }

    /// Restarts every key's age at `now` in hand-out order (aging turned on).
    pub(crate) fn restart_ages(&mut self, now: u64) {
        let order = self.order();
        for key in order {
            let seq = self.next();
            let e = self
                .entries
                .iter_mut()
                .find(|e| e.key == key)
                .expect("ready");
            (e.since, e.seq) = (now, seq);
        }
    }
}
