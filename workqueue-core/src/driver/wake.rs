//! The wake-ups a change of the state calls for, and the drains that wait for them.

use std::hash::{BuildHasher, Hash};

use workqueue_ratelimit::Instant;

use super::{Locked, Notifier, QueueCore};
use crate::drain::{DrainIncomplete, DrainStop};

/// Sends the wake-ups a change calls for when it ends, normally or by a panic (see
/// [`QueueCore::mutate`]): one getter when a key became ready or the earliest deadline moved
/// earlier, every drain when the queue may be drained.
pub(super) struct WakeOnChange<'a, 'g, T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    core: &'a QueueCore<T, S, N>,
    pub(super) locked: &'g mut Locked<T, S>,
    ready_before: usize,
    deadline_before: Option<Instant>,
}

impl<'a, 'g, T, S, N> WakeOnChange<'a, 'g, T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    #[inline]
    pub(super) fn new(core: &'a QueueCore<T, S, N>, locked: &'g mut Locked<T, S>) -> Self {
        WakeOnChange {
            core,
            ready_before: locked.state.ready_len(),
            deadline_before: locked.state.next_deadline(),
            locked,
        }
    }
}

impl<T, S, N> Drop for WakeOnChange<'_, '_, T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    #[inline]
    fn drop(&mut self) {
        let g = &*self.locked;
        let earlier_deadline = match (g.state.next_deadline(), self.deadline_before) {
            (Some(now), Some(before)) => now < before,
            (now, before) => now.is_some() && before.is_none(),
        };
        if g.state.ready_len() > self.ready_before || earlier_deadline {
            self.core.wake_getter(g);
        }
        if g.drains > 0 && self.core.is_drained(g) {
            self.core.notifier.wake_drainers(g);
        }
    }
}

/// A registered drain (see [`QueueCore::begin_drain`]).
#[derive(Debug)]
pub struct Drain<'a, T, S, N: Notifier<T, S>> {
    pub(super) core: &'a QueueCore<T, S, N>,
    pub(super) releases: u64,
}

impl<T, S, N> Drain<'_, T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    /// Whether `shut_down()` was called since this drain started.
    pub fn is_released(&self, locked: &Locked<T, S>) -> bool {
        locked.releases != self.releases
    }

    /// Whether the drain is over, and how: `Some(Ok(()))` once drained; `Some(Err(..))` with the
    /// work still in flight once released by `shut_down()` or `timed_out`; `None` to keep waiting.
    /// Both drivers' drain loops decide through this one rule.
    pub fn outcome(
        &self,
        locked: &Locked<T, S>,
        timed_out: bool,
    ) -> Option<Result<(), DrainIncomplete<T>>> {
        if self.core.is_drained(locked) {
            return Some(Ok(()));
        }
        let stop = if self.is_released(locked) {
            DrainStop::Released
        } else if timed_out {
            DrainStop::TimedOut
        } else {
            return None;
        };
        Some(Err(DrainIncomplete {
            stop,
            in_flight: locked.state.processing_keys(),
            queued: locked.state.ready_len(),
        }))
    }
}

impl<T, S, N: Notifier<T, S>> Drop for Drain<'_, T, S, N> {
    fn drop(&mut self) {
        self.core.locked.lock().drains -= 1;
    }
}
