//! The synchronisation primitives the queue is built on, swappable for loom's.
//!
//! Normally these are `parking_lot`'s lock and condition variable and std's atomics, re-exported
//! unchanged. Under `--cfg workqueue_loom` (in this crate's own tests only: loom is a
//! dev-dependency) they are thin wrappers around loom's, with the `parking_lot`-shaped API the
//! queue uses: `lock()` returns the guard, `Condvar::wait(&mut guard)`. Loom cannot model time, so
//! a timed wait panics there: loom models run on a `ManualClock`, whose waits are untimed.
//!
//! `Arc`/`Weak` stay std's: leases and clocks hold the queue as `Arc<dyn Trait>` / `Weak<dyn
//! Trait>`, which loom's `Arc` cannot express, and reference counts are not what the models check.
//!
//! Run the models with
//! `RUSTFLAGS="--cfg workqueue_loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p workqueue-core --release --lib loom`.

#[cfg(not(all(test, workqueue_loom)))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(all(test, workqueue_loom)))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64};

#[cfg(all(test, workqueue_loom))]
pub(crate) use self::loom_shim::{AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard};

#[cfg(all(test, workqueue_loom))]
mod loom_shim {
    use std::fmt;
    use std::ops::{Deref, DerefMut};
    use std::time::Duration;

    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64};

    /// loom's mutex with `parking_lot`'s API (no poisoning in the signature).
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    /// Its guard. The `Option` is empty only while a [`Condvar::wait`] holds the real guard.
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    /// loom's condition variable with `parking_lot`'s API.
    pub struct Condvar(loom::sync::Condvar);

    /// What `parking_lot`'s timed wait returns (never produced: timed waits panic under loom).
    #[derive(Debug)]
    pub struct WaitTimeoutResult(());

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().expect("loom mutex poisoned")))
        }

        #[allow(dead_code)] // parking_lot's API; unused by the queue at the moment
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok().map(|g| MutexGuard(Some(g)))
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Mutex::new(T::default())
        }
    }

    impl<T> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex(loom)")
        }
    }

    impl<T> fmt::Debug for MutexGuard<'_, T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("MutexGuard(loom)")
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            self.0.as_deref().expect("guard taken by a wait")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_deref_mut().expect("guard taken by a wait")
        }
    }

    impl Condvar {
        pub fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let g = guard.0.take().expect("guard taken by a wait");
            guard.0 = Some(self.0.wait(g).expect("loom mutex poisoned"));
        }

        /// Loom does not model time: the queue must not wait with a timeout under loom (use a
        /// `ManualClock`, whose waits are untimed).
        pub fn wait_for<T>(
            &self,
            _guard: &mut MutexGuard<'_, T>,
            timeout: Duration,
        ) -> WaitTimeoutResult {
            panic!("timed wait ({timeout:?}) under loom: drive loom models with a ManualClock");
        }

        pub fn notify_one(&self) {
            self.0.notify_one();
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    impl Default for Condvar {
        fn default() -> Self {
            Condvar::new()
        }
    }

    impl fmt::Debug for Condvar {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Condvar(loom)")
        }
    }
}
