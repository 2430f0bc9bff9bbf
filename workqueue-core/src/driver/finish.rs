//! Finishing a lease: the clock and the limiter before the lock, the state's finish under it,
//! and with outage detection the signal, the pacing of released keys and the detector's events.

use std::hash::{BuildHasher, Hash};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::Ordering;
use std::time::Duration;

use workqueue_ratelimit::{Instant, Signal};

use super::{Notifier, QueueCore};
use crate::lease::LeaseOwner;
use crate::outcome::{Op, Outcome};
use crate::state::{OutageEvent, Ticket};

/// What finishing a lease learnt before taking the lock: the time (for outcomes that re-add),
/// the limiter's delay (for a `Retry`), and the first panic of the clock or the limiter.
#[derive(Default)]
struct BeforeLock {
    now: Option<Instant>,
    delay: Option<Duration>,
    panic: Option<Box<dyn std::any::Any + Send>>,
}

impl<T, S, N> QueueCore<T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    /// The clock and the limiter half of `outcome`, each caught: a `Retry` whose clock or limiter
    /// panicked gets no delay, so it is finished without a re-add.
    fn before_lock(&self, key: &T, outcome: Outcome) -> BeforeLock {
        let needs_time = outcome.readds();
        let mut before = BeforeLock::default();
        if needs_time {
            match catch_unwind(AssertUnwindSafe(|| self.clock.now())) {
                Ok(now) => before.now = Some(now),
                Err(panic) => {
                    before.panic = Some(panic);
                    return before;
                }
            }
        }
        let limiter = catch_unwind(AssertUnwindSafe(|| {
            outcome.consult_limiter(
                &*self.limiter,
                key,
                before.now.unwrap_or_default(),
                self.is_shutting_down(),
            )
        }));
        match limiter {
            Ok(delay) => before.delay = delay,
            Err(panic) => before.panic = Some(panic),
        }
        before
    }
}

impl<T, S, N> QueueCore<T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    /// [`LeaseOwner::finish`] with outage detection on: the key's [`Signal`] (the outcome's, or
    /// the operation's own: `forget` and `requeue_after` succeed, `retry*` fail) goes to the
    /// state's detector with the outcome. A release (a probe succeeded) forgets each released key
    /// in the limiter and takes one bucket reservation for it, under the lock, once per outage.
    #[cold]
    #[inline(never)]
    fn finish_observed(&self, ticket: Ticket, key: &T, outcome: Outcome) {
        let mut first_panic = None;
        let signal = outcome.signal.unwrap_or_else(|| match outcome.op {
            Op::Forget | Op::RequeueAfter(_) => Signal::Success,
            Op::Retry(_) | Op::RetryAfter(_) => {
                // Read before `when` records this failure.
                match catch_unwind(AssertUnwindSafe(|| self.limiter.num_requeues(key))) {
                    Ok(0) => Signal::FirstFailure,
                    Ok(_) => Signal::Failure,
                    Err(panic) => {
                        first_panic = Some(panic);
                        Signal::Failure
                    }
                }
            }
            Op::Done => Signal::Ignored,
        });
        let outcome = outcome.with_signal(signal);
        let mut before = match outcome.op {
            Op::Done => BeforeLock::default(),
            _ => self.before_lock(key, outcome),
        };
        if let Some(panic) = first_panic {
            before.panic.get_or_insert(panic);
        }
        let now = match before.now {
            Some(now) => Some(now),
            None => match catch_unwind(AssertUnwindSafe(|| self.clock.now())) {
                Ok(now) => Some(now),
                Err(panic) => {
                    before.panic.get_or_insert(panic);
                    None
                }
            },
        };
        let limiter = &*self.limiter;
        let (finished, rejected, event, parked) = self.mutate(|g| {
            let now = now.unwrap_or_else(|| g.state.now());
            let rejected = g.state.is_shutting_down();
            let mut pace_panic = None;
            let mut pace = |k: &T| {
                catch_unwind(AssertUnwindSafe(|| {
                    limiter.forget(k);
                    limiter.pace(k, now)
                }))
                .unwrap_or_else(|panic| {
                    pace_panic.get_or_insert(panic);
                    Duration::ZERO
                })
            };
            let result = g
                .state
                .finish(ticket, outcome, before.delay, now, &mut pace);
            if let Some(panic) = pace_panic {
                before.panic.get_or_insert(panic);
            }
            let parked = g.state.parked_len();
            match result {
                Ok(mut finished) => {
                    let event = finished.outage.take();
                    (Some(finished), rejected, event, parked)
                }
                Err(_) => (None, rejected, None, parked),
            }
        });
        self.parked.store(parked, Ordering::Relaxed);
        let released = finished.and_then(|f| f.released);
        if let Some(event) = event {
            if event == OutageEvent::Opened {
                self.outage_openings.fetch_add(1, Ordering::Relaxed);
            }
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.outage_metrics(&event))) {
                before.panic.get_or_insert(panic);
            }
            let hooks = self
                .outage_hooks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            for hook in hooks {
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| hook(&event))) {
                    before.panic.get_or_insert(panic);
                }
            }
        } else if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.parked_metric(parked))) {
            before.panic.get_or_insert(panic);
        }
        if let Some(panic) = before.panic {
            drop(released);
            resume_unwind(panic);
        }
        self.observe_limiter_delay(before.delay);
        self.count_retry(outcome.readds() && !rejected);
        drop(released);
    }

    /// `workqueue_outage_openings_total` and `workqueue_parked_keys` of a named queue.
    fn outage_metrics(&self, event: &OutageEvent) {
        #[cfg(feature = "metrics")]
        if let Some(name) = &self.name
            && self.metrics.is_some()
            && *event == OutageEvent::Opened
        {
            metrics::counter!(
                crate::metrics::OUTAGE_OPENINGS_TOTAL,
                crate::metrics::NAME_LABEL => name.to_string()
            )
            .increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = event;
        self.parked_metric(self.parked.load(Ordering::Relaxed));
    }

    fn parked_metric(&self, parked: usize) {
        #[cfg(feature = "metrics")]
        if let Some(name) = &self.name
            && self.metrics.is_some()
        {
            metrics::gauge!(crate::metrics::PARKED_KEYS, crate::metrics::NAME_LABEL => name.to_string())
                .set(parked as f64);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = parked;
    }
}

impl<T, S, N> LeaseOwner<T> for QueueCore<T, S, N>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    N: Notifier<T, S>,
{
    /// Panic safety: the clock and the limiter (`when`, `forget`) run before the lock, each
    /// caught, so the key is finished whatever they do (a `Retry` whose limiter or clock panicked
    /// is finished without a re-add); the state's `finish` calls no user code. Only then do the
    /// metrics recorder and the released key's `Drop` run. The first panic of any of them
    /// propagates once the key is finished; [`Lease`]'s `Drop` swallows it while unwinding.
    fn finish(&self, ticket: Ticket, key: &T, outcome: Outcome) {
        if self.outage_on.load(Ordering::Relaxed) {
            return self.finish_observed(ticket, key, outcome);
        }
        // `done`, the common case, needs neither the clock nor the limiter before the lock.
        let mut before = match outcome.op {
            Op::Done => BeforeLock::default(),
            _ => self.before_lock(key, outcome),
        };
        let readd = match outcome.op {
            Op::Retry(_) => before.delay.is_some(),
            Op::RetryAfter(_) | Op::RequeueAfter(_) => true,
            Op::Done | Op::Forget => false,
        };
        let (finished, rejected) = self.mutate(|g| {
            let now = match before.now {
                Some(now) => now,
                // Aging alone does not read it: a key re-queued here (re-added while processing)
                // then counts as ready since the state's latest time, a little early, which
                // only serves it sooner.
                None if g.state.has_waiting() || self.has_metrics() => {
                    // A clock that panics finishes the key at the state's latest time.
                    catch_unwind(AssertUnwindSafe(|| self.clock.now())).unwrap_or_else(|panic| {
                        before.panic.get_or_insert(panic);
                        g.state.now()
                    })
                }
                None => g.state.now(),
            };
            let rejected = g.state.is_shutting_down();
            (
                g.state.finish_fast(ticket, outcome, before.delay, now),
                rejected,
            )
        });
        if let Some(panic) = before.panic {
            drop(finished.released);
            resume_unwind(panic);
        }
        self.observe_limiter_delay(before.delay);
        self.count_retry(readd && !rejected);
        drop(finished.released);
    }
}
