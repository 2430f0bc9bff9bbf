//! The ready set: keys that can be handed out now, by level (priority, or overdue), FIFO within a
//! level or round-robin across groups (fairness).

use std::collections::VecDeque;

use hashbrown::HashMap;

use super::slots::{Remap, SlotId};

/// An entry left behind when a key left its level early (a raise, aging). Never a slot id: slot
/// ids stay below `MAX_SLOTS`.
const TOMBSTONE: SlotId = SlotId::MAX;

/// The level of overdue keys (aging): above every priority.
pub(crate) const OVERDUE: i64 = i64::MAX;

/// A FIFO of slot ids. Positions are absolute and wrapping: `fifo[i]` is at `head + i`.
/// Invariant (with positions): `live` counts the entries that are not tombstones.
#[derive(Debug, Default)]
struct Lane {
    fifo: VecDeque<SlotId>,
    head: u32,
    live: usize,
}

impl Lane {
    /// The first live entry, dropping tombstones before it.
    fn front(&mut self) -> Option<SlotId> {
        loop {
            match *self.fifo.front()? {
                TOMBSTONE => {
                    self.fifo.pop_front();
                    self.head = self.head.wrapping_add(1);
                }
                slot => return Some(slot),
            }
        }
    }

    fn pop_front(&mut self) {
        self.fifo.pop_front();
        self.head = self.head.wrapping_add(1);
        self.live -= 1;
    }

    /// Pushes `slot` and returns its position.
    fn push(&mut self, slot: SlotId, front: bool) -> u32 {
        self.live += 1;
        if front {
            self.head = self.head.wrapping_sub(1);
            self.fifo.push_front(slot);
            self.head
        } else {
            self.fifo.push_back(slot);
            self.head.wrapping_add(self.fifo.len() as u32 - 1)
        }
    }

    fn tombstone(&mut self, slot: SlotId, pos: u32) {
        let entry = &mut self.fifo[pos.wrapping_sub(self.head) as usize];
        debug_assert_eq!(*entry, slot, "a slot's recorded position is stale");
        *entry = TOMBSTONE;
        self.live -= 1;
    }

    fn live_slots(&self) -> impl Iterator<Item = SlotId> + '_ {
        self.fifo.iter().copied().filter(|&s| s != TOMBSTONE)
    }
}

/// One level: a single lane, or, with fairness, a lane per group and the ring of groups that
/// have a live entry here, served round-robin.
///
/// Invariants (fair): `ring` holds each group of `lanes` once, and `lanes` holds exactly the
/// groups with a live entry; `live` is the sum of the lanes' `live`.
#[derive(Debug)]
struct Level {
    key: i64,
    live: usize,
    one: Lane,
    ring: VecDeque<u64>,
    lanes: HashMap<u64, Lane>,
}

impl Level {
    fn new(key: i64, fifo: VecDeque<SlotId>) -> Self {
        Level {
            key,
            live: 0,
            one: Lane {
                fifo,
                head: 0,
                live: 0,
            },
            ring: VecDeque::new(),
            lanes: HashMap::new(),
        }
    }
}

/// Slot ids by level, each level FIFO, or round-robin across groups with fairness.
///
/// Two modes. Until a priority other than 0, aging or fairness is used, every key is at level 0
/// and the set is one FIFO, `zero.one.fifo`, with nothing else maintained: a queue that uses
/// none of them pays a predictable branch per operation for them. After that (see
/// [`ReadyQueue::keep_positions`]), levels other than 0 live in `others` (the overdue level
/// last), and each queued slot's position in its lane is kept, so that a key leaving its level
/// early (a raise, aging) leaves a tombstone there, skipped when it reaches the head, with no
/// scan. A group leaves a level's ring as soon as it has no live entry there (a scan of the
/// ring, on that rare path only).
///
/// Invariants:
/// - without positions: `others` is empty, level 0 is not fair, and `len == zero.one.fifo.len()`;
/// - with positions: `others` is sorted by ascending key, has no level 0 and no level without a
///   live entry (a level goes with its last live entry); `len` is the sum of the levels' `live`;
///   every live entry's slot records the entry's position in its lane.
#[derive(Debug)]
pub(crate) struct ReadyQueue {
    zero: Level,
    others: Vec<Level>,
    len: usize,
    positions: Option<Vec<u32>>,
    fair: bool,
}

impl Default for ReadyQueue {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

/// Which level: 0 or an index into `others`.
#[derive(Clone, Copy)]
enum Which {
    Zero,
    Other(usize),
}

impl ReadyQueue {
    pub(crate) fn with_capacity(n: usize) -> Self {
        ReadyQueue {
            zero: Level::new(0, VecDeque::with_capacity(n)),
            others: Vec::new(),
            len: 0,
            positions: None,
            fair: false,
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether positions are kept (priorities, aging or fairness were used).
    #[inline]
    pub(crate) fn has_positions(&self) -> bool {
        self.positions.is_some()
    }

    /// Whether the set is one plain FIFO (no priority, aging or fairness was used).
    #[inline(always)]
    pub(crate) fn is_plain(&self) -> bool {
        self.positions.is_none()
    }

    /// Switches to keeping levels and positions. Idempotent.
    #[cold]
    pub(crate) fn keep_positions(&mut self) {
        if self.positions.is_some() {
            return;
        }
        let mut positions = Vec::new();
        let one = &mut self.zero.one;
        one.head = 0;
        one.live = one.fifo.len();
        self.zero.live = one.live;
        for (i, &slot) in one.fifo.iter().enumerate() {
            set_position(&mut positions, slot, i as u32);
        }
        self.positions = Some(positions);
    }

    /// Serves each level round-robin across groups. Only on an empty set.
    pub(crate) fn set_fair(&mut self) {
        debug_assert_eq!(self.len, 0, "fairness is chosen before the first add");
        self.keep_positions();
        self.fair = true;
    }

    fn level(&mut self, which: Which) -> &mut Level {
        match which {
            Which::Zero => &mut self.zero,
            Which::Other(i) => &mut self.others[i],
        }
    }

    fn find(&self, key: i64) -> Which {
        match key {
            0 => Which::Zero,
            _ => Which::Other(
                self.others
                    .binary_search_by_key(&key, |l| l.key)
                    .expect("a queued slot's level exists"),
            ),
        }
    }

    /// The level of `key`, created if needed (with positions only).
    fn find_or_insert(&mut self, key: i64) -> Which {
        if key == 0 {
            return Which::Zero;
        }
        match self.others.binary_search_by_key(&key, |l| l.key) {
            Ok(i) => Which::Other(i),
            Err(i) => {
                self.others.insert(i, Level::new(key, VecDeque::new()));
                Which::Other(i)
            }
        }
    }

    /// Pushes `slot` at the tail of level `key` (of its group's lane, with fairness).
    #[inline(always)]
    pub(crate) fn push(&mut self, slot: SlotId, key: i64, group: u64) {
        self.len += 1;
        match &mut self.positions {
            None => {
                debug_assert_eq!(key, 0, "a level other than 0 keeps positions");
                self.zero.one.fifo.push_back(slot);
            }
            Some(_) => self.push_level(slot, key, group, false),
        }
    }

    /// Puts `slot` back at the head of level `key` (a get that is undone): at the head of its
    /// lane, and its group back at the head of the ring.
    pub(crate) fn push_front(&mut self, slot: SlotId, key: i64, group: u64) {
        self.len += 1;
        match &mut self.positions {
            None => {
                debug_assert_eq!(key, 0, "a level other than 0 keeps positions");
                self.zero.one.fifo.push_front(slot);
            }
            Some(_) => self.push_level(slot, key, group, true),
        }
    }

    #[inline(never)]
    fn push_level(&mut self, slot: SlotId, key: i64, group: u64, front: bool) {
        let which = self.find_or_insert(key);
        let fair = self.fair;
        let level = self.level(which);
        level.live += 1;
        let pos = if fair {
            let lane = level.lanes.entry(group).or_default();
            let new = lane.live == 0;
            let pos = lane.push(slot, front);
            if front {
                // Undo the rotation of the get: the group was moved to the tail, or left.
                if level.ring.back() == Some(&group) {
                    level.ring.pop_back();
                }
                level.ring.push_front(group);
            } else if new {
                level.ring.push_back(group);
            }
            pos
        } else {
            level.one.push(slot, front)
        };
        let positions = self.positions.as_mut().expect("levels keep positions");
        set_position(positions, slot, pos);
    }

    /// Takes `slot`'s entry out of level `key`, leaving a tombstone. Needs positions.
    pub(crate) fn remove(&mut self, slot: SlotId, key: i64, group: u64) {
        let positions = self
            .positions
            .as_ref()
            .expect("moving between levels needs positions");
        let pos = positions[slot as usize];
        let which = self.find(key);
        let fair = self.fair;
        let level = self.level(which);
        if fair {
            let lane = level
                .lanes
                .get_mut(&group)
                .expect("a queued slot's lane exists");
            lane.tombstone(slot, pos);
            if lane.live == 0 {
                level.lanes.remove(&group);
                level.ring.retain(|&g| g != group);
            }
        } else {
            level.one.tombstone(slot, pos);
        }
        self.left(which);
    }

    /// The level served next: the highest above 0, else 0 if it has a live entry, else the
    /// highest below 0. With positions only.
    #[inline]
    fn next(&self) -> Which {
        match self.others.last() {
            Some(l) if l.key > 0 => Which::Other(self.others.len() - 1),
            _ if self.zero.live > 0 => Which::Zero,
            Some(_) => Which::Other(self.others.len() - 1),
            None => Which::Zero,
        }
    }

    /// The head of the plain FIFO. Only without positions (see [`ReadyQueue::is_plain`]): the
    /// fast path of a queue that uses no priority, aging or fairness.
    #[inline(always)]
    pub(crate) fn plain_front(&self) -> Option<SlotId> {
        debug_assert!(self.is_plain());
        self.zero.one.fifo.front().copied()
    }

    /// Removes the head of the plain FIFO. Only without positions, after `plain_front`.
    #[inline(always)]
    pub(crate) fn plain_pop_front(&mut self) {
        debug_assert!(self.is_plain());
        self.zero.one.fifo.pop_front();
        self.len -= 1;
    }

    /// Keeps only the entries of the plain FIFO for which `keep` holds, in their order. Only
    /// without positions (with them, entries leave one by one through [`ReadyQueue::remove`]).
    pub(crate) fn plain_retain(&mut self, keep: impl FnMut(&SlotId) -> bool) {
        debug_assert!(self.is_plain());
        self.zero.one.fifo.retain(keep);
        self.len = self.zero.one.fifo.len();
    }

    /// Pushes `slot` at the tail of the plain FIFO. Only without positions.
    #[inline(always)]
    pub(crate) fn plain_push_back(&mut self, slot: SlotId) {
        debug_assert!(self.is_plain());
        self.zero.one.fifo.push_back(slot);
        self.len += 1;
    }

    /// The slot handed out next.
    #[inline]
    pub(crate) fn peek(&mut self) -> Option<SlotId> {
        if self.positions.is_none() {
            return self.plain_front();
        }
        if self.len == 0 {
            return None;
        }
        let fair = self.fair;
        let level = self.level(self.next());
        let lane = if fair {
            let group = level
                .ring
                .front()
                .expect("a level with live entries has a group");
            level
                .lanes
                .get_mut(group)
                .expect("a ringed group has a lane")
        } else {
            &mut level.one
        };
        Some(
            lane.front()
                .expect("a lane that is served has a live entry"),
        )
    }

    /// Removes the entry [`ReadyQueue::peek`] returned; with fairness, its group moves to the
    /// tail of the ring, or leaves it.
    #[inline]
    pub(crate) fn pop_peeked(&mut self) {
        if self.positions.is_none() {
            return self.plain_pop_front();
        }
        let which = self.next();
        let fair = self.fair;
        let level = self.level(which);
        if fair {
            let group = level.ring.pop_front().expect("peeked");
            let lane = level
                .lanes
                .get_mut(&group)
                .expect("a ringed group has a lane");
            lane.pop_front();
            if lane.live > 0 {
                level.ring.push_back(group);
            } else {
                level.lanes.remove(&group);
            }
        } else {
            level.one.pop_front();
        }
        self.left(which);
    }

    /// A live entry left a level: a level other than 0 goes with its last live entry.
    fn left(&mut self, which: Which) {
        self.len -= 1;
        let level = self.level(which);
        level.live -= 1;
        if let (0, Which::Other(i)) = (level.live, which) {
            self.others.remove(i);
        }
    }

    /// The live entries with their levels, in the order they would be handed out if nothing
    /// changed meanwhile: levels from the top, round-robin across groups within a fair level.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SlotId, i64)> + '_ {
        let above = self.others.iter().rev().take_while(|l| l.key > 0);
        let below = self.others.iter().rev().skip_while(|l| l.key > 0);
        above
            .chain(std::iter::once(&self.zero))
            .chain(below)
            .flat_map(|l| self.level_order(l).into_iter().map(move |s| (s, l.key)))
    }

    fn level_order(&self, l: &Level) -> Vec<SlotId> {
        if !self.fair {
            return l.one.live_slots().collect();
        }
        let mut lanes: VecDeque<Vec<SlotId>> = l
            .ring
            .iter()
            .map(|g| l.lanes[g].live_slots().collect())
            .collect();
        let mut out = Vec::with_capacity(l.live);
        while let Some(mut lane) = lanes.pop_front() {
            out.push(lane.remove(0));
            if !lane.is_empty() {
                lanes.push_back(lane);
            }
        }
        out
    }

    /// Checks the levels, lanes and positions (for `check_invariants`).
    pub(crate) fn check(&self) {
        let Some(positions) = &self.positions else {
            assert!(self.others.is_empty(), "levels without positions");
            assert!(!self.fair, "fairness without positions");
            assert_eq!(self.len, self.zero.one.fifo.len(), "the ready count is off");
            assert!(
                !self.zero.one.fifo.contains(&TOMBSTONE),
                "a tombstone without positions"
            );
            return;
        };
        assert!(
            self.others.windows(2).all(|w| w[0].key < w[1].key),
            "levels out of order"
        );
        assert!(
            self.others.iter().all(|l| l.key != 0 && l.live > 0),
            "a level 0 in others, or an empty level kept"
        );
        let check_lane = |lane: &Lane| {
            let live = lane.live_slots().count();
            assert_eq!(live, lane.live, "a lane's live count is off");
            for (i, &s) in lane.fifo.iter().enumerate() {
                if s != TOMBSTONE {
                    assert_eq!(
                        positions[s as usize],
                        lane.head.wrapping_add(i as u32),
                        "a slot's recorded position is stale"
                    );
                }
            }
            live
        };
        let mut len = 0;
        for l in std::iter::once(&self.zero).chain(&self.others) {
            let live = if self.fair {
                assert_eq!(l.ring.len(), l.lanes.len(), "ring and lanes disagree");
                for g in &l.ring {
                    assert!(
                        l.lanes[g].live > 0,
                        "a group without live entries is ringed"
                    );
                }
                l.lanes.values().map(check_lane).sum()
            } else {
                check_lane(&l.one)
            };
            assert_eq!(live, l.live, "a level's live count is off");
            len += live;
        }
        assert_eq!(len, self.len, "the ready count is off");
    }

    /// Compaction: renames the slots `remap` moved (positions move with them) and frees the
    /// room the levels, lanes and positions do not use. Tombstones stay: positions are
    /// absolute, and they are dropped when they reach a lane's head, as always.
    pub(crate) fn remap(&mut self, remap: &Remap) {
        let lane = |lane: &mut Lane| {
            for s in lane.fifo.iter_mut().filter(|s| **s != TOMBSTONE) {
                *s = remap.slot(*s);
            }
            lane.fifo.shrink_to_fit();
        };
        for level in std::iter::once(&mut self.zero).chain(&mut self.others) {
            lane(&mut level.one);
            level.lanes.values_mut().for_each(lane);
            level.lanes.shrink_to_fit();
            level.ring.shrink_to_fit();
        }
        self.others.shrink_to_fit();
        if let Some(positions) = &mut self.positions {
            remap.side(positions, 0);
        }
    }

    /// Frees the levels' buffers (the set is empty); the mode stays.
    pub(crate) fn shrink(&mut self) {
        debug_assert_eq!(self.len, 0);
        self.zero = Level::new(0, VecDeque::new());
        self.others = Vec::new();
        if self.positions.is_some() {
            self.positions = Some(Vec::new());
        }
    }

    pub(crate) fn allocated_bytes(&self) -> usize {
        let lane = |l: &Lane| l.fifo.capacity() * size_of::<SlotId>();
        self.others.capacity() * size_of::<Level>()
            + std::iter::once(&self.zero)
                .chain(&self.others)
                .map(|l| {
                    lane(&l.one)
                        + l.lanes.values().map(lane).sum::<usize>()
                        + l.lanes.allocation_size()
                        + l.ring.capacity() * size_of::<u64>()
                })
                .sum::<usize>()
            + self
                .positions
                .as_ref()
                .map_or(0, |p| p.capacity() * size_of::<u32>())
    }
}

fn set_position(positions: &mut Vec<u32>, slot: SlotId, pos: u32) {
    let i = slot as usize;
    if i >= positions.len() {
        positions.resize(i + 1, 0);
    }
    positions[i] = pos;
}
