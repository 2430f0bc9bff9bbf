//! A counting global allocator for W9 (heap bytes per queued item).
//!
//! It forwards every call to [`System`] and, while counting is enabled, adds the bytes allocated
//! and subtracts the bytes freed. A binary installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: workqueue_benches::alloc::CountingAlloc = workqueue_benches::alloc::CountingAlloc;
//! ```
//!
//! Counting is off by default, so other workloads pay one relaxed load per allocation and no
//! locked instruction. Only one measurement may run at a time (the counter is process-wide).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);
static NET: AtomicIsize = AtomicIsize::new(0);

/// The counting allocator: `System`, plus a net byte count while [`measure`] runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

#[inline]
fn count(delta: isize) {
    if ENABLED.load(Ordering::Relaxed) {
        NET.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees hold; the counting only touches atomics and never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, i.e. by `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `System` with `layout`; the caller upholds the rest.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Runs `f` with counting on and returns its result with the net heap bytes it left allocated
/// (allocated minus freed, by every thread, while `f` ran).
///
/// Returns `None` for the bytes when [`CountingAlloc`] is not the global allocator.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Option<isize>) {
    let installed = is_installed();
    NET.store(0, Ordering::SeqCst);
    ENABLED.store(true, Ordering::SeqCst);
    let r = f();
    ENABLED.store(false, Ordering::SeqCst);
    let net = NET.swap(0, Ordering::SeqCst);
    (r, installed.then_some(net))
}

/// Whether [`CountingAlloc`] is this process's global allocator.
pub fn is_installed() -> bool {
    NET.store(0, Ordering::SeqCst);
    ENABLED.store(true, Ordering::SeqCst);
    let probe = std::hint::black_box(Box::new(0u64));
    ENABLED.store(false, Ordering::SeqCst);
    drop(probe);
    NET.swap(0, Ordering::SeqCst) != 0
}

/// A running count: net heap bytes allocated since [`Meter::start`], read at any time with
/// [`Meter::net`] (the memory bound tests read it at several points of one run). Counting stops
/// when the meter is dropped. Like [`measure`], one at a time per process.
#[derive(Debug)]
pub struct Meter(());

impl Meter {
    /// Resets the count and starts counting.
    pub fn start() -> Self {
        NET.store(0, Ordering::SeqCst);
        ENABLED.store(true, Ordering::SeqCst);
        Meter(())
    }

    /// Net heap bytes allocated since the start (allocated minus freed, by every thread).
    pub fn net(&self) -> isize {
        NET.load(Ordering::SeqCst)
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::SeqCst);
    }
}
