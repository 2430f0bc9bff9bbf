//! The processes of W15 besides the harness: a controller (ours or kube-runtime's) and the
//! churn. Each is this binary run again with [`ROLE`] in its environment.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use workqueue_e2e::child::{client_from_env, exit_with_parent};
use workqueue_test_support::ledger_file::{END, LedgerWriter, START};

/// The environment variable that names the role.
pub const ROLE: &str = "W15_ROLE";
pub const LEDGER: &str = "W15_LEDGER";
pub const TOKEN: &str = "W15_TOKEN";
pub const NAMESPACES: &str = "W15_NAMESPACES";
pub const PER_NAMESPACE: &str = "W15_PER_NAMESPACE";
pub const RATE: &str = "W15_RATE";
pub const SECONDS: &str = "W15_SECONDS";
/// The churn's role.
pub const CHURN: &str = "churn";
/// The label of the bench's ConfigMaps.
pub const LABEL: &str = "w15.workqueue/bench";
/// The annotation the reconcile patches.
const SEEN: &str = "w15.workqueue/seen";
/// The controllers' concurrency.
const CONCURRENCY: u16 = 16;

/// A controller implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// `workqueue_kube::controller::Controller`.
    Ours,
    /// `kube::runtime::Controller`.
    KubeRuntime,
}

impl Impl {
    pub fn role(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::KubeRuntime => "kube-runtime",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::KubeRuntime => "kube-runtime",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::KubeRuntime => "kube",
        }
    }
}

/// Runs the role in this process's environment and exits; returns at once if there is none.
pub fn run_if_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    exit_with_parent();
    workqueue_e2e::block_on(async {
        match role.as_str() {
            "ours" => controller(Impl::Ours).await,
            "kube-runtime" => controller(Impl::KubeRuntime).await,
            CHURN => churn().await,
            other => panic!("unknown role {other:?}"),
        }
    });
    std::process::exit(0);
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// What the reconciles share.
struct Context {
    client: Client,
    ledger: LedgerWriter,
    token: String,
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Error(#[from] kube::Error);

/// The reconcile both controllers run: reads the object from its `Arc`; patches the annotation
/// to `<token>/<data.v>` unless it has that value already.
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Context>) -> Result<(), Error> {
    let ns = cm.namespace().unwrap_or_default();
    let name = cm.name_any();
    let subject = format!("{ns}/{name}");
    let version = cm.resource_version().unwrap_or_default();
    ctx.ledger
        .record(START, &subject, &version)
        .expect("the ledger");
    let value = cm
        .data
        .as_ref()
        .and_then(|d| d.get("v"))
        .map_or("", String::as_str);
    let desired = format!("{}/{value}", ctx.token);
    if cm.annotations().get(SEEN) != Some(&desired) {
        let patch = Patch::Merge(json!({ "metadata": { "annotations": { SEEN: desired } } }));
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
            .patch(&name, &PatchParams::default(), &patch)
            .await?;
    }
    ctx.ledger
        .record(END, &subject, "done")
        .expect("the ledger");
    Ok(())
}

async fn controller(implementation: Impl) {
    let client = Client::try_from(client_from_env()).expect("a client");
    let ctx = Arc::new(Context {
        client: client.clone(),
        ledger: LedgerWriter::open(var(LEDGER), implementation.short()).expect("the ledger"),
        token: var(TOKEN),
    });
    let api = Api::<ConfigMap>::all(client);
    let wc = watcher::Config::default().labels(&format!("{LABEL}=yes"));
    match implementation {
        Impl::Ours => {
            use workqueue_kube::controller::{Action, Config, Controller};
            Controller::new(api, wc)
                .with_config(Config::default().concurrency(CONCURRENCY))
                .run(
                    |cm, ctx| async move {
                        reconcile(cm, ctx).await?;
                        Ok::<_, Error>(Action::await_change())
                    },
                    |_, _, _| Action::requeue(Duration::from_secs(1)),
                    ctx,
                )
                .for_each(|_| async {})
                .await;
        }
        Impl::KubeRuntime => {
            use kube::runtime::controller::{Action, Config, Controller};
            Controller::new(api, wc)
                .with_config(Config::default().concurrency(CONCURRENCY))
                .run(
                    |cm, ctx| async move {
                        reconcile(cm, ctx).await?;
                        Ok::<_, Error>(Action::await_change())
                    },
                    |_, _, _| Action::requeue(Duration::from_secs(1)),
                    ctx,
                )
                .for_each(|_| async {})
                .await;
        }
    }
}

/// Changes `data.v` of the objects, `RATE` updates a second for `SECONDS`, each to the next
/// object of a fixed shuffle of all of them; records each accepted update (`update`, with its
/// resourceVersion) or failure (`update-error`).
async fn churn() {
    let client = Client::try_from(client_from_env()).expect("a client");
    let ledger = Arc::new(LedgerWriter::open(var(LEDGER), "churn").expect("the ledger"));
    let token = var(TOKEN);
    let per_namespace: usize = var(PER_NAMESPACE).parse().expect("a number");
    let rate: u64 = var(RATE).parse().expect("a number");
    let seconds: u64 = var(SECONDS).parse().expect("a number");
    let objects: Vec<(String, String)> = var(NAMESPACES)
        .split(',')
        .flat_map(|ns| (0..per_namespace).map(move |i| (ns.to_string(), format!("cm-{i:05}"))))
        .collect();
    let n = objects.len();
    // A fixed shuffle: i -> i * STRIDE mod n, a permutation when STRIDE and n are coprime.
    let stride = (7919..).find(|s| gcd(*s, n) == 1).unwrap();
    let total = rate * seconds;
    // Enough requests in flight for the rate at ~100 ms per request.
    let in_flight = Arc::new(Semaphore::new((rate as usize / 10).max(16)));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let due = start + Duration::from_nanos(i * 1_000_000_000 / rate);
        tokio::time::sleep_until(due).await;
        let permit = in_flight.clone().acquire_owned().await.expect("open");
        let (ns, name) = objects[(i as usize * stride) % n].clone();
        let (client, ledger) = (client.clone(), ledger.clone());
        let value = format!("{token}-{i}");
        tasks.push(tokio::spawn(async move {
            let patch = Patch::Merge(json!({ "data": { "v": value } }));
            let answer = Api::<ConfigMap>::namespaced(client, &ns)
                .patch(&name, &PatchParams::default(), &patch)
                .await;
            let subject = format!("{ns}/{name}");
            match answer {
                Ok(cm) => {
                    let version = cm.resource_version().unwrap_or_default();
                    ledger.record("update", &subject, &version)
                }
                Err(error) => ledger.record("update-error", &subject, &error.to_string()),
            }
            .expect("the ledger");
            drop(permit);
        }));
    }
    let sent = start.elapsed();
    for task in tasks {
        task.await.expect("an update task");
    }
    eprintln!(
        "churn: {total} updates sent in {:.1} s, all answered after {:.1} s",
        sent.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}
