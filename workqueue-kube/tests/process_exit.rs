//! When a replica's process ends itself, in child processes on real time.
//!
//! The lease guard: a reconcile that blocks its runtime's thread (computing without awaiting)
//! for twice the lease duration, on a `current_thread` runtime and on a `multi_thread` runtime
//! with one worker. The renewals and the watchdog are starved, so the standby takes the shard a
//! lease duration after the last renewal while the blocked reconcile runs on; the guard's thread
//! must end the process before that. And `OnLoss::Exit`: a replica cut from the API server ends
//! its process once its shard is lost.
//!
//! Real time and real processes: a blocked thread is the fault, and only the process's exit
//! ends it. Each test runs itself again as a child process (`current_exe`, the scenario named
//! by an environment variable), which runs the replicas against one scripted API server: the
//! leader on the runtime under test (the main thread), the standby on a runtime of its own
//! thread. The child prints a line for each step; the parent judges its exit status and the
//! lines. For the guard: the standby never reconciled (the child ended first), and the blocked
//! reconcile never came back; without the guard the child runs to its end, the standby
//! reconciles, and the reconcile comes back: the test fails. For `OnLoss::Exit`: the child ends
//! with `EXIT_LOST`, where `Rejoin` would run it to its end.

// Each test binary uses a part of it.
#[allow(dead_code, unused_imports)]
mod lease_support;

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher;
use workqueue_kube::controller::{Action, Controller};
use workqueue_kube::lease::{EXIT_LOST, EXIT_UNSTOPPABLE, LeaseConfig, OnLoss};

use lease_support::{CONTROLLER, NAMESPACE};
use workqueue_test_support::apiserver::{ApiServer, Partition};
use workqueue_test_support::fixtures::cm;

/// The environment variable that makes a run of this binary the child of a scenario.
const CHILD: &str = "WORKQUEUE_KUBE_BLOCKED_RUNTIME_CHILD";

const LEASE: Duration = Duration::from_secs(5);
const RENEW: Duration = Duration::from_secs(2);

/// The steps the child prints (one line each).
const LEADER_RECONCILED: &str = "leader reconciled";
const STANDBY_JOINED: &str = "standby joined";
const BLOCKING: &str = "leader's reconcile blocks its thread";
const UNBLOCKED: &str = "leader's reconcile came back";
const TAKEOVER: &str = "standby reconciled";
const CHILD_END: &str = "child ran to its end";
const PARTITIONED: &str = "leader cut from the API server";

fn config(identity: &str) -> LeaseConfig {
    let mut config = LeaseConfig::leader_election(CONTROLLER, NAMESPACE, identity);
    config.lease_duration = LEASE;
    config.renew_deadline = RENEW;
    config.retry_period = Duration::from_millis(500);
    config
}

#[test]
fn a_blocked_current_thread_runtime_ends_the_process_before_the_standby_takes_over() {
    scenario(
        "current_thread",
        "a_blocked_current_thread_runtime_ends_the_process_before_the_standby_takes_over",
    );
}

#[test]
fn a_blocked_single_worker_runtime_ends_the_process_before_the_standby_takes_over() {
    scenario(
        "multi_thread_1",
        "a_blocked_single_worker_runtime_ends_the_process_before_the_standby_takes_over",
    );
}

#[test]
fn a_replica_set_to_exit_on_loss_ends_its_process_when_its_shard_is_lost() {
    let test = "a_replica_set_to_exit_on_loss_ends_its_process_when_its_shard_is_lost";
    let Some(child) = spawn_child("exit_on_loss", test) else {
        return;
    };
    for step in [LEADER_RECONCILED, PARTITIONED] {
        assert!(
            child.said(step),
            "the child never said {step:?}: {}",
            child.context
        );
    }
    assert_eq!(child.code, Some(EXIT_LOST), "{}", child.context);
    assert!(child.stderr.contains("OnLoss::Exit"), "{}", child.context);
    assert!(!child.said(CHILD_END), "{}", child.context);
}

/// In the parent: runs the child for `flavor` and judges it. In a child: runs the child's
/// scenario if it is this one.
fn scenario(flavor: &str, test: &str) {
    let Some(child) = spawn_child(flavor, test) else {
        return;
    };
    let context = &child.context;
    // The ledger of the child's steps: the scenario happened up to the block.
    for step in [LEADER_RECONCILED, STANDBY_JOINED, BLOCKING] {
        assert!(child.said(step), "the child never said {step:?}: {context}");
    }
    assert_eq!(
        child.code,
        Some(EXIT_UNSTOPPABLE),
        "not ended by the lease guard: {context}"
    );
    assert!(
        child.stderr.contains("was still running"),
        "the guard says why: {context}"
    );
    assert!(
        !child.said(TAKEOVER),
        "the standby took over first: {context}"
    );
    assert!(
        !child.said(UNBLOCKED),
        "the blocked reconcile came back: {context}"
    );
    assert!(!child.said(CHILD_END), "{context}");
}

/// What a child process did.
struct Child {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    context: String,
}

impl Child {
    /// Whether the child printed `step`.
    fn said(&self, step: &str) -> bool {
        // libtest may print its own words before a step's on the same line.
        let step = format!("[child] {step}");
        self.stdout.lines().any(|line| line.ends_with(&step))
    }
}

/// In the parent: runs this binary's `test` as a child process for `flavor`, and returns what
/// it did. In a child: runs the child's scenario if it is `flavor`, and returns `None`.
fn spawn_child(flavor: &str, test: &str) -> Option<Child> {
    if let Ok(child) = std::env::var(CHILD) {
        if child == flavor {
            run_child(flavor);
        }
        return None;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, flavor)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let context = format!(
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    Some(Child {
        code: output.status.code(),
        stdout,
        stderr,
        context,
    })
}

fn say(step: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "[child] {step}");
    let _ = out.flush();
}

/// The child: the leader on the runtime under test, then the standby; once the standby has
/// joined, the leader's reconcile blocks its thread for twice the lease duration.
fn run_child(flavor: &str) {
    if flavor == "exit_on_loss" {
        return exit_on_loss_child();
    }
    let server = ApiServer::new();
    server.put(&cm("work-0", "1"));
    let block = Arc::new(AtomicBool::new(false));
    let reconciled = Arc::new(AtomicBool::new(false));
    {
        let (server, block, reconciled) = (server.clone(), block.clone(), reconciled.clone());
        std::thread::spawn(move || direct(&server, &block, &reconciled));
    }
    let runtime = match flavor {
        "current_thread" => tokio::runtime::Builder::new_current_thread(),
        _ => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(1);
            builder
        }
    }
    .enable_all()
    .build()
    .unwrap();
    runtime.block_on(async move {
        let reconcile = move |_: Arc<ConfigMap>, _: Arc<()>| {
            let (block, reconciled) = (block.clone(), reconciled.clone());
            async move {
                if !reconciled.swap(true, Ordering::AcqRel) {
                    say(LEADER_RECONCILED);
                }
                if block.swap(false, Ordering::AcqRel) {
                    say(BLOCKING);
                    // Computing without awaiting: nothing else runs on this thread meanwhile.
                    std::thread::sleep(LEASE * 2);
                    say(UNBLOCKED);
                }
                Ok::<_, std::io::Error>(Action::requeue(Duration::from_millis(100)))
            }
        };
        Controller::new(
            Api::<ConfigMap>::all(server.client_named("leader")),
            watcher::Config::default(),
        )
        .leases(config("leader"))
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .for_each(|_| async {})
        .await;
    });
}

/// The child's director, on a thread of its own: starts the standby once the leader
/// reconciled, blocks the leader's reconcile once the standby may hold shards, and ends the
/// child three lease durations later (only if the guard did not end it first).
fn direct(server: &ApiServer, block: &AtomicBool, reconciled: &AtomicBool) {
    wait(Duration::from_secs(20), || {
        reconciled.load(Ordering::Acquire)
    });
    {
        let server = server.clone();
        std::thread::spawn(move || standby(&server));
    }
    wait(Duration::from_secs(20), || {
        lease_support::leases(server).iter().any(|lease| {
            lease.metadata.name.as_deref() == Some("ctl-member-standby")
                && lease
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("workqueue-kube/held"))
        })
    });
    say(STANDBY_JOINED);
    block.store(true, Ordering::Release);
    std::thread::sleep(LEASE * 3);
    say(CHILD_END);
    std::process::exit(0);
}

/// The standby, on a runtime of its own: says when it reconciles (it then holds the shard).
fn standby(server: &ApiServer) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let reconcile = |_: Arc<ConfigMap>, _: Arc<()>| async {
            say(TAKEOVER);
            Ok::<_, std::io::Error>(Action::await_change())
        };
        Controller::new(
            Api::<ConfigMap>::all(server.client_named("standby")),
            watcher::Config::default(),
        )
        .leases(config("standby"))
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .for_each(|_| async {})
        .await;
    });
}

/// Waits (real time: the child's clocks are real) until `done`, at most `limit`.
fn wait(limit: Duration, done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        if start.elapsed() > limit {
            say("the child gave up waiting");
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `OnLoss::Exit` child: a leader set to exit on loss, cut from the API server once it
/// reconciled; it ends the child three lease durations later if nothing did before.
fn exit_on_loss_child() {
    let server = ApiServer::new();
    server.put(&cm("work-0", "1"));
    let reconciled = Arc::new(AtomicBool::new(false));
    {
        let (server, reconciled) = (server.clone(), reconciled.clone());
        std::thread::spawn(move || {
            wait(Duration::from_secs(20), || {
                reconciled.load(Ordering::Acquire)
            });
            server.set_partition("leader", Partition::Refused);
            say(PARTITIONED);
            std::thread::sleep(LEASE * 3);
            say(CHILD_END);
            std::process::exit(0);
        });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let reconcile = move |_: Arc<ConfigMap>, _: Arc<()>| {
            let reconciled = reconciled.clone();
            async move {
                if !reconciled.swap(true, Ordering::AcqRel) {
                    say(LEADER_RECONCILED);
                }
                Ok::<_, std::io::Error>(Action::requeue(Duration::from_millis(100)))
            }
        };
        let mut config = config("leader");
        config.on_loss = OnLoss::Exit;
        Controller::new(
            Api::<ConfigMap>::all(server.client_named("leader")),
            watcher::Config::default(),
        )
        .leases(config)
        .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()))
        .for_each(|_| async {})
        .await;
    });
}
