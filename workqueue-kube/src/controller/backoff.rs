//! One backoff over all of a controller's watches (kube-runtime's `trigger_backoff`): a watch
//! whose request failed waits before it retries, and the waits of all watches follow one
//! sequence of delays, so that an outage costs the API server as few requests with three
//! watches as with one.
//!
//! The backoff is applied to a trigger's keys, after the watch's `Init` and `InitDone` events
//! were consumed (by the readiness gate and the priorities): `Init` comes before every list
//! attempt, and a backoff that saw it as progress would reset before every retry and never
//! leave its first step.
//!
//! Invariants: once a request failed, the backoff is engaged, and every attempt of a trigger
//! that is not known to work (it failed last, or has delivered nothing yet) waits for the next
//! slot; each slot admits one attempt and is followed by the policy's next delay (taken when the
//! attempt starts, or when a failure comes from an attempt that started before the backoff was
//! engaged), so retries go out one per delay, as through kube-runtime's one stream over all its
//! watches. A watch that delivers keys is known to work and never waits (another one failing
//! does not hold its changes back); the sequence starts over once no trigger is failing (a
//! healthy watch's keys do not reset it while another one still fails).

use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

/// The backoff the watches of one controller share. Clones share it.
#[derive(Clone)]
pub(super) struct TriggerBackoff {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Set once the policy gives up: every trigger then ends, as kube-runtime's trigger stream
    /// does.
    given_up: watch::Sender<bool>,
}

struct State {
    policy: Box<dyn Backoff>,
    /// When the next attempt of a trigger not known to work may start; `None` while the backoff
    /// is not engaged (no trigger failing).
    next_at: Option<Instant>,
    /// Triggers whose last item was an error.
    failing: usize,
}

impl Default for TriggerBackoff {
    /// kube-runtime's default: client-go's reflector backoff (0.8 s doubling to 30 s, with
    /// jitter, reset after two quiet minutes).
    fn default() -> Self {
        TriggerBackoff {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    policy: Box::new(DefaultBackoff::default()),
                    next_at: None,
                    failing: 0,
                }),
                given_up: watch::Sender::new(false),
            }),
        }
    }
}

impl TriggerBackoff {
    /// Replaces the policy (before the controller runs).
    pub(super) fn set(&self, policy: impl Backoff + 'static) {
        self.shared.lock().policy = Box::new(policy);
    }

    /// `trigger`, retried with this backoff: after an error, it is not polled again before its
    /// slot; once the policy gives up, it ends.
    pub(super) fn apply<T: Send + 'static>(
        &self,
        trigger: impl Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    ) -> impl Stream<Item = Result<T, watcher::Error>> + Send + 'static {
        let member = Member {
            shared: self.shared.clone(),
            health: Health::Unknown,
            prepaid: false,
            given_up: self.shared.given_up.subscribe(),
            trigger: trigger.boxed(),
        };
        stream::unfold(member, |mut member| async move {
            let item = member.next().await?;
            Some((item, member))
        })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a few fields, consistent after every step: a panic elsewhere while it
        // was held leaves nothing half done.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_up(&self) {
        tracing::warn!("the trigger backoff gave up: the controller's watches end");
        self.given_up.send_replace(true);
    }
}

impl State {
    /// Moves the next slot `delay` past the later of now and the current slot; `false` if the
    /// policy gave up.
    fn pay(&mut self, now: Instant) -> bool {
        let Some(delay) = self.policy.next() else {
            return false;
        };
        let from = self.next_at.map_or(now, |at| at.max(now));
        // A delay too long to be an instant (`Duration::MAX`) waits as long as tokio can.
        self.next_at = Some(from.checked_add(delay).unwrap_or_else(far_future));
        true
    }
}

/// What a trigger is known to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// It has delivered nothing yet.
    Unknown,
    /// Its last item was a key.
    Working,
    /// Its last item was an error (it counts in `State::failing`).
    Failing,
}

/// One trigger under the shared backoff.
struct Member<T> {
    shared: Arc<Shared>,
    health: Health,
    /// The attempt under way started in a slot, whose delay is already paid.
    prepaid: bool,
    given_up: watch::Receiver<bool>,
    trigger: BoxStream<'static, Result<T, watcher::Error>>,
}

impl<T> Member<T> {
    /// The trigger's next item, after its slot if it is not known to work; `None` once it ended
    /// or the policy gave up.
    async fn next(&mut self) -> Option<Result<T, watcher::Error>> {
        if self.health != Health::Working && !self.wait_for_slot().await {
            return None;
        }
        let item = tokio::select! {
            biased;
            _ = self.given_up.wait_for(|g| *g) => return None,
            item = self.trigger.next() => item?,
        };
        match &item {
            Ok(_) => self.worked(),
            Err(_) => self.failed(),
        }
        Some(item)
    }

    /// Waits for the next slot while the backoff is engaged, and takes it; `false` if the
    /// policy gave up.
    async fn wait_for_slot(&mut self) -> bool {
        loop {
            let next_at = {
                let mut state = self.shared.lock();
                let now = Instant::now();
                match state.next_at {
                    None => return true,
                    Some(at) if at <= now => {
                        if !state.pay(now) {
                            drop(state);
                            self.shared.give_up();
                            return false;
                        }
                        self.prepaid = true;
                        return true;
                    }
                    Some(at) => at,
                }
            };
            // The slot may be taken by another trigger meanwhile: then this one waits again.
            tokio::select! {
                () = sleep_until(next_at) => {}
                _ = self.given_up.wait_for(|g| *g) => return false,
            }
        }
    }

    fn failed(&mut self) {
        let prepaid = std::mem::take(&mut self.prepaid);
        let mut state = self.shared.lock();
        if self.health != Health::Failing {
            self.health = Health::Failing;
            state.failing += 1;
        }
        if !prepaid && !state.pay(Instant::now()) {
            drop(state);
            self.shared.give_up();
        }
    }

    fn worked(&mut self) {
        self.prepaid = false;
        self.stop_failing();
        self.health = Health::Working;
    }

    fn stop_failing(&mut self) {
        if self.health != Health::Failing {
            return;
        }
        self.health = Health::Unknown;
        let mut state = self.shared.lock();
        state.failing -= 1;
        if state.failing == 0 {
            state.policy.reset();
            state.next_at = None;
        }
    }
}

impl<T> Drop for Member<T> {
    /// A trigger that ends while failing no longer holds the sequence back.
    fn drop(&mut self) {
        self.stop_failing();
    }
}

/// About 30 years from now: tokio's own stand-in for "never".
fn far_future() -> Instant {
    Instant::now() + std::time::Duration::from_secs(86400 * 365 * 30)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::mpsc;

    /// The sequence of delays 1 s, 2 s, 4 s, ...
    #[derive(Default)]
    struct Doubling(u32);

    impl Iterator for Doubling {
        type Item = Duration;
        fn next(&mut self) -> Option<Duration> {
            self.0 += 1;
            Some(Duration::from_secs(1 << (self.0 - 1)))
        }
    }

    impl Backoff for Doubling {
        fn reset(&mut self) {
            self.0 = 0;
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn failure() -> watcher::Error {
        watcher::Error::NoResourceVersion
    }

    type Item = Result<u32, watcher::Error>;

    /// A trigger the test feeds.
    fn trigger() -> (
        mpsc::UnboundedSender<Item>,
        impl Stream<Item = Item> + Send + 'static,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let items = stream::unfold(rx, |mut rx| async move { Some((rx.recv().await?, rx)) });
        (tx, items)
    }

    /// A failing trigger waits each delay of the sequence in turn; a working one's keys neither
    /// wait nor reset the sequence while the other fails; the failing one's recovery does.
    #[tokio::test(start_paused = true)]
    async fn failures_follow_one_sequence_and_only_failing_triggers_wait() {
        let backoff = TriggerBackoff::default();
        backoff.set(Doubling::default());
        let (failing_tx, failing) = trigger();
        let (working_tx, working) = trigger();
        let mut failing = Box::pin(backoff.apply(failing));
        let mut working = Box::pin(backoff.apply(working));
        let start = Instant::now();
        working_tx.send(Ok(1)).unwrap();
        assert!(working.next().await.unwrap().is_ok());
        let mut seen = Vec::new();
        for _ in 0..3 {
            failing_tx.send(Err(failure())).unwrap();
            assert!(failing.next().await.unwrap().is_err());
            seen.push(start.elapsed());
            working_tx.send(Ok(1)).unwrap();
            assert!(working.next().await.unwrap().is_ok());
            assert_eq!(
                start.elapsed(),
                *seen.last().unwrap(),
                "a working trigger waited"
            );
        }
        // 0 s, then after 1 s, then after 2 more: the working trigger did not reset it.
        assert_eq!(seen, [secs(0), secs(1), secs(3)]);
        // The failing trigger recovers (in the slot after 4 more): the sequence starts over.
        failing_tx.send(Ok(2)).unwrap();
        assert!(failing.next().await.unwrap().is_ok());
        assert_eq!(start.elapsed(), secs(7));
        failing_tx.send(Err(failure())).unwrap();
        failing_tx.send(Err(failure())).unwrap();
        assert!(failing.next().await.unwrap().is_err());
        assert!(failing.next().await.unwrap().is_err());
        assert_eq!(start.elapsed(), secs(8));
    }

    /// Once a request failed, triggers not known to work go one per slot: the retries of two
    /// failing triggers, and the first attempt of one that has delivered nothing yet.
    #[tokio::test(start_paused = true)]
    async fn one_attempt_per_slot() {
        let backoff = TriggerBackoff::default();
        backoff.set(Doubling::default());
        let (a_tx, a) = trigger();
        let (b_tx, b) = trigger();
        let mut a = Box::pin(backoff.apply(a));
        let mut b = Box::pin(backoff.apply(b));
        let start = Instant::now();
        a_tx.send(Err(failure())).unwrap();
        b_tx.send(Err(failure())).unwrap();
        assert!(a.next().await.unwrap().is_err());
        assert_eq!(start.elapsed(), secs(0));
        assert!(b.next().await.unwrap().is_err(), "b's first attempt");
        assert_eq!(start.elapsed(), secs(1));
        a_tx.send(Ok(1)).unwrap();
        b_tx.send(Ok(1)).unwrap();
        assert!(a.next().await.unwrap().is_ok());
        assert_eq!(start.elapsed(), secs(3), "1 s + 2 s");
        assert!(b.next().await.unwrap().is_ok());
        assert_eq!(start.elapsed(), secs(7), "+ 4 s");
        // Neither fails now: no wait.
        a_tx.send(Ok(1)).unwrap();
        assert!(a.next().await.unwrap().is_ok());
        assert_eq!(start.elapsed(), secs(7));
    }

    /// A policy that gives up ends every trigger, the failing one after its error.
    #[tokio::test(start_paused = true)]
    async fn a_policy_that_gives_up_ends_every_trigger() {
        struct Never;
        impl Iterator for Never {
            type Item = Duration;
            fn next(&mut self) -> Option<Duration> {
                None
            }
        }
        impl Backoff for Never {
            fn reset(&mut self) {}
        }
        let backoff = TriggerBackoff::default();
        backoff.set(Never);
        let (a_tx, a) = trigger();
        let (_b_tx, b) = trigger();
        let mut a = Box::pin(backoff.apply(a));
        let mut b = Box::pin(backoff.apply(b));
        a_tx.send(Err(failure())).unwrap();
        assert!(a.next().await.unwrap().is_err());
        assert!(a.next().await.is_none());
        assert!(b.next().await.is_none(), "a pending trigger ends too");
    }
}
