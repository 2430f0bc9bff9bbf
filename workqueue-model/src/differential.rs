//! Lock-step driver: one sequence of operations applied to [`QueueState`] and to [`Model`].
//!
//! Shared by the property tests (`workqueue-core/tests/state_model.rs`, which generate [`Op`]s with
//! proptest) and the fuzzer (`fuzz/fuzz_targets/state_differential.rs`, which maps arbitrary bytes
//! to [`Op`]s). After every operation [`StateHarness::apply`] compares each result, then every
//! observable of the two (counts, FIFO order, processing set, per-key status and deadline,
//! `next_deadline`, `now`) and runs [`QueueState::check_invariants`]. Any difference panics with
//! the step number and the operation.

use std::collections::BTreeSet;
use std::fmt;
use std::hash::BuildHasher;
use std::time::Duration;

use workqueue_core::state::{DefaultHashBuilder, Get, QueueState, Ticket};

use crate::{AddStatus, Instant, Model, ModelFinished, ModelGet, Outcome};

/// One step of a differential run. Keys are small integers, named `k{n}` in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `add(k)` (through `add_or_return`, whose returned key is checked too).
    Add(u8),
    /// `add_ref(&k)`: clones only untracked keys.
    AddRef(u8),
    /// `add_after(k, d)` (through `add_after_or_return`).
    AddAfter(u8, Duration),
    /// `get()`: the ticket is held until a [`Op::Finish`].
    Get,
    /// Finishes the held ticket at `index % held` with an outcome; the `Option` is the limiter's
    /// delay (used by `Retry`, ignored otherwise).
    Finish(usize, Outcome, Option<Duration>),
    /// Finishing a ticket of another state is refused and changes nothing.
    ForeignFinish,
    /// `shut_down()`.
    ShutDown,
    /// `len()`, which promotes due keys.
    Len,
    /// Moves the driver's clock forward.
    Advance(Duration),
    /// Moves the driver's clock backwards (the state must clamp it).
    Rewind(Duration),
    /// `get` + `finish(Done)` until nothing is ready.
    Drain,
}

/// The queue-side name of key `k`.
pub fn key_name(k: u8) -> String {
    format!("k{k}")
}

/// `QueueState<String, S>` and `Model<String>` driven in lock step.
pub struct StateHarness<S = DefaultHashBuilder> {
    state: QueueState<String, S>,
    model: Model<String>,
    held: Vec<(Ticket, String)>,
    seen: BTreeSet<String>,
    now: u64,
    step: usize,
}

impl<S> fmt::Debug for StateHarness<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateHarness")
            .field("model", &self.model)
            .field("held", &self.held)
            .field("now", &self.now)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl StateHarness {
    /// A harness on a state with the default (randomly seeded) hasher.
    pub fn new() -> Self {
        Self::with_hasher(DefaultHashBuilder::default())
    }
}

impl Default for StateHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: BuildHasher> StateHarness<S> {
    /// A harness on a state hashing with `hasher` (a constant hasher makes every key collide).
    pub fn with_hasher(hasher: S) -> Self {
        StateHarness {
            state: QueueState::with_hasher(hasher),
            model: Model::new(),
            held: Vec::new(),
            seen: BTreeSet::new(),
            now: 0,
            step: 0,
        }
    }

    /// The state under test.
    pub fn state(&self) -> &QueueState<String, S> {
        &self.state
    }

    /// The model.
    pub fn model(&self) -> &Model<String> {
        &self.model
    }

    /// Number of tickets held.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    fn at(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    /// Applies `op` to both sides and checks that they agree.
    pub fn apply(&mut self, op: &Op) {
        self.step += 1;
        let now = self.at();
        let ctx = Ctx {
            step: self.step,
            op,
        };
        match *op {
            Op::Add(k) => {
                let key = key_name(k);
                self.seen.insert(key.clone());
                let tracked = self.model.is_tracked(&key);
                let expected = self.model.add(key.clone(), now);
                let (status, back) = self.state.add_or_return(key.clone(), now);
                assert_eq!(status, expected, "{ctx}: add status");
                let stored = !tracked && status != AddStatus::ShutDown;
                assert_eq!(back.is_none(), stored, "{ctx}: add_or_return hands back");
                if let Some(b) = back {
                    assert_eq!(b, key, "{ctx}: add_or_return handed back another key");
                }
            }
            Op::AddRef(k) => {
                let key = key_name(k);
                self.seen.insert(key.clone());
                let expected = self.model.add(key.clone(), now);
                let status = self.state.add_ref(key.as_str(), now);
                assert_eq!(status, expected, "{ctx}: add_ref status");
            }
            Op::AddAfter(k, delay) => {
                let key = key_name(k);
                self.seen.insert(key.clone());
                let tracked = self.model.is_tracked(&key);
                let expected = self.model.add_after(key.clone(), delay, now);
                let (status, back) = self.state.add_after_or_return(key.clone(), delay, now);
                assert_eq!(status, expected, "{ctx}: add_after status");
                let stored = !tracked && !matches!(status, AddStatus::ShutDown | AddStatus::Never);
                assert_eq!(
                    back.is_none(),
                    stored,
                    "{ctx}: add_after_or_return hands back"
                );
            }
            Op::Get => self.get(ctx, now),
            Op::Finish(index, outcome, delay) => {
                if !self.held.is_empty() {
                    let i = index % self.held.len();
                    self.finish(ctx, i, outcome, delay, now);
                }
            }
            Op::ForeignFinish => {
                let mut other: QueueState<String> = QueueState::new();
                other.add(key_name(0), now);
                let Get::Ready(ticket, _) = other.get(now) else {
                    panic!("{ctx}: a fresh state did not hand out its key");
                };
                assert!(
                    self.state.ticket_key(&ticket).is_none(),
                    "{ctx}: a foreign ticket names a key here"
                );
                let r = self.state.try_finish(ticket, Outcome::Done, None, now);
                assert!(r.is_err(), "{ctx}: a foreign ticket was accepted");
            }
            Op::ShutDown => {
                let expected = self.model.shut_down();
                let mut released = self.state.shut_down();
                released.sort();
                assert_eq!(released, expected, "{ctx}: keys released by shut_down");
            }
            Op::Len => {
                let expected = self.model.len(now);
                assert_eq!(self.state.len(now), expected, "{ctx}: len");
            }
            Op::Advance(d) => {
                self.now = self.now.saturating_add(nanos(d));
            }
            Op::Rewind(d) => {
                self.now = self.now.saturating_sub(nanos(d));
            }
            Op::Drain => {
                for _ in 0..1024 {
                    let ready = self.model.len(now);
                    assert_eq!(self.state.len(now), ready, "{ctx}: len while draining");
                    if ready == 0 {
                        break;
                    }
                    self.get(ctx, now);
                    let last = self.held.len() - 1;
                    self.finish(ctx, last, Outcome::Done, None, now);
                }
            }
        }
        self.compare(ctx);
    }

    fn get(&mut self, ctx: Ctx<'_>, now: Instant) {
        let expected = self.model.get(now);
        match (self.state.get(now), expected) {
            (Get::Ready(ticket, key), ModelGet::Ready(k)) => {
                assert_eq!(key, k, "{ctx}: get handed out another key");
                assert_eq!(
                    self.state.ticket_key(&ticket),
                    Some(&key),
                    "{ctx}: ticket_key"
                );
                assert!(
                    self.held.iter().all(|(_, h)| *h != key),
                    "{ctx}: {key} handed out twice"
                );
                self.held.push((ticket, key));
            }
            (
                Get::Empty { next_deadline },
                ModelGet::Empty {
                    next_deadline: expected,
                },
            ) => assert_eq!(next_deadline, expected, "{ctx}: get's next_deadline"),
            (Get::ShutDown, ModelGet::ShutDown) => {}
            (got, expected) => panic!("{ctx}: get returned {got:?}, the model {expected:?}"),
        }
    }

    fn finish(
        &mut self,
        ctx: Ctx<'_>,
        i: usize,
        outcome: Outcome,
        delay: Option<Duration>,
        now: Instant,
    ) {
        let (ticket, key) = self.held.remove(i);
        assert_eq!(
            self.state.ticket_key(&ticket),
            Some(&key),
            "{ctx}: ticket_key of a held ticket"
        );
        let expected: ModelFinished = self
            .model
            .finish(&key, outcome, delay, now)
            .unwrap_or_else(|| panic!("{ctx}: the model does not process {key}"));
        let f = self.state.finish(ticket, outcome, delay, now);
        let got = ModelFinished {
            requeued: f.requeued,
            waiting: f.waiting,
            released: f.released.is_some(),
        };
        assert_eq!(
            got, expected,
            "{ctx}: finish({key}, {outcome:?}, {delay:?})"
        );
        if let Some(k) = f.released {
            assert_eq!(k, key, "{ctx}: finish released another key");
        }
    }

    /// Compares every observable of the two sides and checks the state's invariants.
    fn compare(&self, ctx: Ctx<'_>) {
        let (s, m) = (&self.state, &self.model);
        s.check_invariants();
        assert_eq!(s.counts(), m.counts(), "{ctx}: counts");
        assert_eq!(s.ready_len(), m.counts().ready, "{ctx}: ready_len");
        assert_eq!(s.ready_keys(), m.ready_keys(), "{ctx}: FIFO");
        let mut processing = s.processing_keys();
        processing.sort();
        assert_eq!(processing, m.processing_keys(), "{ctx}: processing");
        assert_eq!(s.next_deadline(), m.next_deadline(), "{ctx}: next_deadline");
        assert_eq!(
            s.has_waiting(),
            m.next_deadline().is_some(),
            "{ctx}: has_waiting"
        );
        assert_eq!(s.now(), m.now(), "{ctx}: now");
        assert_eq!(
            s.is_shutting_down(),
            m.is_shutting_down(),
            "{ctx}: shutting down"
        );
        for include_queued in [false, true] {
            assert_eq!(
                s.is_drained(include_queued),
                m.is_drained(include_queued),
                "{ctx}: is_drained({include_queued})"
            );
        }
        for key in &self.seen {
            assert_eq!(
                s.is_queued(key.as_str()),
                m.is_queued(key),
                "{ctx}: is_queued({key})"
            );
            assert_eq!(
                s.is_processing(key.as_str()),
                m.is_processing(key),
                "{ctx}: is_processing({key})"
            );
            assert_eq!(
                s.waiting_deadline(key.as_str()),
                m.waiting_deadline(key),
                "{ctx}: waiting_deadline({key})"
            );
        }
        assert_eq!(
            self.held.len(),
            m.counts().processing,
            "{ctx}: tickets held vs processing"
        );
    }

    /// Finishes every held ticket, shuts down and drains: both sides must end empty.
    pub fn wind_down(&mut self) {
        while !self.held.is_empty() {
            self.apply(&Op::Finish(0, Outcome::Done, None));
        }
        self.apply(&Op::ShutDown);
        self.apply(&Op::Drain);
        assert!(self.held.is_empty(), "Drain finishes what it takes");
        assert_eq!(self.state.counts(), Default::default(), "state not empty");
        assert!(matches!(self.state.get(self.at()), Get::ShutDown));
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[derive(Clone, Copy)]
struct Ctx<'a> {
    step: usize,
    op: &'a Op,
}

impl fmt::Display for Ctx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {} ({:?})", self.step, self.op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasherDefault, Hasher};

    /// Every key hashes to 0: all lookups probe through collisions.
    #[derive(Default)]
    struct Collide;
    impl Hasher for Collide {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, _: &[u8]) {}
    }

    fn script() -> Vec<Op> {
        let ms = Duration::from_millis;
        vec![
            Op::Add(1),
            Op::AddAfter(2, ms(5)),
            Op::AddAfter(3, ms(5)),
            Op::AddAfter(2, ms(3)),
            Op::Get,
            Op::AddRef(1),
            Op::Advance(ms(4)),
            Op::Len,
            Op::Get,
            Op::Finish(0, Outcome::Retry, Some(ms(1))),
            Op::Rewind(ms(10)),
            Op::AddAfter(4, Duration::MAX),
            Op::ForeignFinish,
            Op::Advance(ms(2)),
            Op::Get,
            Op::Finish(1, Outcome::RequeueAfter(Duration::ZERO), None),
            Op::ShutDown,
            Op::Add(5),
            Op::Drain,
        ]
    }

    #[test]
    fn a_scripted_run_agrees() {
        let mut h = StateHarness::new();
        for op in script() {
            h.apply(&op);
        }
        h.wind_down();
    }

    #[test]
    fn agrees_when_every_key_collides() {
        let mut h = StateHarness::with_hasher(BuildHasherDefault::<Collide>::default());
        for op in script() {
            h.apply(&op);
        }
        h.wind_down();
    }
}
