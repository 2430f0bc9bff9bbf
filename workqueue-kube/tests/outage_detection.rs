//! `Config::outage_detection` in a `Controller` during an API outage, on the scripted server and
//! tokio's paused clock: the paused-time twin of `e2e/tests/outage_*.rs`. 200 objects per
//! controller, each reconcile working 10 s and then writing; the server goes down (every
//! request 503) while all 200 are in flight, for 60 s. Requests are counted per client.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::time::sleep;
use workqueue_kube::controller::{Action, Config, Controller};
use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::{cm_in, secs};
use workqueue_tokio::ratelimit::OutageConfig;

const OBJECTS: usize = 200;
const OBSERVED: &str = "e2e.example/observed";

struct Ctx {
    client: kube::Client,
    started: Mutex<HashSet<(String, String)>>,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let version = cm.data.as_ref().unwrap()["v"].clone();
    if cm.annotations().get(OBSERVED) == Some(&version) {
        return Ok(Action::await_change());
    }
    let first = ctx
        .started
        .lock()
        .unwrap()
        .insert((cm.name_any(), version.clone()));
    if first {
        sleep(secs(10)).await;
    }
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &cm.namespace().unwrap());
    let patch = json!({ "metadata": { "annotations": { OBSERVED: version } } });
    api.patch(
        &cm.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(Action::await_change())
}

fn start(server: &ApiServer, ns: &'static str, detect: bool) {
    let client = server.client_named(ns);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        started: Mutex::new(HashSet::new()),
    });
    let mut config = Config::default();
    if detect {
        config = config.outage_detection(OutageConfig::default());
    }
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, ns),
        watcher::Config::default(),
    )
    .with_config(config)
    .run(reconcile, |_, _, _| Action::backoff(), ctx)
    .for_each(|_| async {});
    tokio::spawn(controller);
}

fn observed(server: &ApiServer, ns: &str, version: &str) -> usize {
    (0..OBJECTS)
        .filter(|i| {
            let cm: ConfigMap = server.get_in(ns, &format!("cm-{i:03}")).unwrap();
            cm.annotations().get(OBSERVED).map(String::as_str) == Some(version)
        })
        .count()
}

/// Requests (retries beyond each in-flight reconcile's first write) of the default limiter and
/// of outage detection during the outage, with `quiet` seconds between convergence and the
/// change that puts every reconcile in flight.
async fn outage(quiet: u64) -> (usize, usize) {
    let server = ApiServer::new();
    for ns in ["default-limiter", "detection"] {
        for i in 0..OBJECTS {
            server.put(&cm_in(ns, &format!("cm-{i:03}"), "1"));
        }
    }
    start(&server, "default-limiter", false);
    start(&server, "detection", true);
    sleep(secs(15)).await;
    assert_eq!(observed(&server, "detection", "1"), OBJECTS);
    sleep(secs(quiet)).await;
    for ns in ["default-limiter", "detection"] {
        for i in 0..OBJECTS {
            let name = format!("cm-{i:03}");
            let mut cm: ConfigMap = server.get_in(ns, &name).unwrap();
            cm.data.as_mut().unwrap().insert("v".into(), "2".into());
            server.put(&cm);
        }
    }
    sleep(secs(1)).await;
    let before = [
        server.requests_of("default-limiter").len(),
        server.requests_of("detection").len(),
    ];
    server.set_down(true);
    sleep(secs(60)).await;
    let during = [
        server.requests_of("default-limiter").len() - before[0] - OBJECTS,
        server.requests_of("detection").len() - before[1] - OBJECTS,
    ];
    server.set_down(false);
    sleep(secs(20)).await;
    assert_eq!(
        observed(&server, "detection", "2"),
        OBJECTS,
        "detection converged within 20 s"
    );
    println!(
        "quiet {quiet} s: retries during the outage: default {}, detection {}",
        during[0], during[1]
    );
    (during[0], during[1])
}

/// The change (and the outage) comes 31 s after convergence: the detector's window holds no
/// successes; it opens and parks the failing objects.
#[tokio::test(start_paused = true)]
async fn an_outage_after_a_quiet_window_is_detected() {
    let (default, detection) = outage(31).await;
    assert!(
        detection as f64 <= 0.25 * default as f64,
        "{detection} against {default}"
    );
}

/// The change comes right after convergence: 200 first failures against 400 successes in the
/// window (each object's reconcile and the no-op one its own write queued), 10 s before them.
/// The whole window's share of first failures is one third, below the ratio (one half): the
/// detector used to stay closed. It looks at every recent stretch of the window, and the last
/// few seconds hold only first failures: it opens. The real server agrees
/// (e2e/tests/outage_restart.rs).
#[tokio::test(start_paused = true)]
async fn an_outage_right_after_convergence_is_detected() {
    let (default, detection) = outage(0).await;
    assert!(
        detection as f64 <= 0.25 * default as f64,
        "{detection} against {default}"
    );
}
