//! A shard taken by a replica whose workers are all busy with keys that requeue constantly: its
//! objects are reconciled within the bound the `lease` docs give, `(1 + ceil((R + n) / W)) * d`
//! of the takeover (`W` workers, reconciles of at most `d`, `R` keys ready and `n` objects
//! taken), not left behind every requeue until aging (60 s). Tokio's paused clock, the scripted
//! API server, two replicas of two shards.

// Each test binary uses a part of it.
#[allow(dead_code, unused_imports)]
mod lease_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use workqueue_kube::controller::{Action, Config, Controller};
use workqueue_kube::lease::{LeaseConfig, shard_of};

use lease_support::{CONTROLLER, NAMESPACE, clock_of, holder_identity, millis, secs, until};
use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::cm;

/// Every reconcile's start: the replica, the object, when.
type Starts = Arc<Mutex<Vec<(String, String, Instant)>>>;

const SHARDS: u32 = 2;
const WORKERS: u16 = 2;
/// How long every reconcile takes.
const TAKES: Duration = Duration::from_secs(1);

/// A replica whose reconciles take [`TAKES`]; objects named `busy-*` requeue 100 ms after each,
/// the others wait for a change.
fn replica(server: &ApiServer, starts: &Starts, index: usize, identity: &str) -> JoinHandle<()> {
    let mut config = LeaseConfig::new(CONTROLLER, NAMESPACE, identity);
    config.shards = SHARDS;
    let reconcile = {
        let (starts, identity) = (starts.clone(), identity.to_string());
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            let name = cm.name_any();
            starts
                .lock()
                .unwrap()
                .push((identity.clone(), name.clone(), Instant::now()));
            async move {
                sleep(TAKES).await;
                Ok::<_, std::io::Error>(if name.starts_with("busy-") {
                    Action::requeue(millis(100))
                } else {
                    Action::await_change()
                })
            }
        }
    };
    tokio::spawn(
        Controller::new(
            Api::<ConfigMap>::all(server.client_named(identity)),
            watcher::Config::default(),
        )
        .with_config(Config::default().concurrency(WORKERS))
        .leases(config)
        .lease_clock(clock_of(index))
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .for_each(|_| async {}),
    )
}

/// Who holds shard `shard`, as the server's Lease says.
fn holder(server: &ApiServer, shard: u32) -> Option<String> {
    let name = format!("{CONTROLLER}-shard-{shard}");
    lease_support::leases(server)
        .iter()
        .find(|lease| lease.metadata.name.as_deref() == Some(&*name))
        .and_then(holder_identity)
}

/// `count` names starting with `prefix` whose objects fall in `shard`.
fn names_in(shard: u32, prefix: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|name| shard_of(Some(NAMESPACE), name, SHARDS) == shard)
        .take(count)
        .collect()
}

/// r1's workers are all busy with its own shard's objects (six that requeue 100 ms after each
/// 1 s reconcile, two workers); r2 dies, and r1 takes its shard: every object of it is reconciled
/// on r1 within the documented bound of the takeover.
#[tokio::test(start_paused = true)]
async fn a_taken_shards_objects_are_served_within_the_bound_on_a_busy_replica() {
    let server = ApiServer::new();
    let starts: Starts = Arc::default();
    let r1 = replica(&server, &starts, 0, "r1");
    let r2 = replica(&server, &starts, 1, "r2");
    until(secs(60), "each replica holds one shard", || {
        let held: Vec<Option<String>> = (0..SHARDS).map(|s| holder(&server, s)).collect();
        held.contains(&Some("r1".into())) && held.contains(&Some("r2".into()))
    })
    .await;
    let mine = (0..SHARDS)
        .find(|&s| holder(&server, s).as_deref() == Some("r1"))
        .unwrap();
    let theirs = 1 - mine;
    let busy = names_in(mine, "busy", 6);
    let quiet = names_in(theirs, "quiet", 6);
    for name in busy.iter().chain(&quiet) {
        server.put(&cm(name, "1"));
    }
    until(secs(30), "r2 reconciled its objects", || {
        let starts = starts.lock().unwrap();
        quiet
            .iter()
            .all(|q| starts.iter().any(|(r, o, _)| r == "r2" && o == q))
    })
    .await;
    // r1's workers are all busy now, and stay so.
    sleep(secs(10)).await;
    r2.abort();
    let died = Instant::now();
    until(secs(60), "r1 takes r2's shard", || {
        holder(&server, theirs).as_deref() == Some("r1")
    })
    .await;
    // Within 100 ms after the write that took it (the check's period).
    let taken = Instant::now();
    sleep(secs(90)).await;
    r1.abort();

    let starts = starts.lock().unwrap().clone();
    let busy_runs = starts
        .iter()
        .filter(|(r, o, at)| r == "r1" && o.starts_with("busy-") && *at >= died && *at < taken)
        .count();
    // Two workers, each starting a busy reconcile about every second until the takeover.
    assert!(
        busy_runs as u64 >= (taken - died).as_secs(),
        "r1 was not busy: {busy_runs} reconciles in {:?}",
        taken - died
    );
    let (n, workers, ready) = (quiet.len() as u32, u32::from(WORKERS), busy.len() as u32);
    let bound = TAKES * (1 + (ready + n).div_ceil(workers)) + millis(100);
    for object in &quiet {
        let served = starts
            .iter()
            .find(|(r, o, at)| r == "r1" && o == object && *at >= taken - millis(100))
            .map(|(_, _, at)| *at - taken);
        assert!(
            served.is_some_and(|after| after <= bound),
            "{object} of the taken shard reconciled on r1 {served:?} after the takeover; the \
             bound is {bound:?}"
        );
    }
}
