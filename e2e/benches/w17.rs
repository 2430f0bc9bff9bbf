//! W17 (BENCHMARKS.md): divided caches on a real API server. 20,000 ConfigMaps in one
//! namespace; replicas of our `Controller` on 32 shards (each an OS process: this binary run
//! again as `workqueue_e2e::replica`), with divided caches (`divide_caches`) and without, and
//! kube-runtime's `Controller` alone, one configuration after the other:
//!
//! `kube-runtime`, `whole x1`, `divided x1`, `divided x2`, `divided x4`, `whole x4`.
//!
//! ```text
//! export KUBEBUILDER_ASSETS="$(e2e/build-assets.sh)"
//! cargo bench -p workqueue-e2e --features control-plane --bench w17
//! cargo bench -p workqueue-e2e --features control-plane --bench w17 -- --objects 2000 --churn 10
//! ```
//!
//! The reconcile does nothing but record its start and end in a ledger file (no write), so the
//! figures are the watches' and the caches'. The first divided configuration finds the objects
//! without the shard label and labels them (its start-up includes 20,000 patches); the later
//! ones find them labelled.
//!
//! **Start-up**: from the spawn of the replicas to the end of every object's first reconcile and
//! the shards settled (each replica within one of a fair share), then quiet (no reconcile for
//! 2 s). The API server's requests for `configmaps` over it (`apiserver_request_total`).
//!
//! **Steady state**: the harness changes `data.v` of the objects, `--rate` updates/s (100) for
//! `--churn` seconds (20), each to the next object of a fixed shuffle; then 3 s for the events to
//! arrive. Per replica, counted by its own client (`workqueue_e2e::traffic`): the watch events
//! received in that window, and the bytes read over the whole run (lists and watches); the
//! objects in its store at the end; its peak RSS (`VmHWM`). The API server's requests for
//! `configmaps` over the window, less the churn's own.
//!
//! **Creations** (`divided x4` and `whole x4`): new objects created at `--create-rate` a second
//! (200) for `--create` seconds (60): the delay from each one's creation (the server's answer)
//! to the start of its first reconcile, p50 and p99, and whether each was labelled; the
//! objects are deleted afterwards.
//!
//! **Moves** (`divided x4`, unless `--no-moves`): a replica killed (`kill -9`), one joining and
//! one leaving (SIGTERM), one after the other: the objects of the shards that changed holder,
//! the time until the shards settled and until every one of those objects was reconciled by its
//! new holder, and the API server's ConfigMap writes meanwhile (none is needed: the label names
//! the shard, not the replica). The ledger is judged: no object reconciled by two processes at
//! once.
//!
//! Options: `--objects N` (20,000), `--rate N` (100), `--churn SECS` (20), `--create-rate N`
//! (200; 0: no creations), `--create SECS` (60), `--no-moves`, `--only NAME` (one
//! configuration, by its name above).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use workqueue_e2e::child::{Child, this_binary};
use workqueue_e2e::replica::{Spec, fair, held_shards, run_if_replica, shard_holders};
use workqueue_kube::lease::shard_of;
use workqueue_test_support::api_requests::scrape;
use workqueue_test_support::control_plane::ControlPlane;
use workqueue_test_support::figures::{peak_rss_kib, percentile};
use workqueue_test_support::fixtures::cm_in;
use workqueue_test_support::ledger_file::{END, LedgerReader, Line, START, Tail, wall_ns};

const LABEL: &str = "w17.workqueue/bench";
const SHARDS: u32 = 32;
/// The controller's name: the same for every configuration, so that the label written by the
/// first divided one serves the others.
const CONTROLLER: &str = "w17";
/// The replicas' lease duration (renew deadline 2 s, retry period 0.4 s).
const LEASE: Duration = Duration::from_secs(3);

#[derive(Clone, Debug)]
struct Options {
    objects: usize,
    rate: u64,
    churn: Duration,
    only: Option<String>,
    /// Objects created a second in the creations phase (0: none).
    create_rate: u64,
    create: Duration,
    moves: bool,
}

fn options() -> Options {
    let mut options = Options {
        objects: 20_000,
        rate: 100,
        churn: Duration::from_secs(20),
        only: None,
        create_rate: 200,
        create: Duration::from_secs(60),
        moves: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--objects" => options.objects = value().parse().expect("--objects N"),
            "--rate" => options.rate = value().parse().expect("--rate N"),
            "--churn" => options.churn = Duration::from_secs(value().parse().expect("--churn S")),
            "--only" => options.only = Some(value()),
            "--create-rate" => options.create_rate = value().parse().expect("--create-rate N"),
            "--create" => {
                options.create = Duration::from_secs(value().parse().expect("--create S"))
            }
            "--no-moves" => options.moves = false,
            "--bench" => {}
            other => panic!(
                "unknown argument {other:?}: --objects N, --rate N, --churn SECS, --only NAME"
            ),
        }
    }
    options
}

/// A configuration: kube-runtime's controller alone, or `replicas` of ours, divided or not.
#[derive(Clone, Copy, Debug)]
struct Setup {
    kube_runtime: bool,
    divided: bool,
    replicas: usize,
}

impl Setup {
    fn name(self) -> String {
        match (self.kube_runtime, self.divided) {
            (true, _) => "kube-runtime".into(),
            (false, true) => format!("divided x{}", self.replicas),
            (false, false) => format!("whole x{}", self.replicas),
        }
    }
}

/// One replica's figures.
#[derive(Debug)]
struct Replica {
    store: u64,
    events: u64,
    read_mib: f64,
    peak_rss_mib: f64,
}

/// One configuration's figures.
#[derive(Debug)]
struct Figures {
    setup: Setup,
    startup_s: f64,
    startup_requests: f64,
    steady_requests_per_s: f64,
    churn_updates: u64,
    replicas: BTreeMap<String, Replica>,
    created: Option<Creations>,
    moved: Vec<Move>,
}

/// A `traffic` line's fields: store, requests, list bytes, watch bytes, watch events.
fn traffic(line: &Line) -> [u64; 5] {
    let mut fields = line.detail.split(' ').map(|f| f.parse().unwrap_or(0));
    std::array::from_fn(|_| fields.next().unwrap_or(0))
}

/// Each replica's last `traffic` line.
fn last_traffic(lines: &[Line]) -> BTreeMap<String, [u64; 5]> {
    lines
        .iter()
        .filter(|l| l.kind == "traffic")
        .map(|l| (l.replica.clone(), traffic(l)))
        .collect()
}

/// Changes `data.v` of the objects, `rate` a second for `churn`; returns the updates made.
async fn churn(
    api: &Api<ConfigMap>,
    objects: usize,
    rate: u64,
    churn: Duration,
    token: &str,
) -> u64 {
    let stride = (7919..).find(|s| gcd(*s, objects) == 1).expect("a stride");
    let total = rate * churn.as_secs();
    let start = tokio::time::Instant::now();
    let updates = stream::iter(0..total)
        .then(|i| async move {
            tokio::time::sleep_until(start + Duration::from_nanos(i * 1_000_000_000 / rate)).await;
            i
        })
        .map(|i| {
            let name = format!("cm-{:05}", (i as usize * stride) % objects);
            let patch = Patch::Merge(json!({ "data": { "v": format!("{token}-{i}") } }));
            async move {
                api.patch(&name, &PatchParams::default(), &patch)
                    .await
                    .is_ok()
            }
        })
        .buffer_unordered(64)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    updates as u64
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Spawns replica `identity` of `setup`, recording into `ledger`.
fn spawn(
    plane: &ControlPlane,
    dir: &Path,
    ns: &str,
    ledger: &Path,
    setup: Setup,
    identity: &str,
) -> Child {
    let mut spec = Spec::new(identity, ns, CONTROLLER);
    spec.selector = format!("{LABEL}=yes");
    spec.shards = SHARDS;
    spec.timing = Some((LEASE, Duration::from_secs(2), Duration::from_millis(400)));
    spec.ledger = Some(ledger.to_path_buf());
    spec.divided = setup.divided;
    spec.traffic = true;
    spec.kube_runtime = setup.kube_runtime;
    let mut command = this_binary(None);
    spec.apply(&mut command, &plane.config(), dir);
    Child::spawn(identity, command, &dir.join(format!("{identity}.log")))
        .expect("spawning a replica")
}

/// Runs one configuration.
async fn run(
    plane: &ControlPlane,
    ns: &str,
    dir: &Path,
    options: &Options,
    setup: Setup,
) -> Figures {
    let client = plane.client();
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let token = setup.name().replace(' ', "-");
    let ledger = dir.join(format!("ledger-{token}"));
    let mut tail = Tail::new(&ledger);
    let mut lines: Vec<Line> = Vec::new();
    let before = scrape(&client).await.expect("scraping /metrics");
    let started = Instant::now();
    let mut replicas: BTreeMap<String, Child> = BTreeMap::new();
    for r in 0..setup.replicas {
        let identity = format!("{token}-r{r}");
        let child = spawn(plane, dir, ns, &ledger, setup, &identity);
        replicas.insert(identity, child);
    }
    let names: Vec<String> = replicas.keys().cloned().collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let leases = Api::<Lease>::namespaced(client.clone(), ns);

    // Start-up: every object reconciled, the shards settled, then quiet.
    let mut reconciled: HashSet<String> = HashSet::new();
    loop {
        let from = lines.len();
        lines.extend(tail.read_new().expect("reading the ledger"));
        reconciled.extend(
            lines[from..]
                .iter()
                .filter(|l| l.kind == END)
                .map(|l| l.subject.clone()),
        );
        let settled =
            setup.kube_runtime || fair(&shard_holders(&leases, &names).await, &names, SHARDS);
        if reconciled.len() >= options.objects && settled {
            break;
        }
        for (name, child) in &mut replicas {
            assert!(
                !child.has_exited(),
                "{name} exited:\n{}",
                child.log_tail(20)
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "{}: {} of {} objects reconciled after 900 s",
            setup.name(),
            reconciled.len(),
            options.objects
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let startup_s = started.elapsed().as_secs_f64();
    let mut quiet = (
        lines.iter().filter(|l| l.kind == END).count(),
        Instant::now(),
    );
    while quiet.1.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        lines.extend(tail.read_new().expect("reading the ledger"));
        let ends = lines.iter().filter(|l| l.kind == END).count();
        if ends != quiet.0 {
            quiet = (ends, Instant::now());
        }
    }
    // A traffic line after the quiet, for every replica.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    lines.extend(tail.read_new().expect("reading the ledger"));
    let at_start = last_traffic(&lines);
    let steady_from = scrape(&client).await.expect("scraping /metrics");
    let startup_requests = steady_from.since(&before).of("configmaps");

    // Steady state: the churn, then 3 s for its events.
    let window = Instant::now();
    let updates = churn(&api, options.objects, options.rate, options.churn, &token).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let steady_to = scrape(&client).await.expect("scraping /metrics");
    let window_s = window.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    lines.extend(tail.read_new().expect("reading the ledger"));
    let at_end = last_traffic(&lines);
    let steady_requests = steady_to.since(&steady_from).of("configmaps") - updates as f64;
    let mut figures = BTreeMap::new();
    for (name, child) in replicas
        .iter()
        .filter(|(name, _)| at_start.contains_key(*name))
    {
        let (start, end) = (at_start[name], at_end[name]);
        figures.insert(
            name.clone(),
            Replica {
                store: end[0],
                events: end[4] - start[4],
                read_mib: (end[2] + end[3]) as f64 / (1024.0 * 1024.0),
                peak_rss_mib: peak_rss_kib(child.pid()).expect("a peak RSS") as f64 / 1024.0,
            },
        );
    }
    let four = setup.replicas == 4 && !setup.kube_runtime;
    let created = if four && options.create_rate > 0 {
        Some(creations(&api, ns, options, setup, &token, &mut tail, &mut lines).await)
    } else {
        None
    };
    let moved = if four && setup.divided && options.moves {
        let objects: Vec<String> = (0..options.objects)
            .map(|i| format!("{ns}/cm-{i:05}"))
            .collect();
        let mut context = Moves {
            plane,
            dir,
            ns,
            ledger: &ledger,
            setup,
            leases: &leases,
        };
        context.run(&mut replicas, &objects).await
    } else {
        Vec::new()
    };
    for child in replicas.values() {
        child.signal("TERM");
    }
    for (name, mut child) in replicas {
        if child.exit_within(Duration::from_secs(30)).await.is_none() {
            eprintln!("{name} did not exit within 30 s of SIGTERM: killed");
            child.kill();
        }
    }
    // The next configuration starts on fresh Leases.
    let all = leases
        .list(&ListParams::default())
        .await
        .expect("listing Leases");
    for lease in all {
        let _ = leases
            .delete(&lease.name_any(), &DeleteParams::default())
            .await;
    }
    Figures {
        setup,
        startup_s,
        startup_requests,
        steady_requests_per_s: steady_requests / window_s,
        churn_updates: updates,
        replicas: figures,
        created,
        moved,
    }
}

/// New objects created at a steady rate: the delay from each one's creation to its first
/// reconcile.
#[derive(Debug)]
struct Creations {
    created: usize,
    /// How many were not reconciled within 60 s after the last creation.
    unreconciled: usize,
    /// How many lack their shard label (divided caches) once all were reconciled.
    unlabelled: usize,
    p50_ms: f64,
    p99_ms: f64,
}

/// Creates objects at `--create-rate` a second for `--create` seconds and measures the delay
/// from each one's creation (the server's answer) to the start of its first reconcile; then
/// deletes them.
async fn creations(
    api: &Api<ConfigMap>,
    ns: &str,
    options: &Options,
    setup: Setup,
    token: &str,
    tail: &mut Tail,
    lines: &mut Vec<Line>,
) -> Creations {
    let rate = options.create_rate;
    let total = rate * options.create.as_secs();
    let start = tokio::time::Instant::now();
    let created: Vec<(String, String, u128)> = stream::iter(0..total)
        .then(|i| async move {
            tokio::time::sleep_until(start + Duration::from_nanos(i * 1_000_000_000 / rate)).await;
            i
        })
        .map(|i| async move {
            let name = format!("new-{token}-{i:05}");
            let mut cm = cm_in(ns, &name, "0");
            cm.labels_mut().insert(LABEL.into(), "yes".into());
            api.create(&PostParams::default(), &cm)
                .await
                .expect("creating a ConfigMap");
            (format!("{ns}/{name}"), name, wall_ns())
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (delays, unreconciled) = loop {
        lines.extend(tail.read_new().expect("reading the ledger"));
        let mut first: HashMap<&str, u128> = HashMap::new();
        for line in lines.iter().filter(|l| l.kind == START) {
            first.entry(line.subject.as_str()).or_insert(line.at_ns);
        }
        let delays: Vec<f64> = created
            .iter()
            .filter_map(|(object, _, at)| {
                let started = *first.get(object.as_str())?;
                Some((started as f64 - *at as f64) / 1e6)
            })
            .collect();
        let unreconciled = created.len() - delays.len();
        if unreconciled == 0 || Instant::now() > deadline {
            break (delays, unreconciled);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let label = format!("{CONTROLLER}.workqueue-kube.io/shard-of-{SHARDS}");
    let listed = api
        .list(&ListParams::default().labels(&format!("{LABEL}=yes")))
        .await
        .expect("listing");
    let unlabelled = listed
        .iter()
        .filter(|cm| cm.name_any().starts_with(&format!("new-{token}-")))
        .filter(|cm| setup.divided && !cm.labels().contains_key(&label))
        .count();
    stream::iter(&created)
        .map(|(_, name, _)| async move { api.delete(name, &DeleteParams::default()).await })
        .buffer_unordered(32)
        .for_each(|_| async {})
        .await;
    Creations {
        created: created.len(),
        unreconciled,
        unlabelled,
        p50_ms: percentile(&delays, 50.0).unwrap_or(f64::NAN),
        p99_ms: percentile(&delays, 99.0).unwrap_or(f64::NAN),
    }
}

/// One membership change of the moves phase.
#[derive(Debug)]
struct Move {
    what: String,
    /// The objects of the shards that changed holder.
    objects: usize,
    /// From the change to the shards settled (fair on the new replicas).
    settled_s: f64,
    /// From the change to every moved object reconciled (to its end) by its new holder.
    reconciled_s: f64,
    /// The API server's writes of ConfigMaps meanwhile.
    writes: f64,
}

/// The moves phase of divided caches: a replica killed (`kill -9`), one joining, one leaving
/// (SIGTERM), one after the other.
struct Moves<'a> {
    plane: &'a ControlPlane,
    dir: &'a Path,
    ns: &'a str,
    ledger: &'a Path,
    setup: Setup,
    leases: &'a Api<Lease>,
}

impl Moves<'_> {
    async fn run(
        &mut self,
        replicas: &mut BTreeMap<String, Child>,
        objects: &[String],
    ) -> Vec<Move> {
        let mut reader = LedgerReader::new(self.ledger);
        let mut moves = Vec::new();
        let token = self.setup.name().replace(' ', "-");
        for step in ["kill -9", "join", "leave (SIGTERM)"] {
            let names: Vec<String> = replicas.keys().cloned().collect();
            let before_names: Vec<&str> = names.iter().map(String::as_str).collect();
            let held_before = held_shards(self.leases, &before_names).await;
            let client = self.plane.client();
            let scraped = scrape(&client).await.expect("scraping /metrics");
            let at = Instant::now();
            let at_wall = wall_ns();
            match step {
                "kill -9" => {
                    let victim = names.last().expect("a replica").clone();
                    let mut child = replicas.remove(&victim).expect("a replica");
                    child.kill();
                    reader
                        .sync()
                        .stopped(child.pid(), tokio::time::Instant::now());
                }
                "join" => {
                    let identity = format!("{token}-r{}", 4 + moves.len());
                    let child = spawn(
                        self.plane,
                        self.dir,
                        self.ns,
                        self.ledger,
                        self.setup,
                        &identity,
                    );
                    replicas.insert(identity, child);
                }
                _ => {
                    let leaver = names.first().expect("a replica").clone();
                    let mut child = replicas.remove(&leaver).expect("a replica");
                    child.signal("TERM");
                    let _ = child.exit_within(Duration::from_secs(30)).await;
                }
            }
            let names: Vec<String> = replicas.keys().cloned().collect();
            let now_names: Vec<&str> = names.iter().map(String::as_str).collect();
            while !fair(
                &shard_holders(self.leases, &now_names).await,
                &now_names,
                SHARDS,
            ) {
                assert!(
                    at.elapsed() < Duration::from_secs(120),
                    "{step}: the shards did not settle"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let settled_s = at.elapsed().as_secs_f64();
            let held_after = held_shards(self.leases, &now_names).await;
            let holder = |held: &BTreeMap<String, BTreeSet<u32>>, shard: u32| {
                held.iter()
                    .find(|(_, s)| s.contains(&shard))
                    .map(|(r, _)| r.clone())
            };
            let moved: BTreeMap<u32, String> = (0..SHARDS)
                .filter_map(|shard| {
                    let after = holder(&held_after, shard)?;
                    (holder(&held_before, shard).as_ref() != Some(&after)).then_some((shard, after))
                })
                .collect();
            let moved_objects: Vec<(&String, &String)> = objects
                .iter()
                .filter_map(|o| {
                    let (ns, name) = o.split_once('/')?;
                    moved.get(&shard_of(Some(ns), name, SHARDS)).map(|r| (o, r))
                })
                .collect();
            loop {
                reader.sync();
                let done: HashSet<(&str, &str)> = reader
                    .feed()
                    .lines()
                    .iter()
                    .filter(|l| l.kind == END && l.detail == "done" && l.at_ns >= at_wall)
                    .map(|l| (l.subject.as_str(), l.replica.as_str()))
                    .collect();
                if moved_objects
                    .iter()
                    .all(|(o, r)| done.contains(&(o.as_str(), r.as_str())))
                {
                    break;
                }
                assert!(
                    at.elapsed() < Duration::from_secs(180),
                    "{step}: moved objects not reconciled"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let reconciled_s = at.elapsed().as_secs_f64();
            let writes = scrape(&client)
                .await
                .expect("scraping /metrics")
                .since(&scraped)
                .writes_of("configmaps");
            let done = Move {
                what: step.into(),
                objects: moved_objects.len(),
                settled_s,
                reconciled_s,
                writes,
            };
            eprintln!("{done:?}");
            moves.push(done);
        }
        reader.sync();
        let (runs, _) = reader.feed().ledger().assert_never_two_at_once();
        eprintln!("moves: the ledger's {runs} runs, never two at once");
        moves
    }
}

fn main() {
    run_if_replica();
    let options = options();
    workqueue_e2e::block_on(async {
        let plane = ControlPlane::shared().await;
        let dir: PathBuf =
            std::env::temp_dir().join(format!("workqueue-w17-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let ns = plane.namespace("w17").await;
        let created = Instant::now();
        let objects = (0..options.objects).map(|i| (ns.clone(), format!("cm-{i:05}")));
        workqueue_e2e::create_configmaps(&plane.client(), objects, LABEL).await;
        eprintln!(
            "{} ConfigMaps created in {:.1} s",
            options.objects,
            created.elapsed().as_secs_f64()
        );
        let setups = [
            Setup {
                kube_runtime: true,
                divided: false,
                replicas: 1,
            },
            Setup {
                kube_runtime: false,
                divided: false,
                replicas: 1,
            },
            Setup {
                kube_runtime: false,
                divided: true,
                replicas: 1,
            },
            Setup {
                kube_runtime: false,
                divided: true,
                replicas: 2,
            },
            Setup {
                kube_runtime: false,
                divided: true,
                replicas: 4,
            },
            Setup {
                kube_runtime: false,
                divided: false,
                replicas: 4,
            },
        ];
        let mut results = Vec::new();
        for setup in setups {
            if options
                .only
                .as_ref()
                .is_some_and(|only| *only != setup.name())
            {
                continue;
            }
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            eprintln!("{}: load average {}", setup.name(), load.trim());
            let figures = run(plane, &ns, &dir, &options, setup).await;
            eprintln!("{figures:?}");
            results.push(figures);
        }
        println!();
        println!(
            "| configuration | start-up (s) | start-up requests | steady requests/s | replica | objects in store | watch events (churn of {} updates) | read (MiB) | peak RSS (MiB) |",
            results.first().map_or(0, |f| f.churn_updates)
        );
        println!("|---|---:|---:|---:|---|---:|---:|---:|---:|");
        for f in &results {
            for (i, (name, r)) in f.replicas.iter().enumerate() {
                let head = if i == 0 {
                    format!(
                        "{} | {:.1} | {:.0} | {:.1}",
                        f.setup.name(),
                        f.startup_s,
                        f.startup_requests,
                        f.steady_requests_per_s
                    )
                } else {
                    " | | |".to_string()
                };
                println!(
                    "| {head} | {name} | {} | {} | {:.1} | {:.1} |",
                    r.store, r.events, r.read_mib, r.peak_rss_mib
                );
            }
        }
        println!();
        println!(
            "| configuration | objects created | at | first reconcile after creation p50 / p99 (ms) | not reconciled | without their label |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        for f in &results {
            if let Some(c) = &f.created {
                println!(
                    "| {} | {} | {}/s | {:.0} / {:.0} | {} | {} |",
                    f.setup.name(),
                    c.created,
                    options.create_rate,
                    c.p50_ms,
                    c.p99_ms,
                    c.unreconciled,
                    c.unlabelled
                );
            }
        }
        println!();
        println!(
            "| configuration | change | objects moved | shards settled after (s) | moved objects reconciled by their new holder after (s) | ConfigMap writes meanwhile |"
        );
        println!("|---|---|---:|---:|---:|---:|");
        for f in &results {
            for m in &f.moved {
                println!(
                    "| {} | {} | {} | {:.1} | {:.1} | {:.0} |",
                    f.setup.name(),
                    m.what,
                    m.objects,
                    m.settled_s,
                    m.reconciled_s,
                    m.writes + 0.0
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}
