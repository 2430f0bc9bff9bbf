//! Lock-step driver: one sequence of operations applied to [`QueueState`] and to [`Model`].
//!
//! Shared by the property tests (`workqueue-core/tests/state_model.rs`, which generate [`Op`]s with
//! proptest) and the fuzzer (`fuzz/fuzz_targets/state_differential.rs`, which maps arbitrary bytes
//! to [`Op`]s). After every operation [`StateHarness::apply`] compares each result, then every
//! observable of the two (counts, FIFO order, processing set, per-key status and deadline,
//! `next_deadline`, `now`) and runs [`QueueState::check_invariants`]. Any difference panics with
//! the step number and the operation.
//!
//! Panic injection: the queue's keys are [`FaultyKey`]s, and [`Op::Fault`] arms a fault for the
//! next operation (its `n`-th `Clone`, `Hash` or `Eq` panics). Only the operations that call user
//! code may panic (adds and `get`, which hash, compare and clone keys); one that panics must leave
//! the state as the model's [`Model::interrupted`] says (the promotion it made, nothing else),
//! with every invariant intact. Finishing a ticket, shutting down and `len` call no user code, so
//! an injected fault must never strike in them: that is checked too, also on a state that records
//! few index buckets ([`StateHarness::with_bucket_limit`]), where freeing a key takes the path
//! that would otherwise hash it.

use std::collections::BTreeSet;
use std::fmt;
use std::hash::BuildHasher;
use std::panic::resume_unwind;
use std::time::Duration;

use workqueue_core::__private::{StateTesting, finished_flags};
use workqueue_core::AddOptions;
use workqueue_core::ratelimit::{OutageConfig, Signal};
use workqueue_core::state::{DefaultHashBuilder, Get, OutageEvent, QueueState, Ticket};

use crate::faults::{self, Fault, FaultyKey};
use crate::{AddStatus, Instant, Model, ModelAdd, ModelEvent, ModelFinished, ModelGet, Outcome};

/// One step of a differential run. Keys are small integers, named `k{n}` in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `add(k)` (through `add_or_return`, whose returned key is checked too).
    Add(u8),
    /// `add_ref(&k)`: clones only untracked keys.
    AddRef(u8),
    /// An add after `d` (`AddOptions::after`, through `add_or_return`).
    AddAfter(u8, Duration),
    /// An add at `priority` after `d` (through `add_or_return`).
    AddWith(u8, i32, Duration),
    /// An add at `priority` after `d` with the flags in `flags` (through `add_or_return`): bit 0
    /// `rate_limited`, bit 1 `debounced`, bit 2 `bypass_parking`.
    AddFlags(u8, i32, Duration, u8),
    /// `get()`: the ticket is held until a [`Op::Finish`].
    Get,
    /// Finishes the held ticket at `index % held` with an outcome; the `Option` is the limiter's
    /// delay (used by `Retry`, ignored otherwise).
    Finish(usize, Outcome, Option<Duration>),
    /// Like [`Op::Finish`], with the re-add at this priority (`Outcome::with_priority`).
    FinishAt(usize, Outcome, Option<Duration>, i32),
    /// Like [`Op::Finish`], with the signal `signal % 4` (`Outcome::with_signal`: success,
    /// first failure, failure, ignored); a release paces key `k` by `(k % 4) * 3` ms. Without
    /// outage detection ([`StateHarness::with_outage_detection`]) it is `Finish`.
    FinishSignalled(usize, Outcome, Option<Duration>, u8),
    /// Finishing a ticket of another state is refused and changes nothing.
    ForeignFinish,
    /// `shut_down()`.
    ShutDown,
    /// `retain(keep)` keeping key `k` when bit `k % 32` of the mask is set; with a second value
    /// `n > 0`, `keep` panics at its `n`-th call (the state must then be as it was, and `keep`
    /// must be the only user code called).
    Retain(u32, u8),
    /// `len()`, which promotes due keys.
    Len,
    /// Moves the driver's clock forward.
    Advance(Duration),
    /// Moves the driver's clock backwards (the state must clamp it).
    Rewind(Duration),
    /// `get` + `finish(Done)` until nothing is ready.
    Drain,
    /// `compact()`: forces a compaction (which hashes every live key, so a fault may strike;
    /// it must then change nothing). Compaction is invisible to the model.
    Compact,
    /// Arms a fault for the next operation: its `n`-th call of that user code panics (1 is the
    /// first; 0 arms nothing). [`Fault::Drop`] and [`Fault::Limiter`] never strike here: the
    /// state drops no key and calls no limiter.
    Fault(Fault, u8),
}

/// The pacing of a finish that releases nothing (no outage detection, or a signal that cannot
/// close the detector).
fn no_pace(_: &FaultyKey) -> Duration {
    Duration::ZERO
}

/// The queue-side name of key `k`.
pub fn key_name(k: u8) -> String {
    format!("k{k}")
}

/// The fairness group of key `k` (when fairness is on): three groups, so rounds interleave.
pub fn group(k: u8) -> u64 {
    u64::from(k % 3)
}

/// The queue-side key `k`.
fn faulty(k: u8) -> FaultyKey {
    FaultyKey::from(key_name(k).as_str())
}

fn names(keys: Vec<FaultyKey>) -> Vec<String> {
    keys.iter().map(|k| k.as_str().to_owned()).collect()
}

/// `QueueState<FaultyKey, S>` and `Model<String>` driven in lock step.
pub struct StateHarness<S = DefaultHashBuilder> {
    state: QueueState<FaultyKey, S>,
    model: Model<String>,
    held: Vec<(Ticket, String)>,
    seen: BTreeSet<String>,
    now: u64,
    step: usize,
    /// The fault armed for the next operation.
    fault: Option<(Fault, u32)>,
    /// Operations an injected panic interrupted.
    panics: usize,
    /// Whether fairness is on (groups from [`group`]).
    fair: bool,
    /// Outage events seen: opened, probes failed, closed.
    outage_events: [usize; 3],
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
        // Timing on: `check_invariants` then also recounts the depth per priority for metrics.
        let mut state = QueueState::with_capacity_and_hasher(0, hasher);
        state.enable_timing();
        StateHarness {
            state,
            model: Model::new(),
            held: Vec::new(),
            seen: BTreeSet::new(),
            now: 0,
            step: 0,
            fault: None,
            panics: 0,
            fair: false,
            outage_events: [0; 3],
        }
    }

    /// The same harness with fairness on both sides, key `k` in group `k % 3` ([`group`]).
    pub fn with_fairness(mut self) -> Self {
        self.state.enable_fairness();
        self.model = std::mem::take(&mut self.model)
            .with_fairness(|key: &String| group(key[1..].parse().expect("keys are k<number>")));
        self.fair = true;
        self
    }

    /// The same harness on a state that records only index buckets below `limit` in its slots
    /// (see [`QueueState::limit_recorded_buckets`]), so it takes the path of huge queues.
    pub fn with_bucket_limit(mut self, limit: u32) -> Self {
        self.state.limit_recorded_buckets(limit);
        self
    }

    /// The same harness with outage detection on both sides (the state's parking and the
    /// model's, each with its own detector).
    pub fn with_outage_detection(mut self, config: OutageConfig) -> Self {
        self.state.enable_outage_detection(config);
        self.model = std::mem::take(&mut self.model).with_outage_detection(config);
        self
    }

    /// The same harness on a state that compacts from `min` live keys (see
    /// [`QueueState::set_compact_min`]), so `get` compacts on its own with a handful of keys.
    pub fn with_compact_min(mut self, min: usize) -> Self {
        self.state.set_compact_min(min);
        self
    }

    /// The same harness on a state that compacts at the first `get` below its threshold,
    /// without waiting for the live count to settle (see [`QueueState::set_settle`]).
    pub fn without_settling(mut self) -> Self {
        self.state.set_settle(false);
        self
    }

    /// The same harness with `keep_backoff` on both sides (`QueueState::set_keep_backoff`).
    pub fn with_keep_backoff(mut self) -> Self {
        self.state.set_keep_backoff(true);
        self.model = std::mem::take(&mut self.model).with_keep_backoff();
        self
    }

    /// The same harness with aging on both sides (`QueueState::set_max_ready_wait`).
    pub fn with_max_ready_wait(mut self, max_wait: Duration) -> Self {
        self.state.enable_aging(max_wait);
        self.model = std::mem::take(&mut self.model).with_max_ready_wait(max_wait);
        self
    }

    /// The state under test.
    pub fn state(&self) -> &QueueState<FaultyKey, S> {
        &self.state
    }

    /// How many operations an injected panic interrupted so far.
    pub fn panics(&self) -> usize {
        self.panics
    }

    /// The model.
    pub fn model(&self) -> &Model<String> {
        &self.model
    }

    /// The outage detector's events seen so far: (opened, probes failed, closed).
    pub fn outage_events(&self) -> (usize, usize, usize) {
        let [o, p, c] = self.outage_events;
        (o, p, c)
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
        if let Op::Fault(fault, n) = *op {
            self.fault = (n > 0).then_some((fault, u32::from(n)));
            return;
        }
        match *op {
            Op::Add(k) => {
                let key = key_name(k);
                self.seen.insert(key.clone());
                let tracked = self.model.is_tracked(&key);
                let qkey = faulty(k);
                let fair = self.fair;
                let Some((status, back)) = self.on_state(ctx, true, |s| {
                    s.add_or_return(qkey, AddOptions::new(), fair.then(|| group(k)), now)
                }) else {
                    self.model.interrupted(now);
                    return self.compare(ctx);
                };
                let expected = self.model.add(key.clone(), now);
                assert_eq!(status, expected, "{ctx}: add status");
                let stored = !tracked && status != AddStatus::ShutDown;
                assert_eq!(back.is_none(), stored, "{ctx}: add_or_return hands back");
                if let Some(b) = back {
                    assert_eq!(
                        b.as_str(),
                        key,
                        "{ctx}: add_or_return handed back another key"
                    );
                }
            }
            Op::AddRef(k) => {
                let key = key_name(k);
                self.seen.insert(key.clone());
                // With fairness a borrowed add has no group: a driver clones the key first,
                // before the state (so a panicking clone leaves the state untouched).
                let owned = self.fair.then(|| faulty(k));
                let Some(status) = self.on_state(ctx, true, |s| match owned {
                    Some(qkey) => {
                        s.add_or_return(qkey, AddOptions::new(), Some(group(k)), now)
                            .0
                    }
                    None => s.add_ref(key.as_str(), AddOptions::new(), now),
                }) else {
                    self.model.interrupted(now);
                    return self.compare(ctx);
                };
                let expected = self.model.add(key.clone(), now);
                assert_eq!(status, expected, "{ctx}: add_ref status");
            }
            Op::AddAfter(k, delay) => {
                let key = key_name(k);
                self.seen.insert(key.clone());
                let tracked = self.model.is_tracked(&key);
                let qkey = faulty(k);
                let fair = self.fair;
                let opts = AddOptions::new().after(delay);
                let Some((status, back)) = self.on_state(ctx, true, |s| {
                    s.add_or_return(qkey, opts, fair.then(|| group(k)), now)
                }) else {
                    self.model.interrupted(now);
                    return self.compare(ctx);
                };
                let expected = self.model.add_after(key.clone(), delay, now);
                assert_eq!(status, expected, "{ctx}: add_after status");
                let stored = !tracked && !matches!(status, AddStatus::ShutDown | AddStatus::Never);
                assert_eq!(
                    back.is_none(),
                    stored,
                    "{ctx}: add_or_return after a delay hands back"
                );
            }
            Op::AddWith(k, priority, delay) => {
                let key = key_name(k);
                self.seen.insert(key.clone());
                let tracked = self.model.is_tracked(&key);
                let qkey = faulty(k);
                let opts = AddOptions::new().priority(priority).after(delay);
                let Some((status, back)) = self.on_state(ctx, true, |s| {
                    s.add_or_return(qkey, opts, Some(group(k)), now)
                }) else {
                    self.model.interrupted(now);
                    return self.compare(ctx);
                };
                let expected = self.model.add_with(key.clone(), priority, delay, now);
                assert_eq!(status, expected, "{ctx}: add_with status");
                let stored = !tracked && !matches!(status, AddStatus::ShutDown | AddStatus::Never);
                assert_eq!(
                    back.is_none(),
                    stored,
                    "{ctx}: add_or_return with options hands back"
                );
            }
            Op::AddFlags(k, priority, delay, flags) => {
                let key = key_name(k);
                self.seen.insert(key.clone());
                let tracked = self.model.is_tracked(&key);
                let qkey = faulty(k);
                let add = ModelAdd {
                    priority,
                    delay,
                    rate_limited: flags & 1 != 0,
                    debounced: flags & 2 != 0,
                    bypass_parking: flags & 4 != 0,
                };
                let Some((status, back)) = self.on_state(ctx, true, |s| {
                    s.add_or_return(qkey, add.to_queue(), Some(group(k)), now)
                }) else {
                    self.model.interrupted(now);
                    return self.compare(ctx);
                };
                let expected = self.model.add_options(key.clone(), add, now);
                assert_eq!(status, expected, "{ctx}: add with {add:?}: status");
                let stored = !tracked && !matches!(status, AddStatus::ShutDown | AddStatus::Never);
                assert_eq!(
                    back.is_none(),
                    stored,
                    "{ctx}: add_or_return with flags hands back"
                );
            }
            Op::Get => self.get(ctx, now),
            Op::Finish(index, outcome, delay) => {
                if !self.held.is_empty() {
                    let i = index % self.held.len();
                    self.finish(ctx, i, outcome, delay, None, now);
                }
            }
            Op::FinishAt(index, outcome, delay, priority) => {
                if !self.held.is_empty() {
                    let i = index % self.held.len();
                    self.finish(ctx, i, outcome, delay, Some(priority), now);
                }
            }
            Op::FinishSignalled(index, outcome, delay, signal) => {
                if !self.held.is_empty() {
                    let i = index % self.held.len();
                    self.finish_signalled(ctx, i, outcome, delay, signal, now);
                }
            }
            Op::Retain(mask, panic_at) => self.retain(ctx, mask, panic_at),
            Op::ForeignFinish => {
                let mut other: QueueState<String> = QueueState::new();
                other.add(key_name(0), AddOptions::new(), now);
                let Get::Ready(ticket, _) = other.get(now) else {
                    panic!("{ctx}: a fresh state did not hand out its key");
                };
                assert!(
                    self.state.ticket_key(&ticket).is_none(),
                    "{ctx}: a foreign ticket names a key here"
                );
                let r = self
                    .state
                    .finish(ticket, Outcome::Done.to_queue(), None, now, no_pace);
                assert!(r.is_err(), "{ctx}: a foreign ticket was accepted");
            }
            Op::ShutDown => {
                let expected = self.model.shut_down();
                let released = self.on_state(ctx, false, |s| s.shut_down());
                let mut released = names(released.expect("shut_down calls no user code"));
                released.sort();
                assert_eq!(released, expected, "{ctx}: keys released by shut_down");
            }
            Op::Len => {
                let expected = self.model.len(now);
                let len = self.on_state(ctx, false, |s| s.len(now));
                assert_eq!(len, Some(expected), "{ctx}: len");
            }
            Op::Advance(d) => {
                self.now = self.now.saturating_add(nanos(d));
            }
            Op::Rewind(d) => {
                self.now = self.now.saturating_sub(nanos(d));
            }
            Op::Drain => {
                // A loop of gets and finishes: a fault would strike at an arbitrary get of it.
                self.fault = None;
                for _ in 0..1024 {
                    let ready = self.model.len(now);
                    assert_eq!(self.state.len(now), ready, "{ctx}: len while draining");
                    if ready == 0 {
                        break;
                    }
                    self.get(ctx, now);
                    let last = self.held.len() - 1;
                    self.finish(ctx, last, Outcome::Done, None, None, now);
                }
            }
            Op::Compact => {
                let before = self.state.compactions();
                if self.on_state(ctx, true, |s| s.compact()).is_some() {
                    assert_eq!(
                        self.state.compactions(),
                        before + 1,
                        "{ctx}: compact did not count"
                    );
                } else {
                    assert_eq!(
                        self.state.compactions(),
                        before,
                        "{ctx}: an interrupted compaction counted"
                    );
                }
            }
            Op::Fault(..) => unreachable!("handled above"),
        }
        // A fault is armed for one operation only, struck or not.
        self.fault = None;
        self.compare(ctx);
    }

    /// Runs the state's side of an operation with the armed fault, if any: `None` when an
    /// injected panic interrupted it, which only an operation that `may_panic` may do (any other
    /// panic fails the run as it is).
    fn on_state<R>(
        &mut self,
        ctx: Ctx<'_>,
        may_panic: bool,
        op: impl FnOnce(&mut QueueState<FaultyKey, S>) -> R,
    ) -> Option<R> {
        let Some((fault, nth)) = self.fault.take() else {
            return Some(op(&mut self.state));
        };
        let state = &mut self.state;
        match faults::with_fault(fault, nth, || op(state)) {
            Ok(r) => Some(r),
            Err(p) if faults::is_injected(&*p) => {
                assert!(
                    may_panic,
                    "{ctx}: called user code ({fault:?}) but must not"
                );
                self.panics += 1;
                None
            }
            Err(p) => resume_unwind(p),
        }
    }

    /// `retain` on both sides: the same keys removed (no longer tracked), or, when `keep`
    /// panics, nothing changed on either side.
    fn retain(&mut self, ctx: Ctx<'_>, mask: u32, panic_at: u8) {
        let kept = |key: &str| {
            let k: u32 = key[1..].parse().expect("keys are k<number>");
            mask & (1 << (k % 32)) != 0
        };
        let fired = std::cell::Cell::new(false);
        let calls = std::cell::Cell::new(0u32);
        let keep = |key: &FaultyKey| {
            calls.set(calls.get() + 1);
            if calls.get() == u32::from(panic_at) {
                fired.set(true);
                std::panic::panic_any(faults::INJECTED);
            }
            kept(key.as_str())
        };
        let tracked = self.model.tracked_keys().len();
        // Any other fault armed must not strike: `keep` is the only user code `retain` calls.
        let (fault, nth) = self.fault.take().unwrap_or((Fault::Clone, 0));
        let state = &mut self.state;
        let removed = match faults::with_fault(fault, nth, || state.retain(keep)) {
            Ok(removed) => removed,
            Err(p) if faults::is_injected(&*p) => {
                assert!(
                    fired.get(),
                    "{ctx}: retain called user code other than keep"
                );
                assert_eq!(
                    calls.get(),
                    u32::from(panic_at),
                    "{ctx}: keep was called after its panic"
                );
                self.panics += 1;
                return;
            }
            Err(p) => resume_unwind(p),
        };
        assert!(!fired.get(), "{ctx}: keep's panic was swallowed");
        assert_eq!(
            calls.get() as usize,
            tracked,
            "{ctx}: keep is asked once per key"
        );
        let mut removed = names(removed);
        removed.sort();
        let expected = self.model.retain(|key: &String| kept(key));
        assert_eq!(removed, expected, "{ctx}: retain removed");
    }

    fn get(&mut self, ctx: Ctx<'_>, now: Instant) {
        let Some(got) = self.on_state(ctx, true, |s| s.get(now)) else {
            self.model.interrupted_get(now);
            return;
        };
        let expected = self.model.get(now);
        match (got, expected) {
            (Get::Ready(ticket, key), ModelGet::Ready(k)) => {
                let key = key.as_str().to_owned();
                assert_eq!(key, k, "{ctx}: get handed out another key");
                assert_eq!(
                    Some(ticket.priority()),
                    self.model.processing_priority(&key),
                    "{ctx}: the priority {key} was handed out at"
                );
                assert_eq!(
                    self.state.ticket_key(&ticket).map(FaultyKey::as_str),
                    Some(key.as_str()),
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
        priority: Option<i32>,
        now: Instant,
    ) {
        let (ticket, key) = self.held.remove(i);
        let queue_outcome = match priority {
            Some(p) => outcome.to_queue().with_priority(p),
            None => outcome.to_queue(),
        };
        assert_eq!(
            self.state.ticket_key(&ticket).map(FaultyKey::as_str),
            Some(key.as_str()),
            "{ctx}: ticket_key of a held ticket"
        );
        let expected: ModelFinished = self
            .model
            .finish_at(
                &key,
                outcome,
                delay,
                priority.unwrap_or(ticket.priority()),
                now,
            )
            .unwrap_or_else(|| panic!("{ctx}: the model does not process {key}"));
        let f = self
            .on_state(ctx, false, |s| {
                s.finish(ticket, queue_outcome, delay, now, no_pace)
            })
            .expect("finish calls no user code")
            .unwrap_or_else(|_| panic!("{ctx}: a held ticket was refused"));
        let (requeued, waiting) = finished_flags(&f);
        let got = ModelFinished {
            requeued,
            waiting,
            released: f.released.is_some(),
        };
        assert_eq!(
            got, expected,
            "{ctx}: finish({key}, {outcome:?}, {delay:?})"
        );
        if let Some(k) = f.released {
            assert_eq!(k.as_str(), key, "{ctx}: finish released another key");
        }
    }

    /// Finishes held ticket `i` with a signal for the outage detector: the finish, the event,
    /// and the keys released, in order, with their pacing, must agree.
    fn finish_signalled(
        &mut self,
        ctx: Ctx<'_>,
        i: usize,
        outcome: Outcome,
        delay: Option<Duration>,
        signal: u8,
        now: Instant,
    ) {
        let signal = [
            Signal::Success,
            Signal::FirstFailure,
            Signal::Failure,
            Signal::Ignored,
        ][usize::from(signal % 4)];
        let pace = |k: &str| Duration::from_millis(k[1..].parse::<u64>().unwrap_or(0) % 4 * 3);
        let (ticket, key) = self.held.remove(i);
        let mut model_released = Vec::new();
        let expected = self
            .model
            .finish_signalled(
                &key,
                outcome,
                delay,
                ticket.priority(),
                signal,
                now,
                &mut |k: &String| {
                    model_released.push(k.clone());
                    pace(k)
                },
            )
            .unwrap_or_else(|| panic!("{ctx}: the model does not process {key}"));
        let mut released = Vec::new();
        let queue_outcome = outcome.to_queue().with_signal(signal);
        let result = self
            .on_state(ctx, false, |s| {
                s.finish(ticket, queue_outcome, delay, now, |k: &FaultyKey| {
                    released.push(k.as_str().to_owned());
                    pace(k.as_str())
                })
            })
            .expect("finish calls no user code");
        let mut f = result.unwrap_or_else(|_| panic!("{ctx}: a held ticket was refused"));
        let event = f.outage.take();
        let (requeued, waiting) = finished_flags(&f);
        let got = ModelFinished {
            requeued,
            waiting,
            released: f.released.is_some(),
        };
        let event = event.map(|e| match e {
            OutageEvent::Opened => ModelEvent::Opened,
            OutageEvent::ProbeFailed { next } => ModelEvent::ProbeFailed(next),
            OutageEvent::Closed { lasted, released } => ModelEvent::Closed(lasted, released),
            other => panic!("{ctx}: unknown event {other:?}"),
        });
        assert_eq!(
            (got, event),
            expected,
            "{ctx}: finish_signalled({key}, {outcome:?}, {delay:?}, {signal:?})"
        );
        assert_eq!(released, model_released, "{ctx}: keys released, in order");
        match event {
            Some(ModelEvent::Opened) => self.outage_events[0] += 1,
            Some(ModelEvent::ProbeFailed(_)) => self.outage_events[1] += 1,
            Some(ModelEvent::Closed(..)) => self.outage_events[2] += 1,
            None => {}
        }
    }

    /// Compares every observable of the two sides and checks the state's invariants.
    fn compare(&self, ctx: Ctx<'_>) {
        let (s, m) = (&self.state, &self.model);
        s.check_invariants();
        assert_eq!(s.counts(), m.counts(), "{ctx}: counts");
        assert_eq!(names(s.ready_keys()), m.ready_keys(), "{ctx}: FIFO");
        let mut processing = names(s.processing_keys());
        processing.sort();
        assert_eq!(processing, m.processing_keys(), "{ctx}: processing");
        assert_eq!(s.next_deadline(), m.next_deadline(), "{ctx}: next_deadline");
        assert_eq!(s.now(), m.now(), "{ctx}: now");
        assert_eq!(
            s.is_shutting_down(),
            m.is_shutting_down(),
            "{ctx}: shutting down"
        );
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
            assert_eq!(
                s.queued_priority_of(key.as_str()),
                m.queued_priority(key),
                "{ctx}: queued_priority({key})"
            );
            assert_eq!(
                s.waiting_priority_of(key.as_str()),
                m.waiting_priority(key),
                "{ctx}: waiting_priority({key})"
            );
        }
        assert_eq!(
            self.held.len(),
            m.counts().processing,
            "{ctx}: tickets held vs processing"
        );
        // Parking: the same keys parked (a parked key is never lost: it is a waiting entry,
        // compared above, and never leased twice: tickets are compared above), the same open
        // detector, the same probe.
        assert_eq!(
            s.outage_detector().map(|d| d.is_open()),
            self.model_parking().then(|| m.is_outage_open()),
            "{ctx}: detector open"
        );
        assert_eq!(s.parked_len(), m.parked_keys().len(), "{ctx}: parked_len");
        for key in &self.seen {
            assert_eq!(
                s.is_parked(key.as_str()),
                m.is_parked(key),
                "{ctx}: is_parked({key})"
            );
        }
    }

    fn model_parking(&self) -> bool {
        self.state.outage_detector().is_some()
    }

    /// Applies `ops` in order, then [`StateHarness::wind_down`].
    pub fn run(&mut self, ops: &[Op]) {
        for op in ops {
            self.apply(op);
        }
        self.wind_down();
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
            Op::AddWith(6, -100, Duration::ZERO),
            Op::AddWith(7, -100, Duration::ZERO),
            Op::AddWith(7, 0, Duration::ZERO),
            Op::AddWith(8, 5, ms(1)),
            Op::AddWith(8, 7, ms(3)),
            Op::Get,
            Op::AddWith(6, 2, Duration::ZERO),
            Op::Advance(ms(1)),
            Op::Get,
            Op::Finish(0, Outcome::RetryAfter(Duration::ZERO), None),
            Op::Compact,
            Op::ShutDown,
            Op::Add(5),
            Op::Compact,
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

    /// Faults before every operation that can and cannot call user code, on a state that records
    /// no bucket (so freeing a key would hash it, were it not stored).
    #[test]
    fn a_scripted_run_with_faults_agrees() {
        for limit in [u32::MAX, 0] {
            let mut h = StateHarness::new().with_bucket_limit(limit);
            for op in script() {
                for fault in [Fault::Clone, Fault::Hash, Fault::Eq] {
                    h.apply(&Op::Fault(fault, 1));
                    h.apply(&op);
                }
                h.apply(&op);
            }
            assert!(h.panics() > 0, "no fault struck");
            h.wind_down();
        }
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
