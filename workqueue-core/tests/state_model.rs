//! Differential property tests: `QueueState` against the reference model (`workqueue-model`).
//!
//! Random operation sequences (adds, borrowed adds, delayed adds, gets, finishing held tickets in
//! any order with every `Outcome`, foreign tickets, shutdown, `len`, drains, and a clock that moves
//! both ways) are applied to the state and to the model in lock step. After every step the
//! harness compares each result and every observable, and runs `check_invariants()`. The key space
//! is small (six keys) so that de-duplication, dirty re-adds and earliest-wins collide often.
//!
//! Panic injection: the `..._with_panics` properties arm a fault before random operations (a key's
//! `Clone`, `Hash` or `Eq` panics at its `n`-th call), over more keys so that the index grows
//! while a `Hash` may panic, and on states that record few index buckets. After every caught
//! panic the state must match the model (the interrupted operation changed nothing but the
//! promotion it made) and keep its invariants.
//!
//! Compaction: `Op::Compact` forces one, and `..._while_compacting` lowers the size from which
//! `get` compacts on its own to a few keys; compaction must be invisible to the model.
//!
//! A failure shrinks to a short, readable `Vec<Op>`; replay it with `replay(&[...])` in a unit
//! test of its own.

use std::hash::{BuildHasherDefault, DefaultHasher, Hasher};
use std::time::Duration;

use proptest::prelude::*;
use workqueue_core::__private::StateTesting;
use workqueue_model::Outcome;
use workqueue_model::differential::{Op, StateHarness};
use workqueue_model::faults::Fault;

const KEYS: u8 = 6;

/// Delays that make deadlines collide (a few ms), split ties by a nanosecond, and hit the
/// saturation edges (`Duration::MAX` is "never"; `u64::MAX - 1` ns is the latest storable deadline).
fn delay() -> impl Strategy<Value = Duration> {
    prop_oneof![
        6 => (0u64..8).prop_map(Duration::from_millis),
        2 => (0u64..3).prop_map(Duration::from_nanos),
        1 => Just(Duration::MAX),
        1 => Just(Duration::from_nanos(u64::MAX - 1)),
        1 => any::<u64>().prop_map(Duration::from_nanos),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Done),
        Just(Outcome::Forget),
        Just(Outcome::Retry),
        delay().prop_map(Outcome::RetryAfter),
        delay().prop_map(Outcome::RequeueAfter),
    ]
}

/// A few priorities, so that levels collide and keys are raised.
fn priority() -> impl Strategy<Value = i32> {
    prop_oneof![Just(-100), Just(-1), Just(0), Just(1), Just(7)]
}

/// An add with flags (rate-limited, debounced, bypassing parking), debounces often.
fn add_flags(keys: u8) -> impl Strategy<Value = Op> {
    (
        0..keys,
        priority(),
        delay(),
        prop_oneof![3 => Just(2u8), 1 => 0u8..8],
    )
        .prop_map(|(k, p, d, f)| Op::AddFlags(k, p, d, f))
}

/// A removal by predicate (a mask of the keys kept), whose `keep` panics sometimes.
fn retain() -> impl Strategy<Value = Op> {
    (any::<u32>(), prop_oneof![3 => Just(0u8), 1 => 1u8..8]).prop_map(|(m, p)| Op::Retain(m, p))
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    prop_oneof![
        1 => retain(),
        4 => (key.clone(), priority(), delay()).prop_map(|(k, p, d)| Op::AddWith(k, p, d)),
        3 => add_flags(KEYS),
        6 => key.clone().prop_map(Op::Add),
        2 => key.clone().prop_map(Op::AddRef),
        5 => (key, delay()).prop_map(|(k, d)| Op::AddAfter(k, d)),
        6 => Just(Op::Get),
        6 => (0usize..8, outcome(), proptest::option::of(delay()))
            .prop_map(|(i, o, d)| Op::Finish(i, o, d)),
        2 => (0usize..8, outcome(), proptest::option::of(delay()), priority())
            .prop_map(|(i, o, d, p)| Op::FinishAt(i, o, d, p)),
        1 => Just(Op::ForeignFinish),
        1 => Just(Op::ShutDown),
        2 => Just(Op::Len),
        4 => (0u64..6).prop_map(|n| Op::Advance(Duration::from_millis(n))),
        1 => (0u64..6).prop_map(|n| Op::Rewind(Duration::from_millis(n))),
        1 => Just(Op::Drain),
        1 => Just(Op::Compact),
    ]
}

/// [`op`] over 20 keys (the index grows at 4, 8 and 15), with a fault armed before a third of
/// the operations.
fn faulty_op() -> impl Strategy<Value = Op> {
    let fault = prop_oneof![Just(Fault::Clone), Just(Fault::Hash), Just(Fault::Eq)];
    prop_oneof![
        3 => op().prop_map(|op| match op {
            Op::Add(k) => Op::Add(k * 3 + 1),
            Op::AddAfter(k, d) => Op::AddAfter(k * 3 + 2, d),
            Op::AddWith(k, p, d) => Op::AddWith(k * 3, p, d),
            Op::ShutDown => Op::Len,
            op => op,
        }),
        1 => (fault, 1u8..20).prop_map(|(f, n)| Op::Fault(f, n)),
    ]
}

/// Like [`op`], but shutdown is rare, so long runs explore the live queue.
fn live_op() -> impl Strategy<Value = Op> {
    op().prop_filter("rare shutdown", |o| *o != Op::ShutDown)
}

/// Operations for outage detection: mostly signalled finishes (failures often, so the detector
/// opens; successes sometimes, so probes close it), adds of parked keys, and a clock that moves
/// by seconds so that probes come due; shutdown is rare.
fn outage_op() -> impl Strategy<Value = Op> {
    let failing = prop_oneof![
        3 => Just(Outcome::Retry),
        1 => delay().prop_map(Outcome::RetryAfter),
        1 => Just(Outcome::Forget),
        1 => Just(Outcome::Done),
    ];
    prop_oneof![
        10 => (0usize..8, failing, proptest::option::of(delay()), 0u8..4)
            .prop_map(|(i, o, d, s)| Op::FinishSignalled(i, o, d, s)),
        3 => (0usize..8, outcome(), proptest::option::of(delay()), 0u8..4)
            .prop_map(|(i, o, d, s)| Op::FinishSignalled(i, o, d, s)),
        8 => Just(Op::Get),
        3 => (0..KEYS).prop_map(Op::Add),
        2 => (0..KEYS, delay()).prop_map(|(k, d)| Op::AddAfter(k, d)),
        3 => add_flags(KEYS),
        1 => retain(),
        3 => (0u64..3).prop_map(|n| Op::Advance(Duration::from_secs(n))),
        2 => (0u64..6).prop_map(|n| Op::Advance(Duration::from_millis(n))),
        1 => (0usize..8, outcome(), proptest::option::of(delay()))
            .prop_map(|(i, o, d)| Op::Finish(i, o, d)),
        1 => Just(Op::Len),
        1 => Just(Op::Drain),
        1 => op(),
    ]
}

/// Small detector parameters, so that it opens, probes and closes within a short run.
fn outage_config() -> workqueue_core::ratelimit::OutageConfig {
    workqueue_core::ratelimit::OutageConfig::default()
        .with_window(Duration::from_secs(10))
        .with_min_first_failures(2)
        .with_probe_initial(Duration::from_secs(1))
        .with_probe_max(Duration::from_secs(4))
}

fn replay(ops: &[Op]) {
    StateHarness::new().run(ops);
}

/// Random outage runs do reach every part of the mechanism: over a fixed set of seeds, the
/// detector opens, probes fail, and it closes, releasing keys.
#[test]
fn outage_runs_open_probe_and_close() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = proptest::collection::vec(outage_op(), 150..200);
    let mut totals = (0, 0, 0);
    for _ in 0..64 {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        let mut h = StateHarness::new().with_outage_detection(outage_config());
        for op in &ops {
            h.apply(op);
        }
        let (o, p, c) = h.outage_events();
        totals = (totals.0 + o, totals.1 + p, totals.2 + c);
        h.wind_down();
    }
    assert!(
        totals.0 > 10 && totals.1 > 10 && totals.2 > 10,
        "{totals:?}"
    );
}

/// The pinned cases, scripted: an add of a parked key leaves it parked (one that bypasses
/// parking runs it, as an extra probe), a give-up while open is not parked, shutdown drops
/// parked keys and the drain ends without them.
#[test]
fn outage_pinned_cases_scripted() {
    use Op::*;
    let s = Duration::from_secs;
    let retry = |i| FinishSignalled(i, Outcome::Retry, Some(Duration::from_millis(5)), 1);
    let mut h = StateHarness::new().with_outage_detection(outage_config());
    for k in 0..4 {
        h.apply(&Add(k));
    }
    for _ in 0..4 {
        h.apply(&Get);
    }
    for _ in 0..4 {
        h.apply(&retry(0)); // first failures: opens at the second; the rest are parked
    }
    assert!(h.state().outage_detector().unwrap().is_open());
    let parked = h.state().parked_len();
    assert!(parked >= 2, "{parked}");
    // An add of a parked key leaves it parked, whatever its options (but bypass).
    let parked_key = (0..4)
        .find(|&k| h.state().is_parked(format!("k{k}").as_str()))
        .unwrap();
    let len = h.state().counts().ready;
    h.apply(&Add(parked_key));
    h.apply(&AddWith(parked_key, 7, Duration::ZERO));
    h.apply(&AddAfter(parked_key, Duration::from_millis(1)));
    h.apply(&AddFlags(parked_key, 0, Duration::from_millis(1), 1));
    h.apply(&AddFlags(parked_key, 0, Duration::from_millis(1), 2));
    assert_eq!(h.state().counts().ready, len);
    assert!(h.state().is_parked(format!("k{parked_key}").as_str()));
    // One that bypasses parking runs it at once; its failure parks it again.
    h.apply(&AddFlags(parked_key, 0, Duration::ZERO, 4));
    h.apply(&Get);
    h.apply(&FinishSignalled(0, Outcome::Retry, None, 2));
    assert!(h.state().outage_detector().unwrap().is_open());
    assert!(h.state().is_parked(format!("k{parked_key}").as_str()));
    // A give-up (Forget) of a failing key while open: not parked.
    h.apply(&Add(5));
    h.apply(&Get);
    h.apply(&FinishSignalled(0, Outcome::Forget, None, 1));
    assert!(!h.state().is_parked("k5"));
    // k0's backoff (it failed before the opening) and the probe (k1) come due; k0's success
    // is no proof; the probe's success closes it and every parked key is released.
    h.apply(&Advance(s(2)));
    h.apply(&Get);
    h.apply(&Get);
    h.apply(&FinishSignalled(0, Outcome::Forget, None, 0));
    assert!(h.state().outage_detector().unwrap().is_open());
    h.apply(&FinishSignalled(0, Outcome::Forget, None, 0));
    assert!(!h.state().outage_detector().unwrap().is_open());
    assert_eq!(h.state().parked_len(), 0);
    assert_eq!(h.outage_events().2, 1);
    // Re-open, then shut down with parked keys: they are dropped, the drain ends.
    h.apply(&Advance(s(20)));
    h.apply(&Drain);
    for k in 0..4 {
        h.apply(&Add(k));
    }
    for _ in 0..4 {
        h.apply(&Get);
    }
    for _ in 0..4 {
        h.apply(&retry(0));
    }
    assert!(h.state().parked_len() >= 2);
    h.wind_down();
    assert_eq!(h.state().parked_len(), 0);
}

/// Every key hashes alike: the hash index resolves everything by probing.
#[derive(Default)]
struct Collide;

impl Hasher for Collide {
    fn finish(&self) -> u64 {
        7
    }
    fn write(&mut self, _: &[u8]) {}
}

proptest! {
    #[test]
    fn state_agrees_with_model(ops in proptest::collection::vec(op(), 1..100)) {
        replay(&ops);
    }

    /// Outage detection: parked keys are neither lost (each is a waiting entry at the sentinel
    /// on both sides) nor leased twice (one ticket per processing key, compared at every step);
    /// probes, releases (in park order, with their pacing) and events agree with the model; a
    /// shutdown drops parked keys with the other waiting keys, and the final drain does not wait
    /// for them (`wind_down` ends with both sides empty).
    #[test]
    fn state_agrees_with_model_with_outage_detection(
        ops in proptest::collection::vec(outage_op(), 1..200),
    ) {
        let mut h = StateHarness::new().with_outage_detection(outage_config());
        h.run(&ops);
    }

    #[test]
    fn live_state_agrees_with_model(ops in proptest::collection::vec(live_op(), 1..150)) {
        replay(&ops);
    }

    /// `keep_backoff`: adds of keys waiting on a rate-limited retry are held, and retries carry
    /// re-adds made during the run; alone and with outage detection.
    #[test]
    fn state_agrees_with_model_keeping_backoff(
        ops in proptest::collection::vec(outage_op(), 1..200),
        outage in any::<bool>(),
    ) {
        let mut h = StateHarness::new().with_keep_backoff();
        if outage {
            h = h.with_outage_detection(outage_config());
        }
        h.run(&ops);
    }

    #[test]
    fn state_agrees_with_model_with_panics(
        ops in proptest::collection::vec(faulty_op(), 1..200),
        limit in prop_oneof![Just(u32::MAX), Just(0u32), 1u32..16],
    ) {
        let mut h = StateHarness::new().with_bucket_limit(limit);
        h.run(&ops);
    }

    /// Compaction on its own (from one or a few live keys, so every `get` may compact, once the
    /// live count settles or, without settling, at once) and forced, over 20 keys, with faults,
    /// fairness and aging in any combination.
    #[test]
    fn state_agrees_with_model_while_compacting(
        ops in proptest::collection::vec(faulty_op(), 1..200),
        min in 1usize..5,
        settle in any::<bool>(),
        fair in any::<bool>(),
        aging in proptest::option::of(prop_oneof![Just(0u64), 1_000_000u64..5_000_000]),
    ) {
        let mut h = StateHarness::new().with_compact_min(min);
        if !settle {
            h = h.without_settling();
        }
        if fair {
            h = h.with_fairness();
        }
        if let Some(max_wait) = aging {
            h = h.with_max_ready_wait(Duration::from_nanos(max_wait));
        }
        h.run(&ops);
    }

    #[test]
    fn state_agrees_with_model_with_aging(
        ops in proptest::collection::vec(op(), 1..150),
        max_wait in prop_oneof![Just(0u64), 1u64..4, Just(1_000_000), 1_000_000u64..5_000_000],
    ) {
        let mut h = StateHarness::new().with_max_ready_wait(Duration::from_nanos(max_wait));
        h.run(&ops);
    }

    #[test]
    fn state_agrees_with_model_with_fairness(
        ops in proptest::collection::vec(op(), 1..150),
        aging in proptest::option::of(prop_oneof![Just(0u64), 1u64..4, 1_000_000u64..5_000_000]),
    ) {
        let mut h = StateHarness::new().with_fairness();
        if let Some(max_wait) = aging {
            h = h.with_max_ready_wait(Duration::from_nanos(max_wait));
        }
        h.run(&ops);
    }

    #[test]
    fn state_agrees_with_model_under_total_hash_collision(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut h = StateHarness::with_hasher(BuildHasherDefault::<Collide>::default());
        h.run(&ops);
    }

    #[test]
    fn state_agrees_with_model_with_a_fixed_sip_hasher(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut h = StateHarness::with_hasher(BuildHasherDefault::<DefaultHasher>::default());
        h.run(&ops);
    }
}

// ---- hand-written cases: each row of the semantics table that a random run rarely hits ---------

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn due_waiting_entry_of_a_processing_key_marks_it_dirty_before_finish() {
    replay(&[
        Op::Add(0),
        Op::AddAfter(0, ms(1)),
        Op::Get,
        Op::Advance(ms(1)),
        Op::Finish(0, Outcome::RetryAfter(ms(3)), None),
        Op::Get,
    ]);
}

#[test]
fn equal_deadlines_leave_in_insertion_order_and_reinsert_moves_to_the_back() {
    replay(&[
        Op::AddAfter(0, ms(2)),
        Op::AddAfter(1, ms(2)),
        Op::Advance(ms(1)),
        Op::AddAfter(2, ms(1)),
        Op::AddAfter(0, ms(1)),
        Op::AddAfter(0, ms(1)),
        Op::Advance(ms(1)),
        Op::Drain,
    ]);
}

#[test]
fn saturating_delays_and_clock_going_back() {
    replay(&[
        Op::Advance(ms(5)),
        Op::AddAfter(0, Duration::from_nanos(u64::MAX - 1)),
        Op::AddAfter(1, Duration::MAX),
        Op::Rewind(ms(5)),
        Op::AddAfter(2, ms(1)),
        Op::Get,
        Op::Advance(ms(5)),
        Op::Get,
        Op::Finish(0, Outcome::Retry, Some(Duration::MAX)),
        Op::Finish(
            0,
            Outcome::RequeueAfter(Duration::from_nanos(u64::MAX)),
            None,
        ),
        Op::Len,
    ]);
}

/// Retain removes queued, waiting and parked keys (a removed probe is replaced), clears the
/// dirty mark of a processing key that is not kept, and changes nothing when `keep` panics.
#[test]
fn retain_removes_queued_waiting_and_parked_keys() {
    use Op::*;
    let retry = |i| FinishSignalled(i, Outcome::Retry, Some(ms(5)), 1);
    let mut h = StateHarness::new().with_outage_detection(outage_config());
    for k in 0..5 {
        h.apply(&Add(k));
    }
    for _ in 0..4 {
        h.apply(&Get);
    }
    for _ in 0..4 {
        h.apply(&retry(0));
    }
    assert!(h.state().parked_len() >= 2);
    h.apply(&AddFlags(5, 0, ms(3), 2));
    h.apply(&Get); // k4
    h.apply(&Add(4)); // dirty
    h.apply(&Retain(0b1, 3)); // keep panics at its third call: nothing changes
    assert_eq!(h.panics(), 1);
    h.apply(&Retain(0b1, 0)); // keep only k0
    assert_eq!(h.state().counts().tracked, 2, "k0 and the processing k4");
    h.apply(&Finish(0, Outcome::Done, None));
    assert_eq!(h.state().counts().tracked, 1);
    h.wind_down();
}

#[test]
fn finishing_after_shutdown_requeues_dirty_keys_and_drops_retries() {
    replay(&[
        Op::Add(0),
        Op::Add(1),
        Op::Get,
        Op::Get,
        Op::Add(0),
        Op::AddAfter(2, ms(1)),
        Op::ShutDown,
        Op::Finish(0, Outcome::Retry, Some(ms(1))),
        Op::Finish(0, Outcome::RetryAfter(Duration::ZERO), None),
        Op::Add(3),
        Op::Get,
        Op::Get,
        Op::Drain,
    ]);
}
