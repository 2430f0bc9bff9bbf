//! A replica of a `Controller` on Leases as an OS process of its own, against a real API server:
//! what `tests/replicas.rs` kills, stops and continues, and what `benches/lease_load.rs` counts.
//! The process is the test (or bench) binary itself, re-executed ([`crate::child`]) with a
//! [`Spec`] in its environment; [`run_if_replica`] is its entry.
//!
//! The replica reconciles the ConfigMaps of one namespace with a label, on
//! `Controller::leases(..)`, and appends to the ledger file (`test-support`'s `ledger_file`):
//! - `start` of every reconcile (the subject `namespace/name`, the detail the resourceVersion
//!   it was given) and its `end` (`done` when it returned, `dropped` when its future was dropped
//!   before: aborted);
//! - `write` of the fenced object (see [`Spec::fenced`]): `ok <resourceVersion>`, `409`, or the
//!   error, once the write's answer came;
//! - `log` for each event of `workqueue_kube` at INFO or above (the protocol's and the
//!   controller's: "acquired a shard", "lost a shard", ...), with its level and fields;
//! - `up` once the client is made, `item` for each error the controller's stream yields,
//!   `exit` when the stream ended (after a graceful shutdown: SIGTERM);
//! - with divided caches ([`Spec::divided`]) and without [`Spec::traffic`], `store` whenever its
//!   store's contents change; with [`Spec::traffic`], `traffic` every second (W17).
//!
//! With [`Spec::kube_runtime`] it runs kube-runtime's `Controller` instead (no Leases), as W17's
//! peer.
//!
//! Nothing here checks anything: the parent judges the ledger.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;
use workqueue_kube::controller::{Action, Config, Controller};
use workqueue_kube::lease::{LeaseConfig, shard_of};
use workqueue_test_support::ledger_file::{END, LedgerWriter, START};

use crate::traffic::{CountTraffic, Traffic};

/// The environment variable that makes a process a replica (its identity).
pub const ROLE_VAR: &str = "WORKQUEUE_E2E_REPLICA";

/// The annotation the fenced object's reconcile writes: the writer's identity.
pub const WRITER: &str = "e2e.workqueue/writer";

/// What a replica process runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// Its identity (the Lease holder), and its name in the ledger.
    pub identity: String,
    /// The namespace of its ConfigMaps and of its Leases.
    pub namespace: String,
    /// The label selector of its ConfigMaps.
    pub selector: String,
    /// The controller's name (its Leases' prefix).
    pub controller: String,
    /// The number of shards (1: leader election).
    pub shards: u32,
    /// Lease duration, renew deadline and retry period; `None`: the defaults (15 s, 10 s, 2 s).
    pub timing: Option<(Duration, Duration, Duration)>,
    /// The ledger file (none: nothing recorded).
    pub ledger: Option<PathBuf>,
    /// How long each reconcile takes (a sleep).
    pub hold: Duration,
    /// The controller's concurrency (0: unbounded).
    pub concurrency: u16,
    /// `Some(d)`: each reconcile returns `requeue(d)`, so that the holder reconciles all the
    /// time; `None`: `await_change`.
    pub requeue: Option<Duration>,
    /// The object (by name) whose reconcile writes: it takes the object's resourceVersion from
    /// the `Arc` it was given, holds, then replaces the object with [`WRITER`] set to its
    /// identity under that resourceVersion (a precondition: 409 if anyone wrote since). The
    /// hold and the write are a task of their own, started with the reconcile, so the write is
    /// sent even when the reconcile is aborted meanwhile: a request already on its way when the
    /// process froze.
    pub fenced: Option<String>,
    /// While this file exists, the replica's Lease watches hang silently (see
    /// [`crate::faults::WatchHang`]).
    pub hang_watch: Option<PathBuf>,
    /// While this file exists, a reconcile blocks its runtime's thread (`std::thread::sleep`, no
    /// await) for the duration once it has held for `hold`: user code that computes without
    /// yielding.
    pub block: Option<(PathBuf, Duration)>,
    /// The runtime's worker threads: 0 for a `current_thread` runtime (default 2).
    pub workers: usize,
    /// Whether the controller divides its cache (`Controller::divide_caches`); the replica then
    /// records its store's contents (`store` lines: the number of objects and their shards)
    /// whenever they change, unless it records its [`traffic`](Spec::traffic).
    pub divided: bool,
    /// Whether the replica counts its client's ConfigMap traffic ([`crate::traffic`]) and
    /// records it every second with its store's size: `traffic` lines, `<objects in the store>
    /// <requests> <list bytes> <watch bytes> <watch events>` (W17).
    pub traffic: bool,
    /// Runs kube-runtime's `Controller` instead of ours (no Leases: one replica), for W17.
    pub kube_runtime: bool,
}

impl Spec {
    /// A replica `identity` with the defaults: 1 shard, the default timing, no ledger, no hold,
    /// concurrency 16, `await_change`, nothing fenced.
    pub fn new(identity: &str, namespace: &str, controller: &str) -> Self {
        Spec {
            identity: identity.into(),
            namespace: namespace.into(),
            selector: String::new(),
            controller: controller.into(),
            shards: 1,
            timing: None,
            ledger: None,
            hold: Duration::ZERO,
            concurrency: 16,
            requeue: None,
            fenced: None,
            hang_watch: None,
            block: None,
            workers: 2,
            divided: false,
            traffic: false,
            kube_runtime: false,
        }
    }

    /// A command that runs this binary as the replica: `command` (this binary, with the
    /// arguments that reach [`run_if_replica`]) with the spec and `client` in its environment
    /// (the CA's certificate written to `dir`).
    pub fn apply(&self, command: &mut Command, client: &kube::Config, dir: &Path) {
        crate::child::pass_client(client, dir, command);
        let ms = |d: Duration| d.as_millis().to_string();
        command
            .env(ROLE_VAR, &self.identity)
            .env("WORKQUEUE_E2E_NAMESPACE", &self.namespace)
            .env("WORKQUEUE_E2E_SELECTOR", &self.selector)
            .env("WORKQUEUE_E2E_CONTROLLER", &self.controller)
            .env("WORKQUEUE_E2E_SHARDS", self.shards.to_string())
            .env("WORKQUEUE_E2E_HOLD_MS", ms(self.hold))
            .env("WORKQUEUE_E2E_CONCURRENCY", self.concurrency.to_string());
        if let Some((lease, renew, retry)) = self.timing {
            let timing = format!("{},{},{}", ms(lease), ms(renew), ms(retry));
            command.env("WORKQUEUE_E2E_TIMING", timing);
        }
        if let Some(ledger) = &self.ledger {
            command.env("WORKQUEUE_E2E_LEDGER", ledger);
        }
        if let Some(requeue) = self.requeue {
            command.env("WORKQUEUE_E2E_REQUEUE_MS", ms(requeue));
        }
        if let Some(fenced) = &self.fenced {
            command.env("WORKQUEUE_E2E_FENCED", fenced);
        }
        if let Some(flag) = &self.hang_watch {
            command.env("WORKQUEUE_E2E_HANG_WATCH", flag);
        }
        if let Some((flag, block)) = &self.block {
            command.env("WORKQUEUE_E2E_BLOCK_FLAG", flag);
            command.env("WORKQUEUE_E2E_BLOCK_MS", ms(*block));
        }
        command.env("WORKQUEUE_E2E_WORKERS", self.workers.to_string());
        for (flag, var) in [
            (self.divided, "WORKQUEUE_E2E_DIVIDED"),
            (self.traffic, "WORKQUEUE_E2E_TRAFFIC"),
            (self.kube_runtime, "WORKQUEUE_E2E_KUBE_RUNTIME"),
        ] {
            if flag {
                command.env(var, "1");
            }
        }
    }

    /// The spec in this process's environment, if it is a replica.
    pub fn from_env() -> Option<Spec> {
        let identity = std::env::var(ROLE_VAR).ok()?;
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let required = |name: &str| var(name).unwrap_or_else(|| panic!("{name} is not set"));
        let ms = |v: &str| Duration::from_millis(v.parse().expect("a number of ms"));
        let timing = var("WORKQUEUE_E2E_TIMING").map(|t| {
            let parts: Vec<Duration> = t.split(',').map(ms).collect();
            (parts[0], parts[1], parts[2])
        });
        Some(Spec {
            identity,
            namespace: required("WORKQUEUE_E2E_NAMESPACE"),
            selector: var("WORKQUEUE_E2E_SELECTOR").unwrap_or_default(),
            controller: required("WORKQUEUE_E2E_CONTROLLER"),
            shards: required("WORKQUEUE_E2E_SHARDS").parse().expect("shards"),
            timing,
            ledger: var("WORKQUEUE_E2E_LEDGER").map(PathBuf::from),
            hold: ms(&required("WORKQUEUE_E2E_HOLD_MS")),
            concurrency: required("WORKQUEUE_E2E_CONCURRENCY")
                .parse()
                .expect("concurrency"),
            requeue: var("WORKQUEUE_E2E_REQUEUE_MS").map(|v| ms(&v)),
            fenced: var("WORKQUEUE_E2E_FENCED"),
            hang_watch: var("WORKQUEUE_E2E_HANG_WATCH").map(PathBuf::from),
            block: var("WORKQUEUE_E2E_BLOCK_FLAG").map(|flag| {
                let block = ms(&required("WORKQUEUE_E2E_BLOCK_MS"));
                (PathBuf::from(flag), block)
            }),
            workers: var("WORKQUEUE_E2E_WORKERS").map_or(2, |w| w.parse().expect("workers")),
            divided: var("WORKQUEUE_E2E_DIVIDED").is_some(),
            traffic: var("WORKQUEUE_E2E_TRAFFIC").is_some(),
            kube_runtime: var("WORKQUEUE_E2E_KUBE_RUNTIME").is_some(),
        })
    }

    /// The Lease configuration of this replica.
    pub fn lease_config(&self) -> LeaseConfig {
        let mut config = LeaseConfig::new(&self.controller, &self.namespace, &self.identity);
        config.shards = self.shards;
        if let Some((lease, renew, retry)) = self.timing {
            config.lease_duration = lease;
            config.renew_deadline = renew;
            config.retry_period = retry;
            // A hand-over cannot take longer than a renewal may: the defaults' ratio (10 s of 10 s).
            config.hand_over_timeout = renew;
        }
        config
    }
}

/// How many shard Leases each holder holds, as the server says (see [`held_shards`]).
pub async fn shard_holders(leases: &Api<Lease>, replicas: &[&str]) -> BTreeMap<String, u32> {
    let held = held_shards(leases, replicas).await;
    held.into_iter()
        .map(|(replica, shards)| (replica, shards.len() as u32))
        .collect()
}

/// Which shards each holder holds, as the server says. `leases` is the Lease API of a
/// namespace that holds one controller's Leases only (a test's own): its Leases named
/// `{controller}-shard-{i}` are the shards; a holder is counted under the first of `replicas`
/// that starts its `holderIdentity` (so that an identity with an instance suffix is still its
/// replica's).
pub async fn held_shards(
    leases: &Api<Lease>,
    replicas: &[&str],
) -> BTreeMap<String, BTreeSet<u32>> {
    let list = leases
        .list(&ListParams::default())
        .await
        .expect("listing the Leases");
    let mut held: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for lease in list {
        let name = lease.name_any();
        let Some(shard) = name
            .rsplit_once("-shard-")
            .and_then(|(_, i)| i.parse().ok())
        else {
            continue;
        };
        let holder = lease.spec.and_then(|s| s.holder_identity);
        if let Some(holder) = holder.filter(|h| !h.is_empty()) {
            let replica = replicas
                .iter()
                .find(|r| holder.starts_with(**r))
                .map_or(holder, |r| r.to_string());
            held.entry(replica).or_default().insert(shard);
        }
    }
    held
}

/// Whether `held` is every one of `shards` held by `replicas` alone, each within one of a fair
/// share.
pub fn fair(held: &BTreeMap<String, u32>, replicas: &[&str], shards: u32) -> bool {
    let k = replicas.len() as u32;
    let (floor, ceil) = (shards / k, shards.div_ceil(k));
    held.values().sum::<u32>() == shards
        && held.keys().all(|h| replicas.contains(&h.as_str()))
        && replicas
            .iter()
            .all(|r| (floor..=ceil).contains(&held.get(*r).copied().unwrap_or(0)))
}

/// Runs the replica and exits the process if this process is one (its environment holds a
/// [`Spec`]); returns at once otherwise.
pub fn run_if_replica() {
    let Some(spec) = Spec::from_env() else {
        return;
    };
    crate::child::exit_with_parent();
    let mut builder = match spec.workers {
        0 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    };
    let runtime = builder.enable_all().build().expect("a tokio runtime");
    runtime.block_on(run(spec));
    std::process::exit(0);
}

/// What the reconciles share.
struct Context {
    spec: Spec,
    ledger: Option<Arc<LedgerWriter>>,
    api: Api<ConfigMap>,
}

impl Context {
    fn record(&self, kind: &str, subject: &str, detail: &str) {
        if let Some(ledger) = &self.ledger {
            ledger
                .record(kind, subject, detail)
                .expect("writing the ledger");
        }
    }
}

/// Writes the `end` of a run when dropped: `done` after the reconcile returned, `dropped` when
/// its future was dropped before (aborted).
struct Running {
    ctx: Arc<Context>,
    subject: String,
    done: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        let how = if self.done { "done" } else { "dropped" };
        self.ctx.record(END, &self.subject, how);
    }
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Context>) -> Result<Action, Infallible> {
    let name = cm.name_any();
    let subject = format!("{}/{name}", cm.namespace().unwrap_or_default());
    let version = cm.resource_version().unwrap_or_default();
    ctx.record(START, &subject, &version);
    let mut running = Running {
        ctx: ctx.clone(),
        subject: subject.clone(),
        done: false,
    };
    if ctx.spec.fenced.as_deref() == Some(name.as_str()) {
        let mut object = (*cm).clone();
        object.metadata.managed_fields = None;
        object
            .annotations_mut()
            .insert(WRITER.into(), ctx.spec.identity.clone());
        let write_ctx = ctx.clone();
        // A task of its own, started now: the write goes out after the hold even if this
        // reconcile is aborted meanwhile (a request already on its way when the process froze).
        let write = tokio::spawn(async move {
            tokio::time::sleep(write_ctx.spec.hold).await;
            let answer = write_ctx
                .api
                .replace(&name, &PostParams::default(), &object)
                .await;
            let detail = match answer {
                Ok(written) => format!("ok {}", written.resource_version().unwrap_or_default()),
                Err(kube::Error::Api(status)) if status.code == 409 => "409".to_string(),
                Err(error) => format!("error {error}"),
            };
            write_ctx.record("write", &subject, &detail);
        });
        let _ = write.await;
    } else if !ctx.spec.hold.is_zero() {
        tokio::time::sleep(ctx.spec.hold).await;
    }
    if let Some((flag, block)) = &ctx.spec.block
        && flag.exists()
    {
        ctx.record("block", &running.subject, &block.as_millis().to_string());
        // Computes without yielding: nothing else on this thread runs meanwhile.
        std::thread::sleep(*block);
        ctx.record("unblocked", &running.subject, "");
    }
    running.done = true;
    Ok(match ctx.spec.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

async fn run(spec: Spec) {
    let ledger = spec.ledger.as_ref().map(|path| {
        Arc::new(LedgerWriter::open(path, &spec.identity).expect("opening the ledger"))
    });
    let logs = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .with(ledger.clone().map(log::ToLedger::new));
    tracing::subscriber::set_global_default(logs).expect("one subscriber");
    let config = crate::child::client_from_env();
    let traffic = Arc::new(Traffic::default());
    let client = match (&spec.hang_watch, spec.traffic) {
        (Some(flag), _) => kube::client::ClientBuilder::try_from(config)
            .expect("a client builder")
            .with_layer(&crate::faults::WatchHang::new(flag.clone()))
            .build(),
        (None, true) => kube::client::ClientBuilder::try_from(config)
            .expect("a client builder")
            .with_layer(&CountTraffic::new("configmaps", traffic.clone()))
            .build(),
        (None, false) => Client::try_from(config).expect("a client"),
    };
    let api = Api::<ConfigMap>::namespaced(client.clone(), &spec.namespace);
    let ctx = Arc::new(Context {
        spec: spec.clone(),
        ledger,
        api: api.clone(),
    });
    ctx.record("up", "-", "");
    let config = Config::default().concurrency(spec.concurrency);
    let watch = watcher::Config::default().labels(&spec.selector);
    if spec.kube_runtime {
        use kube::runtime::controller::{Action as KubeAction, Controller as KubeController};
        let controller = KubeController::new(api, watch)
            .with_config(kube::runtime::controller::Config::default().concurrency(spec.concurrency))
            .shutdown_on_signal();
        if spec.traffic {
            tokio::spawn(record_traffic(controller.store(), traffic, ctx.clone()));
        }
        let reconcile = |cm, ctx| async move {
            reconcile(cm, ctx).await?;
            Ok::<_, Infallible>(KubeAction::await_change())
        };
        controller
            .run(reconcile, |_, _, _| KubeAction::await_change(), ctx.clone())
            .for_each(|_| async {})
            .await;
        ctx.record("exit", "-", "");
        return;
    }
    let controller = Controller::new(api, watch)
        .with_config(config)
        .leases(spec.lease_config())
        .shutdown_on_signal();
    // One recorder: a benchmark's (`traffic`) reads only the store's size, so that the process
    // measured does not also scan its store every 100 ms.
    if spec.traffic {
        tokio::spawn(record_traffic(controller.store(), traffic, ctx.clone()));
    } else if spec.divided {
        tokio::spawn(record_store(controller.store(), ctx.clone()));
    }
    let controller = if spec.divided {
        controller.divide_caches()
    } else {
        controller
    };
    let items = controller.run(reconcile, |_, _, _| Action::await_change(), ctx.clone());
    let ctx_items = ctx.clone();
    items
        .for_each(|item| {
            if let Err(error) = item {
                eprintln!("{}: {error}", ctx_items.spec.identity);
                ctx_items.record("item", "-", &error.to_string());
            }
            async {}
        })
        .await;
    ctx.record("exit", "-", "");
}

/// Records the store's contents as a `store` line whenever they change (looked at every 100 ms):
/// the detail is the number of objects, then their shards (`3 0,5`).
async fn record_store(store: Store<ConfigMap>, ctx: Arc<Context>) {
    let mut last = String::new();
    loop {
        let objects = store.state();
        let shards: BTreeSet<u32> = objects
            .iter()
            .map(|cm| shard_of(cm.namespace().as_deref(), &cm.name_any(), ctx.spec.shards))
            .collect();
        let shards: Vec<String> = shards.iter().map(u32::to_string).collect();
        let detail = format!("{} {}", objects.len(), shards.join(","));
        if detail != last {
            ctx.record("store", "-", &detail);
            last = detail;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Records the store's size and the client's ConfigMap traffic every second (`traffic` lines).
async fn record_traffic(store: Store<ConfigMap>, traffic: Arc<Traffic>, ctx: Arc<Context>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let detail = format!("{} {}", store.len(), traffic.line());
        ctx.record("traffic", "-", &detail);
    }
}

/// The `log` lines of the ledger.
mod log {
    use std::fmt::Write as _;
    use std::sync::Arc;

    use tracing::field::{Field, Visit};
    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::layer::{Context, Layer};
    use workqueue_test_support::ledger_file::LedgerWriter;

    /// Appends every event of `workqueue_kube` at INFO or above to the ledger, as `log` lines:
    /// the subject is the event's `shard` (or `-`), the detail its level, message and fields.
    pub(super) struct ToLedger(Arc<LedgerWriter>);

    impl ToLedger {
        pub(super) fn new(ledger: Arc<LedgerWriter>) -> Self {
            ToLedger(ledger)
        }
    }

    #[derive(Default)]
    struct Fields {
        shard: Option<String>,
        message: String,
        rest: String,
    }

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            match field.name() {
                "message" => self.message = format!("{value:?}"),
                "shard" => self.shard = Some(format!("{value:?}")),
                name => {
                    let _ = write!(self.rest, " {name}={value:?}");
                }
            }
        }
    }

    impl<S: Subscriber> Layer<S> for ToLedger {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let meta = event.metadata();
            if *meta.level() > Level::INFO || !meta.target().starts_with("workqueue_kube") {
                return;
            }
            let mut fields = Fields::default();
            event.record(&mut fields);
            let subject = fields.shard.as_deref().unwrap_or("-");
            let detail = format!("{} {}{}", meta.level(), fields.message, fields.rest);
            let _ = self.0.record("log", subject, &detail);
        }
    }
}
