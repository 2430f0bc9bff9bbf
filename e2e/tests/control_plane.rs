//! The harness itself: the control plane starts, reports the version we built, authenticates
//! the administrator and other users, enforces RBAC, and survives a pause and a restart.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use workqueue_test_support::control_plane::ControlPlane;
use workqueue_test_support::fixtures::cm_in;

/// The tests of this binary share one control plane, and one of them pauses and kills it: they
/// take turns.
static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_control_plane_serves_the_pinned_version_with_rbac() {
    let _turn = TURNS.lock().await;
    let plane = ControlPlane::shared().await;
    let client = plane.client();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.36.3");
    let ns = plane.namespace("harness").await;
    let admin = Api::<ConfigMap>::namespaced(client, &ns);
    admin
        .create(&PostParams::default(), &cm_in(&ns, "a", "1"))
        .await
        .unwrap();
    // Another user is authenticated, and RBAC allows it nothing.
    let nobody = kube::Client::try_from(plane.config_as("nobody")).unwrap();
    let denied = Api::<ConfigMap>::namespaced(nobody, &ns).get("a").await;
    match denied {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status
                    .message
                    .contains("User \"nobody\" cannot get resource \"configmaps\""),
                "{}",
                status.message
            );
        }
        other => panic!("expected 403, got {other:?}"),
    }
}

#[tokio::test]
async fn kube_apiserver_pauses_and_restarts_on_the_same_etcd() {
    let _turn = TURNS.lock().await;
    let plane = ControlPlane::shared().await;
    let ns = plane.namespace("restart").await;
    let api = Api::<ConfigMap>::namespaced(plane.client(), &ns);
    api.create(&PostParams::default(), &cm_in(&ns, "kept", "1"))
        .await
        .unwrap();

    plane.pause_apiserver();
    let paused = tokio::time::timeout(Duration::from_secs(2), api.get("kept")).await;
    assert!(paused.is_err(), "a paused server answered: {paused:?}");
    plane.resume_apiserver();
    assert_eq!(
        api.get("kept").await.unwrap().data,
        cm_in(&ns, "kept", "1").data
    );

    plane.kill_apiserver();
    let refused = api.get("kept").await;
    assert!(
        matches!(
            refused,
            Err(kube::Error::HyperError(_) | kube::Error::Service(_))
        ),
        "{refused:?}"
    );
    let start = Instant::now();
    plane.restart_apiserver().await;
    println!(
        "kube-apiserver restarted in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    // The same etcd: the object is still there; the same port and CA: the old client works.
    assert_eq!(
        api.get("kept").await.unwrap().data,
        cm_in(&ns, "kept", "1").data
    );
}

/// What `workqueue_kube::lease::deadline`'s docs promise about fenced writes, on the real
/// server: a merge patch, a strategic merge patch and a server-side apply whose body carries a
/// stale `metadata.resourceVersion` are refused with 409; the same patch without it is not.
#[tokio::test]
async fn writes_carrying_a_stale_resource_version_are_refused() {
    use kube::ResourceExt;
    use kube::api::{Patch, PatchParams};

    let _turn = TURNS.lock().await;
    let plane = ControlPlane::shared().await;
    let ns = plane.namespace("fenced-writes").await;
    let api = Api::<ConfigMap>::namespaced(plane.client(), &ns);
    let read = api
        .create(&PostParams::default(), &cm_in(&ns, "f", "1"))
        .await
        .unwrap();
    let stale = read.resource_version().unwrap();
    // Another writer moves the object on.
    let moved = serde_json::json!({ "data": { "v": "2" } });
    api.patch("f", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap();
    let fenced = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": "f", "resourceVersion": stale },
        "data": { "v": "3" },
    });
    let apply = PatchParams::apply("e2e-fenced").force();
    let patches: [(&str, Patch<&serde_json::Value>, &PatchParams); 3] = [
        ("merge", Patch::Merge(&fenced), &PatchParams::default()),
        (
            "strategic",
            Patch::Strategic(&fenced),
            &PatchParams::default(),
        ),
        ("apply", Patch::Apply(&fenced), &apply),
    ];
    for (what, patch, params) in patches {
        match api.patch("f", params, &patch).await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{what}: {status:?}"),
            other => panic!("{what} with a stale resourceVersion was not refused: {other:?}"),
        }
    }
    let unfenced = serde_json::json!({ "data": { "v": "4" } });
    api.patch("f", &PatchParams::default(), &Patch::Merge(&unfenced))
        .await
        .expect("the same patch without a resourceVersion is applied");
}
