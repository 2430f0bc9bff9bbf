//! `workqueue_kube::Controller` against the scripted API server, on tokio's paused clock:
//! kube-runtime's guarantees (no reconcile before the store is ready or while it relists, none of
//! an object absent from it, one at a time per object), its builder (`owns`, `watches`,
//! `reconcile_all_on`, `reconcile_on`, `for_stream`), `Config`'s `concurrency` and `debounce`,
//! the mapping of results onto the queue, and graceful shutdown.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use workqueue_kube::controller::{Action, Config, Controller, Error};

use workqueue_test_support::apiserver::{ApiServer, Partition};
use workqueue_test_support::fixtures::{cm, cm_in, deployment, ms, secs};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(String);

/// What the reconciles saw: each start (object, its `v` value, when) and the peak of reconciles
/// running at once.
#[derive(Default)]
struct Ledger {
    starts: Mutex<Vec<(String, String, Instant)>>,
    running: Mutex<(usize, usize)>,
}

impl Ledger {
    fn names(&self) -> Vec<String> {
        self.starts
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _, _)| n.clone())
            .collect()
    }

    fn count(&self, name: &str) -> usize {
        self.names().iter().filter(|n| *n == name).count()
    }

    fn peak(&self) -> usize {
        self.running.lock().unwrap().1
    }
}

/// How the test reconcile behaves: how long it takes, and what it returns.
#[derive(Clone)]
struct Behaviour {
    takes: Duration,
    result: fn(&ConfigMap) -> Result<Action, Failed>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            takes: Duration::ZERO,
            result: |_| Ok(Action::await_change()),
        }
    }
}

/// A controller's stream run as a task, with what it yielded and how to stop it.
struct Running {
    ledger: Arc<Ledger>,
    items: Arc<Mutex<Vec<String>>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    fn start(controller: Controller<ConfigMap>, behaviour: Behaviour) -> Self {
        let ledger = Arc::new(Ledger::default());
        let items = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = oneshot::channel::<()>();
        let reconcile = {
            let ledger = ledger.clone();
            move |cm: Arc<ConfigMap>, _ctx: Arc<()>| {
                let ledger = ledger.clone();
                let behaviour = behaviour.clone();
                let value = cm.data.as_ref().and_then(|d| d.get("v")).cloned();
                ledger.starts.lock().unwrap().push((
                    cm.name_any(),
                    value.unwrap_or_default(),
                    Instant::now(),
                ));
                async move {
                    {
                        let mut running = ledger.running.lock().unwrap();
                        running.0 += 1;
                        running.1 = running.1.max(running.0);
                    }
                    sleep(behaviour.takes).await;
                    ledger.running.lock().unwrap().0 -= 1;
                    (behaviour.result)(&cm)
                }
            }
        };
        let error_policy = |_: Arc<ConfigMap>, _: &Failed, _: Arc<()>| Action::requeue(secs(1));
        let stream = controller
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(reconcile, error_policy, Arc::new(()));
        let task = tokio::spawn({
            let items = items.clone();
            stream.for_each(move |item| {
                items.lock().unwrap().push(describe(&item));
                async {}
            })
        });
        Running {
            ledger,
            items,
            stop: Some(stop),
            task,
        }
    }

    fn items(&self) -> Vec<String> {
        self.items.lock().unwrap().clone()
    }

    fn not_found(&self) -> Vec<String> {
        self.items()
            .into_iter()
            .filter(|i| i.starts_with("not found"))
            .collect()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

fn describe(
    item: &Result<(ObjectRef<ConfigMap>, Action), Error<Failed, watcher::Error>>,
) -> String {
    match item {
        Ok((key, action)) => format!("ok {} {action:?}", key.name),
        Err(Error::ObjectNotFound(key)) => format!("not found {}", key.name),
        Err(Error::ReconcilerFailed(e, key)) => format!("failed {} {e}", key.name),
        Err(Error::QueueError(e)) => format!("watch {e}"),
        Err(Error::RunnerError(e)) => format!("runner {e}"),
    }
}

fn configmaps(server: &ApiServer) -> Controller<ConfigMap> {
    Controller::new(Api::all(server.client()), watcher::Config::default())
}

/// No reconcile before the first list is complete: with the list held after its first page, the
/// keys of the listed objects and of an owned object's event are queued, and none runs; once the
/// list completes, each object is reconciled once, none reported missing.
#[tokio::test(start_paused = true)]
async fn nothing_is_reconciled_before_the_first_list_is_complete() {
    let server = ApiServer::new();
    for name in ["a", "b", "c"] {
        server.put(&cm(name, "1"));
    }
    let owner = server.get::<ConfigMap>("a").unwrap();
    server.put(&deployment("a-1", 1, Some(&owner)));
    server.set_max_page_size("configmaps", 2);
    let pages = server.gate_lists("configmaps");
    let controller = configmaps(&server).owns(
        Api::<Deployment>::all(server.client()),
        watcher::Config::default(),
    );
    let c = Running::start(controller, Behaviour::default());
    pages.until_held(1).await;
    pages.release_one();
    pages.until_held(1).await;
    sleep(secs(10)).await;
    assert_eq!(c.ledger.names(), Vec::<String>::new());
    pages.open();
    sleep(secs(1)).await;
    let mut names = c.ledger.names();
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(c.not_found(), Vec::<String>::new());
    c.stop().await;
}

/// While the main watch relists (after a partition and a compaction: 410 Gone), no reconcile
/// starts: an object deleted meanwhile is in the old store until the new list is complete, and
/// a requeue of it that comes due during the relist must not reconcile it. After the relist it is
/// reported missing, not reconciled; the others go on.
#[tokio::test(start_paused = true)]
async fn a_relist_does_not_reconcile_objects_the_new_list_lacks() {
    let server = ApiServer::new();
    for name in ["keep", "gone"] {
        server.put(&cm(name, "1"));
    }
    let behaviour = Behaviour {
        takes: Duration::ZERO,
        result: |_| Ok(Action::requeue(secs(20))),
    };
    let c = Running::start(configmaps(&server), behaviour);
    sleep(secs(1)).await;
    assert_eq!((c.ledger.count("keep"), c.ledger.count("gone")), (1, 1));
    // The watch breaks; "gone" is deleted and the history compacted while the controller is cut
    // off, so the watcher must relist; the relist is held past the requeues' time.
    server.set_partition("default", Partition::Refused);
    server.delete::<ConfigMap>("gone");
    server.compact();
    let pages = server.gate_lists("configmaps");
    sleep(secs(2)).await;
    server.set_partition("default", Partition::Connected);
    pages.until_held(1).await;
    sleep(secs(30)).await; // both requeues (at 21 s) came due meanwhile
    assert_eq!((c.ledger.count("keep"), c.ledger.count("gone")), (1, 1));
    pages.open();
    sleep(secs(1)).await;
    assert_eq!(c.ledger.count("gone"), 1, "reconciled after it was deleted");
    assert_eq!(c.ledger.count("keep"), 2);
    assert_eq!(c.not_found(), ["not found gone"]);
    c.stop().await;
}

/// `owns` reconciles the owner of a changed child; `watches` the objects its mapper names.
#[tokio::test(start_paused = true)]
async fn owns_and_watches_map_to_the_right_objects() {
    let server = ApiServer::new();
    for name in ["web", "db"] {
        server.put(&cm(name, "1"));
    }
    let controller = configmaps(&server)
        .owns(
            Api::<Deployment>::all(server.client()),
            watcher::Config::default(),
        )
        .watches(
            Api::<Secret>::all(server.client()),
            watcher::Config::default(),
            |secret: Secret| {
                // A secret named "<configmap>-creds" relates to its ConfigMap.
                let name = secret.name_any();
                let owner = name.strip_suffix("-creds").map(str::to_owned);
                owner.map(|o| ObjectRef::new(&o).within("default"))
            },
        );
    let c = Running::start(controller, Behaviour::default());
    sleep(secs(1)).await;
    assert_eq!((c.ledger.count("web"), c.ledger.count("db")), (1, 1));
    let owner = server.get::<ConfigMap>("web").unwrap();
    server.put(&deployment("web-1", 1, Some(&owner)));
    sleep(secs(1)).await;
    assert_eq!((c.ledger.count("web"), c.ledger.count("db")), (2, 1));
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("db-creds".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    server.put(&secret);
    sleep(secs(1)).await;
    assert_eq!((c.ledger.count("web"), c.ledger.count("db")), (2, 2));
    c.stop().await;
}

/// `reconcile_all_on` reconciles every object in the store at each trigger; `reconcile_on` the
/// objects it names (one not in the store is reported missing).
#[tokio::test(start_paused = true)]
async fn reconcile_all_on_and_reconcile_on() {
    let server = ApiServer::new();
    for name in ["a", "b"] {
        server.put(&cm(name, "1"));
    }
    let (all_tx, all_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (one_tx, one_rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<ConfigMap>>();
    let controller = configmaps(&server)
        .reconcile_all_on(tokio_stream(all_rx))
        .reconcile_on(tokio_stream(one_rx));
    let c = Running::start(controller, Behaviour::default());
    sleep(secs(1)).await;
    assert_eq!((c.ledger.count("a"), c.ledger.count("b")), (1, 1));
    all_tx.send(()).unwrap();
    sleep(secs(1)).await;
    assert_eq!((c.ledger.count("a"), c.ledger.count("b")), (2, 2));
    one_tx.send(ObjectRef::new("b").within("default")).unwrap();
    one_tx
        .send(ObjectRef::new("nope").within("default"))
        .unwrap();
    sleep(secs(1)).await;
    assert_eq!((c.ledger.count("a"), c.ledger.count("b")), (2, 3));
    assert_eq!(c.not_found(), ["not found nope"]);
    c.stop().await;
}

fn tokio_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// `concurrency(n)` bounds the reconciles running at once to `n`; `concurrency(0)` (the
/// default, as in kube-runtime) is unbounded.
#[tokio::test(start_paused = true)]
async fn concurrency_bounds_reconciles_and_zero_is_unbounded() {
    for (concurrency, peak) in [(3u16, 3usize), (0, 20)] {
        let server = ApiServer::new();
        for i in 0..20 {
            server.put(&cm(&format!("cm-{i:02}"), "1"));
        }
        let controller =
            configmaps(&server).with_config(Config::default().concurrency(concurrency));
        let behaviour = Behaviour {
            takes: secs(1),
            ..Behaviour::default()
        };
        let c = Running::start(controller, behaviour);
        sleep(secs(30)).await;
        assert_eq!(c.ledger.names().len(), 20, "concurrency {concurrency}");
        assert_eq!(c.ledger.peak(), peak, "concurrency {concurrency}");
        c.stop().await;
    }
}

/// An object is never reconciled twice at once: changes during its reconcile run it once more,
/// after it.
#[tokio::test(start_paused = true)]
async fn an_object_is_reconciled_one_at_a_time() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let behaviour = Behaviour {
        takes: secs(5),
        ..Behaviour::default()
    };
    let c = Running::start(configmaps(&server), behaviour);
    sleep(secs(1)).await;
    for v in 2..5 {
        let mut changed = cm("a", "1");
        changed.data = Some(BTreeMap::from([("v".into(), v.to_string())]));
        server.put(&changed);
        sleep(ms(100)).await;
    }
    sleep(secs(20)).await;
    assert_eq!(c.ledger.peak(), 1);
    let starts = c.ledger.starts.lock().unwrap().clone();
    let values: Vec<_> = starts.iter().map(|(_, v, _)| v.as_str()).collect();
    assert_eq!(values, ["1", "4"], "the second run reads the latest object");
    c.stop().await;
}

/// Trailing-edge debounce: a burst of changes 1 s apart, with a 3 s debounce, is reconciled once,
/// 3 s after the last change (kube-runtime's rule); an isolated change waits 3 s.
#[tokio::test(start_paused = true)]
async fn debounce_reconciles_a_burst_once_after_the_last_change() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let controller = configmaps(&server).with_config(Config::default().debounce(secs(3)));
    let start = Instant::now();
    let c = Running::start(controller, Behaviour::default());
    sleep(secs(10)).await;
    assert_eq!(c.ledger.count("a"), 1);
    let first = c.ledger.starts.lock().unwrap()[0].2;
    assert_eq!(
        first - start,
        secs(3),
        "the initial list waits the debounce too"
    );
    let burst = Instant::now();
    for v in 2..6 {
        let mut changed = cm("a", "1");
        changed.data = Some(BTreeMap::from([("v".into(), v.to_string())]));
        server.put(&changed);
        sleep(secs(1)).await;
    }
    sleep(secs(10)).await;
    let starts = c.ledger.starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert_eq!(starts[1].1, "5");
    assert_eq!(
        starts[1].2 - burst,
        secs(3) + secs(3),
        "3 s after the last change (at 3 s)"
    );
    c.stop().await;
}

/// What a result does to the queue: `requeue(d)` runs the object again after `d`; an error
/// runs the error policy's `requeue(d)` after `d`; `await_change()` waits for a change.
#[tokio::test(start_paused = true)]
async fn results_map_onto_the_queue() {
    let server = ApiServer::new();
    for name in ["poll", "fail", "done"] {
        server.put(&cm(name, "1"));
    }
    let behaviour = Behaviour {
        takes: Duration::ZERO,
        result: |cm| match cm.name_any().as_str() {
            "poll" => Ok(Action::requeue(secs(10))),
            "fail" => Err(Failed("down".into())),
            _ => Ok(Action::await_change()),
        },
    };
    let c = Running::start(configmaps(&server), behaviour);
    sleep(secs(25)).await;
    // poll: at 0, 10, 20; fail: every 1 s (the policy's fixed requeue); done: once.
    assert_eq!(c.ledger.count("poll"), 3);
    assert!(
        (24..=26).contains(&c.ledger.count("fail")),
        "{}",
        c.ledger.count("fail")
    );
    assert_eq!(c.ledger.count("done"), 1);
    assert!(c.items().iter().any(|i| i == "failed fail down"));
    c.stop().await;
}

/// With `per_key_backoff`, the error policy's `requeue(1 s)` waits at least the limiter's delay:
/// 1 s while that is shorter, doubling beyond, so far fewer retries than a fixed 1 s.
#[tokio::test(start_paused = true)]
async fn per_key_backoff_makes_a_failing_object_wait_longer_each_time() {
    let server = ApiServer::new();
    server.put(&cm("fail", "1"));
    let behaviour = Behaviour {
        takes: Duration::ZERO,
        result: |_| Err(Failed("down".into())),
    };
    let controller = configmaps(&server).with_config(Config::default().per_key_backoff(true));
    let c = Running::start(controller, behaviour);
    sleep(secs(600)).await;
    let starts = c.ledger.starts.lock().unwrap().clone();
    let gaps: Vec<_> = starts.windows(2).map(|w| w[1].2 - w[0].2).collect();
    assert!(gaps.iter().all(|g| *g >= secs(1)), "{gaps:?}");
    assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
    // 1 s until 5 ms · 2^n passes it (n = 8: 1.28 s), then doubling: about 17 in ten minutes.
    assert!(
        (12..=20).contains(&starts.len()),
        "{} retries: {gaps:?}",
        starts.len()
    );
    c.stop().await;
}

/// Priorities as controller-runtime sets them: with one reconcile at a time, a change made while
/// the initial list is being served is reconciled before the rest of the list.
#[tokio::test(start_paused = true)]
async fn a_change_is_served_before_the_initial_list() {
    let server = ApiServer::new();
    for i in 0..10 {
        server.put(&cm(&format!("cm-{i}"), "1"));
    }
    let controller = configmaps(&server).with_config(Config::default().concurrency(1));
    let behaviour = Behaviour {
        takes: secs(1),
        ..Behaviour::default()
    };
    let c = Running::start(controller, behaviour);
    sleep(ms(1500)).await;
    server.put(&cm("changed", "1"));
    sleep(secs(20)).await;
    let names = c.ledger.names();
    let position = names.iter().position(|n| n == "changed").unwrap();
    assert!(position <= 2, "{names:?}");
    c.stop().await;
}

/// Graceful shutdown: reconciles in flight finish (their results are reported), nothing new
/// starts, and the stream ends.
#[tokio::test(start_paused = true)]
async fn graceful_shutdown_lets_in_flight_reconciles_finish() {
    let server = ApiServer::new();
    for i in 0..4 {
        server.put(&cm(&format!("cm-{i}"), "1"));
    }
    let controller = configmaps(&server).with_config(Config::default().concurrency(2));
    let behaviour = Behaviour {
        takes: secs(10),
        ..Behaviour::default()
    };
    let c = Running::start(controller, behaviour);
    sleep(secs(1)).await;
    let items = c.items.clone();
    let ledger = c.ledger.clone();
    let at = Instant::now();
    c.stop().await;
    assert_eq!(Instant::now() - at, secs(9), "the two in flight finished");
    assert_eq!(ledger.names().len(), 2, "nothing new started");
    assert_eq!(items.lock().unwrap().len(), 2, "both results reported");
}

/// `for_stream` reconciles the objects of a stream, reading them from the store it is given, once
/// that store is ready; the stream ending drains the queue and ends the controller's stream.
#[tokio::test(start_paused = true)]
async fn for_stream_waits_for_its_store_and_ends_with_its_stream() {
    let (reader, mut writer) = reflector::store::<ConfigMap>();
    let (a, b) = (cm("a", "1"), cm("b", "1"));
    let ledger = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let reconcile = {
        let ledger = ledger.clone();
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            *ledger.lock().unwrap().entry(cm.name_any()).or_default() += 1;
            async { Ok::<_, Failed>(Action::await_change()) }
        }
    };
    let objects = stream::iter([Ok(a.clone()), Ok(b.clone())]);
    let run = tokio::spawn(
        Controller::for_stream(objects, reader)
            .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
            .collect::<Vec<_>>(),
    );
    sleep(secs(10)).await;
    assert!(ledger.lock().unwrap().is_empty(), "the store is not ready");
    for event in [
        watcher::Event::Init,
        watcher::Event::InitApply(a),
        watcher::Event::InitApply(b),
        watcher::Event::InitDone,
    ] {
        writer.apply_watcher_event(&event);
    }
    let items = run.await.unwrap();
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(Result::is_ok));
    assert_eq!(ledger.lock().unwrap().len(), 2);
}

/// Fairness across namespaces: with one reconcile at a time, namespace b's one object is served
/// within two reconciles of namespace a's many.
#[tokio::test(start_paused = true)]
async fn fair_namespaces_serves_a_small_namespace_promptly() {
    let server = ApiServer::new();
    for i in 0..20 {
        server.put(&cm_in("a", &format!("cm-{i:02}"), "1"));
    }
    server.put(&cm_in("b", "lonely", "1"));
    let controller =
        configmaps(&server).with_config(Config::default().concurrency(1).fair_namespaces(true));
    let behaviour = Behaviour {
        takes: secs(1),
        ..Behaviour::default()
    };
    let c = Running::start(controller, behaviour);
    sleep(secs(30)).await;
    let names = c.ledger.names();
    let position = names.iter().position(|n| n == "lonely").unwrap();
    assert!(position <= 1, "{names:?}");
    c.stop().await;
}

/// The store `store()` returns is the controller's: it holds the listed objects.
#[tokio::test(start_paused = true)]
async fn store_is_the_controllers_store() {
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let controller = configmaps(&server);
    let store = controller.store();
    let c = Running::start(controller, Behaviour::default());
    sleep(secs(1)).await;
    assert_eq!(store.len(), 1);
    assert!(store.get(&ObjectRef::new("a").within("default")).is_some());
    assert_eq!(ConfigMap::kind(&()), "ConfigMap");
    c.stop().await;
}

/// A store whose writer is dropped before it became ready can never be read: the stream yields
/// kube-runtime's `RunnerError::Readiness` and ends, whether its trigger stream stays open or
/// ends (before, it waited for ever with an open one, and ended without an item with a finite
/// one).
#[tokio::test(start_paused = true)]
async fn a_dropped_writer_before_the_store_is_ready_yields_readiness() {
    for open in [true, false] {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let objects = stream::iter([Ok(cm("a", "1"))]);
        let objects = if open {
            objects.chain(stream::pending()).left_stream()
        } else {
            objects.right_stream()
        };
        let reconciled = Arc::new(Mutex::new(0));
        let reconcile = {
            let reconciled = reconciled.clone();
            move |_: Arc<ConfigMap>, _: Arc<()>| {
                *reconciled.lock().unwrap() += 1;
                async { Ok::<_, Failed>(Action::await_change()) }
            }
        };
        let run = tokio::spawn(
            Controller::for_stream(objects, reader)
                .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
                .map(|item| describe(&item))
                .collect::<Vec<_>>(),
        );
        sleep(secs(1)).await;
        drop(writer);
        let items = tokio::time::timeout(secs(3600), run)
            .await
            .unwrap_or_else(|_| panic!("open trigger {open}: the stream never ended"))
            .unwrap();
        assert_eq!(
            items,
            [
                "runner readiness gate failed to become ready: writer was dropped before store became ready"
            ],
            "open trigger {open}"
        );
        assert_eq!(*reconciled.lock().unwrap(), 0);
    }
}

/// A relist that keeps failing does not hold the reconciles for as long as it fails: the watch is
/// told to relist (a compaction: 410 Gone), and the API server goes down after the relist's first
/// page, for 5 minutes. Between failed lists the store holds the last complete list, and the
/// objects' requeue polls (every 10 s) go on from it, as in kube-runtime and client-go (before,
/// none ran in those 5 minutes). While a list is in flight, nothing starts.
#[tokio::test(start_paused = true)]
async fn a_relist_that_keeps_failing_does_not_hold_requeue_polls() {
    let server = ApiServer::new();
    for name in ["other", "poll"] {
        server.put(&cm(name, "1"));
    }
    server.set_max_page_size("configmaps", 1);
    let behaviour = Behaviour {
        takes: Duration::ZERO,
        result: |cm| match cm.name_any().as_str() {
            "poll" => Ok(Action::requeue(secs(10))),
            _ => Ok(Action::await_change()),
        },
    };
    let c = Running::start(configmaps(&server), behaviour);
    sleep(secs(2)).await;
    assert_eq!(c.ledger.count("poll"), 1);
    // The watch breaks while a change is made and the history compacted: its next watch is
    // answered 410 and it relists; the server goes down after the relist's first page.
    server.set_partition("default", Partition::Refused);
    server.put(&cm("new", "1"));
    server.compact();
    let pages = server.gate_lists("configmaps");
    sleep(secs(2)).await;
    server.set_partition("default", Partition::Connected);
    tokio::time::timeout(secs(60), pages.until_held(1))
        .await
        .expect("the watch relists");
    server.set_down(true);
    pages.open();
    sleep(secs(300)).await;
    let polls = c.ledger.count("poll") - 1;
    println!("{polls} polls in 300 s of failing relists");
    assert!(
        (25..=31).contains(&polls),
        "{polls} polls in 300 s of failing relists"
    );
    assert!(
        c.items().iter().any(|i| i.starts_with("watch ")),
        "the failing lists are reported"
    );
    server.set_down(false);
    c.stop().await;
}

/// With every trigger stream ended, the triggers still waiting for their debounce are reconciled
/// before the stream ends (before, they were dropped: a finite trigger stream with a debounce
/// reconciled nothing; kube-runtime drops whatever has not started); the requeues the reconciles
/// ask for are dropped, so the stream ends then and not 300 s later.
#[tokio::test(start_paused = true)]
async fn debounced_triggers_are_reconciled_after_every_trigger_ended() {
    let (reader, mut writer) = reflector::store::<ConfigMap>();
    let (a, b) = (cm("a", "1"), cm("b", "1"));
    for event in [
        watcher::Event::Init,
        watcher::Event::InitApply(a.clone()),
        watcher::Event::InitApply(b.clone()),
        watcher::Event::InitDone,
    ] {
        writer.apply_watcher_event(&event);
    }
    let reconciled = Arc::new(Mutex::new(Vec::new()));
    let reconcile = {
        let reconciled = reconciled.clone();
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            reconciled
                .lock()
                .unwrap()
                .push((cm.name_any(), Instant::now()));
            async { Ok::<_, Failed>(Action::requeue(secs(300))) }
        }
    };
    let start = Instant::now();
    let items = Controller::for_stream(stream::iter([Ok(a), Ok(b)]), reader)
        .with_config(Config::default().debounce(secs(3)))
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .collect::<Vec<_>>()
        .await;
    assert_eq!(
        items.len(),
        2,
        "{:?}",
        items.iter().map(describe).collect::<Vec<_>>()
    );
    let reconciled = reconciled.lock().unwrap().clone();
    let names: Vec<_> = reconciled.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert!(reconciled.iter().all(|(_, at)| *at - start == secs(3)));
    assert_eq!(Instant::now() - start, secs(3), "the requeues were dropped");
}

/// kube-runtime puts no bound on the context: one that is neither `Send` nor `Sync` (a `Cell`)
/// is given to the reconciler and the error policy, which run on the task that polls the stream
/// and need not be `Send` either.
#[tokio::test(start_paused = true)]
async fn a_context_that_is_neither_send_nor_sync() {
    use std::cell::Cell;
    use std::rc::Rc;
    let server = ApiServer::new();
    server.put(&cm("a", "1"));
    let calls = Rc::new(Cell::new(0u32));
    let reconcile = {
        let calls = calls.clone();
        move |_: Arc<ConfigMap>, ctx: Arc<Cell<u32>>| {
            calls.set(calls.get() + 1);
            ctx.set(ctx.get() + 1);
            async { Err::<Action, _>(Failed("once".into())) }
        }
    };
    // kube-runtime's signature takes an `Arc` of the context, whatever it holds.
    #[allow(clippy::arc_with_non_send_sync)]
    let context = Arc::new(Cell::new(0u32));
    let policy = |_: Arc<ConfigMap>, _: &Failed, ctx: Arc<Cell<u32>>| {
        ctx.set(ctx.get() + 100);
        Action::await_change()
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let items = configmaps(&server)
        .graceful_shutdown_on(async move {
            let _ = stop_rx.await;
        })
        .run(reconcile, policy, context.clone())
        .take(1)
        .collect::<Vec<_>>()
        .await;
    drop(stop_tx);
    assert_eq!(items.len(), 1);
    assert_eq!((calls.get(), context.get()), (1, 101));
}

/// A reconcile that computes before its first `.await` holds only its own object: on a runtime of
/// two threads, while its first poll runs (computing until every other object has been
/// reconciled, for at most 10 s), the other 50 are handed out and reconciled through the three
/// other slots (before, the stream's task polled each reconcile first and held every other
/// object behind it).
#[test]
fn a_reconcile_computing_before_its_first_await_holds_only_its_object() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (reader, mut writer) = reflector::store::<ConfigMap>();
    let objects: Vec<ConfigMap> = (0..=50).map(|i| cm(&format!("cm-{i:02}"), "1")).collect();
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in &objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let others = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let saw = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let reconcile = {
        let (others, saw) = (others.clone(), saw.clone());
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            let (others, saw) = (others.clone(), saw.clone());
            async move {
                use std::sync::atomic::Ordering::SeqCst;
                if cm.name_any() == "cm-00" {
                    let computing = std::time::Instant::now();
                    while others.load(SeqCst) < 50 && computing.elapsed() < secs(10) {
                        std::hint::spin_loop();
                    }
                    saw.store(others.load(SeqCst), SeqCst);
                } else {
                    others.fetch_add(1, SeqCst);
                }
                Ok::<_, Failed>(Action::await_change())
            }
        }
    };
    let objects = stream::iter(objects.into_iter().map(Ok));
    let items = runtime.block_on(
        Controller::for_stream(objects, reader)
            .with_config(Config::default().concurrency(4))
            .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
            .collect::<Vec<_>>(),
    );
    assert_eq!(items.len(), 51);
    assert_eq!(
        saw.load(std::sync::atomic::Ordering::SeqCst),
        50,
        "the others were reconciled while the first computed"
    );
}
