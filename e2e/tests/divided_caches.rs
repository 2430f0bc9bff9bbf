//! Divided caches (`Controller::divide_caches`) on the real kube-apiserver, each replica an OS
//! process of its own (`workqueue_e2e::replica`, which records its store's contents in the
//! ledger): objects created without the shard label are labelled by the controller; each
//! replica's store holds the objects of the shards it holds and no other; a label removed or
//! changed by a third party is set right; a replica killed (`kill -9`), one joining and one
//! leaving (SIGTERM) move shards without writing any object (their resourceVersions stay), and
//! every object of a moved shard is reconciled by its new holder. No object is ever reconciled
//! by two processes at once (the ledger). And owned objects: labelled with their owner's shard,
//! their changes reconciling their owner on the replica that holds it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;
use workqueue_e2e::replica::run_if_replica;
use workqueue_kube::lease::shard_of;
use workqueue_test_support::api_requests::scrape;

mod scenario;

use scenario::{CONTROLLER, Scenario};

/// Not a test: the entry of the replica processes the test below starts.
#[test]
fn replica_process() {
    run_if_replica();
}

/// The scenarios run one at a time: one counts the API server's writes, which are
/// server-wide.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SHARDS: u32 = 8;
const OBJECTS: usize = 300;

/// The controller's shard label.
fn label() -> String {
    label_of(SHARDS)
}

/// The controller's shard label with `shards` shards.
fn label_of(shards: u32) -> String {
    format!("{CONTROLLER}.workqueue-kube.io/shard-of-{shards}")
}

/// The shard of `namespace/name`.
fn shard(object: &str) -> u32 {
    let (ns, name) = object.split_once('/').expect("namespace/name");
    shard_of(Some(ns), name, SHARDS)
}

/// Waits until every object carries its shard's label; returns their resourceVersions.
async fn until_labelled(s: &mut Scenario, what: &str) -> HashMap<String, u64> {
    until_labelled_in(s, what, SHARDS, OBJECTS).await
}

/// Waits until every one of `objects` objects carries its shard's label with `shards` shards;
/// returns their resourceVersions.
async fn until_labelled_in(
    s: &mut Scenario,
    what: &str,
    shards: u32,
    objects: usize,
) -> HashMap<String, u64> {
    let start = Instant::now();
    loop {
        let (versions, wrong) = s.versions_and_unlabelled(&label_of(shards), shards).await;
        if wrong == 0 && versions.len() == objects {
            println!(
                "{what}: every object labelled {:.1} s after",
                start.elapsed().as_secs_f64()
            );
            return versions;
        }
        s.check_alive();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: {wrong} objects without their label after 60 s\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until each replica's store holds exactly the objects of the shards it holds (by the
/// Leases), the shards held by `replicas` alone, fairly; returns who holds what.
async fn until_stores_match(
    s: &mut Scenario,
    what: &str,
    replicas: &[&str],
    objects: &[String],
) -> BTreeMap<String, BTreeSet<u32>> {
    s.until_fair(Duration::from_secs(60), replicas, SHARDS)
        .await;
    let start = Instant::now();
    loop {
        let held = s.held_shards().await;
        s.sync();
        let stores = s.stores();
        let expected = |shards: &BTreeSet<u32>| {
            let count = objects
                .iter()
                .filter(|o| shards.contains(&shard(o)))
                .count();
            (count, shards.clone())
        };
        let matching = replicas.iter().all(|r| {
            let shards = held.get(*r).cloned().unwrap_or_default();
            stores.get(*r) == Some(&expected(&shards))
        });
        if matching {
            let sizes: Vec<String> = replicas
                .iter()
                .map(|r| format!("{r}: {} objects of {:?}", stores[*r].0, held[*r]))
                .collect();
            println!(
                "{what}: stores match the shards held {:.1} s after the shards settled ({})",
                start.elapsed().as_secs_f64(),
                sizes.join("; ")
            );
            return held;
        }
        s.check_alive();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: stores {stores:?} do not match the shards held {held:?}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every object of `shards` was reconciled to its end by `replica` after `since`.
async fn until_reconciled_by(
    s: &mut Scenario,
    what: &str,
    replica: &str,
    shards: &BTreeSet<u32>,
    objects: &[String],
    since: Instant,
) {
    let moved: BTreeSet<&String> = objects
        .iter()
        .filter(|o| shards.contains(&shard(o)))
        .collect();
    assert!(!moved.is_empty(), "{what}: no object moved");
    s.until(Duration::from_secs(60), what, |s| {
        let done: BTreeSet<String> = s
            .completed()
            .into_iter()
            .filter(|c| c.replica == replica && c.start >= since)
            .map(|c| c.object)
            .collect();
        moved.iter().all(|o| done.contains(*o))
    })
    .await;
    println!(
        "{what}: the {} objects of the moved shards {shards:?} reconciled by {replica} within {:.1} s",
        moved.len(),
        since.elapsed().as_secs_f64()
    );
}

/// Asserts that no object was written since `before` (its resourceVersion is the same).
async fn assert_unwritten(s: &Scenario, what: &str, before: &HashMap<String, u64>) {
    let (now, _) = s.versions_and_unlabelled(&label(), SHARDS).await;
    let written: Vec<&String> = before
        .iter()
        .filter(|(object, version)| now.get(*object) != Some(version))
        .map(|(object, _)| object)
        .collect();
    assert!(written.is_empty(), "{what}: objects written: {written:?}");
    println!("{what}: no object written ({} unchanged)", before.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divided_caches_hold_their_shards_only_and_move_without_writes() {
    let _serial = SERIAL.lock().await;
    let mut s = Scenario::new("divided").await;
    let names: Vec<String> = (0..OBJECTS).map(Scenario::name).collect();
    s.create(&names).await;
    let objects: Vec<String> = names.iter().map(|n| format!("{}/{n}", s.ns)).collect();
    let spec = |s: &Scenario, identity: &str| {
        let mut spec = s.spec(identity, SHARDS);
        spec.divided = true;
        spec
    };
    for identity in ["r1", "r2"] {
        let next = spec(&s, identity);
        s.start(&next);
    }

    // Labelled by the controller, each store holding its shards' objects, all reconciled.
    let labelled = until_labelled(&mut s, "start").await;
    let held = until_stores_match(&mut s, "start", &["r1", "r2"], &objects).await;
    s.until(
        Duration::from_secs(60),
        "start: every object reconciled",
        |s| s.not_reconciled(&labelled) == 0,
    )
    .await;

    // A third party removes one label and changes another: both are set right.
    let third_party = json!({ "metadata": { "labels": { label(): null } } });
    let removed = s
        .api
        .patch(
            &names[0],
            &PatchParams::default(),
            &Patch::Merge(&third_party),
        )
        .await
        .expect("removing a label");
    assert!(!removed.labels().contains_key(&label()));
    let wrong = (shard(&objects[1]) + 1) % SHARDS;
    let third_party = json!({ "metadata": { "labels": { label(): wrong.to_string() } } });
    let changed = s
        .api
        .patch(
            &names[1],
            &PatchParams::default(),
            &Patch::Merge(&third_party),
        )
        .await
        .expect("changing a label");
    assert_eq!(changed.labels().get(&label()), Some(&wrong.to_string()));
    let edited = [(&objects[0], &removed), (&objects[1], &changed)];
    let relabelled = until_labelled(&mut s, "a third party's edits").await;
    for (object, edit) in edited {
        let edit: u64 = edit.resource_version().unwrap().parse().unwrap();
        assert!(
            relabelled[object] > edit,
            "{object} was written again after the edit"
        );
    }
    s.until(
        Duration::from_secs(60),
        "a third party's edits: the relabelled objects reconciled",
        |s| s.not_reconciled(&relabelled) == 0,
    )
    .await;

    // kill -9: the survivor takes the shards, lists them, reconciles them; nothing is written.
    let before = until_labelled(&mut s, "before the kill").await;
    let killed = s.kill("r2");
    until_stores_match(&mut s, "kill -9 (r2)", &["r1"], &objects).await;
    let moved = held["r2"].clone();
    until_reconciled_by(&mut s, "kill -9 (r2)", "r1", &moved, &objects, killed).await;
    assert_unwritten(&s, "kill -9 (r2)", &before).await;

    // A join: the newcomer takes its share, lists it and reconciles it; nothing is written.
    let joined = Instant::now();
    let next = spec(&s, "r3");
    s.start(&next);
    let held = until_stores_match(&mut s, "join (r3)", &["r1", "r3"], &objects).await;
    until_reconciled_by(&mut s, "join (r3)", "r3", &held["r3"], &objects, joined).await;
    assert_unwritten(&s, "join (r3)", &before).await;

    // A graceful leave: r1 hands its shards over to r3; nothing is written.
    let left = Instant::now();
    let moved = held["r1"].clone();
    s.replica("r1").signal("TERM");
    let mut r1 = s.replicas.remove("r1").expect("r1 runs");
    let status = r1.exit_within(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "r1 did not exit cleanly after SIGTERM: {status:?}\n{}",
        r1.log_tail(20)
    );
    until_stores_match(&mut s, "leave (r1, SIGTERM)", &["r3"], &objects).await;
    until_reconciled_by(&mut s, "leave (r1, SIGTERM)", "r3", &moved, &objects, left).await;
    assert_unwritten(&s, "leave (r1, SIGTERM)", &before).await;

    let runs = s.assert_never_two_at_once();
    assert!(runs >= 2 * OBJECTS, "{runs} runs judged");
    s.shut_down();
}

/// Owned objects with divided caches: two controllers (in this process, each on its own
/// client) own Secrets through owner references to their ConfigMaps. Each Secret, created
/// without the label, is labelled with its owner's shard; a change of a Secret reconciles its
/// owner on the replica that holds the owner's shard; a Secret whose label a third party
/// changes is set right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_objects_carry_their_owners_shard() {
    let _serial = SERIAL.lock().await;
    use std::sync::{Arc, Mutex};

    use futures_util::StreamExt;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::ResourceExt;
    use kube::api::{Api, PostParams};
    use kube::runtime::watcher;
    use workqueue_kube::controller::{Action, Controller};
    use workqueue_kube::lease::LeaseConfig;
    use workqueue_test_support::control_plane::ControlPlane;
    use workqueue_test_support::fixtures::cm_in;

    const OWNERS: usize = 20;
    const SELECTOR: &str = "e2e.workqueue/owned";
    let plane = ControlPlane::shared().await;
    let ns = plane.namespace("divided-owned").await;
    let key = format!("owned.workqueue-kube.io/shard-of-{SHARDS}");
    let configmaps = Api::<ConfigMap>::namespaced(plane.client(), &ns);
    let secrets = Api::<Secret>::namespaced(plane.client(), &ns);
    let mut owners = Vec::new();
    for i in 0..OWNERS {
        let mut cm = cm_in(&ns, &format!("owner-{i:02}"), "0");
        cm.labels_mut().insert(SELECTOR.into(), "yes".into());
        owners.push(
            configmaps
                .create(&PostParams::default(), &cm)
                .await
                .expect("an owner"),
        );
    }
    // Every reconcile: (replica, owner's name, when).
    let reconciles: Arc<Mutex<Vec<(String, String, Instant)>>> = Arc::default();
    let mut controllers = Vec::new();
    for identity in ["o1", "o2"] {
        let client = plane.client();
        let mut leases = LeaseConfig::new("owned", &ns, identity);
        leases.shards = SHARDS;
        leases.lease_duration = Duration::from_secs(3);
        leases.renew_deadline = Duration::from_secs(2);
        leases.retry_period = Duration::from_millis(400);
        leases.hand_over_timeout = Duration::from_secs(2);
        let wc = watcher::Config::default().labels(SELECTOR);
        let reconciles = reconciles.clone();
        let stream = Controller::new(
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            wc.clone(),
        )
        .owns(Api::<Secret>::namespaced(client, &ns), wc)
        .leases(leases)
        .divide_caches()
        .run(
            move |cm: Arc<ConfigMap>, _: Arc<()>| {
                let done = (identity.to_string(), cm.name_any(), Instant::now());
                reconciles.lock().unwrap().push(done);
                async { Ok::<_, std::convert::Infallible>(Action::await_change()) }
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
        controllers.push(tokio::spawn(stream.for_each(|_| async {})));
    }
    // The children, without the label.
    let child = |i: usize, value: &str| {
        let owner = &owners[i];
        let mut secret = Secret {
            string_data: Some([("v".to_string(), value.to_string())].into()),
            ..Secret::default()
        };
        secret.metadata.name = Some(format!("child-{i:02}"));
        secret.metadata.namespace = Some(ns.clone());
        secret.labels_mut().insert(SELECTOR.into(), "yes".into());
        secret.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: owner.name_any(),
            uid: owner.uid().expect("a uid"),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        secret
    };
    for i in 0..OWNERS {
        secrets
            .create(&PostParams::default(), &child(i, "0"))
            .await
            .expect("a child");
    }
    let owner_shard = |i: usize| shard_of(Some(&ns), &format!("owner-{i:02}"), SHARDS).to_string();
    let labelled = || async {
        let list = secrets
            .list(&Default::default())
            .await
            .expect("the children");
        list.iter()
            .filter(|s| {
                let i: usize = s.name_any()["child-".len()..].parse().unwrap();
                s.labels().get(&key) == Some(&owner_shard(i))
            })
            .count()
    };
    let start = Instant::now();
    while labelled().await < OWNERS {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "children not labelled in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "owned: every child labelled with its owner's shard {:.1} s after",
        start.elapsed().as_secs_f64()
    );

    // A change of each child reconciles its owner, once settled; by one replica per shard.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let touched = Instant::now();
    for i in 0..OWNERS {
        let patch = json!({ "stringData": { "v": "1" } });
        secrets
            .patch(
                &format!("child-{i:02}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .expect("touching a child");
    }
    let owners_reconciled = || {
        let reconciles = reconciles.lock().unwrap();
        let after: Vec<&(String, String, Instant)> = reconciles
            .iter()
            .filter(|(_, _, at)| *at >= touched)
            .collect();
        let names: BTreeSet<&String> = after.iter().map(|(_, name, _)| name).collect();
        let mut by_shard: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for (replica, name, _) in &after {
            let shard = shard_of(Some(&ns), name, SHARDS);
            by_shard.entry(shard).or_default().insert(replica.clone());
        }
        (names.len(), by_shard.values().all(|r| r.len() == 1))
    };
    let start = Instant::now();
    loop {
        let (reconciled, one_each) = owners_reconciled();
        assert!(one_each, "a shard's owners reconciled by two replicas");
        if reconciled == OWNERS {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{reconciled} owners reconciled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "owned: a change of every child reconciled its owner within {:.1} s",
        start.elapsed().as_secs_f64()
    );

    // A third party changes a child's label: it is set right.
    let wrong = (owner_shard(0).parse::<u32>().unwrap() + 1) % SHARDS;
    let patch = json!({ "metadata": { "labels": { key.clone(): wrong.to_string() } } });
    let changed = secrets
        .patch("child-00", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("changing a label");
    assert_eq!(changed.labels().get(&key), Some(&wrong.to_string()));
    let changed_version: u64 = changed.resource_version().unwrap().parse().unwrap();
    let start = Instant::now();
    loop {
        let now = secrets.get("child-00").await.expect("child-00");
        let version: u64 = now.resource_version().unwrap().parse().unwrap();
        if labelled().await == OWNERS && version > changed_version {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "child-00 not relabelled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "owned: a changed label set right within {:.1} s",
        start.elapsed().as_secs_f64()
    );
    for controller in controllers {
        controller.abort();
    }
}

/// A new number of shards (a rolling update that changes it, once the old replicas are gone):
/// the new layout has a label of its own, written once on every object (the API server counts
/// one write per object), and the old layout's label stays as it was, so old replicas still
/// running would still find their objects. Every object is reconciled by the new replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_number_of_shards_labels_every_object_once_and_keeps_the_old_layout() {
    let _serial = SERIAL.lock().await;
    const FEW: usize = 100;
    let mut s = Scenario::new("divided-reshard").await;
    let names: Vec<String> = (0..FEW).map(Scenario::name).collect();
    s.create(&names).await;
    let mut old = s.spec("r1", SHARDS);
    old.divided = true;
    s.start(&old);
    let labelled = until_labelled_in(&mut s, "8 shards", SHARDS, FEW).await;
    s.until(
        Duration::from_secs(60),
        "8 shards: every object reconciled",
        |s| s.not_reconciled(&labelled) == 0,
    )
    .await;
    s.shut_down();

    let client = s.api.clone().into_client();
    let before = scrape(&client).await.expect("scraping /metrics");
    let started = Instant::now();
    let mut new = s.spec("r2", 4);
    new.divided = true;
    s.start(&new);
    let relabelled = until_labelled_in(&mut s, "4 shards", 4, FEW).await;
    s.until(
        Duration::from_secs(60),
        "4 shards: every object reconciled",
        |s| s.not_reconciled(&relabelled) == 0,
    )
    .await;
    let (old_versions, old_wrong) = s.versions_and_unlabelled(&label_of(SHARDS), SHARDS).await;
    assert_eq!(old_wrong, 0, "the old layout's labels stay");
    assert_eq!(old_versions, relabelled, "no write since the new labels");
    let writes = scrape(&client)
        .await
        .expect("scraping /metrics")
        .since(&before)
        .writes_of("configmaps");
    assert_eq!(writes, FEW as f64, "one write per object");
    let reconciled_by_r2 = s
        .completed()
        .iter()
        .filter(|c| c.replica == "r2" && c.start >= started)
        .map(|c| c.object.clone())
        .collect::<BTreeSet<_>>()
        .len();
    assert_eq!(reconciled_by_r2, FEW);
    println!(
        "a new number of shards: {FEW} objects labelled once ({writes} writes), the old labels kept"
    );
    s.assert_never_two_at_once();
    s.shut_down();
}
