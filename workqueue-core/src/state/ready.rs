//! The ready FIFO: keys that can be handed out now.

use std::collections::VecDeque;

use super::slots::SlotId;

/// Slot ids in the order their keys became ready.
///
/// Its own type so that priority levels (one FIFO per level) can replace it without touching the
/// rest of the state machine.
#[derive(Debug, Default)]
pub(crate) struct ReadyQueue {
    fifo: VecDeque<SlotId>,
}

impl ReadyQueue {
    pub(crate) fn with_capacity(n: usize) -> Self {
        ReadyQueue {
            fifo: VecDeque::with_capacity(n),
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.fifo.len()
    }

    #[inline]
    pub(crate) fn push(&mut self, slot: SlotId) {
        self.fifo.push_back(slot);
    }

    /// The slot handed out next.
    #[inline]
    pub(crate) fn peek(&self) -> Option<SlotId> {
        self.fifo.front().copied()
    }

    /// Puts a slot back at the head (a get that is undone).
    pub(crate) fn push_front(&mut self, slot: SlotId) {
        self.fifo.push_front(slot);
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<SlotId> {
        self.fifo.pop_front()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = SlotId> + '_ {
        self.fifo.iter().copied()
    }

    pub(crate) fn shrink(&mut self) {
        self.fifo = VecDeque::new();
    }

    pub(crate) fn allocated_bytes(&self) -> usize {
        self.fifo.capacity() * size_of::<SlotId>()
    }
}
