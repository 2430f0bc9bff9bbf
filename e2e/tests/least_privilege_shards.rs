//! Scenario 8's sharded half on the real server: a controller on Leases (4 shards) as a user
//! bound only to the RBAC the README documents ("Permissions" for its kind, "Running more than
//! one replica" for the Leases, in a namespace of their own). With all of it, it works; with any
//! one documented Lease verb removed, its stream reports an error that names the missing
//! permission, and it goes on (no hang, no silent stop, no panic) and shuts down.
//!
//! `delete` is used only to collect the Leases of replicas that are gone: each case starts
//! after a previous replica (the administrator, another identity) ran and left, so that its
//! vacated membership Lease is there to collect.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use workqueue_e2e::running::Running;
use workqueue_e2e::until;
use workqueue_kube::controller::{Action, Controller};
use workqueue_kube::lease::LeaseConfig;
use workqueue_test_support::control_plane::ControlPlane;
use workqueue_test_support::fixtures::{cm_in, meta_in};

/// The README's RBAC for a controller of ConfigMaps that patches them.
const OBJECT_RULES: [(&str, &str, &[&str]); 1] = [("", "configmaps", &["list", "watch", "patch"])];
/// The README's RBAC for the Leases, in their namespace.
const LEASE_RULES: [(&str, &str, &[&str]); 1] = [(
    "coordination.k8s.io",
    "leases",
    &["list", "watch", "create", "update", "delete"],
)];
/// The annotation each reconcile writes.
const SEEN: &str = "e2e.example/seen";
/// Objects per case.
const OBJECTS: usize = 12;
const SHARDS: u32 = 4;

fn lease_config(lease_ns: &str, identity: &str) -> LeaseConfig {
    let mut config = LeaseConfig::new("lp-sharded", lease_ns, identity);
    config.shards = SHARDS;
    config.lease_duration = Duration::from_secs(4);
    config.renew_deadline = Duration::from_secs(3);
    config.retry_period = Duration::from_secs(1);
    config.hand_over_timeout = Duration::from_secs(3);
    config
}

fn role(ns: &str, rules: &[(&str, &str, &[&str])], missing: Option<(&str, &str, &str)>) -> Role {
    let rules = rules
        .iter()
        .map(|(group, resource, verbs)| PolicyRule {
            api_groups: Some(vec![group.to_string()]),
            resources: Some(vec![resource.to_string()]),
            verbs: verbs
                .iter()
                .filter(|v| missing != Some((group, resource, v)))
                .map(|v| v.to_string())
                .collect(),
            ..Default::default()
        })
        .collect();
    Role {
        metadata: meta_in(ns, "sharded"),
        rules: Some(rules),
    }
}

fn binding(ns: &str, user: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta_in(ns, "sharded"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "sharded".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.into(),
            ..Default::default()
        }]),
    }
}

/// A namespace of ConfigMaps and one of Leases, with the README's Roles minus `missing` (a Lease
/// verb) bound to a user of its own. Returns (objects' namespace, Leases' namespace, config).
async fn setup(prefix: &str, missing: Option<&str>) -> (String, String, kube::Config) {
    let plane = ControlPlane::shared().await;
    let ns = plane.namespace(prefix).await;
    let lease_ns = plane.namespace(&format!("{prefix}-leases")).await;
    let admin = plane.client();
    let user = format!("{ns}-user");
    let pp = PostParams::default();
    let missing = missing.map(|verb| ("coordination.k8s.io", "leases", verb));
    for (namespace, role) in [
        (&ns, role(&ns, &OBJECT_RULES, None)),
        (&lease_ns, role(&lease_ns, &LEASE_RULES, missing)),
    ] {
        Api::<Role>::namespaced(admin.clone(), namespace)
            .create(&pp, &role)
            .await
            .unwrap();
        Api::<RoleBinding>::namespaced(admin.clone(), namespace)
            .create(&pp, &binding(namespace, &user))
            .await
            .unwrap();
    }
    let configmaps = Api::<ConfigMap>::namespaced(admin, &ns);
    for i in 0..OBJECTS {
        configmaps
            .create(&pp, &cm_in(&ns, &format!("cm-{i}"), &i.to_string()))
            .await
            .unwrap();
    }
    (ns.clone(), lease_ns, plane.config_as(&user))
}

async fn reconcile(cm: Arc<ConfigMap>, client: Arc<kube::Client>) -> Result<Action, kube::Error> {
    let api = Api::<ConfigMap>::namespaced((*client).clone(), &cm.namespace().unwrap());
    let patch = json!({ "metadata": { "annotations": { SEEN: "yes" } } });
    api.patch(
        &cm.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(Action::await_change())
}

/// The sharded controller on `config`'s user; what its stream says is collected.
fn start(ns: &str, lease_ns: &str, identity: &str, config: kube::Config) -> Running {
    let client = kube::Client::try_from(config).unwrap();
    Running::start(|stopped| {
        Controller::new(
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            watcher::Config::default(),
        )
        .leases(lease_config(lease_ns, identity))
        .graceful_shutdown_on(stopped)
        .run(
            reconcile,
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            Arc::new(client),
        )
    })
}

/// How many of `ns`'s ConfigMaps carry the reconcile's annotation.
async fn seen(admin: &kube::Client, ns: &str) -> usize {
    let list = Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap();
    list.items
        .iter()
        .filter(|cm| cm.annotations().contains_key(SEEN))
        .count()
}

/// A replica with every right (the administrator's client) that reconciles everything, then
/// leaves: its vacated membership Lease is left for the next replica to collect.
async fn previous_replica(ns: &str, lease_ns: &str) {
    let plane = ControlPlane::shared().await;
    let admin = plane.client();
    let previous = start(ns, lease_ns, "previous", plane.config());
    until(
        Duration::from_secs(60),
        "the previous replica's reconciles",
        || {
            let admin = admin.clone();
            async move { seen(&admin, ns).await == OBJECTS }
        },
    )
    .await;
    previous.stop().await;
    // The next replica reconciles again: clear the marks.
    let api = Api::<ConfigMap>::namespaced(admin, ns);
    for i in 0..OBJECTS {
        let patch = json!({ "metadata": { "annotations": { SEEN: null } } });
        api.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    }
}

/// With the documented Roles it works: every object reconciled, nothing forbidden, and the
/// previous replica's membership Lease collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_rbac_is_enough_for_a_sharded_controller() {
    let (ns, lease_ns, config) = setup("lps-all", None).await;
    previous_replica(&ns, &lease_ns).await;
    let c = start(&ns, &lease_ns, "replica", config);
    let admin = ControlPlane::shared().await.client();
    let took = until(Duration::from_secs(60), "every object reconciled", || {
        let admin = admin.clone();
        let ns = ns.clone();
        async move { seen(&admin, &ns).await == OBJECTS }
    })
    .await;
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin, &lease_ns);
    until(
        Duration::from_secs(60),
        "the previous replica's Lease collected",
        || async {
            let names: Vec<String> = leases
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .map(|l| l.name_any())
                .collect();
            !names.iter().any(|n| n.contains("previous"))
        },
    )
    .await;
    let said = c.said();
    assert!(said.iter().all(|s| !s.contains("forbidden")), "{said:#?}");
    assert!(
        said.iter().filter(|s| s.starts_with("ok ")).count() >= OBJECTS,
        "{said:#?}"
    );
    let stopped = c.stop().await;
    println!("all verbs: every object reconciled after {took:?}, stopped in {stopped:?}");
}

/// Each documented Lease verb removed in turn (five controllers at once, each its own user and
/// namespaces): an error naming the missing permission within 60 s; the controller still runs,
/// then stops when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_missing_lease_verb_is_reported_by_name() {
    let (_, _, verbs) = LEASE_RULES[0];
    let runs = verbs.iter().enumerate().map(|(i, verb)| async move {
        let (ns, lease_ns, config) = setup(&format!("lps-{i}"), Some(verb)).await;
        previous_replica(&ns, &lease_ns).await;
        let c = start(&ns, &lease_ns, "replica", config);
        let wanted = format!("cannot {verb} resource \"leases\"");
        let what = format!("an error saying {wanted}");
        let took = until(Duration::from_secs(60), &what, || async {
            c.said().iter().any(|s| s.contains(&wanted))
        })
        .await;
        assert!(
            !c.is_finished(),
            "{verb} leases: the controller stopped: {:#?}",
            c.said()
        );
        let said = c.said();
        let first = said.iter().find(|s| s.contains(&wanted)).unwrap();
        let first: String = first.chars().take(160).collect();
        let reported = said.iter().filter(|s| s.contains(&wanted)).count();
        let stopped = c.stop().await;
        println!(
            "{verb} leases: reported after {took:?} ({reported} times), stopped in {stopped:?}: {first}"
        );
    });
    futures_util::future::join_all(runs).await;
}
