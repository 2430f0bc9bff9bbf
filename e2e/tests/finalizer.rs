//! Scenario 2 on the real server: finalizers. What the API server does (a delete that sets
//! `deletionTimestamp`, no new finalizer then, the last removal deletes), and
//! `workqueue_kube::finalizer` in a `Controller`: add, apply, a delete during apply, cleanup,
//! removal. The scripted server's versions: `apiserver_behaviour.rs`
//! (`deletion_waits_for_finalizers_and_completes_when_a_patch_removes_the_last`) and
//! `kube_runtime_program.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::oneshot;
use workqueue_e2e::until;
use workqueue_kube::controller::{Action, Controller};
use workqueue_kube::finalizer::{Error as FinalizerError, Event, finalizer};
use workqueue_test_support::control_plane::ControlPlane;
use workqueue_test_support::fixtures::cm_in;

const NAME: &str = "example.com/cleanup";

fn status<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The server's side: DELETE of an object with a finalizer marks it (deletionTimestamp,
/// deletionGracePeriodSeconds 0: MODIFIED); a second DELETE changes nothing; a new finalizer is
/// refused (422); a JSON Patch that removes the last finalizer deletes it (DELETED).
#[tokio::test]
async fn deletion_waits_for_finalizers_and_completes_when_a_patch_removes_the_last() {
    let plane = ControlPlane::shared().await;
    let ns = plane.namespace("finalizer-server").await;
    let api = Api::<ConfigMap>::namespaced(plane.client(), &ns);
    let mut object = cm_in(&ns, "x", "1");
    object.metadata.finalizers = Some(vec!["example.com/a".into()]);
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    let from = created.resource_version().unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let marked = api.delete("x", &DeleteParams::default()).await.unwrap();
    let marked = marked.left().expect("the object, still there");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(0));
    let version = marked.resource_version();
    let again = api.delete("x", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        again.left().unwrap().resource_version(),
        version,
        "a second delete changes nothing"
    );
    let add = json!({ "metadata": { "finalizers": ["example.com/a", "example.com/b"] } });
    let refused = api
        .patch("x", &PatchParams::default(), &Patch::Merge(&add))
        .await;
    let (code, reason) = status(refused);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    let remove = json!([
        { "op": "test", "path": "/metadata/finalizers/0", "value": "example.com/a" },
        { "op": "remove", "path": "/metadata/finalizers/0" },
    ]);
    let patch: Patch<()> = Patch::Json(serde_json::from_value(remove).unwrap());
    let last = api
        .patch("x", &PatchParams::default(), &patch)
        .await
        .unwrap();
    assert!(api.get_opt("x").await.unwrap().is_none());
    // The watch: the mark (MODIFIED), then DELETED; no MODIFIED for the removal's own write.
    let mut seen = Vec::new();
    while let Some(event) = events.try_next().await.unwrap() {
        let (kind, o) = match event {
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            other => panic!("{other:?}"),
        };
        seen.push((kind, o.resource_version().unwrap(), o.finalizers().len()));
        if kind == "DELETED" {
            break;
        }
    }
    println!(
        "events {seen:?}; the mark at {version:?}; the removal answered {:?} with finalizers {:?}",
        last.resource_version(),
        last.finalizers()
    );
    // The removal of the last finalizer deletes the object without writing the removal: its
    // answer is the object without the finalizer at the mark's resourceVersion, and the
    // DELETED event carries the object as stored (the finalizer still listed) at the
    // deletion's resourceVersion.
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        (seen[0].0, Some(seen[0].1.clone())),
        ("MODIFIED", version.clone())
    );
    assert_eq!((seen[1].0, seen[1].2), ("DELETED", 1));
    assert_eq!(last.resource_version(), version);
    assert!(last.finalizers().is_empty());
    let rv = |v: &str| v.parse::<u64>().unwrap();
    assert!(rv(&seen[1].1) > rv(version.as_deref().unwrap()), "{seen:?}");
    // Without finalizers, a delete is at once, and answers a Status (not the object).
    api.create(&PostParams::default(), &cm_in(&ns, "y", "1"))
        .await
        .unwrap();
    let gone = api.delete("y", &DeleteParams::default()).await.unwrap();
    let status = gone.right().expect("a Status for an immediate delete");
    let details = status.details.unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("y", "configmaps")
    );
    assert!(api.get_opt("y").await.unwrap().is_none());
}

struct Ctx {
    client: kube::Client,
    log: Mutex<Vec<String>>,
}

async fn reconcile(
    cm: Arc<ConfigMap>,
    ctx: Arc<Ctx>,
) -> Result<Action, FinalizerError<kube::Error>> {
    let ns = cm.namespace().unwrap();
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, NAME, cm, |event| async {
        match event {
            Event::Apply(cm) => {
                ctx.log
                    .lock()
                    .unwrap()
                    .push(format!("apply {}", cm.name_any()));
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(Action::requeue(Duration::from_secs(300)))
            }
            Event::Cleanup(cm) => {
                ctx.log
                    .lock()
                    .unwrap()
                    .push(format!("cleanup {}", cm.name_any()));
                Ok(Action::await_change())
            }
        }
    })
    .await
}

/// The controller: the finalizer is added and the apply runs; the object is deleted 2 s into
/// its 5 s apply (it stays, marked, held by the finalizer); once the apply returns, the
/// cleanup runs, the finalizer is removed and the object goes.
#[tokio::test]
async fn a_delete_during_apply_is_cleaned_up_after_it() {
    let plane = ControlPlane::shared().await;
    let ns = plane.namespace("finalizer-controller").await;
    let client = plane.client();
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &cm_in(&ns, "web", "1"))
        .await
        .unwrap();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        log: Mutex::new(Vec::new()),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(
        Controller::new(api.clone(), watcher::Config::default())
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(
                reconcile,
                |_, _, _| Action::requeue(Duration::from_secs(1)),
                ctx.clone(),
            )
            .map(|item| format!("{item:?}"))
            .collect::<Vec<_>>(),
    );
    until(Duration::from_secs(30), "the apply began", || async {
        ctx.log.lock().unwrap().len() == 1
    })
    .await;
    let with_finalizer = api.get("web").await.unwrap();
    assert_eq!(with_finalizer.finalizers(), [NAME]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    api.delete("web", &DeleteParams::default()).await.unwrap();
    let marked = api.get("web").await.unwrap();
    assert!(
        marked.metadata.deletion_timestamp.is_some(),
        "held by its finalizer"
    );
    let took = until(
        Duration::from_secs(30),
        "gone after the cleanup",
        || async { api.get_opt("web").await.unwrap().is_none() },
    )
    .await;
    println!("gone {took:?} after the delete");
    let _ = stop.send(());
    let items = run.await.unwrap();
    assert_eq!(
        *ctx.log.lock().unwrap(),
        ["apply web", "cleanup web"],
        "{items:#?}"
    );
    assert!(items.iter().all(|i| i.starts_with("Ok")), "{items:#?}");
}
