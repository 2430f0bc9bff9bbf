//! Leases: a handed-out key that cannot be forgotten.

use std::fmt;
use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;

use crate::Outcome;
use crate::state::Ticket;

/// The queue side of a [`Lease`]: what finishing a lease does.
///
/// Implemented by the driver core that both queues share (so leases come only from this crate's
/// queues; a driver for another runtime builds on `QueueState` with a lease type of its own). An
/// implementation must finish the key even when user code it calls (a limiter, a metrics
/// recorder) panics, and may then let that panic propagate: [`Lease`]'s `Drop` catches it, and
/// swallows it while the thread is already unwinding (a second panic there would abort the
/// process).
pub(crate) trait LeaseOwner<T>: Send + Sync {
    /// Finishes the key `ticket` was issued for, as `outcome` says.
    fn finish(&self, ticket: Ticket, key: &T, outcome: Outcome);
}

/// A key handed out by a queue, held until processing ends.
///
/// While a lease exists, no other lease for the same key does: the queue holds back a key that is
/// re-added meanwhile and hands it out again once this lease is finished. A lease derefs to its key
/// and is finished exactly once: by [`finish`](Lease::finish) with an [`Outcome`] (whose table says
/// what each does), by [`done`](Lease::done), or by being dropped:
///
/// | how it ends | queue operation |
/// |---|---|
/// | [`done()`](Lease::done), `finish(Outcome::done())`, or drop | done |
/// | `finish(outcome)` | as [`Outcome`] says: forget, retry, re-add after a delay, with a priority |
/// | dropped while the thread panics | as `finish(Outcome::retry())`: a panic is a failure |
///
/// User code that runs when a lease ends (the rate limiter, a metrics recorder, the key's own
/// `Drop`) may panic. The key is finished first, whatever that code does, so it is never stranded;
/// then the panic propagates out of the consuming method or the `Drop`. While the thread is
/// already unwinding, a `Drop` swallows such a panic, so it never aborts the process.
///
/// Traps, all documented rather than silent:
/// - `queue.get();` discards the lease at once, finishing a key nobody processed (hence
///   `#[must_use]`).
/// - `std::mem::forget(lease)` keeps its key in flight forever: the key is never handed out again
///   and a drain waits for it (the timed drain reports it). Other keys are unaffected.
/// - Draining the queue from a thread that holds a lease waits for that lease: finish it first,
///   or use the timed drain.
///
/// ```
/// use workqueue_core::{Outcome, WorkQueue};
///
/// let queue: WorkQueue<String> = WorkQueue::new();
/// queue.add("default/web".to_string());
/// let lease = queue.get().expect("a key is queued");
/// assert_eq!(lease.as_str(), "default/web");
/// lease.finish(Outcome::forget()); // processed successfully: reset its backoff
/// ```
#[must_use = "dropping a lease at once finishes a key that was never processed"]
pub struct Lease<T> {
    /// `Some` until the lease ends: `Drop` takes the key to drop it where a panic of its `Drop`
    /// can be caught.
    key: Option<T>,
    /// `Some` until the lease is finished (or taken apart by its driver).
    ticket: Option<Ticket>,
    owner: Arc<dyn LeaseOwner<T>>,
}

impl<T> Lease<T> {
    /// A lease for `key`, finished through `owner` with `ticket`. For the driver core.
    pub(crate) fn new(key: T, ticket: Ticket, owner: Arc<dyn LeaseOwner<T>>) -> Self {
        Lease {
            key: Some(key),
            ticket: Some(ticket),
            owner,
        }
    }

    /// The priority the key was handed out at. A re-add that the lease's outcome asks for
    /// (`retry`, `requeue_after`, ...) queues the key at this priority, unless the outcome names
    /// another ([`Outcome::with_priority`]).
    pub fn priority(&self) -> i32 {
        // The ticket lives as long as the lease can be asked.
        self.ticket.as_ref().map_or(0, Ticket::priority)
    }

    /// Takes the lease apart without finishing it, for a driver that gives the key back to its
    /// state by other means (a hand-out undone under the queue's lock).
    pub(crate) fn into_parts(mut self) -> (T, Ticket) {
        let key = self.key.take().expect("a live lease has its key");
        let ticket = self.ticket.take().expect("a live lease has its ticket");
        (key, ticket)
    }

    /// The leased key.
    pub fn key(&self) -> &T {
        self.key.as_ref().expect("a live lease has its key")
    }

    /// Finishes processing: the key is done. It is queued again if it was re-added meanwhile.
    pub fn done(self) {
        self.finish(Outcome::done())
    }

    /// Finishes as `outcome` says: its operation, the priority of the re-add it asks for
    /// ([`Outcome::with_priority`]), and what it tells the outage detector
    /// ([`Outcome::with_signal`]).
    pub fn finish(mut self, outcome: Outcome) {
        self.finish_with(outcome);
    }

    fn finish_with(&mut self, outcome: Outcome) {
        if let (Some(ticket), Some(key)) = (self.ticket.take(), &self.key) {
            self.owner.finish(ticket, key, outcome);
        }
    }
}

impl<T> Drop for Lease<T> {
    fn drop(&mut self) {
        let unwinding = std::thread::panicking();
        if self.ticket.is_none() && !unwinding {
            // Finished by a consuming method: the key drops like any value.
            return;
        }
        let outcome = if unwinding {
            Outcome::retry()
        } else {
            Outcome::done()
        };
        // The owner finishes the key before any user code it runs can panic; the key's own
        // `Drop` runs here too, inside the catch.
        let ended = catch_unwind(AssertUnwindSafe(|| {
            self.finish_with(outcome);
            drop(self.key.take());
        }));
        if let Err(panic) = ended
            && !unwinding
        {
            resume_unwind(panic);
        }
    }
}

impl<T> Deref for Lease<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.key()
    }
}

impl<T: fmt::Debug> fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Lease").field(self.key()).finish()
    }
}
