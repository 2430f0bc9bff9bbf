//! The seam against kube-runtime's real watcher, on the scripted API server and paused time:
//! the keys and priorities it yields through an initial list, changes, an outage and a relist,
//! and the errors it passes on for the runner to skip.

use std::time::Duration;

use futures_util::stream::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio::time::sleep;
use workqueue_kube::sources::{AddOptions, LOW_PRIORITY, keys, prioritized};

use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::cm;

/// What the stream yielded since the last call: keys with priorities, and how many errors.
fn drain(
    rx: &mut mpsc::UnboundedReceiver<Result<(String, i32), String>>,
) -> (Vec<(String, i32)>, usize) {
    let (mut keys, mut errors) = (Vec::new(), 0);
    while let Ok(item) = rx.try_recv() {
        match item {
            Ok(key) => keys.push(key),
            Err(_) => errors += 1,
        }
    }
    (keys, errors)
}

/// The priority `opts` add at: the sources add at 0 or at `LOW_PRIORITY`, with no other option.
fn priority_of(opts: AddOptions) -> i32 {
    if opts == AddOptions::new().priority(LOW_PRIORITY) {
        return LOW_PRIORITY;
    }
    assert_eq!(opts, AddOptions::new(), "options other than a priority");
    0
}

fn low(name: &str) -> (String, i32) {
    (name.into(), LOW_PRIORITY)
}

fn normal(name: &str) -> (String, i32) {
    (name.into(), 0)
}

/// controller-runtime's rule on a real watch: the initial list at LOW; a change at 0; after an
/// outage long enough to need a relist, an object whose resourceVersion did not change is at LOW
/// again, a changed or new one at 0. The watcher's errors meanwhile are items, not the end of
/// the stream.
#[tokio::test(start_paused = true)]
async fn initial_list_low_changes_normal_relist_low_only_when_unchanged() {
    let api = ApiServer::new();
    for name in ["a", "b", "gone"] {
        api.put(&cm(name, "1"));
    }
    let events = watcher(
        Api::<ConfigMap>::all(api.client()),
        watcher::Config::default(),
    );
    // The backoff after the stages, where the watcher's `Init` events no longer reset it.
    let mut stream = keys(prioritized(events))
        .default_backoff()
        .map(|item| {
            item.map(|(key, opts)| (key.name, priority_of(opts)))
                .map_err(|e| e.to_string())
        })
        .boxed();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Some(item) = stream.next().await {
            tx.send(item).unwrap();
        }
    });
    sleep(Duration::from_secs(1)).await;
    assert_eq!(drain(&mut rx), (vec![low("a"), low("b"), low("gone")], 0));

    api.put(&cm("a", "2"));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(drain(&mut rx), (vec![normal("a")], 0));

    // An outage; meanwhile b changes, c appears, `gone` is deleted, and the history is compacted:
    // the watcher must relist.
    api.set_down(true);
    sleep(Duration::from_secs(10)).await;
    api.put(&cm("b", "2"));
    api.put(&cm("c", "1"));
    api.delete::<ConfigMap>("gone");
    api.compact();
    api.set_down(false);
    sleep(Duration::from_secs(60)).await;
    let (keys, errors) = drain(&mut rx);
    assert_eq!(keys, [low("a"), normal("b"), normal("c")]);
    // The failed watches and lists during the outage, and the "410 Gone".
    assert!(errors >= 2, "{errors} errors");
    // (`gone` is not reported: a relist does not say what it no longer returns.)
    assert!(!reader.is_finished(), "the stream goes on after its errors");
    reader.abort();
}
