//! Run a function over `0..pieces` on a bounded number of threads (client-go's `ParallelizeUntil`).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use parking_lot::Mutex;

use crate::panics::panic_message;

/// How a [`parallelize`] run ended when no piece panicked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parallelized {
    /// Pieces that ran to completion.
    pub completed: usize,
    /// Whether cancellation kept at least one piece from starting.
    pub cancelled: bool,
}

/// Why [`parallelize`] did not run every piece.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParallelizeError {
    /// `workers` was zero, so no piece could run.
    #[error("parallelize needs at least one worker; pass workers >= 1")]
    NoWorkers,
    /// A piece panicked. No new pieces were started after it; pieces already running finished.
    #[error("piece {piece} panicked: {message}")]
    Panicked {
        /// The piece that panicked (the first, if several did).
        piece: usize,
        /// The panic's message, when it was a string.
        message: String,
        /// Pieces that ran to completion.
        completed: usize,
    },
}

/// Calls `work(piece)` for every piece in `0..pieces` on at most `workers` threads, handing out
/// `chunk_size` consecutive pieces at a time (0 is taken as 1), and returns when all have run.
///
/// `cancelled` is checked before each piece: once it is set, no new piece starts (pieces already
/// running finish) and the result says so. A panicking piece does not abort the process: it stops
/// the run and is reported as [`ParallelizeError::Panicked`].
///
/// ```
/// use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
/// use workqueue_core::parallelize;
///
/// let sum = AtomicUsize::new(0);
/// let never = AtomicBool::new(false);
/// let done = parallelize(4, 100, 10, &never, |piece| {
///     sum.fetch_add(piece, Ordering::Relaxed);
/// })
/// .unwrap();
/// assert_eq!(done.completed, 100);
/// assert_eq!(sum.into_inner(), 4950);
/// ```
pub fn parallelize<F>(
    workers: usize,
    pieces: usize,
    chunk_size: usize,
    cancelled: &AtomicBool,
    work: F,
) -> Result<Parallelized, ParallelizeError>
where
    F: Fn(usize) + Sync,
{
    if workers == 0 {
        return Err(ParallelizeError::NoWorkers);
    }
    let chunk_size = chunk_size.max(1);
    let chunks = pieces.div_ceil(chunk_size);
    let next_chunk = AtomicUsize::new(0);
    let completed = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let was_cancelled = AtomicBool::new(false);
    let panic: Mutex<Option<(usize, Box<dyn Any + Send>)>> = Mutex::new(None);

    let run = || {
        loop {
            let chunk = next_chunk.fetch_add(1, Ordering::Relaxed);
            if chunk >= chunks {
                return;
            }
            // `chunk < chunks` keeps `start < pieces`; the end saturates, as a chunk as large as
            // `usize::MAX / 2 + 2` would overflow `start + chunk_size`.
            let start = chunk * chunk_size;
            for piece in start..start.saturating_add(chunk_size).min(pieces) {
                if cancelled.load(Ordering::Relaxed) {
                    was_cancelled.store(true, Ordering::Relaxed);
                    return;
                }
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                match catch_unwind(AssertUnwindSafe(|| work(piece))) {
                    Ok(()) => {
                        completed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(payload) => {
                        stop.store(true, Ordering::Relaxed);
                        panic.lock().get_or_insert((piece, payload));
                        return;
                    }
                }
            }
        }
    };
    let threads = workers.min(chunks);
    thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(run);
        }
        if threads > 0 {
            run();
        }
    });

    let completed = completed.into_inner();
    if let Some((piece, payload)) = panic.into_inner() {
        return Err(ParallelizeError::Panicked {
            piece,
            message: panic_message(&*payload),
            completed,
        });
    }
    Ok(Parallelized {
        completed,
        cancelled: was_cancelled.into_inner(),
    })
}
