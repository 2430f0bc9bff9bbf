//! Replicas of the Lease protocol in one process, against one scripted API server, each on its
//! own named client (its own partitions and latency) and its own skewed clock; and a ledger of
//! every replica's beliefs ("I may run shard s until T"), recorded as each replica publishes
//! them, to check that no two replicas ever believe they hold one shard at the same instant.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::SignedDuration;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use workqueue_test_support::apiserver::ApiServer;

use crate::lease::{
    Assignment, Ended, HandOver, LeaseClock, LeaseConfig, Report, ShardLeases, SkewedClock,
    acknowledge_all,
};

pub const NAMESPACE: &str = "default";
pub const CONTROLLER: &str = "ctl";

// `millis`: the name the Lease tests use.
pub use workqueue_test_support::fixtures::{ms as millis, secs};

/// A clock `offset_secs` off 2025-01-01 running at `rate`.
pub fn clock(offset_secs: i64, rate: f64) -> SkewedClock {
    SkewedClock::new(SignedDuration::from_secs(offset_secs), rate)
}

/// The clocks of replicas r1, r2, ...: offsets of minutes either way, rates within 1%, the
/// fastest and the slowest first.
pub fn clock_of(index: usize) -> SkewedClock {
    const CLOCKS: [(i64, f64); 6] = [
        (300, 1.01),
        (-420, 0.99),
        (90, 1.005),
        (-45, 0.995),
        (1800, 1.0),
        (-1800, 1.008),
    ];
    let (offset, rate) = CLOCKS[index % CLOCKS.len()];
    clock(offset, rate)
}

pub fn config(identity: &str, shards: u32) -> LeaseConfig {
    let mut config = LeaseConfig::new(CONTROLLER, NAMESPACE, identity);
    config.shards = shards;
    config
}

/// What a replica's controller does with hand-overs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    /// Acknowledges at once ([`acknowledge_all`]).
    AcksAtOnce,
    /// Acknowledges after a delay (its in-flight work finishing).
    AcksAfter(Duration),
    /// Never acknowledges (keeps each request until the protocol ends).
    Never,
}

/// One running replica.
pub struct Replica {
    pub name: String,
    pub assignment: watch::Receiver<Assignment>,
    pub task: JoinHandle<Ended>,
    shutdown: Option<oneshot::Sender<()>>,
    process: usize,
    ledger: Ledger,
    /// What its protocol reported (as a controller's stream would show it), in order.
    pub reports: Arc<Mutex<Vec<Report>>>,
}

impl Replica {
    /// Asks it to leave (the shutdown future completes).
    pub fn shut_down(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Stops its protocol dead: its task is dropped, nothing released. Its controller is taken
    /// to run on until the last published `valid_until` (the ledger keeps its beliefs).
    pub fn kill(&self) {
        self.task.abort();
    }

    /// The whole process dies: its protocol and its controller, at once. Only then may a new
    /// process reuse its identity (a pod restarted in place).
    pub fn crash(&self) {
        self.task.abort();
        self.ledger.died(self.process, Instant::now());
    }

    pub fn held(&self) -> Vec<u32> {
        self.assignment.borrow().held().map(|(s, _)| s).collect()
    }

    pub fn held_count(&self) -> u32 {
        self.assignment.borrow().held_count()
    }

    pub fn assignment(&self) -> Assignment {
        self.assignment.borrow().clone()
    }
}

/// Starts a replica on the client `name` with `clock`.
pub fn start(
    server: &ApiServer,
    ledger: &Ledger,
    config: LeaseConfig,
    clock: impl LeaseClock,
    controller: Controller,
) -> Replica {
    let name = config.identity.clone();
    let (leases, events) = ShardLeases::new(server.client_named(&name), config).unwrap();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let leases = leases.with_clock(clock).with_reports({
        let reports = reports.clone();
        Arc::new(move |report| reports.lock().unwrap().push(report))
    });
    match controller {
        Controller::AcksAtOnce => {
            tokio::spawn(acknowledge_all(events.hand_overs));
        }
        Controller::AcksAfter(delay) => {
            let mut rx = events.hand_overs;
            tokio::spawn(async move {
                while let Some(hand_over) = rx.recv().await {
                    tokio::spawn(async move {
                        sleep(delay).await;
                        hand_over.acknowledge();
                    });
                }
            });
        }
        Controller::Never => {
            let mut rx = events.hand_overs;
            tokio::spawn(async move {
                let mut kept: Vec<HandOver> = Vec::new();
                while let Some(hand_over) = rx.recv().await {
                    kept.push(hand_over);
                }
            });
        }
    }
    let process = follow(ledger, &name, events.assignment.clone());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(leases.run(async move {
        let _ = rx.await;
    }));
    Replica {
        name,
        assignment: events.assignment,
        task,
        shutdown: Some(tx),
        process,
        ledger: ledger.clone(),
        reports,
    }
}

/// Every replica's beliefs that it may run a shard (the subject: the shard's number), recorded
/// as each replica publishes its [`Assignment`] (on paused time a recorder runs at the instant
/// of the change, before time moves on, so the record is exact): a belief lasts from when the
/// replica published the holding until it published its end or its `valid_until` passed,
/// whichever came first.
pub type Ledger = workqueue_test_support::ledger::Ledger<u32>;

/// Records a process's beliefs, from its published assignments; returns its process number.
fn follow(ledger: &Ledger, replica: &str, mut rx: watch::Receiver<Assignment>) -> usize {
    let process = ledger.process();
    let ledger = ledger.clone();
    let replica = replica.to_string();
    tokio::spawn(async move {
        // Shard -> its open belief: the run's index and the holding's epoch.
        let mut open: BTreeMap<u32, (usize, u64)> = BTreeMap::new();
        loop {
            let assignment = rx.borrow_and_update().clone();
            for shard in 0..assignment.shard_count() {
                let holding = assignment.state(shard).holding();
                if let Some(&(run, epoch)) = open.get(&shard) {
                    if let Some(h) = holding.filter(|h| h.epoch() == epoch) {
                        ledger.valid_until(run, h.valid_until());
                        continue;
                    }
                    ledger.end(run);
                    open.remove(&shard);
                }
                if let Some(h) = holding {
                    let run = ledger.begin(&replica, process, shard);
                    ledger.valid_until(run, h.valid_until());
                    open.insert(shard, (run, h.epoch()));
                }
            }
            if rx.changed().await.is_err() {
                // The protocol ended or was killed: the last published state stands until
                // its validity passes.
                return;
            }
        }
    });
    process
}

/// The identity of the holder of shard `shard`'s Lease as stored now (the holder is written
/// `{identity}_{instance}`).
pub fn stored_holder(server: &ApiServer, shard: u32) -> Option<String> {
    let lease: Lease = server.get_in(NAMESPACE, &format!("{CONTROLLER}-shard-{shard}"))?;
    holder_identity(&lease)
}

/// The identity part of a Lease's holder (`None`: vacant).
pub fn holder_identity(lease: &Lease) -> Option<String> {
    let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
    let identity = holder.rsplit_once('_').map_or(holder, |(id, _)| id);
    (!identity.is_empty()).then(|| identity.to_string())
}

/// The identity holding replica `identity`'s membership Lease (`None`: vacant or absent).
pub fn member_holder(server: &ApiServer, identity: &str) -> Option<String> {
    let lease: Lease = server.get_in(NAMESPACE, &format!("{CONTROLLER}-member-{identity}"))?;
    holder_identity(&lease)
}

/// Waits (on tokio's clock) until `done` holds, checking every 100 ms; panics with `what`
/// after `limit`.
pub async fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        sleep(millis(100)).await;
    }
    start.elapsed()
}

/// Whether the replicas hold every shard between them, each within one of a fair share.
pub fn settled(replicas: &[&Replica], shards: u32) -> bool {
    let counts: Vec<u32> = replicas.iter().map(|r| r.held_count()).collect();
    let k = replicas.len() as u32;
    let (floor, ceil) = (shards / k, shards.div_ceil(k));
    counts.iter().sum::<u32>() == shards && counts.iter().all(|&c| floor <= c && c <= ceil)
}
