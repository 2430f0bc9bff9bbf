//! A replica whose process is frozen (a `SIGSTOP`, a paused VM) past its shards' deadline and
//! then thawed, on tokio's paused clock: `tokio::time::advance` jumps the clock with no task
//! running in between, as a thawed process finds every timer due at once. The reconciles that
//! were waiting when it froze must not be polled again: the runner asks the shard's deadline
//! before each poll, whatever order the thawed tasks run in (the watchdog's abort may come
//! after the reconciles' own timers).

// Each test binary uses a part of it.
#[allow(dead_code)]
mod lease_support;

use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::time::{Instant, advance, sleep};
use workqueue_kube::controller::{Action, Controller};
use workqueue_kube::lease::{self, LeaseConfig};

use lease_support::{CONTROLLER, NAMESPACE, secs, until};
use workqueue_test_support::apiserver::{ApiServer, Partition};
use workqueue_test_support::fixtures::cm;

/// One poll of a reconcile's future: the object, when, and its shard's deadline then.
#[derive(Clone, Debug)]
struct Polled {
    object: String,
    at: Instant,
    deadline: Option<Instant>,
}

/// Every poll of every reconcile, and the objects whose reconcile future is gone (returned or
/// dropped), with whether it returned.
#[derive(Clone, Default)]
struct Polls {
    polls: Arc<Mutex<Vec<Polled>>>,
    ended: Arc<Mutex<Vec<(String, bool)>>>,
}

/// Marks its reconcile's end when dropped: returned if `returned` was set first.
struct EndGuard {
    polls: Polls,
    object: String,
    returned: bool,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        let end = (self.object.clone(), self.returned);
        self.polls.ended.lock().unwrap().push(end);
    }
}

/// A frozen and thawed process polls no reconcile of a shard past the shard's deadline: every
/// poll the ledger saw was before the deadline its reconcile read at that poll, none came after
/// the thaw, and each reconcile waiting at the freeze ended dropped, not returned.
#[tokio::test(start_paused = true)]
async fn a_thawed_replica_polls_no_reconcile_past_its_deadline() {
    let server = ApiServer::new();
    let objects = ["cm-0", "cm-1", "cm-2", "cm-3"];
    for name in objects {
        server.put(&cm(name, "1"));
    }
    let polls = Polls::default();
    let reconcile = {
        let polls = polls.clone();
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            let polls = polls.clone();
            let object = cm.name_any();
            let mut guard = EndGuard {
                polls: polls.clone(),
                object: object.clone(),
                returned: false,
            };
            // A reconcile that works in steps of a second (each step a write, say) for a minute.
            let mut work = Box::pin(async {
                for _ in 0..60 {
                    sleep(secs(1)).await;
                }
            });
            let mut done = false;
            std::future::poll_fn(move |cx| {
                // The whole guard, not its field alone: it must live as long as the future.
                let guard = &mut guard;
                polls.polls.lock().unwrap().push(Polled {
                    object: object.clone(),
                    at: Instant::now(),
                    deadline: lease::deadline(),
                });
                if done || work.as_mut().poll(cx).is_ready() {
                    done = true;
                    guard.returned = true;
                    return Poll::Ready(Ok::<_, std::io::Error>(Action::await_change()));
                }
                Poll::Pending
            })
        }
    };
    let run = tokio::spawn(
        Controller::new(
            Api::<ConfigMap>::all(server.client_named("r1")),
            watcher::Config::default(),
        )
        .leases(LeaseConfig::leader_election(CONTROLLER, NAMESPACE, "r1"))
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .for_each(|_| async {}),
    );
    until(secs(30), "every object's reconcile polled", || {
        let polls = polls.polls.lock().unwrap();
        objects
            .iter()
            .all(|o| polls.iter().filter(|p| p.object == *o).count() >= 3)
    })
    .await;
    assert!(
        polls.ended.lock().unwrap().is_empty(),
        "every reconcile waits at the freeze"
    );
    // The freeze: the other replicas fence this one meanwhile, so its renewals after the thaw
    // never succeed (here: they hang). No task runs between the partition and the jump.
    server.set_partition("r1", Partition::Blackholed);
    let frozen = Instant::now();
    advance(secs(30)).await;
    let thawed = frozen + secs(30);
    sleep(secs(30)).await;
    run.abort();

    let polls_seen = polls.polls.lock().unwrap().clone();
    let before: Vec<&Polled> = polls_seen.iter().filter(|p| p.at < frozen).collect();
    assert!(before.len() >= objects.len() * 3, "{before:?}");
    for poll in &polls_seen {
        let deadline = poll.deadline.expect("a reconcile on Leases has a deadline");
        assert!(
            poll.at < deadline,
            "{} polled at {:?} past its deadline {:?} (frozen at {frozen:?})",
            poll.object,
            poll.at,
            deadline
        );
    }
    let after: Vec<&Polled> = polls_seen.iter().filter(|p| p.at >= thawed).collect();
    assert!(after.is_empty(), "polled after the thaw: {after:?}");
    let mut ended = polls.ended.lock().unwrap().clone();
    ended.sort();
    let dropped: Vec<(String, bool)> = objects.iter().map(|o| (o.to_string(), false)).collect();
    assert_eq!(ended, dropped, "each reconcile dropped, none returned");
}
