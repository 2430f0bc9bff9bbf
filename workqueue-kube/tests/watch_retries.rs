//! How often a controller's watches retry a list that fails, counted at the scripted API server
//! over five minutes of paused time, beside kube-runtime's `Controller` in the same scenario
//! (`watch_retries/controller.rs`, one program included after each crate's `use` lines): an
//! outage from the start, a `list` that RBAC denies for the main, an owned and a watched
//! resource, and a relist that keeps failing; and the readiness gate once a denied list is
//! allowed.
//!
//! Both sides are compared under one deterministic backoff (kube's default without its
//! jitter) given to `trigger_backoff`, where ours must send at most as many lists as
//! kube-runtime; and with their defaults, where ours must stay within what kube's default
//! backoff allows at most (its figure is printed beside ours: its jitter makes it vary).

mod on_kube_runtime {
    use kube::runtime::controller::{Action, Controller};

    include!("watch_retries/controller.rs");
}

mod on_workqueue_kube {
    use workqueue_kube::controller::{Action, Controller};

    include!("watch_retries/controller.rs");
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use tokio::time::{Instant, sleep};

use workqueue_kube::controller::{Action, Controller};
use workqueue_test_support::apiserver::{ApiServer, Partition};
use workqueue_test_support::fixtures::{cm, secs};

/// The watches of the controller besides its main one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Watches {
    owns: bool,
    watches: bool,
}

const MAIN: Watches = Watches {
    owns: false,
    watches: false,
};
const OWNS: Watches = Watches {
    owns: true,
    watches: false,
};
const WATCHES: Watches = Watches {
    owns: false,
    watches: true,
};
const ALL: Watches = Watches {
    owns: true,
    watches: true,
};

/// kube-runtime's default trigger backoff without its jitter: 0.8 s, doubling to 30 s.
#[derive(Debug, Default)]
pub struct Steps(u32);

impl Iterator for Steps {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = Duration::from_millis(800) * 2u32.pow(self.0.min(6));
        self.0 += 1;
        Some(delay.min(Duration::from_secs(30)))
    }
}

impl kube::runtime::utils::Backoff for Steps {
    fn reset(&mut self) {
        self.0 = 0;
    }
}

/// What goes wrong, from when (tokio's clock, from the controller's start).
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The API server answers 503 to everything, from the start.
    Outage,
    /// RBAC denies `list` on this resource, from the start.
    Denied(&'static str),
    /// After the first list, the controller is cut off for a second while the history is
    /// compacted, so that its watch must relist, and `list` on ConfigMaps is denied.
    FailingRelist,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    KubeRuntime,
    Ours,
}

/// How long each scenario's fault lasts.
const WINDOW: Duration = Duration::from_secs(300);
/// When a failing relist begins.
const RELIST_AT: Duration = Duration::from_secs(10);

/// What one run saw: lists of each resource sent while the fault lasted, and the stream's
/// errors.
#[derive(Debug, Default)]
struct Counted {
    configmaps: usize,
    deployments: usize,
    secrets: usize,
    errors: usize,
}

impl Counted {
    fn total(&self) -> usize {
        self.configmaps + self.deployments + self.secrets
    }
}

/// List requests (GETs of a collection that are not watches) to `resource` that reached the
/// server within `[from, to)`.
fn lists(server: &ApiServer, resource: &str, from: Instant, to: Instant) -> usize {
    let log = server.request_log();
    log.iter()
        .filter(|l| l.reached && l.method == Method::GET && l.is_to(resource))
        .filter(|l| !l.uri.contains("watch=true"))
        .filter(|l| from <= l.at && l.at < to)
        .count()
}

async fn run(side: Side, watches: Watches, fault: Fault, backoff: Option<Steps>) -> Counted {
    let server = ApiServer::new();
    server.put(&cm("web", "1"));
    match fault {
        Fault::Outage => server.set_down(true),
        Fault::Denied(resource) => server.deny("list", resource),
        Fault::FailingRelist => {}
    }
    let errors = Arc::new(AtomicUsize::new(0));
    let client = server.client();
    let task = match side {
        Side::KubeRuntime => tokio::spawn(on_kube_runtime::run(
            client,
            watches,
            backoff,
            errors.clone(),
        )),
        Side::Ours => tokio::spawn(on_workqueue_kube::run(
            client,
            watches,
            backoff,
            errors.clone(),
        )),
    };
    let start = Instant::now();
    let from = match fault {
        Fault::FailingRelist => {
            sleep(RELIST_AT).await;
            // Cut off, the watcher misses a change and the history is compacted: once back,
            // its watch is answered 410 and it must relist, which is denied.
            server.set_partition("default", Partition::Refused);
            server.put(&cm("new", "1"));
            server.compact();
            server.deny("list", "configmaps");
            errors.store(0, Ordering::Relaxed);
            sleep(secs(1)).await;
            server.set_partition("default", Partition::Connected);
            start + RELIST_AT
        }
        _ => start,
    };
    let to = from + WINDOW;
    tokio::time::sleep_until(to).await;
    task.abort();
    let _ = task.await;
    Counted {
        configmaps: lists(&server, "configmaps", from, to),
        deployments: lists(&server, "deployments", from, to),
        secrets: lists(&server, "secrets", from, to),
        errors: errors.load(Ordering::Relaxed),
    }
}

/// The most lists kube's default backoff lets a controller send in [`WINDOW`] while its
/// watches fail, however many there are: its shortest delays (0.8 s doubling to 30 s, before
/// its jitter adds up to as much again) fit 14 retries after the first list.
const MOST_BY_DEFAULT: usize = 15;

/// Runs a scenario on both sides under [`Steps`] (ours at most kube-runtime's lists and errors)
/// and with their defaults (ours at most [`MOST_BY_DEFAULT`]).
async fn compare(name: &str, watches: Watches, fault: Fault) {
    let kube = run(Side::KubeRuntime, watches, fault, Some(Steps::default())).await;
    let ours = run(Side::Ours, watches, fault, Some(Steps::default())).await;
    let kube_default = run(Side::KubeRuntime, watches, fault, None).await;
    let ours_default = run(Side::Ours, watches, fault, None).await;
    println!("{name}, one backoff: kube-runtime {kube:?}, ours {ours:?}");
    println!("{name}, defaults: kube-runtime {kube_default:?}, ours {ours_default:?}");
    assert!(
        kube.total() > 0,
        "{name}: kube-runtime sent no list: {kube:?}"
    );
    assert!(
        ours.total() <= kube.total(),
        "{name}: ours sent more lists than kube-runtime: {ours:?} against {kube:?}"
    );
    assert!(
        ours.errors <= kube.errors,
        "{name}: ours reported more errors than kube-runtime: {ours:?} against {kube:?}"
    );
    assert!(
        ours_default.total() <= MOST_BY_DEFAULT,
        "{name}: ours sent {ours_default:?} with its default backoff; kube-runtime \
         {kube_default:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_outage_from_the_start() {
    compare("outage, main watch", MAIN, Fault::Outage).await;
    compare("outage, main and owns", OWNS, Fault::Outage).await;
    compare("outage, main and watches", WATCHES, Fault::Outage).await;
    compare("outage, all three", ALL, Fault::Outage).await;
}

#[tokio::test(start_paused = true)]
async fn a_denied_list() {
    compare("denied, main", MAIN, Fault::Denied("configmaps")).await;
    compare("denied, owns", OWNS, Fault::Denied("deployments.apps")).await;
    compare("denied, watches", WATCHES, Fault::Denied("secrets")).await;
}

#[tokio::test(start_paused = true)]
async fn a_relist_that_keeps_failing() {
    compare("failing relist", MAIN, Fault::FailingRelist).await;
}

/// The readiness gate under the backoff: while the main list is denied nothing is reconciled;
/// once it is allowed, the next retry (in the backoff's next slot) lists, and each object is
/// reconciled once.
#[tokio::test(start_paused = true)]
async fn the_first_list_after_a_denial_opens_the_gate() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    server.put(&cm("b", "1"));
    server.deny("list", "configmaps");
    let reconciled = Arc::new(Mutex::new(Vec::new()));
    let log = reconciled.clone();
    let api = kube::Api::<ConfigMap>::all(server.client());
    let stream = Controller::new(api, Default::default())
        .trigger_backoff(Steps::default())
        .run(
            move |cm: Arc<ConfigMap>, _: Arc<()>| {
                log.lock().unwrap().push((cm.name_any(), Instant::now()));
                async { Ok::<_, kube::Error>(Action::await_change()) }
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
    let start = Instant::now();
    let task = tokio::spawn(stream.for_each(|_| std::future::ready(())));
    sleep(secs(60)).await;
    assert!(reconciled.lock().unwrap().is_empty());
    server.allow("list", "configmaps");
    // Retries at 0, 0.8, 2.4, 5.6, 12, 24.8 and 50.4 s were denied; the next is at 80.4 s.
    sleep(secs(25)).await;
    let mut seen = reconciled.lock().unwrap().clone();
    seen.sort();
    let names: Vec<_> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    for (_, at) in &seen {
        let after = *at - start;
        assert!(
            after >= Duration::from_millis(80_400),
            "reconciled at {after:?}"
        );
    }
    task.abort();
}
