//! `QueueState` against the reference model, driven by arbitrary operations.
//!
//! The same lock-step check as `workqueue-core/tests/state_model.rs` (the harness lives in
//! `workqueue_model::differential`): every result and every observable must agree, and
//! `check_invariants()` must hold after every step. The hasher is chosen by the input too: the
//! default random one, a fixed SipHash, or one under which every key collides.
#![no_main]

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hasher};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use workqueue_fuzz::{FDelay, FOutcome};
use workqueue_model::differential::{Op, StateHarness};

#[derive(Debug, Arbitrary)]
enum FOp {
    Add(u8),
    AddRef(u8),
    AddAfter(u8, FDelay),
    Get,
    Finish(u8, FOutcome, Option<FDelay>),
    ForeignFinish,
    /// Shuts down only for small values, so most runs stay live for a while.
    ShutDown(u8),
    Len,
    Advance(FDelay),
    Rewind(FDelay),
    Drain,
}

#[derive(Debug, Arbitrary)]
enum HasherChoice {
    Random,
    Sip,
    Collide,
}

#[derive(Debug, Arbitrary)]
struct Input {
    hasher: HasherChoice,
    ops: Vec<FOp>,
}

/// Every key hashes alike.
#[derive(Default)]
struct Collide;

impl Hasher for Collide {
    fn finish(&self) -> u64 {
        0x5555
    }
    fn write(&mut self, _: &[u8]) {}
}

const KEYS: u8 = 8;

fn op(f: &FOp) -> Option<Op> {
    Some(match *f {
        FOp::Add(k) => Op::Add(k % KEYS),
        FOp::AddRef(k) => Op::AddRef(k % KEYS),
        FOp::AddAfter(k, d) => Op::AddAfter(k % KEYS, d.get()),
        FOp::Get => Op::Get,
        FOp::Finish(i, o, d) => Op::Finish(usize::from(i), o.get(), d.map(FDelay::get)),
        FOp::ForeignFinish => Op::ForeignFinish,
        FOp::ShutDown(n) if n < 8 => Op::ShutDown,
        FOp::ShutDown(_) => return None,
        FOp::Len => Op::Len,
        FOp::Advance(d) => Op::Advance(d.get()),
        FOp::Rewind(d) => Op::Rewind(d.get()),
        FOp::Drain => Op::Drain,
    })
}

fn run<S: BuildHasher>(mut h: StateHarness<S>, ops: &[FOp]) {
    for f in ops.iter().take(2048) {
        if let Some(op) = op(f) {
            h.apply(&op);
        }
    }
    h.wind_down();
}

fuzz_target!(|input: Input| {
    match input.hasher {
        HasherChoice::Random => run(StateHarness::new(), &input.ops),
        HasherChoice::Sip => run(
            StateHarness::with_hasher(BuildHasherDefault::<DefaultHasher>::default()),
            &input.ops,
        ),
        HasherChoice::Collide => run(
            StateHarness::with_hasher(BuildHasherDefault::<Collide>::default()),
            &input.ops,
        ),
    }
});
