//! Leader election (the Lease protocol with one shard): two replicas against one scripted API
//! server, each on its own client and its own clock (offsets of minutes, rates within 1%), on
//! tokio's paused clock. Every test checks, from each replica's published beliefs, that the two
//! never believe they hold the shard at the same instant.

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::{Instant, sleep};

use crate::lease::{Ended, OnLoss};

use super::support::*;
use workqueue_test_support::apiserver::{ApiServer, Partition};

const LEASE: u64 = 15;
const RETRY: u64 = 2;
const RENEW: u64 = 10;

fn shard_lease(server: &ApiServer) -> Lease {
    server
        .get_in(NAMESPACE, &format!("{CONTROLLER}-shard-0"))
        .unwrap()
}

/// Two replicas: one leader, a stable one (no hand-over back and forth), and a failover within
/// lease duration + retry period + 1 s when the leader dies without releasing.
#[tokio::test(start_paused = true)]
async fn one_leader_at_a_time_and_failover_when_it_dies() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    for name in ["r1", "r2"] {
        server.set_latency(name, millis(5), millis(5));
    }
    let r1 = start(
        &server,
        &ledger,
        config("r1", 1),
        clock_of(0),
        Controller::AcksAtOnce,
    );
    let r2 = start(
        &server,
        &ledger,
        config("r2", 1),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    let elected = until(secs(10), "a leader", || {
        r1.held_count() + r2.held_count() == 1
    })
    .await;
    println!("elected after {elected:?}");
    let (leader, standby) = if r1.held_count() == 1 {
        (&r1, &r2)
    } else {
        (&r2, &r1)
    };
    sleep(secs(60)).await;
    assert_eq!(
        (leader.held(), standby.held()),
        (vec![0], vec![]),
        "the leader stays"
    );
    assert_eq!(leader.assignment().stats().hand_overs(), 0);
    assert_eq!(leader.assignment().members(), 2);
    assert_eq!(stored_holder(&server, 0), Some(leader.name.clone()));

    let killed = Instant::now();
    leader.kill();
    until(secs(30), "the standby takes over", || {
        standby.held_count() == 1
    })
    .await;
    assert_eq!(stored_holder(&server, 0), Some(standby.name.clone()));
    let taken = ledger.taken_after(0, killed).unwrap();
    let failover = taken.start - killed;
    println!("failover {failover:?} after the leader died");
    assert_eq!(taken.replica, standby.name);
    assert!(
        failover <= secs(LEASE + RETRY + 1),
        "failover took {failover:?}"
    );

    // The dead one comes back (a new process, same identity): it stands by.
    let back = start(
        &server,
        &ledger,
        config(&leader.name, 1),
        clock_of(2),
        Controller::AcksAtOnce,
    );
    sleep(secs(60)).await;
    assert_eq!((standby.held(), back.held()), (vec![0], vec![]));
    let (checked, gap) = ledger.assert_never_two_at_once();
    println!("{checked} beliefs, smallest gap between holders {gap:?}");
}

/// A leader cut off from the API server, its requests unanswered (blackholed) or refused,
/// stops believing it leads before the other can take the Lease; when the partition heals it
/// stands by.
#[tokio::test(start_paused = true)]
async fn a_partitioned_leader_stops_before_the_other_takes_over() {
    for partition in [Partition::Blackholed, Partition::Refused] {
        let server = ApiServer::new();
        let ledger = Ledger::new();
        // The worst case: the leader's clock slow (its renew deadline lasts longest), the
        // standby's fast (the lease expires soonest by it).
        let slow = start(
            &server,
            &ledger,
            config("slow", 1),
            clock(-420, 0.99),
            Controller::AcksAtOnce,
        );
        until(secs(10), "the slow one leads", || slow.held_count() == 1).await;
        let fast = start(
            &server,
            &ledger,
            config("fast", 1),
            clock(300, 1.01),
            Controller::AcksAtOnce,
        );
        sleep(secs(30)).await;
        assert_eq!((slow.held(), fast.held()), (vec![0], vec![]));

        let cut = Instant::now();
        server.set_partition("slow", partition);
        until(secs(40), "the fast one takes over", || {
            fast.held_count() == 1
        })
        .await;
        let beliefs = ledger.runs();
        let lost = beliefs.iter().find(|b| b.replica == "slow").unwrap();
        // A belief always has its validity: it has an end.
        let lost = lost.end().unwrap();
        let taken = ledger.taken_after(0, cut).unwrap();
        assert_eq!(taken.replica, "fast");
        let margin = taken.start - lost;
        println!(
            "{partition:?}: cut at 0, leader stopped at {:?}, taken at {:?}, margin {margin:?}",
            lost - cut,
            taken.start - cut
        );
        assert!(lost < taken.start);
        assert!(
            lost - cut <= secs(RENEW),
            "the leader believed for {:?}",
            lost - cut
        );
        // The margin is at least lease / 1.01 - renew deadline / 0.99: the time the controller
        // has to abort the lost shard's work.
        assert!(margin >= millis(4_700), "margin {margin:?}");
        assert!(taken.start - cut <= secs(LEASE + RETRY + 1));

        server.set_partition("slow", Partition::Connected);
        sleep(secs(60)).await;
        assert_eq!(
            (slow.held(), fast.held()),
            (vec![], vec![0]),
            "{partition:?}: no flapping"
        );
        assert!(slow.assignment().stats().losses() >= 1);
        ledger.assert_never_two_at_once();
    }
}

/// A leader that shuts down hands over, releases the Lease (no holder) and leaves the
/// membership; the standby takes over at its next retry period, not after expiry.
#[tokio::test(start_paused = true)]
async fn a_leader_that_shuts_down_releases_and_the_standby_takes_over_at_once() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let mut r1 = start(
        &server,
        &ledger,
        config("r1", 1),
        clock_of(0),
        Controller::AcksAtOnce,
    );
    until(secs(10), "r1 leads", || r1.held_count() == 1).await;
    let r2 = start(
        &server,
        &ledger,
        config("r2", 1),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    sleep(secs(20)).await;
    let asked = Instant::now();
    r1.shut_down();
    let ended = (&mut r1.task).await.unwrap();
    assert_eq!(ended, Ended::Shutdown);
    let left = asked.elapsed();
    assert!(left < secs(1), "leaving took {left:?}");
    assert_eq!(r1.assignment().stats().releases(), 1);
    assert_eq!(member_holder(&server, "r1"), None, "vacated");
    let took = until(secs(RETRY + 1), "r2 takes over", || r2.held_count() == 1).await;
    println!("left in {left:?}, taken {took:?} after");
    assert!(took <= secs(RETRY) + millis(100));
    ledger.assert_never_two_at_once();
}

/// With `OnLoss::Stop`, a leader that loses its Lease leaves and `run` returns `Lost`, within the
/// renew deadline plus a retry period of its last renewal.
#[tokio::test(start_paused = true)]
async fn a_leader_set_to_stop_on_loss_returns_lost() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let mut config = config("r1", 1);
    config.on_loss = OnLoss::Stop;
    let mut r1 = start(
        &server,
        &ledger,
        config,
        clock_of(1),
        Controller::AcksAtOnce,
    );
    until(secs(10), "r1 leads", || r1.held_count() == 1).await;
    sleep(secs(7)).await;
    let cut = Instant::now();
    server.set_partition("r1", Partition::Refused);
    let ended = (&mut r1.task).await.unwrap();
    assert_eq!(ended, Ended::Lost { shard: Some(0) });
    let took = cut.elapsed();
    println!("stopped {took:?} after the partition");
    assert!(took <= secs(RENEW + RETRY), "{took:?}");
    assert_eq!(r1.held_count(), 0);
    ledger.assert_never_two_at_once();
}

/// A replica of the same protocol run by the test: its membership Lease, renewed by hand with
/// a `renewTime` an hour off, and shard Leases naming it.
fn ghost(kind: &str, name: &str, renew_time: &str, counter: u32) -> Lease {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{CONTROLLER}-{kind}-{name}"),
            "namespace": NAMESPACE,
            "labels": { "workqueue-kube/controller": CONTROLLER, "workqueue-kube/lease-role": kind },
            "annotations": {
                "workqueue-kube/shards": "2",
                "workqueue-kube/protocol": "2",
                "workqueue-kube/renewal": counter.to_string(),
            },
        },
        "spec": {
            "holderIdentity": "ghost_0000000000000001",
            "leaseDurationSeconds": 15,
            "renewTime": renew_time,
        },
    }))
    .unwrap()
}

/// Expiry is judged by the observer's clock from the first sight of each version, never from
/// the `renewTime` the holder wrote: a member whose clock is an hour behind keeps its shards
/// while it renews its membership Lease, and loses them a lease duration after its last
/// renewal as the observer saw it.
#[tokio::test(start_paused = true)]
async fn expiry_is_judged_from_the_last_change_seen_not_from_renew_time() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    // The ghost holds both shards and renews its membership every 2 s, an hour behind.
    let behind = "2024-12-31T23:00:00.000000Z";
    server.put(&ghost("member", "ghost", behind, 0));
    server.put(&ghost("shard", "0", behind, 0));
    server.put(&ghost("shard", "1", behind, 0));
    let r1 = start(
        &server,
        &ledger,
        config("r1", 2),
        clock_of(0),
        Controller::AcksAtOnce,
    );
    for i in 1..=20 {
        sleep(secs(RETRY)).await;
        server.put(&ghost("member", "ghost", behind, i));
        assert_eq!(r1.held_count(), 0, "r1 took a shard of a live member");
    }
    let stopped = Instant::now();
    until(
        secs(LEASE + RETRY + 1),
        "r1 takes both once the ghost stops",
        || r1.held_count() == 2,
    )
    .await;
    let after = stopped.elapsed();
    println!("taken {after:?} after the ghost's last renewal");
    // Not before a lease duration on r1's clock (1% fast) since it last saw a change.
    assert!(after >= millis(14_850), "{after:?}");
    assert_eq!(member_holder(&server, "ghost"), None, "fenced");
    let lease = shard_lease(&server);
    assert_eq!(holder_identity(&lease).as_deref(), Some("r1"));
    // r1's own wall time, 5 minutes ahead of 2025-01-01 plus the time it ran.
    let renewed = lease.spec.unwrap().renew_time.unwrap().0;
    assert!(renewed.as_second() > 1_735_689_600 + 300, "{renewed}");
    ledger.assert_never_two_at_once();
}
