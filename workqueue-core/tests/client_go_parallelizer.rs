//! Ports of client-go's `util/workqueue/parallelizer_test.go`, plus what it leaves untested:
//! zero workers, cancellation, and a panicking piece.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use workqueue_core::{ParallelizeError, Parallelized, parallelize};

struct Case {
    pieces: usize,
    workers: usize,
    chunk_size: usize,
}

const CASES: [Case; 4] = [
    Case {
        pieces: 1000,
        workers: 10,
        chunk_size: 1,
    },
    Case {
        pieces: 1000,
        workers: 10,
        chunk_size: 10,
    },
    Case {
        pieces: 1000,
        workers: 10,
        chunk_size: 100,
    },
    Case {
        pieces: 999,
        workers: 10,
        chunk_size: 13,
    },
];

fn counters(n: usize) -> Vec<AtomicUsize> {
    (0..n).map(|_| AtomicUsize::new(0)).collect()
}

// Go: TestParallelizeUntil.
#[test]
fn parallelize_until() {
    let never = AtomicBool::new(false);
    for case in &CASES {
        let seen = counters(case.pieces);
        let result = parallelize(case.workers, case.pieces, case.chunk_size, &never, |p| {
            seen[p].fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(
            result,
            Ok(Parallelized {
                completed: case.pieces,
                cancelled: false,
            }),
            "pieces {} workers {} chunk {}",
            case.pieces,
            case.workers,
            case.chunk_size
        );
        for (piece, count) in seen.iter().enumerate() {
            assert_eq!(
                count.load(Ordering::Relaxed),
                1,
                "piece {piece} of case pieces {} workers {} chunk {}",
                case.pieces,
                case.workers,
                case.chunk_size
            );
        }
    }
}

fn is_prime(n: usize) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

// Go: BenchmarkParallelizeUntil (its validation of the first 12 results, for every case).
#[test]
fn parallelize_until_is_prime() {
    const EXPECTED: [bool; 12] = [
        false, false, true, true, false, true, false, true, false, false, false, true,
    ];
    let never = AtomicBool::new(false);
    for case in &CASES {
        let primes: Vec<AtomicBool> = (0..case.pieces).map(|_| AtomicBool::new(false)).collect();
        parallelize(case.workers, case.pieces, case.chunk_size, &never, |p| {
            primes[p].store(is_prime(p), Ordering::Relaxed);
        })
        .unwrap();
        let first: Vec<bool> = primes[..12]
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        assert_eq!(first, EXPECTED);
        for (p, b) in primes.iter().enumerate() {
            assert_eq!(b.load(Ordering::Relaxed), is_prime(p), "piece {p}");
        }
    }
}

// Not tested upstream: zero workers is an error (no piece could run), not a silent no-op.
#[test]
fn parallelize_until_zero_workers_is_an_error() {
    let never = AtomicBool::new(false);
    let ran = AtomicUsize::new(0);
    let result = parallelize(0, 10, 1, &never, |_| {
        ran.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(result, Err(ParallelizeError::NoWorkers));
    assert_eq!(ran.load(Ordering::Relaxed), 0);
}

// Not tested upstream: zero pieces, a zero chunk size, more workers than pieces.
#[test]
fn parallelize_until_degenerate_shapes() {
    let never = AtomicBool::new(false);
    assert_eq!(
        parallelize(4, 0, 1, &never, |_| panic!("no piece to run")),
        Ok(Parallelized {
            completed: 0,
            cancelled: false
        })
    );
    for (workers, pieces, chunk) in [(3, 10, 0), (64, 5, 1), (1, 7, 100), (usize::MAX, 9, 2)] {
        run_every_piece_once(workers, pieces, chunk);
    }
}

/// A chunk so large that the second chunk's `start + chunk_size` overflows: every piece of a
/// small run still runs once, and in a huge run the worker that takes the second chunk finds
/// its end saturated (the first piece cancels the run, so it ends).
#[test]
fn parallelize_with_a_huge_chunk_size_does_not_overflow() {
    for chunk in [usize::MAX / 2 + 2, usize::MAX] {
        run_every_piece_once(2, 9, chunk);
    }
    let cancelled = AtomicBool::new(false);
    let result = parallelize(2, usize::MAX, usize::MAX / 2 + 2, &cancelled, |_| {
        cancelled.store(true, Ordering::Relaxed);
    })
    .expect("no piece panics");
    // Each worker runs at most the first piece of its chunk before it sees the cancellation.
    assert!(result.cancelled && (1..=2).contains(&result.completed));
}

fn run_every_piece_once(workers: usize, pieces: usize, chunk: usize) {
    let never = AtomicBool::new(false);
    {
        let seen = counters(pieces);
        let result = parallelize(workers, pieces, chunk, &never, |p| {
            seen[p].fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(
            result,
            Ok(Parallelized {
                completed: pieces,
                cancelled: false
            })
        );
        assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }
}

// Not tested upstream (context cancellation of ParallelizeUntil): one worker, deterministic.
#[test]
fn parallelize_until_cancellation_stops_early() {
    let cancelled = AtomicBool::new(false);
    let seen = counters(100);
    let result = parallelize(1, 100, 7, &cancelled, |p| {
        seen[p].fetch_add(1, Ordering::Relaxed);
        if p == 10 {
            cancelled.store(true, Ordering::Relaxed);
        }
    });
    // The piece that cancels finishes; no later piece starts.
    assert_eq!(
        result,
        Ok(Parallelized {
            completed: 11,
            cancelled: true
        })
    );
    for (p, c) in seen.iter().enumerate() {
        assert_eq!(c.load(Ordering::Relaxed), usize::from(p <= 10), "piece {p}");
    }

    // Cancelled before it starts: nothing runs.
    let result = parallelize(4, 100, 1, &cancelled, |_| {
        panic!("cancelled run ran a piece")
    });
    assert_eq!(
        result,
        Ok(Parallelized {
            completed: 0,
            cancelled: true
        })
    );
}

// Not tested upstream: cancellation with several workers. Piece 0 cancels; every other piece
// that starts waits until it has, so at most one piece per worker completes.
#[test]
fn parallelize_until_cancellation_with_several_workers() {
    const WORKERS: usize = 4;
    let cancelled = AtomicBool::new(false);
    let seen = counters(1000);
    let result = parallelize(WORKERS, 1000, 1, &cancelled, |p| {
        seen[p].fetch_add(1, Ordering::Relaxed);
        if p == 0 {
            cancelled.store(true, Ordering::SeqCst);
        } else {
            while !cancelled.load(Ordering::SeqCst) {
                thread::yield_now();
            }
        }
    })
    .unwrap();
    assert!(result.cancelled);
    assert!((1..=WORKERS).contains(&result.completed), "{result:?}");
    assert_eq!(seen[0].load(Ordering::Relaxed), 1);
    let ran: usize = seen.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    assert_eq!(ran, result.completed);
    assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) <= 1));
}

// Not tested upstream: a panicking piece is reported, with its number, and does not abort.
#[test]
fn parallelize_until_panicking_piece_is_reported() {
    let never = AtomicBool::new(false);

    // One worker: deterministic, pieces before the panicking one all completed.
    let seen = counters(100);
    let result = parallelize(1, 100, 10, &never, |p| {
        seen[p].fetch_add(1, Ordering::Relaxed);
        if p == 37 {
            panic!("piece {p} failed");
        }
    });
    match result {
        Err(ParallelizeError::Panicked {
            piece,
            message,
            completed,
        }) => {
            assert_eq!(piece, 37);
            assert_eq!(message, "piece 37 failed");
            assert_eq!(completed, 37);
        }
        other => panic!("expected a panic report, got {other:?}"),
    }
    for (p, c) in seen.iter().enumerate() {
        assert_eq!(c.load(Ordering::Relaxed), usize::from(p <= 37), "piece {p}");
    }

    // Several workers: the panicking piece is reported; no piece ran twice.
    let seen = counters(1000);
    let result = parallelize(4, 1000, 10, &never, |p| {
        seen[p].fetch_add(1, Ordering::Relaxed);
        if p == 537 {
            panic!("static message");
        }
    });
    match result {
        Err(ParallelizeError::Panicked {
            piece,
            message,
            completed,
        }) => {
            assert_eq!(piece, 537);
            assert_eq!(message, "static message");
            assert!(completed < 1000);
            let ran: usize = seen.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            assert_eq!(
                ran,
                completed + 1,
                "completed pieces plus the panicking one"
            );
        }
        other => panic!("expected a panic report, got {other:?}"),
    }
    assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) <= 1));

    // The process (and this thread) carry on: a later run works.
    let result = parallelize(4, 10, 1, &never, |_| {});
    assert_eq!(
        result,
        Ok(Parallelized {
            completed: 10,
            cancelled: false
        })
    );
}
