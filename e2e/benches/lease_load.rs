//! The Lease protocol's load on the API server, as the server counts it: `apiserver_request_total`
//! for `leases` from kube-apiserver's own `/metrics`, scraped before and after a steady-state
//! window, with 1 and 3 replicas (each an OS process: this binary run again), for leader
//! election, 32 shards and 256 shards, at the protocol's default timing (lease 15 s, renew
//! deadline 10 s, retry 2 s).
//!
//! ```text
//! export KUBEBUILDER_ASSETS="$(e2e/build-assets.sh)"
//! cargo bench -p workqueue-e2e --features control-plane --bench lease_load
//! cargo bench -p workqueue-e2e --features control-plane --bench lease_load -- --window 30 --shards 32 --replicas 3
//! ```
//!
//! Options: `--window SECS` (default 120), `--shards N` and `--replicas K` (repeatable; default
//! 1, 32, 256 and 1, 3), `--settle SECS` (the longest wait for the shards to be shared fairly
//! before the window opens, default 180), `--hang-watch` (the first replica's Lease watch hangs
//! silently through the window: it lives on relists). Before the cases, one window without replicas measures
//! the server's own Lease traffic (its identity and endpoint Leases), which is subtracted.
//!
//! Each case has a namespace of its own; its replicas start together, the window opens once the
//! shard Leases are held fairly plus two retry periods, and the replicas are stopped with SIGTERM
//! after it. Printed: per case, requests/s and writes/s in all and per replica, by verb, and a
//! Markdown table.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use workqueue_e2e::child::{Child, this_binary};
use workqueue_e2e::replica::{Spec, fair, run_if_replica, shard_holders};
use workqueue_test_support::api_requests::{RequestCounts, scrape};
use workqueue_test_support::control_plane::ControlPlane;

/// The settings of a run.
struct Options {
    window: Duration,
    settle: Duration,
    shards: Vec<u32>,
    replicas: Vec<usize>,
    hang_watch: bool,
}

fn options() -> Options {
    let mut options = Options {
        window: Duration::from_secs(120),
        settle: Duration::from_secs(180),
        shards: Vec::new(),
        replicas: Vec::new(),
        hang_watch: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| -> u64 {
            let v = args
                .next()
                .unwrap_or_else(|| panic!("{what} needs a value"));
            v.parse().unwrap_or_else(|e| panic!("{what} {v:?}: {e}"))
        };
        match arg.as_str() {
            "--window" => options.window = Duration::from_secs(value("--window")),
            "--settle" => options.settle = Duration::from_secs(value("--settle")),
            "--shards" => options.shards.push(value("--shards") as u32),
            "--replicas" => options.replicas.push(value("--replicas") as usize),
            "--hang-watch" => options.hang_watch = true,
            // What cargo bench passes.
            "--bench" => {}
            other => panic!(
                "unknown argument {other:?}: --window SECS, --settle SECS, --shards N, --replicas K, --hang-watch"
            ),
        }
    }
    if options.shards.is_empty() {
        options.shards = vec![1, 32, 256];
    }
    if options.replicas.is_empty() {
        options.replicas = vec![1, 3];
    }
    options
}

/// What one window counted for `leases`.
#[derive(Debug)]
struct Load {
    requests: f64,
    writes: f64,
    verbs: BTreeMap<String, f64>,
    seconds: f64,
}

impl Load {
    fn of(before: &RequestCounts, after: &RequestCounts, seconds: f64) -> Load {
        let delta = after.since(before);
        Load {
            requests: delta.of("leases"),
            writes: delta.writes_of("leases"),
            verbs: delta.verbs_of("leases"),
            seconds,
        }
    }

    /// Requests/s and writes/s, less `baseline`'s rates.
    fn rates_over(&self, baseline: &Load) -> (f64, f64) {
        (
            self.requests / self.seconds - baseline.requests / baseline.seconds,
            self.writes / self.seconds - baseline.writes / baseline.seconds,
        )
    }

    fn verbs_per_second(&self) -> String {
        let verbs: Vec<String> = self
            .verbs
            .iter()
            .map(|(verb, n)| format!("{verb} {:.2}", n / self.seconds))
            .collect();
        verbs.join(", ")
    }
}

/// Scrapes before and after `window`.
async fn window(client: &kube::Client, window: Duration) -> Load {
    let before = scrape(client).await.expect("scraping /metrics");
    let start = Instant::now();
    tokio::time::sleep(window).await;
    let after = scrape(client).await.expect("scraping /metrics");
    Load::of(&before, &after, start.elapsed().as_secs_f64())
}

fn case_name(shards: u32) -> String {
    if shards == 1 {
        "leader election".into()
    } else {
        format!("{shards} shards")
    }
}

/// One case: `k` replicas of a controller with `shards` shards, settled, then a window.
async fn case(plane: &ControlPlane, options: &Options, shards: u32, k: usize) -> Load {
    let client = plane.client();
    let ns = plane.namespace("lease-load").await;
    let dir: PathBuf = std::env::temp_dir().join(format!("workqueue-lease-load-{ns}"));
    std::fs::create_dir_all(&dir).expect("a folder");
    let names: Vec<String> = (1..=k).map(|i| format!("r{i}")).collect();
    let hang_flag = dir.join("hang-r1");
    let mut replicas: Vec<Child> = names
        .iter()
        .map(|identity| {
            let mut spec = Spec::new(identity, &ns, "load");
            spec.shards = shards;
            // No objects: the Leases are all there is to count.
            spec.selector = "e2e.workqueue/lease-load".into();
            if options.hang_watch && identity == "r1" {
                spec.hang_watch = Some(hang_flag.clone());
            }
            let mut command = this_binary(None);
            spec.apply(&mut command, &plane.config(), &dir);
            let log = dir.join(format!("{identity}.log"));
            Child::spawn(identity, command, &log).expect("spawning a replica")
        })
        .collect();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let start = Instant::now();
    loop {
        let held = shard_holders(&leases, &refs).await;
        if fair(&held, &refs, shards) {
            break;
        }
        for child in &mut replicas {
            assert!(
                !child.has_exited(),
                "{} exited:\n{}",
                child.name(),
                child.log_tail(20)
            );
        }
        assert!(
            start.elapsed() < options.settle,
            "{} with {k} replicas: not settled within {:?}: {held:?}",
            case_name(shards),
            options.settle
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled = start.elapsed();
    // Two retry periods more: the last takes' follow-ups (the membership counts) are done.
    tokio::time::sleep(Duration::from_secs(4)).await;
    eprintln!(
        "{} with {k} replicas: settled after {:.1} s; counting for {:?}",
        case_name(shards),
        settled.as_secs_f64(),
        options.window
    );
    if options.hang_watch {
        std::fs::write(&hang_flag, b"").expect("the flag file");
        eprintln!("r1's Lease watch hangs through the window");
    }
    let load = window(&client, options.window).await;
    let _ = std::fs::remove_file(&hang_flag);
    for child in &replicas {
        child.signal("TERM");
    }
    for mut child in replicas {
        let status = child.wait_exit(Duration::from_secs(30));
        assert!(
            status.is_some(),
            "{} did not exit after SIGTERM:\n{}",
            child.name(),
            child.log_tail(20)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    load
}

fn main() {
    run_if_replica();
    let options = options();
    workqueue_e2e::block_on(async {
        let plane = ControlPlane::shared().await;
        let client = plane.client();
        let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        eprintln!("load average at the start: {}", load_avg.trim());
        eprintln!(
            "baseline: the server's own Lease traffic, no replicas, {:?}",
            options.window
        );
        let baseline = window(&client, options.window).await;
        eprintln!(
            "baseline: {:.2} requests/s, {:.2} writes/s ({})",
            baseline.requests / baseline.seconds,
            baseline.writes / baseline.seconds,
            baseline.verbs_per_second()
        );
        let mut rows = Vec::new();
        for &shards in &options.shards {
            for &k in &options.replicas {
                let load = case(plane, &options, shards, k).await;
                let (requests, writes) = load.rates_over(&baseline);
                println!(
                    "{} with {k} replica(s): {requests:.2} requests/s, {writes:.2} writes/s in all \
                     ({:.2} and {:.2} per replica); by verb, server's own included: {}",
                    case_name(shards),
                    requests / k as f64,
                    writes / k as f64,
                    load.verbs_per_second()
                );
                rows.push((shards, k, requests, writes, load.verbs_per_second()));
            }
        }
        let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("\nload average at the end: {}", load_avg.trim());
        println!(
            "baseline (the server's own, subtracted): {:.2} requests/s, {:.2} writes/s\n",
            baseline.requests / baseline.seconds,
            baseline.writes / baseline.seconds
        );
        println!(
            "| Leases | replicas | requests/s (all) | writes/s (all) | writes/s per replica | by verb (/s, with the server's own) |"
        );
        println!("|---|---:|---:|---:|---:|---|");
        for (shards, k, requests, writes, verbs) in rows {
            println!(
                "| {} | {k} | {requests:.2} | {writes:.2} | {:.2} | {verbs} |",
                case_name(shards),
                writes / k as f64
            );
        }
    });
}
