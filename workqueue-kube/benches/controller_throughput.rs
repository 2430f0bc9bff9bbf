//! W14, controller throughput against kube-runtime (BENCHMARKS.md): the same store of 100,000
//! ConfigMaps (10 namespaces), every object triggered once by the same stream of `ObjectRef`s, a
//! reconcile that reads the object from its `Arc` and returns `await_change`, concurrency 16, a
//! multi-thread tokio runtime with 2 workers. kube-runtime's side is its stable `applier`; ours is
//! `Controller::for_stream(..).reconcile_on(..)` with its defaults (priorities, aging, and with
//! the `metrics` feature, the named queue's metrics).
//!
//! ```text
//! cargo bench -p workqueue-kube --bench controller_throughput                 # both, 5 runs each
//! cargo bench -p workqueue-kube --bench controller_throughput -- kube 100000  # one run of one
//! ```
//!
//! Each run is a process of its own (peak memory is the process's `VmHWM`); the runs alternate
//! between the two implementations. Figures: reconciles per second, p99 of the time from an
//! object's trigger (the stream yielding its key) to its reconcile's start, peak RSS.

use std::hint::black_box;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use futures_util::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;

const NAMESPACES: usize = 10;
const CONCURRENCY: u16 = 16;

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// When each object was triggered and when its reconcile started (ns since the run's start).
struct Times {
    start: Instant,
    triggered: Vec<AtomicU64>,
    started: Vec<AtomicU64>,
}

impl Times {
    fn new(n: usize) -> Self {
        Times {
            start: Instant::now(),
            triggered: (0..n).map(|_| AtomicU64::new(0)).collect(),
            started: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The p99 of start − trigger, in µs.
    fn p99_us(&self) -> f64 {
        let mut waits: Vec<u64> = self
            .triggered
            .iter()
            .zip(&self.started)
            .map(|(t, s)| s.load(Relaxed).saturating_sub(t.load(Relaxed)))
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

/// The shared trigger stream: each key, timestamped as it is yielded.
fn triggers(
    refs: Vec<ObjectRef<ConfigMap>>,
    times: Arc<Times>,
) -> impl futures_util::Stream<Item = ObjectRef<ConfigMap>> + Send + 'static {
    stream::iter(refs).map(move |key| {
        let i: usize = key.name[3..].parse().unwrap();
        times.triggered[i].store(times.now(), Relaxed);
        key
    })
}

async fn run_kube(
    store: Store<ConfigMap>,
    refs: Vec<ObjectRef<ConfigMap>>,
    times: Arc<Times>,
) -> usize {
    use kube::runtime::controller::{Action, Config, applier};
    let reconcile = {
        let times = times.clone();
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            times.started[index(&cm)].store(times.now(), Relaxed);
            black_box(&cm.metadata.name);
            std::future::ready(Ok::<_, Never>(Action::await_change()))
        }
    };
    let queue = triggers(refs, times).map(Ok::<_, watcher::Error>);
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
            times.started[index(&cm)].store(times.now(), Relaxed);
            black_box(&cm.metadata.name);
            std::future::ready(Ok::<_, Never>(Action::await_change()))
        }
    };
    Controller::for_stream(stream::empty(), store)
        .reconcile_on(triggers(refs, times))
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

/// One run of one implementation, in this process; prints `impl rps p99_us peak_kib`.
fn child(which: &str, n: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (store, refs) = store(n);
    let times = Arc::new(Times::new(n));
    let begun = Instant::now();
    let done = runtime.block_on(async {
        match which {
            "kube" => run_kube(store, refs, times.clone()).await,
            _ => run_ours(store, refs, times.clone()).await,
        }
    });
    let elapsed = begun.elapsed();
    assert_eq!(done, n, "{which}: every object reconciled once");
    println!(
        "{which} {:.0} {:.1} {}",
        n as f64 / elapsed.as_secs_f64(),
        times.p99_us(),
        peak_rss_kib()
    );
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let which = args.first().map_or("all", String::as_str);
    let n: usize = args.get(1).map_or(100_000, |s| s.parse().expect("N"));
    if which != "all" {
        child(which, n);
        return;
    }
    let runs: usize = args.get(2).map_or(5, |s| s.parse().expect("RUNS"));
    let exe = std::env::current_exe().unwrap();
    // Per implementation, one (figures of a run) triple per run.
    type Runs = Vec<(f64, f64, f64)>;
    let mut figures: Vec<(String, Runs)> =
        vec![("kube".into(), Vec::new()), ("ours".into(), Vec::new())];
    for _ in 0..runs {
        for (name, results) in &mut figures {
            let out = Command::new(&exe)
                .args([name.as_str(), &n.to_string()])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8(out.stdout).unwrap();
            let f: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap())
                .collect();
            results.push((f[0], f[1], f[2]));
        }
    }
    println!(
        "W14 controller throughput, {n} objects, concurrency {CONCURRENCY}, 2 runtime threads, {runs} runs each (median [min, max])"
    );
    println!("| implementation | reconciles/s | p99 trigger-to-start (ms) | peak RSS (MiB) |");
    println!("|---|---:|---:|---:|");
    let mut medians = Vec::new();
    for (name, results) in &figures {
        let rps = median(results.iter().map(|r| r.0).collect());
        let p99 = median(results.iter().map(|r| r.1 / 1e3).collect());
        let rss = median(results.iter().map(|r| r.2 / 1024.0).collect());
        println!(
            "| {name} | {:.0} [{:.0}, {:.0}] | {:.1} [{:.1}, {:.1}] | {:.1} [{:.1}, {:.1}] |",
            rps.0, rps.1, rps.2, p99.0, p99.1, p99.2, rss.0, rss.1, rss.2
        );
        medians.push((rps.0, p99.0, rss.0));
    }
    let (kube, ours) = (medians[0], medians[1]);
    println!(
        "RATIO W14 reconciles/s {:.2}x (target >= 2), p99 {:.2}x (target <= 1), peak RSS {:.2}x (target <= 1)",
        ours.0 / kube.0,
        ours.1 / kube.1,
        ours.2 / kube.2
    );
}
