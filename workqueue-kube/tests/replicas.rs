//! Several replicas of one `Controller` on Leases, in one process, against one scripted API
//! server, on tokio's paused clock: each replica on its own client (its own partitions) and its
//! own Lease clock (offsets of minutes, rates within 1%). A ledger records every reconcile's
//! start and end on every replica; every scenario checks that no object ever has overlapping
//! reconciles on two replicas.

mod lease_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use workqueue_kube::controller::{Action, Config, Controller, Error, RunnerError};
use workqueue_kube::lease::LeaseConfig;

use lease_support::{CONTROLLER, NAMESPACE, clock_of, millis, secs, until};
use workqueue_test_support::apiserver::{ApiServer, Partition};
use workqueue_test_support::fixtures::cm;

/// Every reconcile on every replica: the subject is the object's name.
type Ledger = workqueue_test_support::ledger::Ledger<String>;

/// How long a reconcile takes and what it returns, by the object's name.
type Behaviour = Arc<dyn Fn(&str) -> (Duration, Action) + Send + Sync>;

/// A running replica: its controller's stream as a task.
struct Replica {
    /// Its number in the ledger.
    process: usize,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Vec<String>>,
}

impl Replica {
    fn start(
        server: &ApiServer,
        ledger: &Ledger,
        index: usize,
        config: LeaseConfig,
        takes: Duration,
        concurrency: u16,
    ) -> Replica {
        Self::start_then(
            server,
            ledger,
            index,
            config,
            takes,
            concurrency,
            Action::await_change(),
        )
    }

    /// [`Replica::start`] with a reconcile that returns `then`.
    fn start_then(
        server: &ApiServer,
        ledger: &Ledger,
        index: usize,
        config: LeaseConfig,
        takes: Duration,
        concurrency: u16,
        then: Action,
    ) -> Replica {
        Self::start_consumed(
            server,
            ledger,
            index,
            config,
            Arc::new(move |_: &str| (takes, then)),
            concurrency,
            Duration::ZERO,
        )
    }

    /// [`Replica::start_then`] with reconciles that take and return what `behaviour` says for
    /// each object, and a consumer of the stream that takes `per_item` for each item (writing
    /// it somewhere slow).
    fn start_consumed(
        server: &ApiServer,
        ledger: &Ledger,
        index: usize,
        config: LeaseConfig,
        behaviour: Behaviour,
        concurrency: u16,
        per_item: Duration,
    ) -> Replica {
        let name = config.identity.clone();
        let client = server.client_named(&name);
        let process = ledger.process();
        let (stop, stopped) = oneshot::channel::<()>();
        let reconcile = {
            let (ledger, name) = (ledger.clone(), name.clone());
            move |cm: Arc<ConfigMap>, _: Arc<()>| {
                // The run ends when its future does: returned, or dropped (aborted).
                let run = ledger.run(&name, process, cm.name_any());
                let (takes, then) = behaviour(&cm.name_any());
                async move {
                    sleep(takes).await;
                    drop(run);
                    Ok::<_, std::convert::Infallible>(then)
                }
            }
        };
        let stream = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
            .with_config(Config::default().concurrency(concurrency))
            .leases(config)
            .lease_clock(clock_of(index))
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(
                reconcile,
                |_, _: &std::convert::Infallible, _| Action::await_change(),
                Arc::new(()),
            );
        let task = tokio::spawn(
            stream
                .then(move |item| async move {
                    sleep(per_item).await;
                    format!("{item:?}")
                })
                .collect(),
        );
        Replica {
            process,
            stop: Some(stop),
            task,
        }
    }

    /// Kills the replica: its controller's stream is dropped at once (its reconciles with it);
    /// nothing is released.
    fn kill(&self, ledger: &Ledger) {
        self.task.abort();
        ledger.died(self.process, Instant::now());
    }

    async fn shut_down(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

fn leader(identity: &str) -> LeaseConfig {
    LeaseConfig::leader_election(CONTROLLER, NAMESPACE, identity)
}

fn sharded(identity: &str) -> LeaseConfig {
    LeaseConfig::new(CONTROLLER, NAMESPACE, identity)
}

fn sharded_in(identity: &str, shards: u32) -> LeaseConfig {
    let mut config = sharded(identity);
    config.shards = shards;
    config
}

/// The shards each replica holds, as the server's Leases say.
fn holders(server: &ApiServer) -> BTreeMap<String, u32> {
    let mut held = BTreeMap::new();
    for lease in lease_support::leases(server) {
        let role = lease
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("workqueue-kube/lease-role").cloned());
        // The label the module docs give for a shard's Lease.
        if role.as_deref() != Some("shard") {
            continue;
        }
        if let Some(holder) = lease_support::holder_identity(&lease) {
            *held.entry(holder).or_default() += 1;
        }
    }
    held
}

/// Whether `replicas` hold all `shards` shards, each within one of a fair share.
fn fair(server: &ApiServer, replicas: &[&str], shards: u32) -> bool {
    let held = holders(server);
    let k = replicas.len() as u32;
    let (floor, ceil) = (shards / k, shards.div_ceil(k));
    held.values().sum::<u32>() == shards
        && held.keys().all(|h| replicas.contains(&h.as_str()))
        && replicas
            .iter()
            .all(|r| (floor..=ceil).contains(&held.get(*r).copied().unwrap_or(0)))
}

/// An invalid Lease configuration is the stream's only item, its message saying what to change;
/// nothing is reconciled and no Lease is written.
#[tokio::test(start_paused = true)]
async fn an_invalid_lease_configuration_is_reported_and_nothing_runs() {
    let server = ApiServer::new();
    server.put(&cm("cm-0", "1"));
    let mut config = sharded("r1");
    config.renew_deadline = secs(20);
    let items: Vec<_> = Controller::new(
        Api::<ConfigMap>::all(server.client_named("r1")),
        watcher::Config::default(),
    )
    .leases(config)
    .run(
        // A reconcile would be an item of its own.
        |cm: Arc<ConfigMap>, _: Arc<()>| async move {
            Err::<Action, _>(std::io::Error::other(format!(
                "{} reconciled",
                cm.name_any()
            )))
        },
        |_, _: &std::io::Error, _| Action::await_change(),
        Arc::new(()),
    )
    .collect()
    .await;
    let [Err(Error::RunnerError(RunnerError::Leases(error)))] = &items[..] else {
        panic!("not one Leases error: {items:?}");
    };
    assert_eq!(
        error.to_string(),
        "the renew deadline (20s) must be shorter than the lease duration (15s): the difference \
         is the margin in which a holder that lost its Lease stops its work before another \
         replica may take it"
    );
    assert!(lease_support::leases(&server).is_empty());
}

/// Divided caches without Leases (nothing to divide by), or on a controller made from a stream
/// (its store is filled elsewhere), are the stream's only item; nothing is reconciled.
#[tokio::test(start_paused = true)]
async fn divided_caches_without_leases_or_a_watch_are_reported_and_nothing_runs() {
    let server = ApiServer::new();
    server.put(&cm("cm-0", "1"));
    let reconcile = |cm: Arc<ConfigMap>, _: Arc<()>| async move {
        Err::<Action, _>(std::io::Error::other(format!(
            "{} reconciled",
            cm.name_any()
        )))
    };
    let api = Api::<ConfigMap>::all(server.client_named("r1"));
    let without_leases = Controller::new(api.clone(), watcher::Config::default()).divide_caches();
    let (reader, writer) = kube::runtime::reflector::store::<ConfigMap>();
    let objects = kube::runtime::reflector(writer, watcher(api, watcher::Config::default()));
    let from_a_stream = Controller::for_stream(
        kube::runtime::WatchStreamExt::applied_objects(objects),
        reader,
    )
    .divide_caches();
    for controller in [without_leases, from_a_stream] {
        let items: Vec<_> = controller
            .run(
                reconcile,
                |_, _: &std::io::Error, _| Action::await_change(),
                Arc::new(()),
            )
            .collect()
            .await;
        let [Err(Error::RunnerError(error @ RunnerError::DividedCachesNeedLeases))] = &items[..]
        else {
            panic!("not one DividedCachesNeedLeases: {items:?}");
        };
        assert_eq!(
            error.to_string(),
            "divided caches need a controller made with Controller::new and run on Leases \
             (Controller::leases)"
        );
    }
    assert!(lease_support::leases(&server).is_empty());
}

/// A reconcile of a controller on Leases reads its shard's deadline (`lease::deadline`): in the
/// future, at most a renew deadline ahead, and moving forward with the renewals; without Leases
/// (and outside a reconcile) there is none.
#[tokio::test(start_paused = true)]
async fn a_reconcile_reads_its_shards_deadline() {
    let server = ApiServer::new();
    server.put(&cm("cm-0", "1"));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let reconcile = {
        let seen = seen.clone();
        move |_: Arc<ConfigMap>, _: Arc<()>| {
            let seen = seen.clone();
            async move {
                // Read after an await too: the scope follows the reconcile's future.
                tokio::task::yield_now().await;
                let left = workqueue_kube::lease::deadline()
                    .map(|d| d.saturating_duration_since(Instant::now()));
                seen.lock().unwrap().push(left);
                Ok::<_, std::io::Error>(Action::requeue(secs(5)))
            }
        }
    };
    let config = sharded("r1");
    let renew_deadline = config.renew_deadline;
    let run = tokio::spawn(
        Controller::new(
            Api::<ConfigMap>::all(server.client_named("r1")),
            watcher::Config::default(),
        )
        .leases(config)
        .run(
            reconcile.clone(),
            |_, _, _| Action::await_change(),
            Arc::new(()),
        )
        .for_each(|_| async {}),
    );
    sleep(secs(60)).await;
    run.abort();
    let on_leases = seen.lock().unwrap().drain(..).collect::<Vec<_>>();
    assert!(on_leases.len() >= 5, "{on_leases:?}");
    for left in &on_leases {
        let left = left.expect("a deadline on Leases");
        assert!(left > Duration::ZERO && left <= renew_deadline, "{left:?}");
    }
    assert_eq!(
        workqueue_kube::lease::deadline(),
        None,
        "outside a reconcile"
    );
    let run = tokio::spawn(
        Controller::new(
            Api::<ConfigMap>::all(server.client_named("plain")),
            watcher::Config::default(),
        )
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .for_each(|_| async {}),
    );
    sleep(secs(12)).await;
    run.abort();
    let plain = seen.lock().unwrap().clone();
    assert!(
        !plain.is_empty() && plain.iter().all(Option::is_none),
        "{plain:?}"
    );
}

/// A Lease verb the API server refuses (403: RBAC without `update` on leases) is reported on
/// the stream, naming the verb and the Lease, once while it keeps failing (not once per retry
/// period); the controller goes on, and when the permission comes back the replica holds its
/// shards and reconciles; a later refusal is reported again.
#[tokio::test(start_paused = true)]
async fn a_refused_lease_request_is_reported_once_until_it_works_again() {
    let server = ApiServer::new();
    server.put(&cm("cm-0", "1"));
    server.deny("update", "leases");
    let said = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = said.clone();
    let run = tokio::spawn(
        Controller::new(
            Api::<ConfigMap>::all(server.client_named("r1")),
            watcher::Config::default(),
        )
        .leases(sharded("r1"))
        .run(
            |_: Arc<ConfigMap>, _: Arc<()>| async {
                Ok::<_, std::io::Error>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        )
        .for_each(move |item| {
            log.lock().unwrap().push(match item {
                Ok((object, _)) => format!("ok {}", object.name),
                Err(Error::RunnerError(RunnerError::LeaseRequestFailed {
                    verb,
                    lease,
                    message,
                })) => {
                    format!("failed {verb} {lease}: {message}")
                }
                Err(e) => format!("other {e}"),
            });
            async {}
        }),
    );
    let refused = |said: &[String]| {
        said.iter()
            .filter(|s| s.starts_with("failed update"))
            .count()
    };
    // 60 s of renewals refused, every retry period.
    sleep(secs(60)).await;
    let first = said.lock().unwrap().clone();
    assert_eq!(refused(&first), 1, "{first:#?}");
    let line = first
        .iter()
        .find(|s| s.starts_with("failed update"))
        .unwrap();
    assert!(line.contains("r1") && line.contains("403"), "{line}");
    assert!(!first.iter().any(|s| s.starts_with("ok ")), "{first:#?}");
    assert!(!run.is_finished());
    // Allowed again: the replica holds its shards and reconciles.
    server.allow("update", "leases");
    sleep(secs(60)).await;
    let second = said.lock().unwrap().clone();
    assert!(second.iter().any(|s| s == "ok cm-0"), "{second:#?}");
    assert_eq!(refused(&second), 1, "{second:#?}");
    // Refused again: told again.
    server.deny("update", "leases");
    sleep(secs(30)).await;
    let third = said.lock().unwrap().clone();
    assert_eq!(refused(&third), 2, "{third:#?}");
    run.abort();
}

/// Failover: the leader is killed in the middle of its reconciles (they poll every second); the
/// standby takes the Lease and reconciles every object again (a new leader enqueues its whole
/// store), all within lease duration + retry period + 1 s of the kill.
#[tokio::test(start_paused = true)]
async fn a_killed_leader_is_replaced_and_every_object_reconciled_again() {
    let server = ApiServer::new();
    for i in 0..20 {
        server.put(&cm(&format!("cm-{i:02}"), "1"));
    }
    let ledger = Ledger::new();
    let poll = Action::requeue(millis(500));
    let r1 = Replica::start_then(&server, &ledger, 0, leader("r1"), millis(500), 0, poll);
    sleep(secs(5)).await;
    let r2 = Replica::start_then(&server, &ledger, 1, leader("r2"), millis(500), 0, poll);
    sleep(millis(2200)).await;
    // r1 leads (it started first) and is in the middle of its reconciles.
    let runs = ledger.runs();
    assert!(runs.iter().all(|r| r.replica == "r1"), "{runs:?}");
    assert!(runs.iter().any(|r| r.ended.is_none()), "r1 is reconciling");
    let killed = Instant::now();
    r1.kill(&ledger);
    let limit = secs(15) + secs(2) + secs(1);
    let reconciled = |ledger: &Ledger| {
        let runs = ledger.runs();
        let done: std::collections::HashSet<_> = runs
            .iter()
            .filter(|r| r.replica == "r2" && r.start >= killed && r.ended.is_some())
            .map(|r| r.subject.clone())
            .collect();
        done.len()
    };
    let took = until(secs(60), "r2 reconciles every object again", || {
        reconciled(&ledger) == 20
    })
    .await;
    println!("failover: every object reconciled again {took:?} after the kill");
    assert!(
        took <= limit,
        "every object reconciled again {took:?} after the kill"
    );
    ledger.assert_never_two_at_once();
    r2.shut_down().await;
}

/// Partition: the leader is cut off from the API; it stops reconciling (its valid-until passes)
/// before the standby can take the Lease, so no object runs on both.
#[tokio::test(start_paused = true)]
async fn a_partitioned_leader_stops_before_its_lease_can_be_taken() {
    for partition in [Partition::Blackholed, Partition::Refused] {
        let server = ApiServer::new();
        for i in 0..10 {
            server.put(&cm(&format!("cm-{i}"), "1"));
        }
        let ledger = Ledger::new();
        // Reconciles that outlive the loss: the partitioned leader must abort them.
        let r1 = Replica::start(&server, &ledger, 0, leader("r1"), secs(4), 2);
        sleep(secs(5)).await;
        let r2 = Replica::start(&server, &ledger, 1, leader("r2"), secs(4), 2);
        sleep(secs(3)).await;
        let cut = Instant::now();
        server.set_partition("r1", partition);
        until(secs(40), "r2 takes over", || {
            ledger.runs().iter().any(|r| r.replica == "r2")
        })
        .await;
        sleep(secs(30)).await;
        let runs = ledger.runs();
        let r1_last = runs
            .iter()
            .filter(|r| r.replica == "r1")
            .filter_map(|r| r.ended)
            .max()
            .unwrap();
        let r2_first = runs
            .iter()
            .filter(|r| r.replica == "r2")
            .map(|r| r.start)
            .min()
            .unwrap();
        println!(
            "partition ({partition:?}): r1's last reconcile ended {:?} after the cut, r2's first began {:?} after",
            r1_last - cut,
            r2_first - cut
        );
        assert!(
            r1_last < r2_first,
            "{partition:?}: r1's last reconcile ended {:?} after the cut, r2's first began {:?} after",
            r1_last - cut,
            r2_first - cut
        );
        assert!(
            runs.iter()
                .filter(|r| r.replica == "r1")
                .all(|r| r.ended.is_some()),
            "r1 stopped every reconcile"
        );
        ledger.assert_never_two_at_once();
        r1.kill(&ledger);
        r2.shut_down().await;
    }
}

/// Safety does not depend on the application: the leader's stream is consumed by a task that
/// takes 5 s per item (a slow sink; 20 short reconciles that requeue keep it always behind), and
/// the leader is cut off while two long reconciles run; its watchdog still aborts them before
/// the standby can take the Lease, so no object runs on both (before, the aborts waited for the
/// consumer to poll the stream again, and the long ones ran 10 s past the standby's take).
#[tokio::test(start_paused = true)]
async fn a_slow_consumer_does_not_delay_the_aborts_of_a_partitioned_leader() {
    let server = ApiServer::new();
    for name in ["long-0", "long-1"] {
        server.put(&cm(name, "1"));
    }
    for i in 0..20 {
        server.put(&cm(&format!("short-{i:02}"), "1"));
    }
    let ledger = Ledger::new();
    let behaviour: Behaviour = Arc::new(|name| {
        if name.starts_with("long") {
            (secs(60), Action::await_change())
        } else {
            (millis(100), Action::requeue(millis(500)))
        }
    });
    let slow = secs(5);
    let r1 = Replica::start_consumed(
        &server,
        &ledger,
        0,
        leader("r1"),
        behaviour.clone(),
        0,
        slow,
    );
    sleep(secs(5)).await;
    let r2 = Replica::start_consumed(&server, &ledger, 1, leader("r2"), behaviour, 0, slow);
    sleep(secs(3)).await;
    let long_running = ledger
        .runs()
        .iter()
        .filter(|r| r.replica == "r1" && r.subject.starts_with("long") && r.ended.is_none())
        .count();
    assert_eq!(long_running, 2, "r1 runs the long reconciles");
    let cut = Instant::now();
    server.set_partition("r1", Partition::Blackholed);
    until(secs(40), "r2 takes over", || {
        ledger.runs().iter().any(|r| r.replica == "r2")
    })
    .await;
    sleep(secs(10)).await;
    let runs = ledger.runs();
    let r1_last = runs
        .iter()
        .filter(|r| r.replica == "r1")
        .map(|r| r.ended.unwrap_or(Instant::now()))
        .max()
        .unwrap();
    let r2_first = runs
        .iter()
        .filter(|r| r.replica == "r2")
        .map(|r| r.start)
        .min()
        .unwrap();
    println!(
        "slow consumer: r1's last reconcile ended {:?} after the cut, r2's first began {:?} after",
        r1_last - cut,
        r2_first - cut
    );
    assert!(
        r1_last < r2_first,
        "r1's last reconcile ended {:?} after the cut, r2's first began {:?} after",
        r1_last - cut,
        r2_first - cut
    );
    let (checked, _) = ledger.assert_never_two_at_once();
    assert!(
        checked >= 22,
        "the ledger holds the runs it judged: {checked}"
    );
    r1.kill(&ledger);
    r2.shut_down().await;
}

/// Rebalance with 32 and with 256 shards, 1 → 3 → 2 replicas: after each change each replica
/// holds within one of a fair share, the objects of the shards that moved are reconciled by their
/// new owner, and a change of every object then is reconciled once, by the replica holding its
/// shard.
#[tokio::test(start_paused = true)]
async fn rebalance_one_three_two_loses_nothing() {
    for shards in [32, 256] {
        rebalance_one_three_two(shards).await;
    }
}

async fn rebalance_one_three_two(shards: u32) {
    let server = ApiServer::new();
    const OBJECTS: usize = 200;
    for i in 0..OBJECTS {
        server.put(&cm(&format!("cm-{i:03}"), "1"));
    }
    let ledger = Ledger::new();
    let mut version = 1;
    // Touches every object and checks that each is reconciled once after it, on one replica.
    let touch_all = |version: u32| {
        for i in 0..OBJECTS {
            server.put(&cm(&format!("cm-{i:03}"), &version.to_string()));
        }
    };
    let r1 = Replica::start(&server, &ledger, 0, sharded_in("r1", shards), millis(10), 4);
    until(secs(30), "r1 holds everything", || {
        fair(&server, &["r1"], shards)
    })
    .await;
    until(secs(30), "every object reconciled", || {
        ledger.started_since(Instant::now() - secs(60)).len() == OBJECTS
    })
    .await;
    let mut replicas = vec![r1];
    for (index, name) in [(1, "r2"), (2, "r3")] {
        replicas.push(Replica::start(
            &server,
            &ledger,
            index,
            sharded_in(name, shards),
            millis(10),
            4,
        ));
    }
    let joined = Instant::now();
    until(secs(30), "three replicas settle", || {
        fair(&server, &["r1", "r2", "r3"], shards)
    })
    .await;
    sleep(secs(5)).await;
    // The objects of the shards r2 and r3 took were reconciled by them on taking.
    let taken = ledger.started_since(joined);
    let by_newcomers = taken
        .values()
        .filter(|replicas| replicas.iter().any(|r| r == "r2" || r == "r3"))
        .count();
    assert!(
        by_newcomers >= OBJECTS / 2,
        "{by_newcomers} objects re-enqueued by r2 and r3"
    );
    for round in 0..2 {
        if round == 1 {
            // r3 leaves: killed, its shards taken after they expire.
            let r3 = replicas.pop().unwrap();
            r3.kill(&ledger);
            until(secs(60), "two replicas settle", || {
                fair(&server, &["r1", "r2"], shards)
            })
            .await;
            sleep(secs(5)).await;
        }
        version += 1;
        let touched = Instant::now();
        touch_all(version);
        until(secs(30), "every change reconciled", || {
            ledger.started_since(touched).len() == OBJECTS
        })
        .await;
        sleep(secs(2)).await;
        let after = ledger.started_since(touched);
        for (object, on) in &after {
            assert_eq!(
                on.len(),
                1,
                "{object} reconciled by {on:?} after one change"
            );
        }
    }
    ledger.assert_never_two_at_once();
    for replica in replicas {
        replica.shut_down().await;
    }
}

/// Scale: replicas started and settled first, then 10,000 objects created; reconciles of 10 ms,
/// concurrency 4 per replica. The time until all are reconciled, with 1, 2 and 4 replicas, with
/// 32 and with 256 shards.
#[tokio::test(start_paused = true)]
async fn scale_ten_thousand_objects_over_one_two_and_four_replicas() {
    for shards in [32, 256] {
        scale_over_one_two_and_four(shards).await;
    }
}

async fn scale_over_one_two_and_four(shards: u32) {
    const OBJECTS: usize = 10_000;
    let mut times = Vec::new();
    for k in [1usize, 2, 4] {
        let server = ApiServer::new();
        let ledger = Ledger::new();
        let names: Vec<String> = (1..=k).map(|i| format!("r{i}")).collect();
        let replicas: Vec<Replica> = names
            .iter()
            .enumerate()
            .map(|(i, n)| Replica::start(&server, &ledger, i, sharded_in(n, shards), millis(10), 4))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        until(secs(60), "the replicas settle", || {
            fair(&server, &refs, shards)
        })
        .await;
        let created = Instant::now();
        for i in 0..OBJECTS {
            server.put(&cm(&format!("cm-{i:05}"), "1"));
        }
        let took = until(secs(300), "every object reconciled", || {
            ledger.started_since(created).len() == OBJECTS
        })
        .await;
        ledger.assert_never_two_at_once();
        println!("{shards} shards, {k} replica(s): all {OBJECTS} reconciled in {took:?}");
        times.push(took);
        for replica in replicas {
            replica.shut_down().await;
        }
    }
    let ratio = times[2].as_secs_f64() / times[0].as_secs_f64();
    println!("{shards} shards: 4 replicas / 1 replica: {ratio:.2}x");
    assert!(ratio <= 0.35, "4 replicas took {ratio:.2}x of 1: {times:?}");
}

/// The Lease clock given before `leases` is the one the protocol reads (it was dropped once).
#[tokio::test(start_paused = true)]
async fn a_lease_clock_given_before_leases_is_used() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use workqueue_kube::lease::{LeaseClock, LocalInstant, TokioClock};

    #[derive(Debug)]
    struct Counting(TokioClock, Arc<AtomicUsize>);
    impl LeaseClock for Counting {
        fn now(&self) -> LocalInstant {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.now()
        }
        fn tokio_instant(&self, at: LocalInstant) -> Instant {
            self.0.tokio_instant(at)
        }
    }

    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut config = LeaseConfig::new(CONTROLLER, NAMESPACE, "r1");
    config.shards = 1;
    let stream = Controller::new(
        Api::<ConfigMap>::all(server.client()),
        watcher::Config::default(),
    )
    .lease_clock(Counting(TokioClock::new(), reads.clone()))
    .leases(config)
    .run(
        |_: Arc<ConfigMap>, _: Arc<()>| async {
            Ok::<_, std::convert::Infallible>(Action::await_change())
        },
        |_, _: &std::convert::Infallible, _| Action::await_change(),
        Arc::new(()),
    );
    let task = tokio::spawn(stream.take(1).collect::<Vec<_>>());
    until(
        secs(30),
        "the controller reconciles under its Lease",
        || task.is_finished(),
    )
    .await;
    assert!(
        reads.load(Ordering::Relaxed) > 0,
        "the clock given before `leases` was never read"
    );
}

/// A trigger backoff that gives up at the first failure.
#[derive(Debug)]
struct GiveUp;

impl Iterator for GiveUp {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        None
    }
}

impl kube::runtime::utils::Backoff for GiveUp {
    fn reset(&mut self) {}
}

/// A controller on Leases whose watches end (its trigger backoff gives up) reconciles what is
/// due and ends, as one without Leases does: its Lease protocol leaves (its membership
/// vacated) instead of holding the stream open.
#[tokio::test(start_paused = true)]
async fn a_controller_whose_watches_end_leaves_its_leases_and_ends() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let reconciled = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let stream = Controller::new(
        Api::<ConfigMap>::all(server.client_named("r1")),
        watcher::Config::default(),
    )
    .trigger_backoff(GiveUp)
    .leases(leader("r1"))
    .run(
        {
            let reconciled = reconciled.clone();
            move |_: Arc<ConfigMap>, _: Arc<()>| {
                reconciled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async { Ok::<_, std::convert::Infallible>(Action::await_change()) }
            }
        },
        |_, _: &std::convert::Infallible, _| Action::await_change(),
        Arc::new(()),
    );
    let task = tokio::spawn(stream.collect::<Vec<_>>());
    until(secs(30), "the object is reconciled under the Lease", || {
        reconciled.load(std::sync::atomic::Ordering::Relaxed) == 1
    })
    .await;
    // The watch breaks and its relist is refused: the backoff gives up, the watch ends.
    server.deny("list", "configmaps");
    server.deny("watch", "configmaps");
    server.compact();
    until(secs(120), "the controller's stream ends", || {
        task.is_finished()
    })
    .await;
    let items = task.await.unwrap();
    assert!(
        items
            .iter()
            .any(|item| matches!(item, Err(Error::QueueError(_)))),
        "the refused list is an item: {items:?}"
    );
    // It left: its membership vacated (a shard whose holder left is free to take at once).
    let members: Vec<_> = lease_support::leases(&server)
        .into_iter()
        .filter(|lease| lease.metadata.name.as_deref() == Some("ctl-member-r1"))
        .collect();
    assert_eq!(members.len(), 1, "the membership Lease: {members:?}");
    assert_eq!(lease_support::holder_identity(&members[0]), None, "vacated");
}

/// A replica that takes its shards while its first list of the objects is under way: the list's
/// first pages came while it held no shard (their keys were not taken), and its store was still
/// empty when it took the shards (nothing to enqueue from it). Every object is reconciled: the
/// shards taken during a list have their objects enqueued once the list is complete.
#[tokio::test(start_paused = true)]
async fn shards_taken_during_the_first_list_lose_no_object() {
    let server = ApiServer::new();
    for i in 0..100 {
        server.put(&cm(&format!("cm-{i:03}"), "1"));
    }
    server.set_max_page_size("configmaps", 10);
    let objects = server.gate_lists("configmaps");
    let leases = server.gate_lists("leases");
    let ledger = Ledger::new();
    let r1 = Replica::start(&server, &ledger, 0, sharded_in("r1", 8), millis(10), 4);
    // Half of the objects' first list while no shard is held: five pages, one at a time, and
    // the sixth waiting at the gate.
    for _ in 0..5 {
        objects.until_held(1).await;
        objects.release_one();
        sleep(millis(100)).await;
    }
    objects.until_held(1).await;
    sleep(secs(1)).await;
    assert!(holders(&server).is_empty(), "no shard is held yet");
    assert!(ledger.runs().is_empty(), "nothing reconciled yet");
    // The shards are taken while the rest of the list waits.
    leases.open();
    until(secs(30), "r1 holds every shard", || {
        fair(&server, &["r1"], 8)
    })
    .await;
    sleep(secs(1)).await;
    objects.open();
    let reconciled = |ledger: &Ledger| {
        let runs = ledger.runs();
        let done: std::collections::HashSet<_> = runs
            .iter()
            .filter(|r| r.ended.is_some())
            .map(|r| r.subject.clone())
            .collect();
        done.len()
    };
    until(secs(60), "every object reconciled", || {
        reconciled(&ledger) == 100
    })
    .await;
    ledger.assert_never_two_at_once();
    r1.shut_down().await;
}
