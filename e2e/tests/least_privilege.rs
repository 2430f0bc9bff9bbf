//! Scenario 8 on the real server: the counter controller (`examples/counter/`) as a user bound
//! only to the RBAC the README documents for it ("Permissions"), in one namespace. With all of
//! it, it works; with any one documented verb removed, its stream reports an error that names the
//! missing permission, and it goes on (no hang, no silent stop, no panic) and shuts down.
//! (The sharded controller's half, with the Lease verbs, waits for the new Lease protocol.)

#[allow(dead_code)]
#[path = "../../workqueue-kube/examples/counter/main.rs"]
mod controller;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use workqueue_e2e::running::Running;
use workqueue_e2e::until;
use workqueue_kube::controller::Controller;
use workqueue_test_support::control_plane::ControlPlane;
use workqueue_test_support::fixtures::{deployment_in, meta_in};

use controller::{APPLIED, REPLICAS};

/// The README's RBAC for the counter controller in one namespace: API group, resource, verbs.
const RULES: [(&str, &str, &[&str]); 3] = [
    ("", "configmaps", &["list", "watch", "patch"]),
    ("apps", "deployments", &["get", "list", "watch", "patch"]),
    ("events.k8s.io", "events", &["create", "patch"]),
];

fn configmap(ns: &str, name: &str, replicas: &str) -> ConfigMap {
    let mut metadata = meta_in(ns, name);
    metadata.annotations = Some(BTreeMap::from([(REPLICAS.into(), replicas.into())]));
    ConfigMap {
        metadata,
        ..Default::default()
    }
}

/// A namespace with the README's Role minus `missing` (group, resource, verb), bound to a user
/// of its own; a valid ConfigMap `web` with its Deployment, and `bad` with an invalid
/// annotation (its reconcile records Events). Returns the namespace and the user's config.
async fn setup(prefix: &str, missing: Option<(&str, &str, &str)>) -> (String, kube::Config) {
    let plane = ControlPlane::shared().await;
    let ns = plane.namespace(prefix).await;
    let admin = plane.client();
    let rules = RULES
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
    let pp = PostParams::default();
    let role = Role {
        metadata: meta_in(&ns, "counter"),
        rules: Some(rules),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&pp, &role)
        .await
        .unwrap();
    let user = format!("{ns}-user");
    let binding = RoleBinding {
        metadata: meta_in(&ns, "counter"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "counter".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.clone(),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&pp, &binding)
        .await
        .unwrap();
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), &ns);
    let web = configmaps
        .create(&pp, &configmap(&ns, "web", "3"))
        .await
        .unwrap();
    configmaps
        .create(&pp, &configmap(&ns, "bad", "three"))
        .await
        .unwrap();
    Api::<Deployment>::namespaced(admin, &ns)
        .create(&pp, &deployment_in(&ns, "web", 1, Some(&web)))
        .await
        .unwrap();
    (ns.clone(), plane.config_as(&user))
}

/// The counter controller, wired as its `main` wires it, on `config`'s user in `ns`; what its
/// stream says is collected (each error with its sources).
fn start(ns: &str, config: kube::Config) -> Running {
    let client = kube::Client::try_from(config).unwrap();
    let reporter = Reporter {
        controller: "counter".into(),
        instance: None,
    };
    let state = Arc::new(controller::State {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
    });
    let wc = watcher::Config::default();
    Running::start(|stopped| {
        Controller::new(Api::<ConfigMap>::namespaced(client.clone(), ns), wc.clone())
            .owns(Api::<Deployment>::namespaced(client, ns), wc)
            .graceful_shutdown_on(stopped)
            .run(controller::reconcile, controller::error_policy, state)
    })
}

/// With the whole documented Role it works: `web` scaled and its `applied` annotation written,
/// `bad`'s Events recorded (created, then patched), and nothing forbidden.
#[tokio::test]
async fn the_documented_rbac_is_enough() {
    let (ns, config) = setup("lp-all", None).await;
    let c = start(&ns, config);
    let admin = ControlPlane::shared().await.client();
    let deployments = Api::<Deployment>::namespaced(admin.clone(), &ns);
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), &ns);
    until(Duration::from_secs(30), "web scaled", || async {
        let scaled = deployments.get("web").await.unwrap().spec.replicas == Some(3);
        let applied = configmaps
            .get("web")
            .await
            .unwrap()
            .annotations()
            .get(APPLIED)
            .cloned();
        scaled && applied.as_deref() == Some("3")
    })
    .await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin, &ns);
    until(Duration::from_secs(30), "bad's Event repeated", || async {
        let list = events.list(&Default::default()).await.unwrap().items;
        list.iter()
            .any(|e| e.series.as_ref().is_some_and(|s| s.count >= 3))
    })
    .await;
    let said = c.said();
    assert!(said.iter().all(|s| !s.contains("forbidden")), "{said:#?}");
    c.stop().await;
}

/// Each documented verb removed in turn (nine controllers at once, each its own user and
/// namespace): an error naming the missing permission within 60 s; the controller still runs,
/// then stops when asked.
#[tokio::test]
async fn each_missing_verb_is_reported_by_name() {
    let mut cases = Vec::new();
    for (group, resource, verbs) in RULES {
        for verb in verbs {
            cases.push((group, resource, *verb));
        }
    }
    let runs = cases
        .into_iter()
        .enumerate()
        .map(|(i, (group, resource, verb))| async move {
            let (ns, config) = setup(&format!("lp-{i}"), Some((group, resource, verb))).await;
            let c = start(&ns, config);
            let wanted = format!("cannot {verb} resource \"{resource}\"");
            let what = format!("an error saying {wanted}");
            let took = until(Duration::from_secs(60), &what, || async {
                c.said().iter().any(|s| s.contains(&wanted))
            })
            .await;
            assert!(
                !c.is_finished(),
                "{verb} {resource}: the controller stopped: {:#?}",
                c.said()
            );
            let said = c.said();
            let first = said.iter().find(|s| s.contains(&wanted)).unwrap();
            let first: String = first.chars().take(150).collect();
            let stopped = c.stop().await;
            println!("{verb} {resource}: reported after {took:?}, stopped in {stopped:?}: {first}");
        });
    futures_util::future::join_all(runs).await;
}
