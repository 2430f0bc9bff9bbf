//! The faults of issue 29 against the Lease protocol alone, on the scripted API server and
//! tokio's paused clock: a slow API server, a restart under the same identity, two processes
//! given one identity, a wall clock that stands still, and a shard Lease deleted by a third
//! party. Each checks, from every replica's published beliefs, that no two replicas ever
//! believe they hold one shard at once, and that it judged the beliefs the scenario makes.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use tokio::time::{Instant, sleep};
use workqueue_test_support::apiserver::{ApiServer, Partition};

use crate::lease::{LeaseClock, LocalInstant, SkewedClock};

use super::support::*;

const LEASE: u64 = 15;
const RETRY: u64 = 2;

/// 2 s of latency each way, for every request and watch event, after the replicas settled:
/// every shard stays held, by the same replica, for ten minutes.
#[tokio::test(start_paused = true)]
async fn two_seconds_of_latency_each_way_keeps_every_shard() {
    for shards in [32u32, 256] {
        let server = ApiServer::new();
        let ledger = Ledger::new();
        let r1 = start(
            &server,
            &ledger,
            config("r1", shards),
            clock_of(0),
            Controller::AcksAtOnce,
        );
        let r2 = start(
            &server,
            &ledger,
            config("r2", shards),
            clock_of(1),
            Controller::AcksAtOnce,
        );
        until(secs(30), "settled", || settled(&[&r1, &r2], shards)).await;
        let held = (r1.held(), r2.held());
        let losses = |r: &Replica| r.assignment().stats().losses();
        let before = (losses(&r1), losses(&r2));
        for name in ["r1", "r2"] {
            server.set_latency(name, secs(2), secs(2));
        }
        for _ in 0..600 {
            sleep(secs(1)).await;
            assert_eq!(
                (r1.held(), r2.held()),
                held,
                "{shards} shards: moved or lost"
            );
        }
        assert_eq!((losses(&r1), losses(&r2)), before, "{shards} shards");
        let (beliefs, _) = ledger.assert_never_two_at_once();
        assert!(beliefs >= shards as usize);
        println!("{shards} shards: every shard held for 10 minutes at 2 s each way");
    }
}

/// A single replica killed (its process gone) and restarted under the same identity within
/// 5 s holds every shard again within the lease duration plus two retry periods of the
/// restart; beside another replica, it gets its share back within 20 s.
#[tokio::test(start_paused = true)]
async fn a_replica_restarted_under_its_identity_rejoins() {
    for shards in [32u32, 256] {
        let server = ApiServer::new();
        let ledger = Ledger::new();
        let r1 = start(
            &server,
            &ledger,
            config("r1", shards),
            clock_of(0),
            Controller::AcksAtOnce,
        );
        until(secs(10), "r1 holds every shard", || settled(&[&r1], shards)).await;
        sleep(secs(10)).await;
        r1.crash();
        sleep(secs(5)).await;
        let again = start(
            &server,
            &ledger,
            config("r1", shards),
            clock_of(2),
            Controller::AcksAtOnce,
        );
        let took = until(secs(LEASE + 2 * RETRY), "every shard held again", || {
            settled(&[&again], shards)
        })
        .await;
        println!("{shards} shards, alone: every shard held again {took:?} after the restart");

        let r2 = start(
            &server,
            &ledger,
            config("r2", shards),
            clock_of(1),
            Controller::AcksAtOnce,
        );
        until(secs(30), "two settle", || settled(&[&again, &r2], shards)).await;
        sleep(secs(10)).await;
        let share = again.held_count();
        again.crash();
        sleep(secs(5)).await;
        let back = start(
            &server,
            &ledger,
            config("r1", shards),
            clock_of(3),
            Controller::AcksAtOnce,
        );
        let took = until(secs(20), "its share back", || back.held_count() == share).await;
        println!("{shards} shards, beside r2: its share back {took:?} after the restart");
        let (beliefs, _) = ledger.assert_never_two_at_once();
        assert!(beliefs >= 3 * shards as usize);
    }
}

/// Two processes given one identity for ten minutes: they are two holders (their instances
/// differ), so the second waits for the first and holds nothing; never both.
#[tokio::test(start_paused = true)]
async fn two_processes_given_one_identity_never_both_hold() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let first = start(
        &server,
        &ledger,
        config("r1", 8),
        clock_of(0),
        Controller::AcksAtOnce,
    );
    until(secs(10), "the first holds every shard", || {
        settled(&[&first], 8)
    })
    .await;
    let second = start(
        &server,
        &ledger,
        config("r1", 8),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    for _ in 0..600 {
        sleep(secs(1)).await;
        assert_eq!((first.held_count(), second.held_count()), (8, 0));
    }
    assert_eq!(second.assignment().members(), 0, "the second never joined");
    // The first dies: the second takes over, as a restart would.
    first.crash();
    let took = until(secs(LEASE + 2 * RETRY), "the second takes over", || {
        second.held_count() == 8
    })
    .await;
    println!("the second took over {took:?} after the first died");
    let (beliefs, _) = ledger.assert_never_two_at_once();
    assert!(beliefs >= 16);
}

/// A replica's clock whose wall time stands still: every `renewTime` it writes is the same.
#[derive(Debug)]
struct StillWall(SkewedClock);

impl LeaseClock for StillWall {
    fn now(&self) -> LocalInstant {
        self.0.now()
    }

    fn tokio_instant(&self, at: LocalInstant) -> Instant {
        self.0.tokio_instant(at)
    }

    fn wall(&self) -> Timestamp {
        Timestamp::UNIX_EPOCH
    }
}

/// Wall clocks that stand still: the Leases' `renewTime` never changes, and nothing changes.
/// Renewals still make new resourceVersions; a partitioned holder still stops before the other
/// takes its shards.
#[tokio::test(start_paused = true)]
async fn a_wall_clock_that_stands_still_changes_nothing() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let r1 = start(
        &server,
        &ledger,
        config("r1", 8),
        StillWall(clock_of(0)),
        Controller::AcksAtOnce,
    );
    let r2 = start(
        &server,
        &ledger,
        config("r2", 8),
        StillWall(clock_of(1)),
        Controller::AcksAtOnce,
    );
    until(secs(10), "settled", || settled(&[&r1, &r2], 8)).await;
    sleep(secs(60)).await;
    assert!(settled(&[&r1, &r2], 8));
    let rv = |server: &ApiServer| {
        let lease: Lease = server.get_in(NAMESPACE, "ctl-member-r1").unwrap();
        lease.metadata.resource_version.unwrap()
    };
    let before = rv(&server);
    sleep(secs(RETRY + 1)).await;
    assert_ne!(rv(&server), before, "a renewal makes a new resourceVersion");
    server.set_partition("r1", Partition::Blackholed);
    until(secs(LEASE + 3 * RETRY), "r2 takes every shard", || {
        r2.held_count() == 8
    })
    .await;
    server.set_partition("r1", Partition::Connected);
    until(secs(LEASE + 5 * RETRY), "settled again", || {
        settled(&[&r1, &r2], 8)
    })
    .await;
    let (beliefs, gap) = ledger.assert_never_two_at_once();
    assert!(beliefs >= 16);
    println!("{beliefs} beliefs; the smallest gap between holders {gap:?}");
}

/// Shard Leases deleted by a third party just after their holder renewed its membership: the
/// holders stop believing in them, and nobody takes them until a lease duration has passed;
/// then every shard is held again.
#[tokio::test(start_paused = true)]
async fn a_deleted_shard_lease_is_not_taken_by_two() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let r1 = start(
        &server,
        &ledger,
        config("r1", 8),
        clock_of(0),
        Controller::AcksAtOnce,
    );
    let r2 = start(
        &server,
        &ledger,
        config("r2", 8),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    until(secs(10), "settled", || settled(&[&r1, &r2], 8)).await;
    sleep(secs(20)).await;
    let renewed = || {
        let lease: Option<Lease> = server.get_in(NAMESPACE, "ctl-member-r1");
        lease.and_then(|l| l.metadata.resource_version)
    };
    let rv = renewed();
    until(secs(RETRY + 1), "r1 renews", || renewed() != rv).await;
    let deleted = Instant::now();
    for shard in 0..8 {
        server.delete_in::<Lease>(NAMESPACE, &format!("{CONTROLLER}-shard-{shard}"));
    }
    until(secs(1), "nobody holds them", || {
        r1.held_count() + r2.held_count() == 0
    })
    .await;
    let took = until(secs(LEASE + 2 * RETRY), "every shard held again", || {
        settled(&[&r1, &r2], 8)
    })
    .await;
    assert!(
        deleted.elapsed() >= secs(LEASE - 1),
        "not before a lease duration: {took:?}"
    );
    let (beliefs, _) = ledger.assert_never_two_at_once();
    assert!(beliefs >= 16);
    println!("held again {took:?} after the delete");
}
