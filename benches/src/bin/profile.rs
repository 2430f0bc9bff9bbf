//! Runs one implementation of one workload, for a profiler:
//!
//! ```text
//! cargo build --release -p workqueue-benches --bin profile
//! valgrind --tool=callgrind --cache-sim=yes target/release/profile W1 ours 100000
//! callgrind_annotate callgrind.out.<pid>
//! ```
//!
//! Arguments: `WORKLOAD IMPLEMENTATION [N] [RUNS]`. `N` overrides the workload's main size (keys,
//! or calls for W6–W8); `RUNS` (default 1) repeats it. Implementations: `ours`, `naive`, and per
//! workload `crossbeam`, `delay_queue`, `governor`, `add_ref` (W2), `shared_now` (W8),
//! `presized` (W1, W4), `named` (W1), `async` (W5, W10: the tokio queue),
//! `tokio_sleep` (W5), `aging` and `aging-exact-clock` (W11). W12 and W13 (built with `--features metrics`) have `ours`
//! only (the peer of W11, W12 and W13 is `W1 ours`). R1 has `ours` (a current-thread runtime)
//! and `multi_thread` (2 worker threads).
//! Prints the figure of each run on stderr.

use std::process::ExitCode;
use std::time::Duration;

use workqueue_benches::alloc::CountingAlloc;
use workqueue_benches::keys;
use workqueue_benches::report::Sizes;
use workqueue_benches::workloads::{r1, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn main() -> ExitCode {
    // The system clock calibrates itself at its first read (millions of instructions): do it
    // before the profiled section, which a queue reading the clock would otherwise pay for.
    let _ = workqueue_core::Clock::now(&workqueue_core::SystemClock);
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!(
            "usage: profile WORKLOAD IMPLEMENTATION [N] [RUNS]   e.g. profile W1 ours 100000"
        );
        return ExitCode::FAILURE;
    }
    let (w, imp) = (args[0].to_uppercase(), args[1].as_str());
    let n: Option<usize> = args.get(2).map(|s| s.parse().expect("N is a number"));
    let runs: usize = args
        .get(3)
        .map_or(1, |s| s.parse().expect("RUNS is a number"));
    let s = Sizes::FULL;
    let ns = |d: Duration, n: usize| format!("{:.1} ns/item", d.as_nanos() as f64 / n as f64);
    for _ in 0..runs {
        let figure = match w.as_str() {
            "W1" => {
                let k = keys(n.unwrap_or(s.w1));
                let d = match imp {
                    "ours" => w1::ours(&k),
                    "presized" => w1::ours_presized(&k),
                    "named" => w1::ours_named(&k),
                    "naive" => w1::naive(&k),
                    "crossbeam" => w1::crossbeam(&k),
                    _ => return unknown(&w, imp),
                };
                ns(d, k.len())
            }
            "W2" => {
                let k = keys(s.w2_keys);
                let r = n.unwrap_or(s.w2_keys * s.w2_rounds) / s.w2_keys;
                let d = match imp {
                    "ours" => w2::ours(&k, r),
                    "add_ref" => w2::ours_add_ref(&k, r),
                    "naive" => w2::naive(&k, r),
                    _ => return unknown(&w, imp),
                };
                ns(d, k.len() * r)
            }
            "W3" => {
                let k = keys(n.unwrap_or(s.w3));
                let d = match imp {
                    "ours" => w3::ours(&k, 2, 2),
                    "naive" => w3::naive(&k, 2, 2),
                    "crossbeam" => w3::crossbeam(&k, 2, 2),
                    _ => return unknown(&w, imp),
                };
                ns(d, k.len())
            }
            "W4" => {
                let k = keys(n.unwrap_or(s.w4));
                let dl = w4::delays(k.len());
                let d = match imp {
                    "ours" => w4::ours(&k, &dl),
                    "presized" => w4::ours_presized(&k, &dl),
                    "naive" => w4::naive(&k, &dl),
                    "delay_queue" => w4::delay_queue(&k, &dl),
                    _ => return unknown(&w, imp),
                };
                ns(d, k.len())
            }
            "W5" => {
                let k = keys(n.unwrap_or(s.w5));
                let l = match imp {
                    "ours" => w5::ours(&k),
                    "async" => w5::ours_async(&k),
                    "naive" => w5::naive(&k),
                    "delay_queue" => w5::delay_queue(&k),
                    "tokio_sleep" => w5::tokio_sleep(&k),
                    _ => return unknown(&w, imp),
                };
                format!("{l:?}")
            }
            "W6" | "W7" | "W8" => {
                let calls = n.unwrap_or(s.limiter_calls);
                let k = keys(s.limiter_keys);
                let d = match (w.as_str(), imp) {
                    ("W6", "ours") => w6::ours(&k, calls),
                    ("W6", "naive") => w6::naive(&k, calls),
                    ("W7", "ours") => w7::ours(calls),
                    ("W7", "naive") => w7::naive(calls),
                    ("W7", "governor") => w7::governor(calls),
                    ("W8", "ours") => w8::ours(&k, calls),
                    ("W8", "shared_now") => w8::ours_shared_now(&k, calls),
                    ("W8", "naive") => w8::naive(&k, calls),
                    _ => return unknown(&w, imp),
                };
                ns(d, calls)
            }
            "W9" => {
                let k = keys(n.unwrap_or(s.w9));
                let b = match imp {
                    "ours" => w9::ours(&k),
                    "naive" => w9::naive(&k),
                    "crossbeam" => w9::crossbeam(&k),
                    _ => return unknown(&w, imp),
                };
                format!("{b:.1} B/item")
            }
            "W10" => {
                let k = keys(n.unwrap_or(s.w10));
                let c = match imp {
                    "ours" => w10::ours(&k),
                    "async" => w10::ours_async(&k),
                    "naive" => w10::naive(&k),
                    "delay_queue" => w10::delay_queue(&k),
                    _ => return unknown(&w, imp),
                };
                format!("{} CPU, {} wall", ns(c.cpu, k.len()), ns(c.wall, k.len()))
            }
            "W11" => {
                let k = keys(n.unwrap_or(s.w1));
                let d = match imp {
                    "ours" => w11::ours(&k),
                    "aging" => w11::ours_aging(&k),
                    "aging-exact-clock" => w11::ours_aging_exact_clock(&k),
                    _ => return unknown(&w, imp),
                };
                ns(d, k.len())
            }
            "W12" => {
                let k = keys(n.unwrap_or(s.w1));
                let d = match imp {
                    "ours" => w12::ours(&k),
                    _ => return unknown(&w, imp),
                };
                ns(d, k.len())
            }
            "R1" => {
                let k = keys(n.unwrap_or(s.r1));
                let d = match imp {
                    "ours" => r1::ours(&k),
                    "multi_thread" => r1::ours_multi_thread(&k),
                    _ => return unknown(&w, imp),
                };
                ns(d, k.len())
            }
            #[cfg(feature = "metrics")]
            "W13" => {
                let k = keys(n.unwrap_or(s.w1));
                let d = match imp {
                    "ours" => workqueue_benches::workloads::w13::ours(&k),
                    _ => return unknown(&w, imp),
                };
                ns(d, k.len())
            }
            _ => return unknown(&w, imp),
        };
        eprintln!("{w} {imp}: {figure}");
    }
    ExitCode::SUCCESS
}

fn unknown(w: &str, imp: &str) -> ExitCode {
    eprintln!("unknown workload/implementation: {w} {imp}");
    ExitCode::FAILURE
}
