//! What a finished lease asks of the queue, and the limiter half of that request.

use std::time::Duration;

use workqueue_ratelimit::{Instant, RateLimiter, Signal};

/// How a leased key's processing ended, and what the queue does about it.
///
/// Built by one of the constructors, optionally refined with
/// [`with_priority`](Outcome::with_priority) and [`with_signal`](Outcome::with_signal), and
/// consumed by [`Lease::finish`](crate::Lease::finish), the one way to end a lease other than
/// [`done`](crate::Lease::done) (the same as `finish(Outcome::done())`) and drop. The
/// mapping to queue operations lives in one place, the state machine
/// ([`QueueState::finish`](crate::state::QueueState::finish)), which both queues drive.
///
/// | outcome | limiter | queue |
/// |---|---|---|
/// | [`done()`](Outcome::done) | nothing | done |
/// | [`forget()`](Outcome::forget) | `forget` | done |
/// | [`retry()`](Outcome::retry) | `when` | `add_after(when)`, done |
/// | [`retry_at_least(d)`](Outcome::retry_at_least) | `when` | `add_after(max(when, d))`, done |
/// | [`retry_after(d)`](Outcome::retry_after) | nothing | `add_after(d)`, done |
/// | [`requeue_after(d)`](Outcome::requeue_after) | `forget` | `add_after(d)`, done |
///
/// After shutdown the re-adds are dropped; the lease still finishes, and a key that was re-added
/// while it was processing is still re-queued.
///
/// ```
/// use std::time::Duration;
/// use workqueue_core::ratelimit::Signal;
/// use workqueue_core::{LOW_PRIORITY, Outcome};
///
/// // Poll again in a minute, behind fresh changes (controller-runtime's `Result.Priority`).
/// let poll = Outcome::requeue_after(Duration::from_secs(60)).with_priority(LOW_PRIORITY);
/// // A failure that is the object's own: back off, but tell the outage detector nothing.
/// let invalid = Outcome::retry().with_signal(Signal::Ignored);
/// assert_ne!(poll, invalid);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub(crate) op: Op,
    /// The re-add's priority; `None`: the priority the key was handed out at.
    pub(crate) priority: Option<i32>,
    /// What the outage detector is told; `None`: the operation's own signal.
    pub(crate) signal: Option<Signal>,
}

/// The queue operation of an [`Outcome`]: what the state machine matches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Done,
    Forget,
    /// The limiter's delay, and at least this (zero: `retry()`).
    Retry(Duration),
    RetryAfter(Duration),
    RequeueAfter(Duration),
}

impl Outcome {
    const fn of(op: Op) -> Self {
        Outcome {
            op,
            priority: None,
            signal: None,
        }
    }

    /// Processing finished; the limiter's memory of the key is kept (client-go's `Done`).
    pub const fn done() -> Self {
        Self::of(Op::Done)
    }

    /// Processing succeeded, or was given up: the limiter forgets the key, then done.
    pub const fn forget() -> Self {
        Self::of(Op::Forget)
    }

    /// Processing failed: re-add after the rate limiter's delay, then done.
    pub const fn retry() -> Self {
        Self::of(Op::Retry(Duration::ZERO))
    }

    /// Processing failed: re-add after the rate limiter's delay, but not before `min` (per-key
    /// backoff with a floor: a fixed retry delay that grows once the limiter's does).
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_core::{ManualClock, Outcome, WorkQueue};
    ///
    /// let clock = ManualClock::new();
    /// let queue: WorkQueue<&str> = WorkQueue::builder().clock(clock.clone()).build();
    /// queue.add("flaky");
    /// // The default limiter's first delay is 5 ms: the floor wins.
    /// queue.try_get().unwrap().finish(Outcome::retry_at_least(Duration::from_secs(1)));
    /// clock.advance(Duration::from_millis(999));
    /// assert!(queue.try_get().is_none());
    /// clock.advance(Duration::from_millis(1));
    /// assert!(queue.try_get().is_some());
    /// ```
    pub const fn retry_at_least(min: Duration) -> Self {
        Self::of(Op::Retry(min))
    }

    /// Processing failed: re-add after `delay`; the limiter is not consulted.
    pub const fn retry_after(delay: Duration) -> Self {
        Self::of(Op::RetryAfter(delay))
    }

    /// Processing succeeded and the key should run again after `delay` (polling): the limiter
    /// forgets the key, and it is re-added after the delay.
    pub const fn requeue_after(delay: Duration) -> Self {
        Self::of(Op::RequeueAfter(delay))
    }

    /// The same outcome, with the re-add it asks for at `priority` instead of the priority the
    /// key was handed out at (controller-runtime's `Result.Priority`). By default a re-add keeps
    /// the priority the key had (controller-runtime #3157). `done()` and `forget()` re-add
    /// nothing, so a priority changes nothing for them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_core::{LOW_PRIORITY, ManualClock, Outcome, WorkQueue};
    ///
    /// let clock = ManualClock::new();
    /// let queue: WorkQueue<&str> = WorkQueue::builder().clock(clock.clone()).build();
    /// queue.add("poll-me");
    /// let lease = queue.try_get().unwrap();
    /// lease.finish(Outcome::requeue_after(Duration::from_secs(60)).with_priority(LOW_PRIORITY));
    /// clock.advance(Duration::from_secs(60));
    /// assert_eq!(queue.try_get().unwrap().priority(), LOW_PRIORITY);
    /// ```
    pub const fn with_priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The same outcome, telling the queue's outage detector (when it has one, see
    /// [`Builder::outage_detection`](crate::Builder::outage_detection)) that the key's
    /// processing was `signal`.
    ///
    /// Without it the queue derives the signal from the operation: `forget()` and
    /// `requeue_after(d)` are successes, `retry()` and `retry_after(d)` failures (a first failure
    /// when the rate limiter has no failure recorded for the key), `done()` says nothing. Use it
    /// for a failure that is the object's own ([`Signal::Ignored`]: an invalid spec, a 4xx that is
    /// not 429), which must not open the detector, or for a success that is re-queued through the
    /// limiter.
    ///
    /// ```
    /// use workqueue_core::ratelimit::{OutageConfig, Signal};
    /// use workqueue_core::{Outcome, WorkQueue};
    ///
    /// let queue: WorkQueue<&str> = WorkQueue::builder()
    ///     .outage_detection(OutageConfig::default())
    ///     .build();
    /// for key in ["a", "b", "c", "d", "e", "f"] {
    ///     queue.add(key);
    ///     // Invalid objects: their failures are their own.
    ///     queue.try_get().unwrap().finish(Outcome::retry().with_signal(Signal::Ignored));
    /// }
    /// assert!(!queue.is_outage_open());
    /// ```
    pub const fn with_signal(mut self, signal: Signal) -> Self {
        self.signal = Some(signal);
        self
    }

    /// Whether the operation re-adds the key (`retry*`, `requeue_after`).
    #[inline]
    pub(crate) const fn readds(&self) -> bool {
        !matches!(self.op, Op::Done | Op::Forget)
    }

    /// Performs the limiter half of this outcome for `key`: `forget` for `forget()` and
    /// `requeue_after(d)`, and `when` for `retry()` and `retry_at_least(d)`, whose delay it
    /// returns.
    ///
    /// Drivers call this outside the queue's lock, then pass the delay to
    /// [`QueueState::finish`](crate::state::QueueState::finish). With `shutting_down`, `when` is
    /// not consulted (the re-add would be dropped anyway, and a failure must not be counted for
    /// it).
    pub(crate) fn consult_limiter<K: ?Sized, L: RateLimiter<K> + ?Sized>(
        self,
        limiter: &L,
        key: &K,
        now: Instant,
        shutting_down: bool,
    ) -> Option<Duration> {
        match self.op {
            Op::Done | Op::RetryAfter(_) => None,
            Op::Forget | Op::RequeueAfter(_) => {
                limiter.forget(key);
                None
            }
            Op::Retry(_) if shutting_down => None,
            Op::Retry(_) => Some(limiter.when(key, now)),
        }
    }
}

/// The limiter half of `outcome` (see [`Outcome`]'s table), for a driver of its own: `forget`
/// for `forget()` and `requeue_after(d)`, and `when` for `retry()`, whose delay it returns, to be
/// passed to [`QueueState::finish`](crate::state::QueueState::finish). Call it outside the
/// state's lock; with `shutting_down`, `when` is not consulted.
pub fn consult_limiter<K: ?Sized, L: RateLimiter<K> + ?Sized>(
    outcome: Outcome,
    limiter: &L,
    key: &K,
    now: Instant,
    shutting_down: bool,
) -> Option<Duration> {
    outcome.consult_limiter(limiter, key, now, shutting_down)
}
