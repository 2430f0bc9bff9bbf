//! Panic injection: keys whose `Clone`, `Hash`, `Eq` or `Drop` panic, and a rate limiter that
//! panics, at a chosen call.
//!
//! User code runs inside the queue, and the queue promises that a panic there leaves it usable
//! (DESIGN.md 3.6). The property tests, the fuzzers and the panic-safety tests check that promise
//! by arming a [`Fault`] for one operation: the `n`-th call of that kind of user code on this
//! thread panics with [`INJECTED`], and the fault disarms itself. Faults are per thread, so tests
//! running in parallel do not disturb each other.
//!
//! ```
//! use std::panic::catch_unwind;
//! use workqueue_model::faults::{self, Fault, FaultyKey};
//!
//! let key = FaultyKey::from("a");
//! faults::arm(Fault::Clone, 2);
//! let first = key.clone(); // the first clone passes
//! assert!(catch_unwind(|| key.clone()).is_err()); // the second panics
//! let third = key.clone(); // and the fault is spent
//! # let _ = (first, third);
//! ```

use std::borrow::Borrow;
use std::cell::Cell;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use workqueue_core::Instant;
use workqueue_core::ratelimit::RateLimiter;

/// The panic message of every injected panic.
pub const INJECTED: &str = "injected panic";

/// A kind of user code that can be made to panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// [`FaultyKey`]'s `Clone` (and its `From<&str>`, which is how a borrowed add clones).
    Clone,
    /// [`FaultyKey`]'s `Hash`.
    Hash,
    /// [`FaultyKey`]'s `Eq`.
    Eq,
    /// [`FaultyKey`]'s `Drop` (never while the thread is already unwinding: that would abort).
    Drop,
    /// Every method of a [`FaultyLimiter`].
    Limiter,
}

const KINDS: usize = 5;

thread_local! {
    /// Per kind: how many more calls pass before one panics (0: disarmed).
    static COUNTDOWN: [Cell<u32>; KINDS] = const { [const { Cell::new(0) }; KINDS] };
}

/// Arms `fault` on this thread: its `nth` call from now panics (1 is the next call); 0 disarms.
pub fn arm(fault: Fault, nth: u32) {
    COUNTDOWN.with(|c| c[fault as usize].set(nth));
}

/// Disarms every fault on this thread.
pub fn disarm_all() {
    COUNTDOWN.with(|c| c.iter().for_each(|c| c.set(0)));
}

/// Whether `fault` is armed on this thread (its panic has not struck yet).
pub fn is_armed(fault: Fault) -> bool {
    COUNTDOWN.with(|c| c[fault as usize].get() != 0)
}

/// A call of `fault`'s kind: panics if it is the armed one.
pub fn strike(fault: Fault) {
    if fault == Fault::Drop && std::thread::panicking() {
        return;
    }
    let fire = COUNTDOWN.with(|c| {
        let c = &c[fault as usize];
        match c.get() {
            0 => false,
            n => {
                c.set(n - 1);
                n == 1
            }
        }
    });
    if fire {
        std::panic::panic_any(INJECTED);
    }
}

/// Runs `f` with `fault` armed at its `nth` call, and disarms everything afterwards: `Err` with
/// the panic's payload if `f` panicked (injected or not).
pub fn with_fault<R>(fault: Fault, nth: u32, f: impl FnOnce() -> R) -> std::thread::Result<R> {
    silence_injected_panics();
    arm(fault, nth);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    disarm_all();
    r
}

/// Keeps injected panics out of the panic hook's output (thousands of them in a property test or
/// a fuzz run would bury everything else); other panics are reported as before. Idempotent.
pub fn silence_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !is_injected(info.payload()) {
                previous(info);
            }
        }));
    });
}

/// Whether a caught panic's payload is an injected one.
pub fn is_injected(payload: &(dyn std::any::Any + Send)) -> bool {
    payload.downcast_ref::<&str>() == Some(&INJECTED)
}

/// A string key whose `Clone`, `Hash`, `Eq` and `Drop` strike the armed [`Fault`]s.
///
/// It borrows as `str` (with the same hash), so a queue of them takes borrowed adds, which clone
/// through `From<&str>`: that counts as a `Clone`.
#[derive(PartialOrd, Ord)]
pub struct FaultyKey(String);

impl FaultyKey {
    /// The key's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Clone for FaultyKey {
    fn clone(&self) -> Self {
        strike(Fault::Clone);
        FaultyKey(self.0.clone())
    }
}

impl Hash for FaultyKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        strike(Fault::Hash);
        // As `str` hashes: `Borrow<str>` requires the two to agree.
        self.0.as_str().hash(state);
    }
}

impl PartialEq for FaultyKey {
    fn eq(&self, other: &Self) -> bool {
        strike(Fault::Eq);
        self.0 == other.0
    }
}

impl Eq for FaultyKey {}

impl Drop for FaultyKey {
    fn drop(&mut self) {
        strike(Fault::Drop);
    }
}

impl Borrow<str> for FaultyKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for FaultyKey {
    fn from(s: &str) -> Self {
        strike(Fault::Clone);
        FaultyKey(s.to_owned())
    }
}

impl fmt::Debug for FaultyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A rate limiter whose every call strikes [`Fault::Limiter`] before it asks `inner`.
#[derive(Debug)]
pub struct FaultyLimiter<L>(pub L);

impl<K: ?Sized, L: RateLimiter<K>> RateLimiter<K> for FaultyLimiter<L> {
    fn when(&self, key: &K, now: Instant) -> Duration {
        strike(Fault::Limiter);
        self.0.when(key, now)
    }

    fn forget(&self, key: &K) {
        strike(Fault::Limiter);
        self.0.forget(key)
    }

    fn num_requeues(&self, key: &K) -> u32 {
        strike(Fault::Limiter);
        self.0.num_requeues(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_strikes_once_at_its_call() {
        let k = FaultyKey::from("k");
        let r = with_fault(Fault::Eq, 3, || {
            assert!(k == k);
            assert!(k == k);
            k == k
        });
        assert!(is_injected(&*r.unwrap_err()));
        assert!(!is_armed(Fault::Eq));
        assert!(k == k);
    }

    #[test]
    fn a_drop_fault_waits_while_unwinding() {
        let r = with_fault(Fault::Drop, 1, || {
            let _k = FaultyKey::from("k");
            panic!("first");
        });
        assert!(r.is_err());
        assert!(!is_armed(Fault::Drop), "with_fault disarms");
    }
}
