//! The scripted API server (`apiserver/`) against the API server's behaviour that client code
//! depends on, through kube's own `Api`, watcher, reflector and finalizer helper. Paused tokio
//! time throughout: every delay is virtual and exact.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, DeleteParams, ListParams, ObjectList, ObjectMeta, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::{reflector, watcher};
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, timeout};

use workqueue_test_support::apiserver::{ApiServer, ListOrder, Partition};
use workqueue_test_support::fixtures::{cm, meta, secs};

fn labelled(name: &str, app: &str) -> ConfigMap {
    let mut cm = cm(name, "1");
    cm.metadata.labels = Some(BTreeMap::from([("app".into(), app.into())]));
    cm
}

fn value_of(cm: &ConfigMap) -> &str {
    &cm.data.as_ref().unwrap()["v"]
}

fn names<K: ResourceExt>(items: &[K]) -> Vec<String> {
    items.iter().map(ResourceExt::name_any).collect()
}

/// The code and reason of an API error (a `Status`); panics on any other result.
fn status<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn configmaps(server: &ApiServer) -> Api<ConfigMap> {
    Api::default_namespaced(server.client())
}

fn json_patch(ops: Value) -> Patch<()> {
    Patch::Json(serde_json::from_value(ops).unwrap())
}

fn merge(patch: Value) -> Patch<Value> {
    Patch::Merge(patch)
}

// Lists.

/// Pages continue the snapshot of the first page: objects created, changed or deleted after it
/// do not shift the pages or show up in them, and every page reports the snapshot's version.
#[tokio::test(start_paused = true)]
async fn a_paginated_list_continues_its_snapshot_after_a_concurrent_change() {
    let server = ApiServer::new();
    for name in ["b", "c", "d", "e", "f"] {
        server.put(&cm(name, "1"));
    }
    server.set_max_page_size("configmaps", 2);
    let api = configmaps(&server);
    let first = api.list(&ListParams::default().limit(500)).await.unwrap();
    assert_eq!(names(&first.items), ["b", "c"]);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let snapshot = first.metadata.resource_version.clone().unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    server.put(&cm("a", "1")); // before the first page
    server.put(&cm("d", "2")); // in the second page
    server.delete::<ConfigMap>("e"); // in the second page
    let lp = ListParams::default().limit(500);
    let second = api.list(&lp.clone().continue_token(&token)).await.unwrap();
    assert_eq!(names(&second.items), ["d", "e"]);
    assert_eq!(value_of(&second.items[0]), "1");
    assert_eq!(second.metadata.resource_version.as_ref(), Some(&snapshot));
    let token = second.metadata.continue_.clone().unwrap();
    let third = api.list(&lp.continue_token(&token)).await.unwrap();
    assert_eq!(names(&third.items), ["f"]);
    assert_eq!(third.metadata.continue_, None);
    assert_eq!(third.metadata.resource_version.as_ref(), Some(&snapshot));
    // A client without a limit gets everything, as of now, whatever the server's page size.
    let now = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&now.items), ["a", "b", "c", "d", "f"]);
    assert_eq!(
        now.metadata.resource_version,
        Some(server.version().to_string())
    );
}

/// A continue token whose snapshot was compacted is 410 `Expired`, a garbled one 400.
#[tokio::test(start_paused = true)]
async fn an_expired_continue_token_is_410_expired() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    server.put(&cm("b", "1"));
    let api = configmaps(&server);
    let first = api.list(&ListParams::default().limit(1)).await.unwrap();
    let token = first.metadata.continue_.unwrap();
    server.compact();
    let lp = ListParams::default().limit(1);
    let expired = api.list(&lp.clone().continue_token(&token)).await;
    assert_eq!(status(expired), (410, "Expired".into()));
    let garbled = api.list(&lp.continue_token("not-a-token")).await;
    assert_eq!(status(garbled), (400, "BadRequest".into()));
}

/// A `resourceVersion=0` list comes from the watch cache: whole, whatever the limit (what
/// client-go's reflector sends first; kube's `ListParams` drops `resourceVersion=0` when it
/// sets a limit, so its pages come from the store).
#[tokio::test(start_paused = true)]
async fn a_list_from_the_cache_ignores_the_limit() {
    let server = ApiServer::new();
    for name in ["a", "b", "c"] {
        server.put(&cm(name, "1"));
    }
    let uri = "/api/v1/namespaces/default/configmaps?limit=1&resourceVersion=0";
    let request = http::Request::get(uri).body(Vec::new()).unwrap();
    let list: ObjectList<ConfigMap> = server.client().request(request).await.unwrap();
    assert_eq!(names(&list.items), ["a", "b", "c"]);
    assert_eq!(list.metadata.continue_, None);
    let paged = configmaps(&server)
        .list(&ListParams::default().match_any().limit(1))
        .await
        .unwrap();
    assert_eq!(names(&paged.items), ["a"]);
}

/// The test chooses the order of a list; pages follow it.
#[tokio::test(start_paused = true)]
async fn lists_come_in_the_order_the_test_sets() {
    let server = ApiServer::new();
    for name in ["c", "a", "d", "b"] {
        server.put(&cm(name, "1"));
    }
    let api = configmaps(&server);
    let all = |api: Api<ConfigMap>| async move {
        let (mut out, mut lp) = (Vec::new(), ListParams::default().limit(3));
        loop {
            let page = api.list(&lp).await.unwrap();
            out.extend(names(&page.items));
            match page.metadata.continue_ {
                Some(token) => lp = lp.continue_token(&token),
                None => return out,
            }
        }
    };
    assert_eq!(all(api.clone()).await, ["a", "b", "c", "d"]);
    server.set_list_order("configmaps", ListOrder::Creation);
    assert_eq!(all(api.clone()).await, ["c", "a", "d", "b"]);
    let descending = |a: &Value, b: &Value| {
        b["metadata"]["name"]
            .as_str()
            .cmp(&a["metadata"]["name"].as_str())
    };
    server.set_list_order("configmaps", ListOrder::By(Arc::new(descending)));
    assert_eq!(all(api).await, ["d", "c", "b", "a"]);
}

/// A gated list holds its page (computed when it arrived) until released, while other lists
/// finish; a delayed list takes its delay.
#[tokio::test(start_paused = true)]
async fn a_gated_list_is_held_while_others_finish() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let gate = server.gate_lists("configmaps");
    let api = configmaps(&server);
    let held = tokio::spawn({
        let api = api.clone();
        async move { api.list(&ListParams::default()).await }
    });
    gate.until_held(1).await;
    server.put(&cm("b", "1"));
    let deployments: Api<Deployment> = Api::default_namespaced(server.client());
    assert!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    sleep(secs(60)).await;
    assert!(!held.is_finished());
    gate.release_one();
    let list = held.await.unwrap().unwrap();
    assert_eq!(
        names(&list.items),
        ["a"],
        "the snapshot is of the request's arrival"
    );
    // The gate holds later lists too, until it is opened.
    let next = tokio::spawn({
        let api = api.clone();
        async move { api.list(&ListParams::default()).await }
    });
    gate.until_held(1).await;
    gate.open();
    assert_eq!(names(&next.await.unwrap().unwrap().items), ["a", "b"]);
    server.set_list_delay("configmaps", secs(7));
    let start = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert_eq!(start.elapsed(), secs(7));
}

/// Label and field selectors select in lists and watches; in a watch, an object that starts
/// matching is ADDED and one that stops matching is DELETED.
#[tokio::test(start_paused = true)]
async fn selectors_select_in_lists_and_watches() {
    let server = ApiServer::new();
    server.put(&labelled("a", "web"));
    server.put(&labelled("b", "db"));
    server.put(&cm("c", "1"));
    let api = configmaps(&server);
    let list = |lp: ListParams| {
        let api = api.clone();
        async move { names(&api.list(&lp).await.unwrap().items) }
    };
    assert_eq!(list(ListParams::default().labels("app=web")).await, ["a"]);
    assert_eq!(
        list(ListParams::default().labels("app!=web")).await,
        ["b", "c"]
    );
    assert_eq!(
        list(ListParams::default().labels("app in (web, db)")).await,
        ["a", "b"]
    );
    assert_eq!(
        list(ListParams::default().labels("app,app notin (db)")).await,
        ["a"]
    );
    assert_eq!(list(ListParams::default().labels("!app")).await, ["c"]);
    assert_eq!(
        list(ListParams::default().fields("metadata.name=b")).await,
        ["b"]
    );
    let wp = WatchParams::default().labels("app=web");
    let mut events = api
        .watch(&wp, &server.version().to_string())
        .await
        .unwrap()
        .boxed();
    server.put(&labelled("b", "web"));
    server.put(&labelled("a", "db"));
    server.put(&labelled("c", "db")); // never matches: no event
    server.put(&labelled("b", "web")); // no change: no event
    let mut seen = Vec::new();
    for _ in 0..2 {
        match events.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.name_any())),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.name_any())),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED b", "DELETED a"]);
    assert!(timeout(secs(60), events.next()).await.is_err());
}

/// kube-runtime's watcher pages its initial list (three pages here), the reflector's store
/// has every object at `InitDone`, and changes follow by watch.
#[tokio::test(start_paused = true)]
async fn a_watcher_and_reflector_over_three_pages_reach_init_done_with_all_objects() {
    let server = ApiServer::new();
    for i in 0..5 {
        server.put(&cm(&format!("cm-{i}"), "1"));
    }
    server.set_max_page_size("configmaps", 2);
    let (reader, writer) = reflector::store();
    let api = Api::<ConfigMap>::all(server.client());
    let mut events = reflector(writer, watcher(api, watcher::Config::default())).boxed();
    let mut applied = 0;
    loop {
        match events.try_next().await.unwrap().unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(_) => applied += 1,
            watcher::Event::InitDone => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(applied, 5);
    assert_eq!(reader.state().len(), 5);
    let lists: Vec<String> = server
        .request_log()
        .into_iter()
        .filter(|l| l.is_to("configmaps") && !l.uri.contains("watch="))
        .map(|l| l.uri)
        .collect();
    assert_eq!(lists.len(), 3, "{lists:#?}");
    assert!(
        lists.iter().all(|uri| uri.contains("limit=500")),
        "{lists:#?}"
    );
    assert!(
        lists[1..].iter().all(|uri| uri.contains("continue=")),
        "{lists:#?}"
    );
    server.put(&cm("cm-9", "1"));
    match events.try_next().await.unwrap().unwrap() {
        watcher::Event::Apply(o) => assert_eq!(o.name_any(), "cm-9"),
        other => panic!("{other:?}"),
    }
    assert_eq!(reader.state().len(), 6);
}

/// kube's streaming lists: the initial events end with the `initial-events-end` bookmark.
#[tokio::test(start_paused = true)]
async fn a_streaming_list_watcher_reaches_init_done() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    server.put(&cm("b", "1"));
    let config = watcher::Config::default().streaming_lists();
    let mut events = watcher(configmaps(&server), config).boxed();
    let mut applied = Vec::new();
    loop {
        match events.try_next().await.unwrap().unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => applied.push(o.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(applied, ["a", "b"]);
}

/// The server closes a watch after its `timeoutSeconds`.
#[tokio::test(start_paused = true)]
async fn the_server_ends_a_watch_after_its_timeout() {
    let server = ApiServer::new();
    let api = configmaps(&server);
    let start = Instant::now();
    let events = api
        .watch(&WatchParams::default().timeout(10), "0")
        .await
        .unwrap();
    assert_eq!(events.boxed().count().await, 0);
    assert_eq!(start.elapsed(), secs(10));
}

// Writes.

/// A JSON Patch whose `test` fails is 422 with a Status, and nothing of it applies.
#[tokio::test(start_paused = true)]
async fn a_failed_json_patch_test_is_422_and_changes_nothing() {
    let server = ApiServer::new();
    server.put(&cm("x", "1"));
    let api = configmaps(&server);
    let version = server.version();
    let ops = json!([
        { "op": "replace", "path": "/data/v", "value": "3" },
        { "op": "test", "path": "/data/v", "value": "2" },
    ]);
    let failed = api
        .patch("x", &PatchParams::default(), &json_patch(ops))
        .await;
    assert_eq!(status(failed), (422, "Invalid".into()));
    assert_eq!(value_of(&server.get::<ConfigMap>("x").unwrap()), "1");
    assert_eq!(server.version(), version);
    let ops = json!([
        { "op": "test", "path": "/data/v", "value": "1" },
        { "op": "replace", "path": "/data/v", "value": "3" },
        { "op": "add", "path": "/data/w", "value": "4" },
    ]);
    let patched = api
        .patch("x", &PatchParams::default(), &json_patch(ops))
        .await
        .unwrap();
    assert_eq!(value_of(&patched), "3");
    assert_eq!(patched.data.unwrap()["w"], "4");
    let missing = json!([{ "op": "remove", "path": "/metadata/labels/gone" }]);
    let failed = api
        .patch("x", &PatchParams::default(), &json_patch(missing))
        .await;
    assert_eq!(status(failed), (422, "Invalid".into()));
}

/// A replace or patch carrying a stale resourceVersion is 409 `Conflict`; without one, a
/// ConfigMap is overwritten (unconditional update).
#[tokio::test(start_paused = true)]
async fn a_stale_resource_version_is_409_conflict() {
    let server = ApiServer::new();
    let api = configmaps(&server);
    let pp = PostParams::default();
    let created = api.create(&pp, &cm("x", "1")).await.unwrap();
    let mut fresh = created.clone();
    fresh.data = cm("x", "2").data;
    let replaced = api.replace("x", &pp, &fresh).await.unwrap();
    assert_ne!(replaced.resource_version(), created.resource_version());
    let mut stale = created.clone();
    stale.data = cm("x", "3").data;
    assert_eq!(
        status(api.replace("x", &pp, &stale).await),
        (409, "Conflict".into())
    );
    let stale_rv = created.resource_version().unwrap();
    let patch = merge(json!({ "metadata": { "resourceVersion": stale_rv }, "data": { "v": "4" } }));
    let conflict = api.patch("x", &PatchParams::default(), &patch).await;
    assert_eq!(status(conflict), (409, "Conflict".into()));
    let current = replaced.resource_version().unwrap();
    let patch = merge(json!({ "metadata": { "resourceVersion": current }, "data": { "v": "4" } }));
    api.patch("x", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let mut blind = cm("x", "5");
    blind.metadata.resource_version = None;
    assert_eq!(value_of(&api.replace("x", &pp, &blind).await.unwrap()), "5");
    let mut gone = cm("y", "1");
    gone.metadata.resource_version = Some("1".into());
    assert_eq!(
        status(api.replace("y", &pp, &gone).await),
        (404, "NotFound".into())
    );
    // A delete precondition on a stale version is a conflict too.
    let dp = DeleteParams::default().preconditions(kube::api::Preconditions {
        resource_version: Some(stale_rv),
        uid: None,
    });
    assert_eq!(status(api.delete("x", &dp).await), (409, "Conflict".into()));
}

/// Creating a name that exists is 409 `AlreadyExists`; creating with a resourceVersion is
/// refused; `generateName` makes a name.
#[tokio::test(start_paused = true)]
async fn creating_an_existing_name_is_409_already_exists() {
    let server = ApiServer::new();
    server.put(&cm("x", "1"));
    let api = configmaps(&server);
    let pp = PostParams::default();
    assert_eq!(
        status(api.create(&pp, &cm("x", "2")).await),
        (409, "AlreadyExists".into())
    );
    let mut with_version = cm("y", "1");
    with_version.metadata.resource_version = Some("7".into());
    assert_eq!(status(api.create(&pp, &with_version).await).0, 500);
    let mut generated = cm("", "1");
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("job-".into());
    let made = api.create(&pp, &generated).await.unwrap();
    assert!(made.name_any().starts_with("job-") && made.name_any().len() > 4);
    let dry = api
        .create(
            &PostParams {
                dry_run: true,
                ..pp
            },
            &cm("z", "1"),
        )
        .await
        .unwrap();
    assert_eq!(dry.name_any(), "z");
    assert!(server.get::<ConfigMap>("z").is_none());
}

/// Server-side apply creates, then merges onto the stored object.
#[tokio::test(start_paused = true)]
async fn server_side_apply_creates_then_merges() {
    let server = ApiServer::new();
    let api = configmaps(&server);
    let pp = PatchParams::apply("test-manager");
    let applied = api
        .patch("x", &pp, &Patch::Apply(cm("x", "1")))
        .await
        .unwrap();
    assert_eq!(value_of(&applied), "1");
    let mut more = cm("x", "2");
    more.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
    let applied = api.patch("x", &pp, &Patch::Apply(more)).await.unwrap();
    assert_eq!(
        (value_of(&applied), applied.labels()["app"].as_str()),
        ("2", "web")
    );
    assert_eq!(applied.uid(), server.get::<ConfigMap>("x").unwrap().uid());
}

/// DELETE of an object with finalizers marks it (MODIFIED: deletionTimestamp, grace 0); no new
/// finalizer may be added then; a JSON Patch that removes the last one deletes it (DELETED).
#[tokio::test(start_paused = true)]
async fn deletion_waits_for_finalizers_and_completes_when_a_patch_removes_the_last() {
    let server = ApiServer::new();
    let mut object = cm("x", "1");
    object.metadata.finalizers = Some(vec!["example.com/a".into()]);
    server.put(&object);
    let api = configmaps(&server);
    let from = server.version().to_string();
    let mut events = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    sleep(secs(5)).await;
    let marked = api.delete("x", &DeleteParams::default()).await.unwrap();
    let marked = marked.left().expect("the object, still there");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(0));
    let stored = server.get::<ConfigMap>("x").unwrap();
    assert_eq!(
        stored.metadata.deletion_timestamp,
        marked.metadata.deletion_timestamp
    );
    let version = server.version();
    api.delete("x", &DeleteParams::default()).await.unwrap();
    assert_eq!(server.version(), version, "a second delete changes nothing");
    let add = merge(json!({ "metadata": { "finalizers": ["example.com/a", "example.com/b"] } }));
    let refused = api.patch("x", &PatchParams::default(), &add).await;
    assert_eq!(status(refused), (422, "Invalid".into()));
    let remove = json_patch(json!([
        { "op": "test", "path": "/metadata/finalizers/0", "value": "example.com/a" },
        { "op": "remove", "path": "/metadata/finalizers/0" },
    ]));
    let last = api
        .patch("x", &PatchParams::default(), &remove)
        .await
        .unwrap();
    assert!(server.get::<ConfigMap>("x").is_none());
    // As kube-apiserver 1.36 answers (e2e/tests/finalizer.rs): the removal itself is not
    // written; its answer is the object without the finalizer at the mark's resourceVersion,
    // and DELETED carries the stored object, finalizer listed, at the deletion's.
    assert_eq!(last.resource_version(), marked.resource_version());
    assert!(last.finalizers().is_empty());
    match events.try_next().await.unwrap().unwrap() {
        WatchEvent::Modified(o) => assert!(o.metadata.deletion_timestamp.is_some()),
        other => panic!("{other:?}"),
    }
    match events.try_next().await.unwrap().unwrap() {
        WatchEvent::Deleted(o) => {
            assert_eq!(o.resource_version(), Some(server.version().to_string()));
            assert_eq!(o.finalizers(), ["example.com/a"]);
        }
        other => panic!("{other:?}"),
    }
    // Without finalizers, a delete is at once, and answers a Status (not the object).
    server.put(&cm("y", "1"));
    let gone = api.delete("y", &DeleteParams::default()).await.unwrap();
    let details = gone.right().expect("a Status").details.unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("y", "configmaps")
    );
    assert!(server.get::<ConfigMap>("y").is_none());
}

/// kube-runtime's own `finalizer()` helper against the server: it adds its finalizer (JSON
/// Patch `test` of `null` + `add`, or `test` of the list + `add .../-`), runs Apply, and on
/// deletion runs Cleanup and removes its finalizer (`test` + `remove` by index).
#[tokio::test(start_paused = true)]
async fn kube_runtimes_finalizer_helper_runs_apply_then_cleanup() {
    const NAME: &str = "example.com/cleanup";
    let server = ApiServer::new();
    let api = configmaps(&server);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let step = |name: &'static str| {
        let (api, server, seen) = (api.clone(), server.clone(), seen.clone());
        async move {
            let object = Arc::new(server.get::<ConfigMap>(name).unwrap());
            finalizer(&api, NAME, object, |event| async move {
                let what = match event {
                    Finalized::Apply(o) => format!("apply {}", o.name_any()),
                    Finalized::Cleanup(o) => format!("cleanup {}", o.name_any()),
                };
                seen.lock().unwrap().push(what);
                Ok::<_, std::io::Error>(Action::await_change())
            })
            .await
            .unwrap();
        }
    };
    // No finalizers yet.
    server.put(&cm("x", "1"));
    step("x").await;
    assert_eq!(server.get::<ConfigMap>("x").unwrap().finalizers(), [NAME]);
    step("x").await;
    api.delete("x", &DeleteParams::default()).await.unwrap();
    step("x").await;
    assert!(server.get::<ConfigMap>("x").is_none());
    // Someone else's finalizer first.
    let mut other = cm("y", "1");
    other.metadata.finalizers = Some(vec!["example.com/other".into()]);
    server.put(&other);
    step("y").await;
    let y = server.get::<ConfigMap>("y").unwrap();
    assert_eq!(y.finalizers(), ["example.com/other", NAME]);
    api.delete("y", &DeleteParams::default()).await.unwrap();
    step("y").await;
    let y = server.get::<ConfigMap>("y").unwrap();
    assert_eq!(y.finalizers(), ["example.com/other"], "still being deleted");
    assert_eq!(*seen.lock().unwrap(), ["apply x", "cleanup x", "cleanup y"]);
}

// Leases and custom resources.

fn lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    }
}

fn holder(lease: &Lease) -> &str {
    lease
        .spec
        .as_ref()
        .unwrap()
        .holder_identity
        .as_deref()
        .unwrap()
}

/// Leases: create (409 if it exists), get (404 if not), replace with the resourceVersion
/// precondition (409 on a stale one, 422 without one), PUT of a missing Lease creates it,
/// list, delete.
#[tokio::test(start_paused = true)]
async fn leases_are_created_read_and_replaced_under_the_resource_version_lock() {
    let server = ApiServer::new();
    let one: Api<Lease> = Api::namespaced(server.client_named("replica-1"), "kube-system");
    let two: Api<Lease> = Api::namespaced(server.client_named("replica-2"), "kube-system");
    let pp = PostParams::default();
    assert_eq!(status(one.get("leader").await), (404, "NotFound".into()));
    let mine = one
        .create(&pp, &lease("leader", "replica-1"))
        .await
        .unwrap();
    let theirs = two.create(&pp, &lease("leader", "replica-2")).await;
    assert_eq!(status(theirs), (409, "AlreadyExists".into()));
    // Both read it; replica 2 takes it over first; replica 1's renewal is then stale.
    let seen_by_two = two.get("leader").await.unwrap();
    let mut takeover = seen_by_two.clone();
    takeover.spec.as_mut().unwrap().holder_identity = Some("replica-2".into());
    let taken = two.replace("leader", &pp, &takeover).await.unwrap();
    assert_eq!(holder(&taken), "replica-2");
    let mut renewal = mine.clone();
    renewal.spec.as_mut().unwrap().lease_duration_seconds = Some(30);
    assert_eq!(
        status(one.replace("leader", &pp, &renewal).await),
        (409, "Conflict".into())
    );
    let mut blind = lease("leader", "replica-1");
    blind.metadata.resource_version = None;
    assert_eq!(
        status(one.replace("leader", &pp, &blind).await),
        (422, "Invalid".into())
    );
    assert_eq!(
        holder(&server.get_in::<Lease>("kube-system", "leader").unwrap()),
        "replica-2"
    );
    // A PUT creates a missing Lease (Leases allow create on update).
    let created = one
        .replace("other", &pp, &lease("other", "replica-1"))
        .await
        .unwrap();
    assert!(created.uid().is_some());
    assert_eq!(
        names(&two.list(&ListParams::default()).await.unwrap().items),
        ["leader", "other"]
    );
    two.delete("leader", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(status(one.get("leader").await), (404, "NotFound".into()));
    assert_eq!(server.all("leases.coordination.k8s.io").len(), 1);
}

/// A custom resource with a hand-written `Resource` impl (what `#[derive(CustomResource)]`
/// generates, minus the schema). Its `apiVersion` and `kind` are serialized, as the derive's
/// are: the API server refuses a custom resource's body without them.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
struct Widget {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: WidgetSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<WidgetStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
struct WidgetSpec {
    size: u32,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
struct WidgetStatus {
    phase: String,
}

impl Resource for Widget {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Widget".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "example.com".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "widgets".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Custom resources are served under their group: a body without `apiVersion` and `kind` is
/// refused (400), a status subresource (status is dropped on create and kept by writes to the
/// object), a generation bumped by spec changes only, no unconditional update, no strategic
/// merge patch. Cluster-scoped types are served too.
#[tokio::test(start_paused = true)]
async fn custom_resources_have_a_status_subresource_and_a_generation() {
    let server = ApiServer::new();
    let api: Api<Widget> = Api::default_namespaced(server.client());
    let untyped = Widget {
        metadata: meta("w"),
        ..Default::default()
    };
    let refused = api.create(&PostParams::default(), &untyped).await;
    assert_eq!(status(refused), (400, "BadRequest".into()));
    let widget = Widget {
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        metadata: meta("w"),
        spec: WidgetSpec { size: 1 },
        status: Some(WidgetStatus {
            phase: "made-up".into(),
        }),
    };
    let created = api.create(&PostParams::default(), &widget).await.unwrap();
    assert_eq!(
        (created.status.clone(), created.metadata.generation),
        (None, Some(1))
    );
    assert_eq!(server.all("widgets")[0]["apiVersion"], "example.com/v1");
    let pp = PatchParams::default();
    let grown = api
        .patch("w", &pp, &merge(json!({ "spec": { "size": 2 } })))
        .await
        .unwrap();
    assert_eq!(grown.metadata.generation, Some(2));
    let ignored = api
        .patch("w", &pp, &merge(json!({ "status": { "phase": "x" } })))
        .await
        .unwrap();
    assert_eq!(
        (&ignored.status, ignored.resource_version()),
        (&None, grown.resource_version())
    );
    let status_patch = merge(json!({ "status": { "phase": "ready" }, "spec": { "size": 9 } }));
    let ready = api.patch_status("w", &pp, &status_patch).await.unwrap();
    assert_eq!(
        ready.status,
        Some(WidgetStatus {
            phase: "ready".into()
        })
    );
    assert_eq!((ready.spec.size, ready.metadata.generation), (2, Some(2)));
    let mut blind = ready.clone();
    blind.metadata.resource_version = None;
    let refused = api.replace("w", &PostParams::default(), &blind).await;
    assert_eq!(status(refused), (422, "Invalid".into()));
    let strategic = api
        .patch(
            "w",
            &pp,
            &Patch::Strategic(json!({ "spec": { "size": 3 } })),
        )
        .await;
    assert_eq!(status(strategic), (415, "UnsupportedMediaType".into()));
    let mut watch = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    match watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(w) => assert_eq!(w.spec.size, 2),
        other => panic!("{other:?}"),
    }
    // A cluster-scoped type.
    let namespaces: Api<Namespace> = Api::all(server.client());
    let team = Namespace {
        metadata: ObjectMeta {
            name: Some("team-a".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &team)
        .await
        .unwrap();
    assert!(
        namespaces
            .get("team-a")
            .await
            .unwrap()
            .metadata
            .namespace
            .is_none()
    );
    assert!(server.get::<Namespace>("team-a").is_some());
}

// Clients and faults.

/// A partitioned client's requests fail (a transport error: `kube::Error::Service`) and never
/// reach the server, while another client's succeed; a blackholed client's requests hang
/// until the partition heals, then fail; an answer lost on the way back leaves the write done.
#[tokio::test(start_paused = true)]
async fn a_partitioned_clients_requests_fail_while_another_clients_succeed() {
    let server = ApiServer::new();
    server.put(&cm("x", "1"));
    let one: Api<ConfigMap> = Api::default_namespaced(server.client_named("replica-1"));
    let two: Api<ConfigMap> = Api::default_namespaced(server.client_named("replica-2"));
    two.get("x").await.unwrap();
    let mut watch = two
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        watch.try_next().await,
        Ok(Some(WatchEvent::Added(_)))
    ));
    server.set_partition("replica-2", Partition::Refused);
    let failed = two.get("x").await;
    assert!(matches!(failed, Err(kube::Error::Service(_))), "{failed:?}");
    assert!(watch.try_next().await.is_err(), "the open watch breaks");
    assert_eq!(value_of(&one.get("x").await.unwrap()), "1");
    let sent = server.requests_of("replica-2");
    assert_eq!(sent.len(), 3);
    assert!(
        sent[..2].iter().all(|l| l.reached) && !sent[2].reached,
        "{:#?}",
        server.log()
    );
    assert_eq!(server.requests_of("replica-1").len(), 1);
    // Blackholed: no answer at all until the link is back.
    server.set_partition("replica-2", Partition::Blackholed);
    let pending = tokio::spawn({
        let two = two.clone();
        async move { two.get("x").await }
    });
    sleep(secs(600)).await;
    assert!(!pending.is_finished());
    server.set_partition("replica-2", Partition::Connected);
    let failed = pending.await.unwrap();
    assert!(matches!(failed, Err(kube::Error::Service(_))), "{failed:?}");
    two.get("x").await.unwrap();
    // The server applies a write whose answer the partition then loses.
    server.set_latency("replica-2", Duration::ZERO, secs(1));
    let write = tokio::spawn({
        let two = two.clone();
        async move {
            let patch = merge(json!({ "data": { "v": "2" } }));
            two.patch("x", &PatchParams::default(), &patch).await
        }
    });
    sleep(Duration::from_millis(500)).await;
    server.set_partition("replica-2", Partition::Refused);
    assert!(matches!(write.await.unwrap(), Err(kube::Error::Service(_))));
    assert_eq!(value_of(&server.get::<ConfigMap>("x").unwrap()), "2");
    assert_eq!(
        server.requests_of("replica-2").last().unwrap().status,
        Some(200)
    );
}

/// Latency is per client and on tokio's clock: to the server, back, and on watch events.
#[tokio::test(start_paused = true)]
async fn latency_is_per_client() {
    let server = ApiServer::new();
    server.put(&cm("x", "1"));
    server.set_latency("slow", secs(2), secs(1));
    let slow: Api<ConfigMap> = Api::default_namespaced(server.client_named("slow"));
    let fast: Api<ConfigMap> = Api::default_namespaced(server.client_named("fast"));
    let start = Instant::now();
    fast.get("x").await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    slow.get("x").await.unwrap();
    assert_eq!(start.elapsed(), secs(3));
    let sent = server.requests_of("slow");
    assert_eq!(sent[0].at, start);
    let from = server.version().to_string();
    let mut events = slow
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let put_at = Instant::now();
    server.put(&cm("x", "2"));
    assert!(matches!(
        events.try_next().await,
        Ok(Some(WatchEvent::Modified(_)))
    ));
    assert_eq!(put_at.elapsed(), secs(1));
}

/// The outage of the whole server: 503 for everyone, and back.
#[tokio::test(start_paused = true)]
async fn an_outage_fails_every_client_with_503() {
    let server = ApiServer::new();
    server.put(&cm("x", "1"));
    let api = configmaps(&server);
    server.set_down(true);
    assert_eq!(
        status(api.get("x").await),
        (503, "ServiceUnavailable".into())
    );
    server.set_down(false);
    api.get("x").await.unwrap();
}
