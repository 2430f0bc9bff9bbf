//! W14 and W16, a controller against kube-runtime's (BENCHMARKS.md).
//!
//! W14, throughput: the same store of 100,000 ConfigMaps (10 namespaces), every object triggered
//! once by the same stream of `ObjectRef`s, a reconcile that reads the object from its `Arc` and
//! returns `await_change`, concurrency 16, a multi-thread tokio runtime with 2 workers.
//! kube-runtime's side is its stable `applier`, with each reconcile spawned as its
//! `Controller::run` does (`kube`), and bare (`kube_applier`: the futures polled inline); ours is
//! `Controller::for_stream(..).reconcile_on(..)` with its defaults (priorities, aging, and with
//! the `metrics` feature, the named queue's metrics).
//!
//! W16, one CPU-heavy reconcile among many: the same with 1,000 objects, where the reconcile of
//! the first object triggered computes for 50 ms before its first `.await`; the figure is the p99
//! trigger-to-start of the other 999.
//!
//! ```text
//! cargo bench -p workqueue-kube --bench controller_throughput                     # W14 and W16, 5 runs each
//! cargo bench -p workqueue-kube --bench controller_throughput -- w16 1000 9       # W16 alone, 9 runs each
//! cargo bench -p workqueue-kube --bench controller_throughput -- kube 100000      # one run of one
//! cargo bench -p workqueue-kube --bench controller_throughput -- kube 1000 heavy  # one W16 run of one
//! ```
//!
//! `W14_THREADS=4` (or `1`, or `current_thread`) changes the runtime (default: 2 worker threads).
//! `W14_SCHED=1` makes each run print, on stderr, how the kernel scheduled its threads while it
//! ran (Linux `schedstat`): a `SCHED` line with the time on a CPU and the time waiting in a run
//! queue of the thread that polls the controller's stream (`caller`) and of the other threads
//! together (`others`: the runtime's), and the caller's context switches (voluntary /
//! involuntary), then each other thread's on-CPU / run-queue ms / voluntary switches. A series
//! prints its runs' lines.
//!
//! Each run is a process of its own (peak memory is the process's `VmHWM`); the runs alternate
//! between the implementations. Figures: reconciles per second, p99 of the time from an object's
//! trigger (the stream yielding its key) to its reconcile's start (the first poll of its future,
//! for every implementation), peak RSS.

use std::hint::black_box;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use futures_util::{FutureExt, StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use tokio_util::task::AbortOnDropHandle;

const NAMESPACES: usize = 10;
const CONCURRENCY: u16 = 16;
/// W16: the object whose reconcile computes before its first `.await`, and for how long.
const HEAVY: usize = 0;
const HEAVY_FOR: std::time::Duration = std::time::Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// When each object was triggered and when its reconcile started (ns since the run's start),
/// and a signal once every object has been reconciled.
struct Times {
    start: Instant,
    triggered: Vec<AtomicU64>,
    started: Vec<AtomicU64>,
    reconciled: AtomicU64,
    all: tokio::sync::Notify,
    /// W16: the reconcile of [`HEAVY`] computes for [`HEAVY_FOR`] before its first `.await`.
    heavy: bool,
}

impl Times {
    fn new(n: usize, heavy: bool) -> Self {
        Times {
            start: Instant::now(),
            triggered: (0..n).map(|_| AtomicU64::new(0)).collect(),
            started: (0..n).map(|_| AtomicU64::new(0)).collect(),
            reconciled: AtomicU64::new(0),
            all: tokio::sync::Notify::new(),
            heavy,
        }
    }

    /// What every reconcile does, at its first poll: records its start (signalling once every
    /// object has started one), reads the object, and in W16 computes for [`HEAVY_FOR`] if it is
    /// [`HEAVY`].
    fn reconcile(&self, cm: &ConfigMap) {
        let i = index(cm);
        self.started[i].store(self.now(), Relaxed);
        if self.reconciled.fetch_add(1, Relaxed) + 1 == self.started.len() as u64 {
            self.all.notify_one();
        }
        black_box(&cm.metadata.name);
        if self.heavy && i == HEAVY {
            let computing = Instant::now();
            while computing.elapsed() < HEAVY_FOR {
                black_box(computing);
            }
        }
    }

    /// Completes once every object has been reconciled.
    async fn done(self: Arc<Self>) {
        self.all.notified().await;
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The p99 of start − trigger, in µs (in W16, of the objects other than [`HEAVY`]).
    fn p99_us(&self) -> f64 {
        let mut waits: Vec<u64> = self
            .triggered
            .iter()
            .zip(&self.started)
            .enumerate()
            .filter(|(i, _)| !(self.heavy && *i == HEAVY))
            .map(|(_, (t, s))| s.load(Relaxed).saturating_sub(t.load(Relaxed)))
            .collect();
        waits.sort_unstable();
        waits[waits.len() * 99 / 100] as f64 / 1e3
    }
}

/// The object's index, from its name `cm-{i}`.
fn index(cm: &ConfigMap) -> usize {
    let name = cm.metadata.name.as_deref().unwrap_or_default();
    name[3..].parse().unwrap()
}

fn store(n: usize) -> (Store<ConfigMap>, Vec<ObjectRef<ConfigMap>>) {
    let (reader, mut writer) = reflector::store::<ConfigMap>();
    writer.apply_watcher_event(&watcher::Event::Init);
    let mut refs = Vec::with_capacity(n);
    for i in 0..n {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                namespace: Some(format!("ns-{}", i % NAMESPACES)),
                resource_version: Some(i.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        refs.push(ObjectRef::from_obj(&cm));
        writer.apply_watcher_event(&watcher::Event::InitApply(cm));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    // The writer may go: the store keeps what it holds.
    std::mem::forget(writer);
    (reader, refs)
}

/// The shared trigger stream: each key, timestamped as it is yielded; then it stays open (a
/// controller's watches do), until the run is stopped.
fn triggers(
    refs: Vec<ObjectRef<ConfigMap>>,
    times: Arc<Times>,
) -> impl futures_util::Stream<Item = ObjectRef<ConfigMap>> + Send + 'static {
    stream::iter(refs)
        .map(move |key| {
            let i: usize = key.name[3..].parse().unwrap();
            times.triggered[i].store(times.now(), Relaxed);
            key
        })
        .chain(stream::pending())
}

/// kube-runtime through its stable `applier`: with `spawned`, each reconcile's future runs as a
/// task of its own, as kube-runtime's `Controller::run` does (it wraps the reconciler so, with a
/// private `CancelableJoinHandle`: here a `JoinHandle` aborted on drop); without, the applier
/// polls the futures itself.
async fn run_kube(
    store: Store<ConfigMap>,
    refs: Vec<ObjectRef<ConfigMap>>,
    times: Arc<Times>,
    spawned: bool,
) -> usize {
    use kube::runtime::controller::{Action, Config, applier};
    let reconcile = {
        let times = times.clone();
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            let times = times.clone();
            let fut = async move {
                times.reconcile(&cm);
                Ok::<_, Never>(Action::await_change())
            };
            if spawned {
                // Aborted when dropped, as kube-runtime's `CancelableJoinHandle`.
                let task = AbortOnDropHandle::new(tokio::spawn(fut));
                async move { task.await.expect("the reconcile task") }.boxed()
            } else {
                fut.boxed()
            }
        }
    };
    // kube-runtime's graceful shutdown: its queue stream ends.
    let queue = triggers(refs, times.clone())
        .take_until(times.done())
        .map(Ok::<_, watcher::Error>);
    let config = Config::default().concurrency(CONCURRENCY);
    applier(
        reconcile,
        |_, _, _| Action::await_change(),
        Arc::new(()),
        store,
        queue,
        config,
    )
    .filter(|r| std::future::ready(r.is_ok()))
    .count()
    .await
}

async fn run_ours(
    store: Store<ConfigMap>,
    refs: Vec<ObjectRef<ConfigMap>>,
    times: Arc<Times>,
) -> usize {
    use workqueue_kube::controller::{Action, Config, Controller};
    let reconcile = {
        let times = times.clone();
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            let times = times.clone();
            async move {
                times.reconcile(&cm);
                Ok::<_, Never>(Action::await_change())
            }
        }
    };
    Controller::for_stream(stream::pending(), store)
        .reconcile_on(triggers(refs, times.clone()))
        .graceful_shutdown_on(times.done())
        .with_config(Config::default().concurrency(CONCURRENCY))
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .filter(|r| std::future::ready(r.is_ok()))
        .count()
        .await
}

/// The process's peak resident set, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One run of one implementation, in this process (`heavy`: W16); prints
/// `impl rps p99_us peak_kib`.
fn child(which: &str, n: usize, heavy: bool) {
    // Built here, not by `workqueue-benches`' `workloads::runtime`: neither crate depends on the
    // other.
    let runtime = match runtime_threads() {
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        Some(threads) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap(),
    };
    let (store, refs) = store(n);
    let times = Arc::new(Times::new(n, heavy));
    let sched = std::env::var_os("W14_SCHED").map(|_| Sched::now());
    let begun = Instant::now();
    let done = runtime.block_on(async {
        match which {
            "kube" => run_kube(store, refs, times.clone(), true).await,
            "kube_applier" => run_kube(store, refs, times.clone(), false).await,
            _ => run_ours(store, refs, times.clone()).await,
        }
    });
    let elapsed = begun.elapsed();
    if let Some(before) = sched {
        Sched::now().print_since(&before, which, elapsed, times.p99_us() / 1e3);
    }
    // The stream reports the reconciles that finished before it ended (kube-runtime drops the
    // ones still in flight at its shutdown); every object's reconcile started.
    assert!(done <= n, "{which}: {done} results for {n} objects");
    assert_eq!(
        times.reconciled.load(Relaxed),
        n as u64,
        "{which}: every object reconciled once"
    );
    println!(
        "{which} {:.0} {:.1} {}",
        n as f64 / elapsed.as_secs_f64(),
        times.p99_us(),
        peak_rss_kib()
    );
}

/// How the kernel scheduled this process's threads so far (`W14_SCHED`): per thread, from
/// `/proc/self/task/*/{schedstat,status}`, nanoseconds on a CPU and waiting in a run queue, and
/// voluntary and involuntary context switches. The caller's thread is the process's first.
struct Sched(Vec<(bool, [u64; 4], u64)>);

impl Sched {
    fn now() -> Self {
        let pid = u64::from(std::process::id());
        let mut threads = Vec::new();
        for task in std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
        {
            let read = |f: &str| std::fs::read_to_string(task.path().join(f)).unwrap_or_default();
            let stat: Vec<u64> = read("schedstat")
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            let status = read("status");
            let switches = |field: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            let id: u64 = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            if let [on_cpu, waiting, ..] = stat[..] {
                let voluntary = switches("voluntary_ctxt_switches:");
                let involuntary = switches("nonvoluntary_ctxt_switches:");
                threads.push((id == pid, [on_cpu, waiting, voluntary, involuntary], id));
            }
        }
        Sched(threads)
    }

    /// Prints the `SCHED` line of the figures since `before` (threads that ended meanwhile are
    /// left out; the runtime's threads live as long as the run).
    fn print_since(&self, before: &Sched, which: &str, elapsed: std::time::Duration, p99_ms: f64) {
        let sum = |s: &Sched, caller: bool| {
            s.0.iter()
                .filter(|t| t.0 == caller)
                .fold([0u64; 4], |mut acc, t| {
                    acc.iter_mut().zip(t.1).for_each(|(a, v)| *a += v);
                    acc
                })
        };
        let ms = |ns: u64| ns as f64 / 1e6;
        let (c1, c0) = (sum(self, true), sum(before, true));
        let (r1, r0) = (sum(self, false), sum(before, false));
        // Each other thread's on-CPU / run-queue milliseconds / voluntary switches (its sleeps).
        let each: Vec<String> = self
            .0
            .iter()
            .filter(|t| !t.0)
            .map(|t| {
                let was = before.0.iter().find(|b| b.2 == t.2).map_or([0; 4], |b| b.1);
                format!(
                    "{:.1}/{:.1}/{}",
                    ms(t.1[0].saturating_sub(was[0])),
                    ms(t.1[1].saturating_sub(was[1])),
                    t.1[2].saturating_sub(was[2])
                )
            })
            .collect();
        eprintln!(
            "SCHED {which} elapsed {:.1} ms, p99 {p99_ms:.1} ms; caller on-CPU {:.1} ms, run queue {:.1} ms, switches {}/{}; others on-CPU {:.1} ms, run queue {:.1} ms (each {})",
            elapsed.as_secs_f64() * 1e3,
            ms(c1[0].saturating_sub(c0[0])),
            ms(c1[1].saturating_sub(c0[1])),
            c1[2].saturating_sub(c0[2]),
            c1[3].saturating_sub(c0[3]),
            ms(r1[0].saturating_sub(r0[0])),
            ms(r1[1].saturating_sub(r0[1])),
            each.join(" "),
        );
    }
}

/// The runtime's worker threads (`W14_THREADS`, default 2), or `None` for a `current_thread`
/// runtime (`W14_THREADS=current_thread`).
fn runtime_threads() -> Option<usize> {
    match std::env::var("W14_THREADS").as_deref() {
        Ok("current_thread") => None,
        Ok(n) => Some(n.parse().expect("W14_THREADS: a number or current_thread")),
        Err(_) => Some(2),
    }
}

/// One run's reconciles per second, p99 trigger-to-start (µs) and peak RSS (KiB).
type Figures = (f64, f64, f64);

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Runs `runs` rounds of the three implementations (each run a process), and prints the table
/// and the ratios of `label`.
fn series(label: &str, n: usize, runs: usize, heavy: bool) {
    let exe = std::env::current_exe().unwrap();
    let mut figures: Vec<(String, Vec<Figures>)> = vec![
        ("kube".into(), Vec::new()),
        ("kube_applier".into(), Vec::new()),
        ("ours".into(), Vec::new()),
    ];
    for _ in 0..runs {
        for (name, results) in &mut figures {
            let mut args = vec![name.clone(), n.to_string()];
            if heavy {
                args.push("heavy".into());
            }
            let out = Command::new(&exe).args(&args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{stderr}");
            for line in stderr.lines().filter(|l| l.starts_with("SCHED ")) {
                println!("{line}");
            }
            let line = String::from_utf8(out.stdout).unwrap();
            let f: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap())
                .collect();
            results.push((f[0], f[1], f[2]));
        }
    }
    let what = if heavy {
        format!(
            "{label} one CPU-heavy reconcile ({HEAVY_FOR:?} before its first await) among {n} objects"
        )
    } else {
        format!("{label} controller throughput, {n} objects")
    };
    let threads = match runtime_threads() {
        None => "a current_thread runtime".to_string(),
        Some(n) => format!("{n} runtime threads"),
    };
    println!("{what}, concurrency {CONCURRENCY}, {threads}, {runs} runs each (median [min, max])");
    println!("| implementation | reconciles/s | p99 trigger-to-start (ms) | peak RSS (MiB) |");
    println!("|---|---:|---:|---:|");
    let mut medians = Vec::new();
    for (name, results) in &figures {
        let rps = median(results.iter().map(|r| r.0).collect());
        let p99 = median(results.iter().map(|r| r.1 / 1e3).collect());
        let rss = median(results.iter().map(|r| r.2 / 1024.0).collect());
        println!(
            "| {name} | {:.0} [{:.0}, {:.0}] | {:.2} [{:.2}, {:.2}] | {:.1} [{:.1}, {:.1}] |",
            rps.0, rps.1, rps.2, p99.0, p99.1, p99.2, rss.0, rss.1, rss.2
        );
        medians.push((rps.0, p99.0, rss.0));
    }
    let (kube, applier, ours) = (medians[0], medians[1], medians[2]);
    if heavy {
        println!(
            "RATIO {label} p99 trigger-to-start of the others against kube-runtime's Controller: {:.2}x (target <= 0.8); against the bare applier {:.2}x",
            ours.1 / kube.1,
            ours.1 / applier.1
        );
        return;
    }
    println!(
        "RATIO {label} against kube-runtime's Controller (spawned reconciles): reconciles/s {:.2}x (target >= 2; >= 1.5 beside busy processes), p99 {:.2}x (target <= 1), peak RSS {:.2}x (target <= 1)",
        ours.0 / kube.0,
        ours.1 / kube.1,
        ours.2 / kube.2
    );
    println!(
        "RATIO {label} against the bare applier (reconciles polled inline): reconciles/s {:.2}x, p99 {:.2}x, peak RSS {:.2}x",
        ours.0 / applier.0,
        ours.1 / applier.1,
        ours.2 / applier.2
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let which = args.first().map_or("all", String::as_str);
    let arg = |i: usize| args.get(i).map(|s| s.parse().expect("a number"));
    match which {
        "all" => {
            series("W14", 100_000, 5, false);
            series("W16", 1_000, 5, true);
        }
        "w14" => series("W14", arg(1).unwrap_or(100_000), arg(2).unwrap_or(5), false),
        "w16" => series("W16", arg(1).unwrap_or(1_000), arg(2).unwrap_or(5), true),
        _ => child(
            which,
            arg(1).unwrap_or(100_000),
            args.get(2).is_some_and(|a| a == "heavy"),
        ),
    }
}
