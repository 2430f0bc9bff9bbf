//! Test helpers shared by the test binaries (each includes them with `mod common;`).
#![allow(
    dead_code,
    reason = "not every test binary that shares this module uses all of it"
)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use workqueue_tokio::runner::{Action, Context, Failure};

/// `n` nanoseconds.
pub fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Awaits `fut`, failing instead of hanging if it is not done within a virtual day: with the
/// clock paused, a test whose tasks all wait forever (a lost wake-up) jumps straight to this
/// deadline.
pub async fn within<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(86_400), fut)
        .await
        .expect("hung: not done within a virtual day (lost wake-up?)")
}

/// What makes a [`Fragile`] key's `Clone` or `Display` panic: the 1-based number of the call.
pub struct Trap {
    clones: AtomicU32,
    debugs: AtomicU32,
    clone_panics: fn(u32) -> bool,
    debug_panics: fn(u32) -> bool,
}

/// A key whose `Clone` and `Display` (what the runner's span shows) are user code that can panic.
/// Equality and hashing see only its name and id; `Debug` never panics.
pub struct Fragile {
    pub name: &'static str,
    id: u32,
    trap: Arc<Trap>,
}

impl Fragile {
    pub fn new(
        name: &'static str,
        clone_panics: fn(u32) -> bool,
        debug_panics: fn(u32) -> bool,
    ) -> Self {
        let trap = Trap {
            clones: AtomicU32::new(0),
            debugs: AtomicU32::new(0),
            clone_panics,
            debug_panics,
        };
        Fragile {
            name,
            id: 0,
            trap: Arc::new(trap),
        }
    }

    pub fn sturdy(name: &'static str) -> Self {
        Fragile::new(name, |_| false, |_| false)
    }

    /// The same key with another id (a distinct key of the same name and behaviour).
    pub fn with_id(mut self, id: u32) -> Self {
        self.id = id;
        self
    }
}

impl Clone for Fragile {
    fn clone(&self) -> Self {
        let n = self.trap.clones.fetch_add(1, SeqCst) + 1;
        if (self.trap.clone_panics)(n) {
            panic!(
                "clone {n} of {} panicked (expected by this test)",
                self.name
            );
        }
        Fragile {
            name: self.name,
            id: self.id,
            trap: self.trap.clone(),
        }
    }
}

impl std::fmt::Display for Fragile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.trap.debugs.fetch_add(1, SeqCst) + 1;
        if (self.trap.debug_panics)(n) {
            panic!(
                "display {n} of {} panicked (expected by this test)",
                self.name
            );
        }
        f.write_str(self.name)
    }
}

impl std::fmt::Debug for Fragile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for Fragile {
    fn eq(&self, other: &Self) -> bool {
        (self.name, self.id) == (other.name, other.id)
    }
}

impl Eq for Fragile {}

impl std::hash::Hash for Fragile {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.name, self.id).hash(state)
    }
}

/// The error policy that retries with backoff `n` times and gives up on the `n + 1`-th failure
/// in a row (the runner's count).
pub fn max_retries<T: 'static, E: 'static, C: 'static>(
    n: u32,
) -> impl Fn(&T, &Failure<E>, &Context<C>) -> Action + Send + Sync + 'static {
    move |_, _, ctx| {
        if ctx.failures_in_a_row() < n {
            Action::backoff()
        } else {
            Action::await_change()
        }
    }
}

/// How long a runner's worker pauses after the queue's `get` panicked (the runner's `Report`
/// documents it).
pub const GET_PANIC_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
