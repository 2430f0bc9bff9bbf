//! `Runner::poll_while`: a running reconcile is polled only while the rule holds for its key;
//! once it says no, the reconcile's future is dropped before its next poll, as an aborted one
//! is. Tokio's paused clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::{Instant, sleep};
use workqueue_tokio::CancellationToken;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Runner};

/// Every poll of every reconcile (the key and when), and every reconcile started.
#[derive(Clone, Default)]
struct Ledger {
    polls: Arc<Mutex<Vec<(String, Instant)>>>,
    starts: Arc<Mutex<Vec<String>>>,
}

/// A reconcile of "a/…" stops being polled once its rule says no (no poll after, its future
/// dropped, no item, no re-add since it no longer belongs either); "b/…", whose rule holds,
/// runs to its end.
#[tokio::test(start_paused = true)]
async fn a_reconcile_is_not_polled_once_the_rule_says_no() {
    let ledger = Ledger::default();
    let held = Arc::new(AtomicBool::new(true));
    let queue: WorkQueue<String> = WorkQueue::new();
    queue.add_batch(["a/1".to_string(), "b/1".to_string()]);
    let reconcile = {
        let ledger = ledger.clone();
        move |key: String, _ctx| {
            ledger.starts.lock().unwrap().push(key.clone());
            let polls = ledger.polls.clone();
            // Ten steps of a second each.
            let mut work = Box::pin(async {
                for _ in 0..10 {
                    sleep(Duration::from_secs(1)).await;
                }
            });
            std::future::poll_fn(move |cx| {
                polls.lock().unwrap().push((key.clone(), Instant::now()));
                match work.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Ok::<_, std::io::Error>(Action::await_change())),
                    Poll::Pending => Poll::Pending,
                }
            })
        }
    };
    let rule = {
        let held = held.clone();
        move |key: &String| !key.starts_with("a/") || held.load(Ordering::Acquire)
    };
    let runner = Runner::new(queue.clone(), reconcile)
        .workers(2)
        .belongs(rule.clone())
        .poll_while(rule);
    let start = Instant::now();
    let results = tokio::spawn(
        runner
            .results(CancellationToken::new())
            .map(|item| item.map(|(key, _)| key).map_err(|e| format!("{e:?}")))
            .collect::<Vec<_>>(),
    );
    sleep(Duration::from_millis(3500)).await;
    held.store(false, Ordering::Release);
    let said_no = Instant::now();
    sleep(Duration::from_secs(20)).await;
    queue.shut_down();
    let results = results.await.unwrap();

    let polls = ledger.polls.lock().unwrap().clone();
    // The seconds at which a key's reconcile was polled.
    let of = |prefix: &str| -> Vec<u64> {
        let mut at: Vec<u64> = polls
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .map(|(_, at)| (*at - start).as_secs())
            .collect();
        at.dedup();
        at
    };
    assert_eq!(of("a/"), [0, 1, 2, 3], "{polls:?}");
    assert!(
        polls
            .iter()
            .all(|(key, at)| !key.starts_with("a/") || *at < said_no),
        "a/1 polled after its rule said no: {polls:?}"
    );
    assert_eq!(of("b/"), (0..=10).collect::<Vec<_>>(), "b/1 ran its steps");
    assert_eq!(results, vec![Ok("b/1".to_string())]);
    assert_eq!(
        *ledger.starts.lock().unwrap(),
        ["a/1", "b/1"],
        "no retry of a/1"
    );
}
