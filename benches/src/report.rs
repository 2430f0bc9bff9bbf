//! The report: runs the catalog of workloads (one warm-up, then repeats), and prints markdown
//! tables of medians (with min and max), ratios to the peers, and the targets with pass/fail.
//!
//! Repeats are interleaved across the implementations of a workload (ours, naive, ours, naive,
//! ...), so slow drift of a shared machine affects them alike and the ratios stay meaningful.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::workloads::{r1, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12};
use crate::{Key, keys};

/// Which direction of a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Smaller is better (times, bytes).
    Lower,
    /// Larger is better (throughput).
    Higher,
}

/// A figure a workload reports.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Name with unit, e.g. `ns/item`.
    pub name: &'static str,
    /// Direction.
    pub better: Better,
}

/// One run of an implementation: one value per metric of its workload.
pub type RunFn = Box<dyn FnMut() -> Vec<f64>>;

/// An implementation measured in a workload.
pub struct Row {
    /// Display name (`ours`, `naive`, `crossbeam`, ...).
    pub name: &'static str,
    /// Whether this is one of our implementations.
    pub ours: bool,
    /// The run, or `None` for a row that is not implemented yet (listed as pending).
    pub run: Option<RunFn>,
}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row")
            .field("name", &self.name)
            .field("pending", &self.run.is_none())
            .finish()
    }
}

fn row(name: &'static str, ours: bool, run: impl FnMut() -> Vec<f64> + 'static) -> Row {
    Row {
        name,
        ours,
        run: Some(Box::new(run)),
    }
}

/// A target of `BENCHMARKS.md`.
#[derive(Debug, Clone)]
pub enum Target {
    /// `ours / peer` (medians of `metric`) must be at most (or, for a `Higher` metric, at
    /// least) `limit`.
    Ratio {
        /// Index of the metric.
        metric: usize,
        /// Our row.
        ours: &'static str,
        /// The peer's row.
        peer: &'static str,
        /// The bound on the ratio.
        limit: f64,
    },
    /// Our median of `metric` must be at most `limit`.
    Absolute {
        /// Index of the metric.
        metric: usize,
        /// Our row.
        ours: &'static str,
        /// The bound, in the metric's unit.
        limit: f64,
    },
}

/// A workload of the catalog; its rows are built (keys generated) only when it runs.
pub struct Workload {
    /// `W1` ... `W10` (scaling runs: `W1@10k` ...).
    pub id: String,
    /// Short name.
    pub name: &'static str,
    /// What one run reports.
    pub metrics: Vec<Metric>,
    /// Targets on the medians.
    pub targets: Vec<Target>,
    /// Builds the rows (generating inputs).
    pub build: Box<dyn FnOnce() -> Vec<Row>>,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Workload sizes.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// W1 keys.
    pub w1: usize,
    /// W2 distinct keys.
    pub w2_keys: usize,
    /// W2 adds of each key.
    pub w2_rounds: usize,
    /// W3 keys (split over the producers).
    pub w3: usize,
    /// W4 keys.
    pub w4: usize,
    /// W5 keys.
    pub w5: usize,
    /// W6/W8 distinct keys.
    pub limiter_keys: usize,
    /// W6/W7/W8 calls.
    pub limiter_calls: usize,
    /// W9 keys.
    pub w9: usize,
    /// W10 keys.
    pub w10: usize,
    /// R1 keys.
    pub r1: usize,
}

impl Sizes {
    /// The sizes of `BENCHMARKS.md`.
    pub const FULL: Sizes = Sizes {
        w1: 1_000_000,
        w2_keys: 1_000,
        w2_rounds: 1_000,
        w3: 1_000_000,
        w4: 1_000_000,
        w5: 1_000,
        limiter_keys: 1_000,
        limiter_calls: 1_000_000,
        w9: 1_000_000,
        w10: 100_000,
        r1: 100_000,
    };

    /// A smoke test (CI): a tenth of most sizes.
    pub const QUICK: Sizes = Sizes {
        w1: 100_000,
        w2_keys: 1_000,
        w2_rounds: 100,
        w3: 100_000,
        w4: 100_000,
        w5: 1_000,
        limiter_keys: 1_000,
        limiter_calls: 100_000,
        w9: 100_000,
        w10: 10_000,
        r1: 10_000,
    };
}

fn per(d: Duration, n: usize) -> f64 {
    d.as_nanos() as f64 / n as f64
}

fn shared_keys(n: usize) -> Arc<Vec<Key>> {
    Arc::new(keys(n))
}

const NS_ITEM: Metric = Metric {
    name: "ns/item",
    better: Better::Lower,
};

/// The workloads W1–W13 (W13 with the `metrics` feature) and R1 at `sizes`.
pub fn catalog(sizes: Sizes) -> Vec<Workload> {
    let s = sizes;
    vec![
        Workload {
            id: "W1".into(),
            name: "cycle",
            metrics: vec![NS_ITEM],
            targets: vec![
                ratio("ours", "naive", 0.18),
                ratio("ours", "crossbeam", 3.0),
            ],
            build: Box::new(move || w1_rows(s.w1)),
        },
        Workload {
            id: "W2".into(),
            name: "dedup",
            metrics: vec![Metric {
                name: "ns/add",
                better: Better::Lower,
            }],
            targets: vec![
                ratio("ours", "naive", 0.5),
                ratio("ours (add_ref)", "naive", 0.5),
            ],
            build: Box::new(move || {
                let k = shared_keys(s.w2_keys);
                let (n, r) = (s.w2_keys * s.w2_rounds, s.w2_rounds);
                let (k1, k2, k3) = (k.clone(), k.clone(), k);
                vec![
                    row("ours", true, move || vec![per(w2::ours(&k1, r), n)]),
                    row("ours (add_ref)", true, move || {
                        vec![per(w2::ours_add_ref(&k2, r), n)]
                    }),
                    row("naive", false, move || vec![per(w2::naive(&k3, r), n)]),
                ]
            }),
        },
        Workload {
            id: "W3".into(),
            name: "mpmc 2x2",
            metrics: vec![Metric {
                name: "M items/s",
                better: Better::Higher,
            }],
            targets: vec![ratio("ours", "naive", 3.0)],
            build: Box::new(move || w3_rows(s.w3, 2)),
        },
        Workload {
            id: "W4".into(),
            name: "delay-insert",
            metrics: vec![Metric {
                name: "ns/add_after",
                better: Better::Lower,
            }],
            targets: vec![
                ratio("ours", "naive", 0.15),
                ratio("ours", "DelayQueue", 1.5),
            ],
            build: Box::new(move || {
                let k = shared_keys(s.w4);
                let d = Arc::new(w4::delays(s.w4));
                let n = s.w4;
                let (k1, k2, k3, k4) = (k.clone(), k.clone(), k.clone(), k);
                let (d1, d2, d3, d4) = (d.clone(), d.clone(), d.clone(), d);
                vec![
                    row("ours", true, move || vec![per(w4::ours(&k1, &d1), n)]),
                    row("ours (pre-sized)", true, move || {
                        vec![per(w4::ours_presized(&k4, &d4), n)]
                    }),
                    row("naive", false, move || vec![per(w4::naive(&k2, &d2), n)]),
                    row("DelayQueue", false, move || {
                        vec![per(w4::delay_queue(&k3, &d3), n)]
                    }),
                ]
            }),
        },
        Workload {
            id: "W5".into(),
            name: "delay-precision",
            metrics: vec![
                Metric {
                    name: "p50 µs",
                    better: Better::Lower,
                },
                Metric {
                    name: "p99 µs",
                    better: Better::Lower,
                },
            ],
            targets: vec![
                Target::Absolute {
                    metric: 1,
                    ours: "ours",
                    limit: 150.0,
                },
                Target::Ratio {
                    metric: 1,
                    ours: "ours async",
                    peer: "DelayQueue",
                    limit: 0.6,
                },
            ],
            build: Box::new(move || {
                let k = shared_keys(s.w5);
                let (k1, k2, k3, k4, k5) = (k.clone(), k.clone(), k.clone(), k.clone(), k);
                let us = |l: w5::Lateness| {
                    vec![l.p50.as_nanos() as f64 / 1e3, l.p99.as_nanos() as f64 / 1e3]
                };
                vec![
                    row("ours", true, move || us(w5::ours(&k1))),
                    row("ours async", true, move || us(w5::ours_async(&k4))),
                    row("naive", false, move || us(w5::naive(&k2))),
                    row("DelayQueue", false, move || us(w5::delay_queue(&k3))),
                    row("tokio sleep", false, move || us(w5::tokio_sleep(&k5))),
                ]
            }),
        },
        Workload {
            id: "W6".into(),
            name: "limiter-exp",
            metrics: vec![Metric {
                name: "ns/when",
                better: Better::Lower,
            }],
            targets: vec![ratio("ours", "naive", 0.5)],
            build: Box::new(move || {
                let k = shared_keys(s.limiter_keys);
                let n = s.limiter_calls;
                let (k1, k2) = (k.clone(), k);
                vec![
                    row("ours", true, move || vec![per(w6::ours(&k1, n), n)]),
                    row("naive", false, move || vec![per(w6::naive(&k2, n), n)]),
                ]
            }),
        },
        Workload {
            id: "W7".into(),
            name: "limiter-bucket",
            metrics: vec![Metric {
                name: "ns/when",
                better: Better::Lower,
            }],
            targets: vec![ratio("ours", "governor", 1.0)],
            build: Box::new(move || {
                let n = s.limiter_calls;
                vec![
                    row("ours", true, move || vec![per(w7::ours(n), n)]),
                    row("naive", false, move || vec![per(w7::naive(n), n)]),
                    row("governor", false, move || vec![per(w7::governor(n), n)]),
                ]
            }),
        },
        Workload {
            id: "W8".into(),
            name: "limiter-default",
            metrics: vec![Metric {
                name: "ns/when",
                better: Better::Lower,
            }],
            targets: vec![
                ratio("ours", "naive", 0.5),
                ratio("ours (now per round)", "naive", 0.5),
            ],
            build: Box::new(move || {
                let k = shared_keys(s.limiter_keys);
                let n = s.limiter_calls;
                let (k1, k2, k3) = (k.clone(), k.clone(), k);
                vec![
                    row("ours", true, move || vec![per(w8::ours(&k1, n), n)]),
                    row("ours (now per round)", true, move || {
                        vec![per(w8::ours_shared_now(&k2, n), n)]
                    }),
                    row("naive", false, move || vec![per(w8::naive(&k3, n), n)]),
                ]
            }),
        },
        Workload {
            id: "W9".into(),
            name: "memory",
            metrics: vec![Metric {
                name: "B/item",
                better: Better::Lower,
            }],
            targets: vec![ratio("ours", "naive", 0.75)],
            build: Box::new(move || {
                let k = shared_keys(s.w9);
                let (k1, k2, k3) = (k.clone(), k.clone(), k);
                vec![
                    row("ours", true, move || vec![w9::ours(&k1)]),
                    row("naive", false, move || vec![w9::naive(&k2)]),
                    row("crossbeam", false, move || vec![w9::crossbeam(&k3)]),
                ]
            }),
        },
        Workload {
            id: "W10".into(),
            name: "ratelimited-cycle",
            metrics: vec![
                Metric {
                    name: "CPU ns/item",
                    better: Better::Lower,
                },
                Metric {
                    name: "wall ns/item",
                    better: Better::Lower,
                },
            ],
            targets: vec![
                ratio("ours", "naive", 0.35),
                Target::Ratio {
                    metric: 0,
                    ours: "ours async",
                    peer: "naive",
                    limit: 0.35,
                },
            ],
            build: Box::new(move || {
                let k = shared_keys(s.w10);
                let n = s.w10;
                let (k1, k2, k3, k4) = (k.clone(), k.clone(), k.clone(), k);
                let f = move |c: w10::Cost| vec![per(c.cpu, n), per(c.wall, n)];
                vec![
                    row("ours", true, move || f(w10::ours(&k1))),
                    row("ours async", true, move || f(w10::ours_async(&k4))),
                    row("naive", false, move || f(w10::naive(&k2))),
                    row("DelayQueue", false, move || f(w10::delay_queue(&k3))),
                ]
            }),
        },
        Workload {
            id: "W11".into(),
            name: "priority-cycle",
            metrics: vec![NS_ITEM],
            // The peer is our own W1, interleaved with W11 in the same repeats; aging's peer is
            // W11 itself.
            targets: vec![ratio("ours", W1_OURS, 1.3), ratio(W11_AGING, "ours", 1.1)],
            build: Box::new(move || {
                let k = shared_keys(s.w1);
                let n = s.w1;
                let (k1, k2, k3, k4) = (k.clone(), k.clone(), k.clone(), k);
                vec![
                    row("ours", true, move || vec![per(w11::ours(&k1), n)]),
                    row(W11_AGING, true, move || vec![per(w11::ours_aging(&k3), n)]),
                    // Not a target: aging reading the counter at every add and get, as it did
                    // before `Clock::recent`.
                    row("ours (aging, exact clock)", true, move || {
                        vec![per(w11::ours_aging_exact_clock(&k4), n)]
                    }),
                    row(W1_OURS, true, move || vec![per(w1::ours(&k2), n)]),
                ]
            }),
        },
        Workload {
            id: "W12".into(),
            name: "fair-cycle",
            metrics: vec![NS_ITEM],
            // The peer is our own W1, interleaved with W12 in the same repeats.
            targets: vec![ratio("ours", W1_OURS, 1.5)],
            build: Box::new(move || {
                let k = shared_keys(s.w1);
                let n = s.w1;
                let (k1, k2) = (k.clone(), k);
                vec![
                    row("ours", true, move || vec![per(w12::ours(&k1), n)]),
                    row(W1_OURS, true, move || vec![per(w1::ours(&k2), n)]),
                ]
            }),
        },
        #[cfg(feature = "metrics")]
        Workload {
            id: "W13".into(),
            name: "named-cycle",
            metrics: vec![NS_ITEM],
            // The peer is our own unnamed W1, interleaved with W13 in the same repeats.
            targets: vec![ratio("ours", W1_OURS, 1.25)],
            build: Box::new(move || {
                let k = shared_keys(s.w1);
                let n = s.w1;
                let (k1, k2) = (k.clone(), k);
                vec![
                    row("ours", true, move || {
                        vec![per(crate::workloads::w13::ours(&k1), n)]
                    }),
                    row(W1_OURS, true, move || vec![per(w1::ours(&k2), n)]),
                ]
            }),
        },
        Workload {
            id: "R1".into(),
            name: "runner-cycle",
            metrics: vec![NS_ITEM],
            // No target: watched for regressions.
            targets: Vec::new(),
            build: Box::new(move || {
                let k = shared_keys(s.r1);
                let n = s.r1;
                let (k1, k2) = (k.clone(), k);
                vec![
                    row("ours", true, move || vec![per(r1::ours(&k1), n)]),
                    row("ours (2 threads)", true, move || {
                        vec![per(r1::ours_multi_thread(&k2), n)]
                    }),
                ]
            }),
        },
    ]
}

/// The row of W11, W12 and W13 that runs our W1 (plain `add`, no options, unnamed), the peer of
/// their targets.
const W1_OURS: &str = "ours W1 (add)";
/// The row of W11 with aging on (`max_ready_wait`); its peer is W11's `ours`.
const W11_AGING: &str = "ours (aging)";

fn ratio(ours: &'static str, peer: &'static str, limit: f64) -> Target {
    Target::Ratio {
        metric: 0,
        ours,
        peer,
        limit,
    }
}

fn w1_rows(n: usize) -> Vec<Row> {
    let k = shared_keys(n);
    let (k1, k2, k3, k4, k5) = (k.clone(), k.clone(), k.clone(), k.clone(), k);
    vec![
        row("ours", true, move || vec![per(w1::ours(&k1), n)]),
        row("ours (pre-sized)", true, move || {
            vec![per(w1::ours_presized(&k4), n)]
        }),
        row("ours (named)", true, move || {
            vec![per(w1::ours_named(&k5), n)]
        }),
        row("naive", false, move || vec![per(w1::naive(&k2), n)]),
        row("crossbeam", false, move || vec![per(w1::crossbeam(&k3), n)]),
    ]
}

fn w3_rows(n: usize, threads: usize) -> Vec<Row> {
    let k = shared_keys(n);
    let (k1, k2, k3) = (k.clone(), k.clone(), k);
    let mps = move |d: Duration| vec![n as f64 / d.as_secs_f64() / 1e6];
    vec![
        row("ours", true, move || mps(w3::ours(&k1, threads, threads))),
        row("naive", false, move || {
            mps(w3::naive(&k2, threads, threads))
        }),
        row("crossbeam", false, move || {
            mps(w3::crossbeam(&k3, threads, threads))
        }),
    ]
}

/// The scaling runs: W1 at several N, W3 at several thread counts (each side).
pub fn scaling_catalog(w1_sizes: &[usize], w3_threads: &[usize], w3_keys: usize) -> Vec<Workload> {
    let mut out = Vec::new();
    for &n in w1_sizes {
        out.push(Workload {
            id: format!("W1@{}", human(n)),
            name: "cycle",
            metrics: vec![NS_ITEM],
            targets: Vec::new(),
            build: Box::new(move || w1_rows(n)),
        });
    }
    for &t in w3_threads {
        out.push(Workload {
            id: format!("W3@{t}x{t}"),
            name: "mpmc",
            metrics: vec![Metric {
                name: "M items/s",
                better: Better::Higher,
            }],
            targets: Vec::new(),
            build: Box::new(move || w3_rows(w3_keys, t)),
        });
    }
    out
}

fn human(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n.is_multiple_of(1_000_000) => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n.is_multiple_of(1_000) => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

// ---- running -------------------------------------------------------------------------------------

/// Median, min and max of one metric over the repeats.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Stat {
    /// Summarizes `values` (not empty).
    pub fn of(values: &[f64]) -> Stat {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        assert!(n > 0, "no values");
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stat {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// The results of one implementation.
#[derive(Debug, Clone)]
pub struct RowResult {
    /// Display name.
    pub name: &'static str,
    /// Ours or a peer.
    pub ours: bool,
    /// One per metric; `None` for a pending row.
    pub stats: Option<Vec<Stat>>,
}

/// The outcome of a target.
#[derive(Debug, Clone)]
pub struct TargetResult {
    /// Human-readable target, e.g. `ours <= 0.18x naive`.
    pub text: String,
    /// The measured ratio (or absolute value); `None` when a row is pending.
    pub value: Option<f64>,
    /// Whether it holds; `None` when a row is pending.
    pub pass: Option<bool>,
    /// Whether the value is a ratio (printed with `x`).
    pub is_ratio: bool,
}

/// The results of one workload.
#[derive(Debug, Clone)]
pub struct WorkloadResult {
    /// Id.
    pub id: String,
    /// Name.
    pub name: &'static str,
    /// Metrics.
    pub metrics: Vec<Metric>,
    /// One per row.
    pub rows: Vec<RowResult>,
    /// One per target.
    pub targets: Vec<TargetResult>,
    /// Wall time the workload took to run, warm-up included.
    pub elapsed: Duration,
}

impl WorkloadResult {
    /// The median of `metric` for the row named `name`, if it ran.
    pub fn median(&self, name: &str, metric: usize) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.name == name)
            .and_then(|r| r.stats.as_ref())
            .map(|s| s[metric].median)
    }
}

/// Runs one workload: a warm-up of every row, then `repeats` rounds over the rows.
pub fn run_workload(w: Workload, repeats: usize, log: &mut dyn FnMut(&str)) -> WorkloadResult {
    let started = Instant::now();
    log(&format!("{} {}: generating inputs", w.id, w.name));
    let mut rows = (w.build)();
    let mut samples: Vec<Vec<Vec<f64>>> = rows.iter().map(|_| Vec::new()).collect();
    for round in 0..=repeats {
        for (r, row) in rows.iter_mut().enumerate() {
            if let Some(run) = row.run.as_mut() {
                let v = run();
                assert_eq!(
                    v.len(),
                    w.metrics.len(),
                    "{} {}: metric count",
                    w.id,
                    row.name
                );
                if round > 0 {
                    samples[r].push(v);
                }
            }
        }
        log(&format!(
            "{} {}: {}",
            w.id,
            w.name,
            if round == 0 {
                "warm-up done".to_string()
            } else {
                format!("repeat {round}/{repeats}")
            }
        ));
    }
    let results: Vec<RowResult> = rows
        .iter()
        .zip(&samples)
        .map(|(row, s)| RowResult {
            name: row.name,
            ours: row.ours,
            stats: row.run.as_ref().map(|_| {
                (0..w.metrics.len())
                    .map(|m| Stat::of(&s.iter().map(|v| v[m]).collect::<Vec<_>>()))
                    .collect()
            }),
        })
        .collect();
    drop(rows);
    let mut out = WorkloadResult {
        id: w.id,
        name: w.name,
        metrics: w.metrics,
        rows: results,
        targets: Vec::new(),
        elapsed: Duration::ZERO,
    };
    out.targets = w.targets.iter().map(|t| evaluate(&out, t)).collect();
    out.elapsed = started.elapsed();
    out
}

fn evaluate(w: &WorkloadResult, t: &Target) -> TargetResult {
    match *t {
        Target::Ratio {
            metric,
            ours,
            peer,
            limit,
        } => {
            let higher = w.metrics[metric].better == Better::Higher;
            let text = format!(
                "{ours} {} {limit}x {peer}{}",
                if higher { ">=" } else { "<=" },
                metric_suffix(w, metric)
            );
            let value = w
                .median(ours, metric)
                .zip(w.median(peer, metric))
                .map(|(a, b)| a / b);
            TargetResult {
                text,
                value,
                pass: value.map(|v| if higher { v >= limit } else { v <= limit }),
                is_ratio: true,
            }
        }
        Target::Absolute {
            metric,
            ours,
            limit,
        } => {
            let value = w.median(ours, metric);
            TargetResult {
                text: format!("{ours} {} <= {limit}", w.metrics[metric].name),
                value,
                pass: value.map(|v| v <= limit),
                is_ratio: false,
            }
        }
    }
}

fn metric_suffix(w: &WorkloadResult, metric: usize) -> String {
    if w.metrics.len() > 1 {
        format!(" ({})", w.metrics[metric].name)
    } else {
        String::new()
    }
}

// ---- printing ------------------------------------------------------------------------------------

/// A number with about three significant digits.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The figures table: one line per (workload, metric, implementation), with `ours ÷ this` for the
/// peers (the first `ours` row of the workload divided by this row).
pub fn figures_table(results: &[WorkloadResult]) -> String {
    let mut s = String::new();
    s.push_str("| id | workload | metric | implementation | median | min | max | ours ÷ this |\n");
    s.push_str("|---|---|---|---|---:|---:|---:|---:|\n");
    for w in results {
        let ours = w.rows.iter().find(|r| r.ours && r.stats.is_some());
        for (m, metric) in w.metrics.iter().enumerate() {
            for r in &w.rows {
                let Some(stats) = &r.stats else {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | pending | | | |",
                        w.id, w.name, metric.name, r.name
                    );
                    continue;
                };
                let st = stats[m];
                let ratio = match ours {
                    Some(o) if !r.ours => {
                        let o = o.stats.as_ref().expect("ran")[m].median;
                        format!("{}x", num(o / st.median))
                    }
                    _ => String::new(),
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    w.id,
                    w.name,
                    metric.name,
                    r.name,
                    num(st.median),
                    num(st.min),
                    num(st.max),
                    ratio
                );
            }
        }
    }
    s
}

/// The targets table and a closing count line.
pub fn targets_table(results: &[WorkloadResult]) -> String {
    let mut s = String::new();
    s.push_str("| id | target | measured | result |\n|---|---|---:|---|\n");
    let (mut pass, mut fail, mut pend) = (0, 0, 0);
    for w in results {
        for t in &w.targets {
            let measured = match t.value {
                Some(v) if t.is_ratio => format!("{}x", num(v)),
                Some(v) => num(v),
                None => "–".into(),
            };
            let verdict = match t.pass {
                Some(true) => {
                    pass += 1;
                    "pass"
                }
                Some(false) => {
                    fail += 1;
                    "**FAIL**"
                }
                None => {
                    pend += 1;
                    "pending"
                }
            };
            let _ = writeln!(s, "| {} | {} | {} | {} |", w.id, t.text, measured, verdict);
        }
    }
    let _ = writeln!(s, "\ntargets: {pass} pass, {fail} fail, {pend} pending");
    s
}

/// A one-line-per-target summary (`W1 ours <= 0.18x naive: 0.21x FAIL`), easy to collect over
/// several runs.
pub fn ratio_lines(results: &[WorkloadResult]) -> String {
    let mut s = String::new();
    for w in results {
        for t in &w.targets {
            let v = t.value.map_or("-".into(), num);
            let p = match t.pass {
                Some(true) => "pass",
                Some(false) => "FAIL",
                None => "pending",
            };
            let _ = writeln!(s, "RATIO\t{}\t{}\t{}\t{}", w.id, t.text, v, p);
        }
    }
    s
}

/// The scaling tables: for each id prefix (`W1`, `W3`), one line per size with every
/// implementation's median and `ours ÷ peer`.
pub fn scaling_table(results: &[WorkloadResult]) -> String {
    let mut s = String::new();
    let mut prefixes: Vec<&str> = results
        .iter()
        .map(|w| w.id.split('@').next().unwrap_or(&w.id))
        .collect();
    prefixes.dedup();
    for prefix in prefixes {
        let group: Vec<&WorkloadResult> = results
            .iter()
            .filter(|w| w.id.split('@').next() == Some(prefix))
            .collect();
        let Some(first) = group.first() else { continue };
        let names: Vec<&str> = first.rows.iter().map(|r| r.name).collect();
        let peers: Vec<&str> = first
            .rows
            .iter()
            .filter(|r| !r.ours)
            .map(|r| r.name)
            .collect();
        let _ = writeln!(
            s,
            "\n{} {} ({}, median [min–max])\n",
            prefix, first.name, first.metrics[0].name
        );
        let mut header = String::from("| size |");
        for n in &names {
            let _ = write!(header, " {n} |");
        }
        for p in &peers {
            let _ = write!(header, " ours ÷ {p} |");
        }
        let _ = writeln!(s, "{header}");
        let _ = writeln!(s, "|---|{}", "---:|".repeat(names.len() + peers.len()));
        for w in group {
            let size = w.id.split('@').nth(1).unwrap_or("");
            let mut line = format!("| {size} |");
            for r in &w.rows {
                match &r.stats {
                    Some(st) => {
                        let st = st[0];
                        let _ = write!(
                            line,
                            " {} [{}–{}] |",
                            num(st.median),
                            num(st.min),
                            num(st.max)
                        );
                    }
                    None => line.push_str(" pending |"),
                }
            }
            for p in &peers {
                let v = w.median("ours", 0).zip(w.median(p, 0)).map(|(a, b)| a / b);
                let _ = write!(
                    line,
                    " {} |",
                    v.map_or("–".into(), |v| format!("{}x", num(v)))
                );
            }
            let _ = writeln!(s, "{line}");
        }
    }
    s
}

/// One line about the machine: CPU model, logical CPUs, and whether this is an optimized build.
pub fn machine_line() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let build = if cfg!(debug_assertions) {
        "DEBUG build: figures are meaningless, use --release"
    } else {
        "release build"
    };
    format!("{model}, {cpus} logical CPUs, {build}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_numbers() {
        let s = Stat::of(&[5.0, 1.0, 3.0]);
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 5.0));
        assert_eq!(Stat::of(&[1.0, 2.0, 3.0, 10.0]).median, 2.5);
        assert_eq!(num(683.2), "683");
        assert_eq!(num(24.94), "24.9");
        assert_eq!(num(0.184), "0.18");
        assert_eq!(human(10_000_000), "10M");
        assert_eq!(human(100_000), "100k");
    }

    #[test]
    fn targets_evaluate_in_the_metric_direction() {
        let w = WorkloadResult {
            id: "W".into(),
            name: "t",
            metrics: vec![Metric {
                name: "M items/s",
                better: Better::Higher,
            }],
            rows: vec![
                RowResult {
                    name: "ours",
                    ours: true,
                    stats: Some(vec![Stat::of(&[6.0])]),
                },
                RowResult {
                    name: "naive",
                    ours: false,
                    stats: Some(vec![Stat::of(&[2.0])]),
                },
                RowResult {
                    name: "ours async",
                    ours: true,
                    stats: None,
                },
            ],
            targets: Vec::new(),
            elapsed: Duration::ZERO,
        };
        let t = evaluate(&w, &ratio("ours", "naive", 3.0));
        assert_eq!((t.value, t.pass), (Some(3.0), Some(true)));
        let t = evaluate(&w, &ratio("ours async", "naive", 3.0));
        assert_eq!((t.value, t.pass), (None, None));
        let table = figures_table(&[w]);
        assert!(table.contains("| W | t | M items/s | naive | 2.00 | 2.00 | 2.00 | 3.00x |"));
        assert!(table.contains("pending"));
    }

    #[test]
    fn quick_catalog_runs_one_workload() {
        let mut tiny = Sizes::QUICK;
        tiny.limiter_calls = 10_000;
        let w = catalog(tiny)
            .into_iter()
            .find(|w| w.id == "W7")
            .expect("W7");
        let r = run_workload(w, 1, &mut |_| {});
        assert!(r.rows.len() >= 3 && r.rows.iter().all(|row| row.stats.is_some()));
        assert!(r.targets.iter().all(|t| t.value.is_some()));
    }
}
