//! Catching the panics of user code the runner calls.

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `f`; a panic becomes its message.
///
/// `AssertUnwindSafe` is sound here because every caller either discards what `f` touched or
/// touches only state that stays consistent when `f` panics (counters, the queue, which keeps its
/// invariants through a panic of user code).
pub fn catch<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| workqueue_core::panic_message(&*payload))
}
