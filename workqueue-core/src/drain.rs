//! What an incomplete drain reports. Shared by every driver: the driver core decides the outcome,
//! each queue returns it.

use std::fmt;

/// Why a drain returned before every lease was finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DrainStop {
    /// The timeout passed.
    TimedOut,
    /// `shut_down()` was called, which releases drains (as in client-go).
    Released,
}

/// A drain that returned with work still in flight, and what that work was.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} before the queue drained: {} key(s) still processing, {} queued; finish or drop their leases (a lease held by the draining thread, or passed to mem::forget, is never finished)", match .stop { DrainStop::TimedOut => "timed out", DrainStop::Released => "released by shut_down" }, .in_flight.len(), .queued)]
pub struct DrainIncomplete<T> {
    /// Why the drain stopped waiting.
    pub stop: DrainStop,
    /// The keys whose leases were still outstanding.
    pub in_flight: Vec<T>,
    /// Keys still in the ready FIFO.
    pub queued: usize,
}

impl<T: fmt::Debug> fmt::Debug for DrainIncomplete<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrainIncomplete")
            .field("stop", &self.stop)
            .field("in_flight", &self.in_flight)
            .field("queued", &self.queued)
            .finish()
    }
}
