//! The ready set: keys that can be handed out now, highest priority first, FIFO within a priority.

use std::collections::VecDeque;

use super::slots::SlotId;

/// An entry left behind when a key moved to a higher level. Never a slot id: slot ids stay below
/// `MAX_SLOTS`.
const TOMBSTONE: SlotId = SlotId::MAX;

/// The FIFO of one priority.
///
/// Invariant (once positions are kept): `live` counts the entries of `fifo` that are not
/// tombstones, and `fifo[i]` is at the absolute, wrapping position `head + i`.
#[derive(Debug)]
struct Level {
    priority: i32,
    fifo: VecDeque<SlotId>,
    head: u32,
    live: usize,
}

impl Level {
    fn new(priority: i32, fifo: VecDeque<SlotId>) -> Self {
        Level {
            priority,
            fifo,
            head: 0,
            live: 0,
        }
    }
}

/// Slot ids by priority level, each level in the order its keys entered it.
///
/// Two modes. Until a priority other than 0 is used, every key is at priority 0 and the set is
/// one FIFO, `zero.fifo`, with nothing else maintained: a queue that never uses priorities pays a
/// predictable branch per operation for them. From the first other priority on (see
/// [`ReadyQueue::keep_positions`]), levels other than 0 live in `others`, and each queued slot's
/// position is kept, so that a key whose priority is raised can leave a tombstone in its old
/// level (skipped when it reaches the head) and go to the tail of the new one without a scan.
///
/// Invariants:
/// - without positions: `others` is empty and `len == zero.fifo.len()` (no tombstones);
/// - with positions: `others` is sorted by ascending priority, has no level 0 and no level
///   without a live entry (a level goes with its last live entry, tombstones and all); `len` is
///   the sum of the levels' `live`; every live entry's slot records the entry's position.
#[derive(Debug)]
pub(crate) struct ReadyQueue {
    zero: Level,
    others: Vec<Level>,
    len: usize,
    positions: Option<Vec<u32>>,
}

impl Default for ReadyQueue {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

/// Which level a slot is served from.
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
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether positions are kept (a priority other than 0 was used).
    #[inline]
    pub(crate) fn has_priorities(&self) -> bool {
        self.positions.is_some()
    }

    /// Switches to keeping levels and positions, so that entries can move between levels.
    /// Idempotent.
    #[cold]
    pub(crate) fn keep_positions(&mut self) {
        if self.positions.is_some() {
            return;
        }
        let mut positions = Vec::new();
        self.zero.head = 0;
        self.zero.live = self.zero.fifo.len();
        for (i, &slot) in self.zero.fifo.iter().enumerate() {
            set_position(&mut positions, slot, i as u32);
        }
        self.positions = Some(positions);
    }

    fn level_mut(&mut self, which: Which) -> &mut Level {
        match which {
            Which::Zero => &mut self.zero,
            Which::Other(i) => &mut self.others[i],
        }
    }

    /// The level of `priority`, created if needed (with positions only).
    fn level_for(&mut self, priority: i32) -> Which {
        if priority == 0 {
            return Which::Zero;
        }
        match self.others.binary_search_by_key(&priority, |l| l.priority) {
            Ok(i) => Which::Other(i),
            Err(i) => {
                self.others.insert(i, Level::new(priority, VecDeque::new()));
                Which::Other(i)
            }
        }
    }

    /// Pushes `slot` at the tail of `priority`'s level.
    #[inline(always)]
    pub(crate) fn push(&mut self, slot: SlotId, priority: i32) {
        self.len += 1;
        match &mut self.positions {
            None => {
                debug_assert_eq!(priority, 0, "a priority other than 0 keeps positions");
                self.zero.fifo.push_back(slot);
            }
            Some(_) => self.push_level(slot, priority, false),
        }
    }

    /// Puts `slot` back at the head of `priority`'s level (a get that is undone).
    pub(crate) fn push_front(&mut self, slot: SlotId, priority: i32) {
        self.len += 1;
        match &mut self.positions {
            None => {
                debug_assert_eq!(priority, 0, "a priority other than 0 keeps positions");
                self.zero.fifo.push_front(slot);
            }
            Some(_) => self.push_level(slot, priority, true),
        }
    }

    #[inline(never)]
    fn push_level(&mut self, slot: SlotId, priority: i32, front: bool) {
        let which = self.level_for(priority);
        let positions = self.positions.as_mut().expect("levels keep positions");
        let level = match which {
            Which::Zero => &mut self.zero,
            Which::Other(i) => &mut self.others[i],
        };
        let pos = if front {
            level.head = level.head.wrapping_sub(1);
            level.fifo.push_front(slot);
            level.head
        } else {
            level.fifo.push_back(slot);
            level.head.wrapping_add(level.fifo.len() as u32 - 1)
        };
        level.live += 1;
        set_position(positions, slot, pos);
    }

    /// Takes `slot`'s entry out of `priority`'s level, leaving a tombstone. Needs positions.
    pub(crate) fn remove(&mut self, slot: SlotId, priority: i32) {
        let positions = self
            .positions
            .as_ref()
            .expect("moving between levels needs positions");
        let pos = positions[slot as usize];
        let which = match priority {
            0 => Which::Zero,
            _ => Which::Other(
                self.others
                    .binary_search_by_key(&priority, |l| l.priority)
                    .expect("a queued slot's level exists"),
            ),
        };
        let level = self.level_mut(which);
        let entry = &mut level.fifo[pos.wrapping_sub(level.head) as usize];
        debug_assert_eq!(*entry, slot, "a slot's recorded position is stale");
        *entry = TOMBSTONE;
        self.left(which);
    }

    /// The level served next: a level above 0, else level 0 if it has a live entry, else the
    /// highest level below 0. With positions only.
    #[inline]
    fn next(&self) -> Which {
        match self.others.last() {
            Some(l) if l.priority > 0 => Which::Other(self.others.len() - 1),
            _ if self.zero.live > 0 => Which::Zero,
            Some(_) => Which::Other(self.others.len() - 1),
            None => Which::Zero,
        }
    }

    /// The slot handed out next, and its priority.
    #[inline(always)]
    pub(crate) fn peek(&mut self) -> Option<(SlotId, i32)> {
        if self.positions.is_none() {
            return self.zero.fifo.front().map(|&slot| (slot, 0));
        }
        if self.len == 0 {
            return None;
        }
        let level = self.level_mut(self.next());
        loop {
            match level.fifo.front() {
                Some(&TOMBSTONE) => {
                    level.fifo.pop_front();
                    level.head = level.head.wrapping_add(1);
                }
                Some(&slot) => return Some((slot, level.priority)),
                None => unreachable!("the level served next has a live entry while len > 0"),
            }
        }
    }

    /// Removes the entry [`ReadyQueue::peek`] returned.
    #[inline(always)]
    pub(crate) fn pop_peeked(&mut self) {
        if self.positions.is_none() {
            self.zero.fifo.pop_front();
            self.len -= 1;
            return;
        }
        let which = self.next();
        let level = self.level_mut(which);
        level.fifo.pop_front();
        level.head = level.head.wrapping_add(1);
        self.left(which);
    }

    /// A live entry left a level: a level other than 0 goes with its last live entry.
    fn left(&mut self, which: Which) {
        self.len -= 1;
        let level = self.level_mut(which);
        level.live -= 1;
        if let (0, Which::Other(i)) = (level.live, which) {
            self.others.remove(i);
        }
    }

    /// The live entries in the order they are handed out: highest priority first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SlotId, i32)> + '_ {
        let above = self.others.iter().rev().take_while(|l| l.priority > 0);
        let below = self.others.iter().rev().skip_while(|l| l.priority > 0);
        above
            .chain(std::iter::once(&self.zero))
            .chain(below)
            .flat_map(|l| {
                l.fifo
                    .iter()
                    .copied()
                    .filter(|&s| s != TOMBSTONE)
                    .map(move |s| (s, l.priority))
            })
    }

    /// Checks the levels and positions (for `check_invariants`).
    pub(crate) fn check(&self) {
        let Some(positions) = &self.positions else {
            assert!(self.others.is_empty(), "levels without positions");
            assert_eq!(self.len, self.zero.fifo.len(), "the ready count is off");
            assert!(
                !self.zero.fifo.contains(&TOMBSTONE),
                "a tombstone without positions"
            );
            return;
        };
        assert!(
            self.others
                .windows(2)
                .all(|w| w[0].priority < w[1].priority),
            "levels out of order"
        );
        assert!(
            self.others.iter().all(|l| l.priority != 0 && l.live > 0),
            "a level 0 in others, or an empty level kept"
        );
        let mut len = 0;
        for l in std::iter::once(&self.zero).chain(&self.others) {
            let live = l.fifo.iter().filter(|&&s| s != TOMBSTONE).count();
            assert_eq!(live, l.live, "a level's live count is off");
            len += live;
            for (i, &s) in l.fifo.iter().enumerate() {
                if s != TOMBSTONE {
                    assert_eq!(
                        positions[s as usize],
                        l.head.wrapping_add(i as u32),
                        "a slot's recorded position is stale"
                    );
                }
            }
        }
        assert_eq!(len, self.len, "the ready count is off");
    }

    /// Frees the levels' buffers (the state is empty); the mode stays.
    pub(crate) fn shrink(&mut self) {
        debug_assert_eq!(self.len, 0);
        self.zero = Level::new(0, VecDeque::new());
        self.others = Vec::new();
        if self.positions.is_some() {
            self.positions = Some(Vec::new());
        }
    }

    pub(crate) fn allocated_bytes(&self) -> usize {
        self.others.capacity() * size_of::<Level>()
            + std::iter::once(&self.zero)
                .chain(&self.others)
                .map(|l| l.fifo.capacity() * size_of::<SlotId>())
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
