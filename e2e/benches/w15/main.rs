//! W15 (BENCHMARKS.md): controller throughput on a real API server. 10,000 ConfigMaps in 10
//! namespaces; our `Controller` and kube-runtime's `Controller::run`, each in its own process
//! (this binary run again) against the same kube-apiserver and etcd, the same reconcile,
//! concurrency 16, a tokio runtime with 2 workers; the runs alternate, 3 of each.
//!
//! ```text
//! export KUBEBUILDER_ASSETS="$(e2e/build-assets.sh)"
//! cargo bench -p workqueue-e2e --features control-plane --bench w15
//! cargo bench -p workqueue-e2e --features control-plane --bench w15 -- --runs 1 --per-namespace 100 --rate 100 --churn 10
//! ```
//!
//! **The reconcile** reads the object from its `Arc` and patches one annotation,
//! `w15.workqueue/seen`, to `<run>/<data.v>` (a JSON merge patch), unless it already has that
//! value: then it writes nothing. So the patch's own watch event is reconciled once more and
//! ends there (no loop), every run starts with every object to patch (a new `<run>`), and each
//! change of `data.v` by the churn costs one patch. Each reconcile appends its start (with the
//! resourceVersion it was given) and end to a ledger file (test-support's `ledger_file`).
//!
//! **Phase 1, start-up**: from the process's spawn to the end of the last object's first
//! reconcile. Then the controller is left until it is quiet (no reconcile for 2 s).
//!
//! **Phase 2, churn**: a third process changes `data.v`, 1,000 updates/s for 30 s, spread over
//! the objects (each update goes to the next object of a fixed shuffle of all of them), and
//! records each update's resourceVersion when the server accepted it. Figures: reconcile lag
//! (from an update's acceptance to the start of the first reconcile of that object given at
//! least that resourceVersion; one wall clock for all processes) p50 and p99; API requests per
//! reconcile (the API server's `apiserver_request_total` for `configmaps`, scraped before the
//! churn and after the last update was reconciled, less the churn's own requests, over the
//! reconciles started in between); the controller's peak RSS (`VmHWM`) at the end.
//!
//! Options: `--runs N` (of each, default 3), `--namespaces N` (10), `--per-namespace N`
//! (1,000), `--rate N` (updates/s, 1,000), `--churn SECS` (30), `--only ours|kube-runtime`.
//!
//! **Heap profiles**: with `W15_HEAPTRACK=DIR`, each controller runs with heaptrack's preload
//! library (`W15_HEAPTRACK_LIB`, by default Debian's `/usr/lib/heaptrack/libheaptrack_preload.so`)
//! and writes its raw trace to `DIR/<run>.raw` (the churn process is not traced); read
//! one with `heaptrack_interpret < DIR/<run>.raw | zstd > p.zst; heaptrack_print p.zst`. A traced
//! run's timings and RSS are heaptrack's, not figures. With `W15_SMAPS=DIR`, each controller's
//! `/proc/<pid>/smaps` after the start-up is copied to `DIR/<run>.smaps` (where its RSS is).

mod roles;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use workqueue_e2e::child::{Child, pass_client, this_binary};
use workqueue_test_support::api_requests::scrape;
use workqueue_test_support::control_plane::ControlPlane;
use workqueue_test_support::figures::{
    Versioned, median, peak_rss_kib, percentile, reconcile_lags,
};
use workqueue_test_support::ledger_file::{END, Line, START, Tail, wall_ns};

use roles::{Impl, LABEL};

/// The settings of a run.
#[derive(Clone, Debug)]
struct Options {
    runs: usize,
    namespaces: usize,
    per_namespace: usize,
    rate: u32,
    churn: Duration,
    only: Option<Impl>,
}

fn options() -> Options {
    let mut options = Options {
        runs: 3,
        namespaces: 10,
        per_namespace: 1000,
        rate: 1000,
        churn: Duration::from_secs(30),
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| -> String {
            args.next()
                .unwrap_or_else(|| panic!("{what} needs a value"))
        };
        let number = |what: &str, v: String| -> u64 {
            v.parse().unwrap_or_else(|e| panic!("{what} {v:?}: {e}"))
        };
        match arg.as_str() {
            "--runs" => options.runs = number("--runs", value("--runs")) as usize,
            "--namespaces" => {
                options.namespaces = number("--namespaces", value("--namespaces")) as usize
            }
            "--per-namespace" => {
                options.per_namespace = number("--per-namespace", value("--per-namespace")) as usize
            }
            "--rate" => options.rate = number("--rate", value("--rate")) as u32,
            "--churn" => options.churn = Duration::from_secs(number("--churn", value("--churn"))),
            "--only" => {
                options.only = Some(match value("--only").as_str() {
                    "ours" => Impl::Ours,
                    "kube-runtime" => Impl::KubeRuntime,
                    other => panic!("--only ours|kube-runtime, not {other:?}"),
                })
            }
            "--bench" => {}
            other => panic!(
                "unknown argument {other:?}: --runs N, --namespaces N, --per-namespace N, --rate N, --churn SECS, --only ours|kube-runtime"
            ),
        }
    }
    options
}

/// The figures of one run.
#[derive(Clone, Debug)]
struct Figures {
    implementation: Impl,
    startup_s: f64,
    /// Requests per reconcile in phase 1 (for the record: the initial list and the patches).
    startup_requests: f64,
    lag_p50_ms: f64,
    lag_p99_ms: f64,
    unmatched: usize,
    updates: usize,
    update_rate: f64,
    reconciles: usize,
    requests_per_reconcile: f64,
    /// The controller's requests per update of the churn.
    requests_per_update: f64,
    /// Peak RSS when the start-up was over.
    startup_rss_mib: f64,
    peak_rss_mib: f64,
}

/// The lines of `kind` from `tail`'s file so far, kept in `lines`.
fn read(tail: &mut Tail, lines: &mut Vec<Line>) {
    lines.extend(tail.read_new().expect("reading the ledger"));
}

/// Creates the objects: `per_namespace` ConfigMaps in each of `namespaces`.
async fn create(client: &kube::Client, namespaces: &[String], per_namespace: usize) {
    let objects = namespaces
        .iter()
        .flat_map(|ns| (0..per_namespace).map(move |i| (ns.clone(), format!("cm-{i:05}"))));
    workqueue_e2e::create_configmaps(client, objects, LABEL).await;
}

/// Spawns this binary as `role` with the client configuration and `env`.
fn spawn(
    plane: &ControlPlane,
    dir: &Path,
    name: &str,
    role: &str,
    env: &[(&str, String)],
) -> Child {
    let mut command: Command = this_binary(None);
    pass_client(&plane.config(), dir, &mut command);
    command.env(roles::ROLE, role);
    if let Some(traces) = std::env::var_os("W15_HEAPTRACK").filter(|_| role != roles::CHURN) {
        let library = std::env::var_os("W15_HEAPTRACK_LIB")
            .unwrap_or_else(|| "/usr/lib/heaptrack/libheaptrack_preload.so".into());
        command.env("LD_PRELOAD", library).env(
            "DUMP_HEAPTRACK_OUTPUT",
            Path::new(&traces).join(format!("{name}.raw")),
        );
    }
    for (key, value) in env {
        command.env(key, value);
    }
    Child::spawn(name, command, &dir.join(format!("{name}.log"))).expect("spawning a role")
}

/// One run of `implementation`.
async fn run(
    plane: &ControlPlane,
    options: &Options,
    namespaces: &[String],
    dir: &Path,
    implementation: Impl,
    token: &str,
) -> Figures {
    let client = plane.client();
    let total = namespaces.len() * options.per_namespace;
    let ledger = dir.join(format!("ledger-{token}"));
    let mut tail = Tail::new(&ledger);
    let mut lines: Vec<Line> = Vec::new();
    let before_start = scrape(&client).await.expect("scraping /metrics");
    let spawned = wall_ns();
    let mut controller = spawn(
        plane,
        dir,
        token,
        implementation.role(),
        &[
            (roles::LEDGER, ledger.display().to_string()),
            (roles::TOKEN, token.to_string()),
        ],
    );
    let pid = controller.pid();

    // Phase 1: every object's first reconcile ended.
    let mut first_end: HashMap<String, u128> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while first_end.len() < total {
        let from = lines.len();
        read(&mut tail, &mut lines);
        for line in &lines[from..] {
            if line.kind == END {
                first_end.entry(line.subject.clone()).or_insert(line.at_ns);
            }
        }
        assert!(
            !controller.has_exited(),
            "the controller exited:\n{}",
            controller.log_tail(20)
        );
        assert!(
            Instant::now() < deadline,
            "{} of {total} objects reconciled after 600 s",
            first_end.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let startup_s = (first_end.values().max().unwrap() - spawned) as f64 / 1e9;
    // Quiet: no reconcile for 2 s (the patches' own events reconciled).
    let mut last_len = lines.len();
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        read(&mut tail, &mut lines);
        if lines.len() != last_len {
            last_len = lines.len();
            quiet_since = Instant::now();
        }
    }
    let startup_rss_kib = peak_rss_kib(pid).expect("the controller's peak RSS");
    if let Some(dir) = std::env::var_os("W15_SMAPS") {
        let to = Path::new(&dir).join(format!("{token}.smaps"));
        let _ = std::fs::copy(format!("/proc/{pid}/smaps"), to);
    }
    let before = scrape(&client).await.expect("scraping /metrics");
    let startup_reconciles = lines.iter().filter(|l| l.kind == START).count();
    let startup_requests = before.since(&before_start).of("configmaps") / startup_reconciles as f64;

    // Phase 2: the churn.
    let churn_started = wall_ns();
    let from = lines.len();
    let mut churn = spawn(
        plane,
        dir,
        &format!("churn-{token}"),
        roles::CHURN,
        &[
            (roles::LEDGER, ledger.display().to_string()),
            (roles::TOKEN, token.to_string()),
            (roles::NAMESPACES, namespaces.join(",")),
            (roles::PER_NAMESPACE, options.per_namespace.to_string()),
            (roles::RATE, options.rate.to_string()),
            (roles::SECONDS, options.churn.as_secs().to_string()),
        ],
    );
    let churn_deadline = Instant::now() + options.churn + Duration::from_secs(120);
    while !churn.has_exited() {
        assert!(
            Instant::now() < churn_deadline,
            "the churn did not end:\n{}",
            churn.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        churn.wait_exit(Duration::ZERO).is_some_and(|s| s.success()),
        "the churn failed:\n{}",
        churn.log_tail(20)
    );
    // Every update reconciled (or 60 s passed).
    let lag_deadline = Instant::now() + Duration::from_secs(60);
    let (updates, churn_requests, lags) = loop {
        read(&mut tail, &mut lines);
        let phase = &lines[from..];
        let churn_requests = phase
            .iter()
            .filter(|l| l.kind.starts_with("update"))
            .count();
        let updates: Vec<Versioned> = phase
            .iter()
            .filter(|l| l.kind == "update")
            .map(versioned)
            .collect();
        let starts: Vec<Versioned> = phase
            .iter()
            .filter(|l| l.kind == START)
            .map(versioned)
            .collect();
        let lags = reconcile_lags(&updates, &starts);
        if lags.unmatched == 0 || Instant::now() > lag_deadline {
            break (updates, churn_requests, lags);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let after = scrape(&client).await.expect("scraping /metrics");
    read(&mut tail, &mut lines);
    let reconciles = lines[from..].iter().filter(|l| l.kind == START).count();
    let controller_requests = after.since(&before).of("configmaps") - churn_requests as f64;
    let churn_s = updates
        .iter()
        .map(|u| u.at_ns)
        .max()
        .map_or(0.0, |last| (last - churn_started) as f64 / 1e9);
    let peak_rss_kib = peak_rss_kib(pid).expect("the controller's peak RSS");
    controller.kill();
    Figures {
        implementation,
        startup_s,
        startup_requests,
        lag_p50_ms: percentile(&lags.lags_ms, 50.0).unwrap_or(f64::NAN),
        lag_p99_ms: percentile(&lags.lags_ms, 99.0).unwrap_or(f64::NAN),
        unmatched: lags.unmatched,
        updates: updates.len(),
        update_rate: updates.len() as f64 / churn_s.max(1e-9),
        reconciles,
        requests_per_reconcile: controller_requests / reconciles as f64,
        requests_per_update: controller_requests / updates.len() as f64,
        startup_rss_mib: startup_rss_kib as f64 / 1024.0,
        peak_rss_mib: peak_rss_kib as f64 / 1024.0,
    }
}

/// An `update` or `start` line as an object at a version.
fn versioned(line: &Line) -> Versioned {
    let version = line
        .detail
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Versioned {
        object: line.subject.clone(),
        version,
        at_ns: line.at_ns,
    }
}

fn print_figures(f: &Figures) {
    println!(
        "{:>12}: start-up {:.2} s ({:.2} requests/reconcile, peak RSS {:.1} MiB); churn {} updates at {:.0}/s; lag p50 {:.1} ms, p99 {:.1} ms ({} unmatched); {} reconciles, {:.3} requests/reconcile, {:.3} per update; peak RSS {:.1} MiB",
        f.implementation.name(),
        f.startup_s,
        f.startup_requests,
        f.startup_rss_mib,
        f.updates,
        f.update_rate,
        f.lag_p50_ms,
        f.lag_p99_ms,
        f.unmatched,
        f.reconciles,
        f.requests_per_reconcile,
        f.requests_per_update,
        f.peak_rss_mib
    );
}

fn main() {
    roles::run_if_role();
    let options = options();
    workqueue_e2e::block_on(async {
        let plane = ControlPlane::shared().await;
        let client = plane.client();
        let dir: PathBuf =
            std::env::temp_dir().join(format!("workqueue-w15-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let mut namespaces = Vec::new();
        for _ in 0..options.namespaces {
            namespaces.push(plane.namespace("w15").await);
        }
        let created = Instant::now();
        create(&client, &namespaces, options.per_namespace).await;
        eprintln!(
            "{} ConfigMaps created in {:.1} s",
            options.namespaces * options.per_namespace,
            created.elapsed().as_secs_f64()
        );
        let load = |when: &str| {
            let avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            format!("load average {when}: {}", avg.trim())
        };
        let mut loads = vec![load("at the start")];
        let order: Vec<Impl> = match options.only {
            Some(only) => vec![only],
            None => vec![Impl::Ours, Impl::KubeRuntime],
        };
        let mut results: Vec<Figures> = Vec::new();
        for round in 0..options.runs {
            for &implementation in &order {
                let token = format!("{}-{round}", implementation.short());
                let figures = run(plane, &options, &namespaces, &dir, implementation, &token).await;
                print_figures(&figures);
                results.push(figures);
                loads.push(load(&format!("after {token}")));
            }
        }
        println!();
        for l in &loads {
            println!("{l}");
        }
        println!();
        println!(
            "| run | controller | start-up (s) | lag p50 (ms) | lag p99 (ms) | requests/reconcile | requests/update | reconciles | updates (/s) | peak RSS after start-up / at the end (MiB) |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (i, f) in results.iter().enumerate() {
            println!(
                "| {} | {} | {:.2} | {:.1} | {:.1} | {:.3} | {:.3} | {} | {} ({:.0}) | {:.1} / {:.1} |",
                i / order.len() + 1,
                f.implementation.name(),
                f.startup_s,
                f.lag_p50_ms,
                f.lag_p99_ms,
                f.requests_per_reconcile,
                f.requests_per_update,
                f.reconciles,
                f.updates,
                f.update_rate,
                f.startup_rss_mib,
                f.peak_rss_mib
            );
        }
        if order.len() == 2 {
            // Ratios ours / kube-runtime, per round (the two runs next to each other) and the
            // median of the rounds.
            let pairs: Vec<(&Figures, &Figures)> =
                results.chunks(2).map(|pair| (&pair[0], &pair[1])).collect();
            let ratio = |f: &dyn Fn(&Figures) -> f64| -> Vec<f64> {
                pairs.iter().map(|(o, k)| f(o) / f(k)).collect()
            };
            let rows: [(&str, Vec<f64>); 7] = [
                ("start-up", ratio(&|f| f.startup_s)),
                ("lag p50", ratio(&|f| f.lag_p50_ms)),
                ("lag p99", ratio(&|f| f.lag_p99_ms)),
                ("requests/reconcile", ratio(&|f| f.requests_per_reconcile)),
                ("requests/update", ratio(&|f| f.requests_per_update)),
                ("peak RSS after start-up", ratio(&|f| f.startup_rss_mib)),
                ("peak RSS", ratio(&|f| f.peak_rss_mib)),
            ];
            println!();
            println!("| ours / kube-runtime | per round | median |");
            println!("|---|---|---:|");
            for (what, ratios) in rows {
                let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
                println!(
                    "| {what} | {} | {:.2}x |",
                    each.join(", "),
                    median(&ratios).unwrap_or(f64::NAN)
                );
            }
        }
        let unmatched: HashSet<usize> = results.iter().map(|f| f.unmatched).collect();
        if unmatched.iter().any(|u| *u > 0) {
            println!("\nwarning: some updates were never seen by a reconcile: {unmatched:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}
