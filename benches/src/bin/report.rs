//! Runs every workload of `BENCHMARKS.md` itself (one warm-up, then repeats; median, min, max)
//! and prints markdown tables: figures with ratios to the peers, and the targets with pass/fail.
//!
//! ```text
//! cargo run --release -p workqueue-benches --bin report [-- OPTIONS]
//!   --quick            smaller sizes (CI smoke test)
//!   --only W1,W3       only these workloads
//!   --scaling          also W1 at N = 10k, 100k, 1M, 10M and W3 at 1, 2, 4, 8 threads each side
//!   --scaling-only     only the scaling runs
//!   --repeats N        repeats after the warm-up (default 5)
//! ```
//!
//! Exit status: 0 whatever the targets say (a missed target is a finding, not a crash); 1 when a
//! workload's result check fails (it panics) or the arguments are wrong.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use workqueue_benches::alloc::{CountingAlloc, is_installed};
use workqueue_benches::report::{
    Sizes, catalog, figures_table, machine_line, ratio_lines, run_workload, scaling_catalog,
    scaling_table, targets_table,
};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[derive(Debug)]
struct Options {
    quick: bool,
    only: Option<Vec<String>>,
    scaling: bool,
    main: bool,
    repeats: usize,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        quick: false,
        only: None,
        scaling: false,
        main: true,
        repeats: 5,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--scaling" => o.scaling = true,
            "--scaling-only" => {
                o.scaling = true;
                o.main = false;
            }
            "--only" => {
                let v = args.next().ok_or("--only needs a list, e.g. W1,W3")?;
                o.only = Some(v.split(',').map(|s| s.trim().to_uppercase()).collect());
            }
            "--repeats" => {
                let v = args.next().ok_or("--repeats needs a number")?;
                o.repeats = v.parse().map_err(|_| format!("bad --repeats {v}"))?;
                if o.repeats == 0 {
                    return Err("--repeats must be at least 1".into());
                }
            }
            "--bench" => {} // passed by `cargo bench`; harmless here
            "-h" | "--help" => {
                return Err(
                    "usage: report [--quick] [--only W1,W3] [--scaling | --scaling-only] [--repeats N]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other}; try --help")),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    assert!(is_installed(), "the counting allocator must be installed");
    let started = Instant::now();
    let mut log = |msg: &str| {
        eprintln!("[{:>6.1}s] {msg}", started.elapsed().as_secs_f64());
    };

    let sizes = if o.quick { Sizes::QUICK } else { Sizes::FULL };
    println!("# workqueue benchmark report\n");
    println!("- machine: {}", machine_line());
    println!(
        "- sizes: {} ({} repeats after one warm-up; figures are medians)",
        if o.quick { "quick" } else { "full" },
        o.repeats
    );

    let mut results = Vec::new();
    if o.main {
        for w in catalog(sizes) {
            if o.only.as_ref().is_some_and(|only| !only.contains(&w.id)) {
                continue;
            }
            let r = run_workload(w, o.repeats, &mut log);
            log(&format!("{} took {:.1}s", r.id, r.elapsed.as_secs_f64()));
            results.push(r);
        }
        println!("\n## Figures\n\n{}", figures_table(&results));
        println!("## Targets\n\n{}", targets_table(&results));
        print!("{}", ratio_lines(&results));
    }

    if o.scaling {
        let (w1, w3_threads, w3_keys): (&[usize], &[usize], usize) = if o.quick {
            (&[10_000, 100_000], &[1, 2, 4], 100_000)
        } else {
            (
                &[10_000, 100_000, 1_000_000, 10_000_000],
                &[1, 2, 4, 8],
                1_000_000,
            )
        };
        let mut scaled = Vec::new();
        for w in scaling_catalog(w1, w3_threads, w3_keys) {
            let r = run_workload(w, o.repeats, &mut log);
            log(&format!("{} took {:.1}s", r.id, r.elapsed.as_secs_f64()));
            scaled.push(r);
        }
        println!("\n## Scaling\n{}", scaling_table(&scaled));
    }
    println!("\n(report took {:.0} s)", started.elapsed().as_secs_f64());
    let _ = std::io::stdout().flush();
    ExitCode::SUCCESS
}
