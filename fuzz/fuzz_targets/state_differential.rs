//! `QueueState` against the reference model, driven by arbitrary operations.
//!
//! The same lock-step check as `workqueue-core/tests/state_model.rs` (the harness lives in
//! `workqueue_model::differential`): every result and every observable must agree, and
//! `check_invariants()` must hold after every step. The hasher is chosen by the input too: the
//! default random one, a fixed SipHash, or one under which every key collides.
//!
//! Panic injection: `Fault` arms a panic in the next operation's `n`-th key `Clone`, `Hash` or
//! `Eq`; the harness checks that only operations that may call user code panic, and that the
//! state then matches the model and keeps its invariants. The input also chooses how many index
//! buckets the state records in its slots, so freeing keys takes the path of huge queues, and
//! from how many live keys `get` compacts on its own (once the live count settles, or at once);
//! `Compact` forces a compaction.
//!
//! Outage detection: the input may turn it on (with small parameters, so the detector opens,
//! probes and closes within a run); `FinishSignalled` then finishes a ticket with a signal, and
//! parked keys, probes, releases (in order, with their pacing) and events must agree with the
//! model's, with no parked key lost or leased twice.
//!
//! Adds with flags (`AddFlags`: rate-limited, debounced, bypassing parking) and the input's
//! `keep_backoff` exercise the rules that look at why a key waits; `Retain` removes keys by a
//! predicate that may panic (the state must then be as it was).
#![no_main]

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hasher};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use workqueue_fuzz::{FDelay, FOutcome};
use workqueue_model::differential::{Op, StateHarness};
use workqueue_model::faults::Fault;

#[derive(Debug, Arbitrary)]
enum FOp {
    Add(u8),
    AddRef(u8),
    AddAfter(u8, FDelay),
    AddWith(u8, FPriority, FDelay),
    /// An add with flags: bit 0 rate-limited, bit 1 debounced, bit 2 bypassing parking.
    AddFlags(u8, FPriority, FDelay, u8),
    Get,
    Finish(u8, FOutcome, Option<FDelay>),
    FinishAt(u8, FOutcome, Option<FDelay>, FPriority),
    FinishSignalled(u8, FOutcome, Option<FDelay>, u8),
    /// Moves the clock by whole seconds (probes are seconds apart).
    AdvanceSecs(u8),
    ForeignFinish,
    /// Shuts down only for small values, so most runs stay live for a while.
    ShutDown(u8),
    Len,
    Advance(FDelay),
    Rewind(FDelay),
    Drain,
    Fault(FFault, u8),
    /// Forces a compaction.
    Compact,
    /// `retain` keeping the keys whose bit is set; `keep` panics at the given call (0: never).
    Retain(u32, u8),
}

/// A few priorities that collide, and any other.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum FPriority {
    Low,
    Zero,
    One,
    Seven,
    Any(i32),
}

impl FPriority {
    fn get(self) -> i32 {
        match self {
            FPriority::Low => workqueue_core::LOW_PRIORITY,
            FPriority::Zero => 0,
            FPriority::One => 1,
            FPriority::Seven => 7,
            FPriority::Any(p) => p,
        }
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum FFault {
    Clone,
    Hash,
    Eq,
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
    /// Index buckets at or above this are not recorded in slots (`u32::MAX`: as in production).
    bucket_limit: Option<u8>,
    /// Aging on, with this limit.
    max_ready_wait: Option<FDelay>,
    /// Fairness on (three groups).
    fair: bool,
    /// Outage detection on, with these parameters.
    outage: Option<FOutage>,
    /// `QueueState::set_keep_backoff(true)`.
    keep_backoff: bool,
    /// `get` compacts from this many live keys, mod 8 (`None`: the default, which 20 keys never
    /// reach); with bit 3 set, at the first get below the threshold, without settling.
    compact_min: Option<u8>,
    ops: Vec<FOp>,
}

/// Small detector parameters: the window in seconds, the fewest first failures, the ratio in
/// tenths, the first probe interval and its cap in seconds.
#[derive(Debug, Clone, Copy, Arbitrary)]
struct FOutage {
    window: u8,
    min: u8,
    ratio: u8,
    probe: u8,
    cap: u8,
}

impl FOutage {
    fn get(self) -> workqueue_ratelimit::OutageConfig {
        use std::time::Duration;
        workqueue_ratelimit::OutageConfig::default()
            .with_window(Duration::from_secs(u64::from(self.window % 60)))
            .with_min_first_failures(u32::from(self.min % 6))
            .with_ratio(f64::from(self.ratio % 11) / 10.0)
            .with_probe_initial(Duration::from_millis(u64::from(self.probe) * 40))
            .with_probe_max(Duration::from_secs(u64::from(self.cap % 10)))
    }
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

/// Enough keys that the index grows three times (at 4, 8 and 15 keys), also while a `Hash` panics.
const KEYS: u8 = 20;

fn op(f: &FOp) -> Option<Op> {
    Some(match *f {
        FOp::Add(k) => Op::Add(k % KEYS),
        FOp::AddRef(k) => Op::AddRef(k % KEYS),
        FOp::AddAfter(k, d) => Op::AddAfter(k % KEYS, d.get()),
        FOp::AddWith(k, p, d) => Op::AddWith(k % KEYS, p.get(), d.get()),
        FOp::AddFlags(k, p, d, f) => Op::AddFlags(k % KEYS, p.get(), d.get(), f % 8),
        FOp::Get => Op::Get,
        FOp::Finish(i, o, d) => Op::Finish(usize::from(i), o.get(), d.map(FDelay::get)),
        FOp::FinishAt(i, o, d, p) => {
            Op::FinishAt(usize::from(i), o.get(), d.map(FDelay::get), p.get())
        }
        FOp::FinishSignalled(i, o, d, sig) => {
            Op::FinishSignalled(usize::from(i), o.get(), d.map(FDelay::get), sig)
        }
        FOp::AdvanceSecs(n) => Op::Advance(std::time::Duration::from_secs(u64::from(n % 8))),
        FOp::ForeignFinish => Op::ForeignFinish,
        FOp::ShutDown(n) if n < 8 => Op::ShutDown,
        FOp::ShutDown(_) => return None,
        FOp::Len => Op::Len,
        FOp::Advance(d) => Op::Advance(d.get()),
        FOp::Rewind(d) => Op::Rewind(d.get()),
        FOp::Drain => Op::Drain,
        FOp::Compact => Op::Compact,
        FOp::Retain(mask, n) => Op::Retain(mask, n % 24),
        FOp::Fault(f, n) => Op::Fault(
            match f {
                FFault::Clone => Fault::Clone,
                FFault::Hash => Fault::Hash,
                FFault::Eq => Fault::Eq,
            },
            n % 24,
        ),
    })
}

fn run<S: BuildHasher>(h: StateHarness<S>, input: &Input) {
    let mut h = h.with_bucket_limit(input.bucket_limit.map_or(u32::MAX, u32::from));
    if input.fair {
        h = h.with_fairness();
    }
    if let Some(min) = input.compact_min {
        h = h.with_compact_min(usize::from(min % 8));
        if min & 8 != 0 {
            h = h.without_settling();
        }
    }
    if let Some(max_wait) = input.max_ready_wait {
        h = h.with_max_ready_wait(max_wait.get());
    }
    if let Some(outage) = input.outage {
        h = h.with_outage_detection(outage.get());
    }
    if input.keep_backoff {
        h = h.with_keep_backoff();
    }
    let ops = &input.ops;
    for f in ops.iter().take(2048) {
        if let Some(op) = op(f) {
            h.apply(&op);
        }
    }
    h.wind_down();
}

fuzz_target!(|input: Input| {
    match input.hasher {
        HasherChoice::Random => run(StateHarness::new(), &input),
        HasherChoice::Sip => run(
            StateHarness::with_hasher(BuildHasherDefault::<DefaultHasher>::default()),
            &input,
        ),
        HasherChoice::Collide => run(
            StateHarness::with_hasher(BuildHasherDefault::<Collide>::default()),
            &input,
        ),
    }
});
