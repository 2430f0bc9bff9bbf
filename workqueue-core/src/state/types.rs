//! The values the state hands to its driver: statuses, results, tickets and counts.

use std::fmt;
use std::num::NonZeroU32;

use workqueue_ratelimit::Instant;

use super::OutageEvent;
#[cfg(doc)]
use super::QueueState;
use super::slots::SlotId;

/// The default hasher: foldhash, randomly seeded per queue.
///
/// Fast, with minimal resistance to hash flooding. Keys that tenants control (object names) can be
/// chosen to collide for a known hasher, but not for a random seed they cannot observe; where that
/// is not enough, use `std::hash::RandomState` (SipHash) as the hasher type parameter.
pub type DefaultHashBuilder = foldhash::fast::RandomState;

/// What [`QueueState::add`] did with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddStatus {
    /// The key was pushed to the tail of the ready FIFO.
    Queued,
    /// The key was already in the ready FIFO: nothing changed.
    AlreadyQueued,
    /// The key is being processed: it was marked dirty and is queued again when its lease finishes.
    Dirty,
    /// The key is being processed and was already marked dirty: nothing changed.
    AlreadyDirty,
    /// The key now waits for its deadline (a new waiting entry, or an earlier deadline for an
    /// existing one).
    Waiting,
    /// The key already waits for an earlier (or equal) deadline, at a higher (or equal)
    /// priority: nothing changed. With
    /// [`QueueState::set_keep_backoff`] on, also what an add of a key waiting on a
    /// rate-limited retry reports: it keeps waiting until its backoff ends.
    AlreadyWaiting,
    /// The key is parked by the open outage detector (see
    /// [`QueueState::enable_outage_detection`]), or waits to be its probe: it stays so, and is
    /// run by the probe or the release. Nothing changed but its priority, raised for the release
    /// if the add asked for a higher one.
    Parked,
    /// The key was queued at a lower priority: it moved to the tail of the new priority's FIFO.
    Raised,
    /// The deadline is never reached (a delay of about 584 years or more): nothing was stored.
    Never,
    /// The queue is shutting down: the add was ignored.
    ShutDown,
}

/// The result of [`QueueState::get`].
#[derive(Debug)]
pub enum Get<T> {
    /// A key was handed out; finish it with its ticket.
    Ready(Ticket, T),
    /// Nothing is ready. A key becomes due at `next_deadline`, if it is `Some`.
    Empty {
        /// When the earliest waiting key becomes due.
        next_deadline: Option<Instant>,
    },
    /// The queue is shutting down and nothing is ready: the getter should stop.
    ShutDown,
}

/// Proof that a key was handed out: finishing it requires giving the ticket back.
///
/// A ticket is neither `Copy` nor `Clone`, so a key cannot be finished twice (client-go's
/// "spurious Done" that let two workers hold one key). It only fits the state that issued it.
#[must_use = "a ticket that is never finished keeps its key in flight forever"]
pub struct Ticket {
    pub(super) slot: SlotId,
    /// Never zero, so `Option<Ticket>` (in every lease) is no larger than a ticket.
    pub(super) state: NonZeroU32,
    pub(super) priority: i32,
}

impl Ticket {
    /// The priority the key was handed out at. Re-adds that finishing asks for use it, unless
    /// the outcome names another ([`Outcome::with_priority`](crate::Outcome::with_priority)).
    pub fn priority(&self) -> i32 {
        self.priority
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("slot", &self.slot)
            .field("priority", &self.priority)
            .finish()
    }
}

/// A [`Ticket`] was given to a state that did not issue it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this ticket was issued by another queue state; finish each ticket on the state it came from"
)]
pub struct ForeignTicket;

/// What [`QueueState::finish`] did.
///
/// Whether the finish made a key ready, or moved the earliest deadline, a driver learns as after
/// any operation: from [`QueueState::counts`] and [`QueueState::next_deadline`] before and after.
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "the freed key should be dropped outside any lock"]
pub struct Finished<T> {
    /// Whether the key went back to the ready FIFO (it was dirty, or re-added without delay).
    pub(crate) requeued: bool,
    /// Whether the key now waits for a deadline.
    pub(crate) waiting: bool,
    /// The key, when the state no longer tracks it. Drivers drop it after releasing their lock,
    /// so user `Drop` code does not run under it.
    pub released: Option<T>,
    /// What the finish changed in the outage detector, if it is on and changed.
    pub outage: Option<OutageEvent>,
}

impl<T> Finished<T> {
    /// What finishing a foreign ticket did: nothing.
    pub(super) fn nothing() -> Self {
        Finished {
            requeued: false,
            waiting: false,
            released: None,
            outage: None,
        }
    }
}

/// Counters that describe the state at a glance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Keys in the ready FIFO.
    pub ready: usize,
    /// Keys handed out and not finished.
    pub processing: usize,
    /// Keys waiting for a deadline.
    pub waiting: usize,
    /// Keys the state tracks (each counted once, whatever it is doing).
    pub tracked: usize,
}
