//! Sharding (the Lease protocol with 32 shards): replicas joining, leaving, dying and cut off,
//! against one scripted API server, each on its own client and its own clock (offsets of
//! minutes, rates within 1%), on tokio's paused clock. Every test checks, from each replica's
//! published beliefs, that no two replicas ever believe they hold one shard at the same instant.

use std::collections::BTreeSet;

use http::Method;
use tokio::time::{Instant, sleep};

use crate::lease::Ended;
use crate::lease::assignment::ShardState;

use super::support::*;
use workqueue_test_support::apiserver::{ApiServer, Partition};

const SHARDS: u32 = 32;
const LEASE: u64 = 15;
const RETRY: u64 = 2;

fn hand_overs(replicas: &[&Replica]) -> u64 {
    replicas
        .iter()
        .map(|r| r.assignment().stats().hand_overs())
        .sum()
}

fn counts(replicas: &[&Replica]) -> Vec<u32> {
    replicas.iter().map(|r| r.held_count()).collect()
}

/// 1 -> 3 -> 2 replicas: each change settles within a few retry periods (a dead replica's
/// shards after their Leases expire), every replica within one of a fair share, by
/// acknowledged hand-overs, and nothing moves once settled.
#[tokio::test(start_paused = true)]
async fn replicas_rebalance_from_one_to_three_to_two() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    for name in ["r1", "r2", "r3"] {
        server.set_latency(name, millis(5), millis(5));
    }
    let r1 = start(
        &server,
        &ledger,
        config("r1", SHARDS),
        clock_of(0),
        Controller::AcksAtOnce,
    );
    let took = until(secs(10), "r1 holds every shard", || settled(&[&r1], SHARDS)).await;
    println!("1 replica: all {SHARDS} shards after {took:?}");
    sleep(secs(20)).await;

    let r2 = start(
        &server,
        &ledger,
        config("r2", SHARDS),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    let r3 = start(
        &server,
        &ledger,
        config("r3", SHARDS),
        clock_of(2),
        Controller::AcksAtOnce,
    );
    let three = [&r1, &r2, &r3];
    let took = until(secs(5 * RETRY), "three replicas settle", || {
        settled(&three, SHARDS)
    })
    .await;
    println!(
        "3 replicas: {:?} after {took:?}, {} hand-overs",
        counts(&three),
        hand_overs(&three)
    );
    assert_eq!(
        hand_overs(&three),
        21,
        "r1 gives away exactly what the others take"
    );
    let before = hand_overs(&three);
    sleep(secs(60)).await;
    assert!(settled(&three, SHARDS), "{:?}", counts(&three));
    assert_eq!(hand_overs(&three), before, "no hand-over once settled");

    let killed = Instant::now();
    r3.kill();
    let orphans: Vec<u32> = r3.held();
    let two = [&r1, &r2];
    let took = until(secs(LEASE + 3 * RETRY), "two replicas settle", || {
        settled(&two, SHARDS)
    })
    .await;
    println!("2 replicas: {:?} {took:?} after r3 died", counts(&two));
    for &shard in &orphans {
        let taken = ledger.taken_after(shard, killed).unwrap();
        assert!(
            taken.start - killed <= secs(LEASE + RETRY + 1),
            "shard {shard} taken after {:?}",
            taken.start - killed
        );
    }
    sleep(secs(60)).await;
    assert!(settled(&two, SHARDS), "{:?}", counts(&two));
    for r in [&r1, &r2] {
        let stats = r.assignment().stats();
        assert_eq!(
            (stats.hand_over_timeouts(), stats.losses()),
            (0, 0),
            "{}",
            r.name
        );
        assert_eq!(r.assignment().members(), 2);
    }
    // The dead replica's membership Lease is collected after a while.
    assert!(
        server
            .get_in::<k8s_openapi::api::coordination::v1::Lease>(NAMESPACE, "ctl-member-r3")
            .is_none()
    );
    let (checked, gap) = ledger.assert_never_two_at_once();
    println!("{checked} beliefs, smallest gap between holders {gap:?}");
}

/// Four replicas started at the same instant settle without handing shards back and forth: each
/// waits one retry period after joining, so they see each other before taking shards.
#[tokio::test(start_paused = true)]
async fn replicas_started_together_settle_without_hand_overs() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let names = ["r1", "r2", "r3", "r4"];
    let replicas: Vec<Replica> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            start(
                &server,
                &ledger,
                config(n, SHARDS),
                clock_of(i),
                Controller::AcksAtOnce,
            )
        })
        .collect();
    let all: Vec<&Replica> = replicas.iter().collect();
    let took = until(secs(5 * RETRY), "four replicas settle", || {
        settled(&all, SHARDS)
    })
    .await;
    println!(
        "4 replicas started together: {:?} after {took:?}, {} hand-overs",
        counts(&all),
        hand_overs(&all)
    );
    assert_eq!(hand_overs(&all), 0);
    sleep(secs(60)).await;
    assert!(settled(&all, SHARDS));
    assert_eq!(hand_overs(&all), 0);
    ledger.assert_never_two_at_once();
}

/// A replica's clean shutdown hands over and releases its shards, and the others take them at
/// their next retry period, not after the Leases expire.
#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_releases_shards_and_they_are_taken_at_once() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    // r1's controller drains for a while before each acknowledgement.
    let mut r1 = start(
        &server,
        &ledger,
        config("r1", SHARDS),
        clock_of(0),
        Controller::AcksAfter(millis(1500)),
    );
    let r2 = start(
        &server,
        &ledger,
        config("r2", SHARDS),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    let r3 = start(
        &server,
        &ledger,
        config("r3", SHARDS),
        clock_of(2),
        Controller::AcksAtOnce,
    );
    until(secs(5 * RETRY), "three replicas settle", || {
        settled(&[&r1, &r2, &r3], SHARDS)
    })
    .await;
    sleep(secs(10)).await;
    let released: BTreeSet<u32> = r1.held().into_iter().collect();
    let asked = Instant::now();
    r1.shut_down();
    assert_eq!((&mut r1.task).await.unwrap(), Ended::Shutdown);
    let left = asked.elapsed();
    assert_eq!(r1.assignment().stats().releases(), released.len() as u64);
    assert_eq!(member_holder(&server, "r1"), None, "vacated");
    let took = until(secs(RETRY + 1), "r2 and r3 take r1's shards", || {
        settled(&[&r2, &r3], SHARDS)
    })
    .await;
    println!(
        "r1 left in {left:?}; its {} shards taken {took:?} after",
        released.len()
    );
    for &shard in &released {
        let holder = stored_holder(&server, shard).unwrap();
        assert!(holder == "r2" || holder == "r3", "shard {shard}: {holder}");
    }
    ledger.assert_never_two_at_once();
}

/// A replica cut off from the API server (blackholed, then refused) stops believing it holds
/// its shards before any other replica takes one of them; the others take them after they
/// expire; when the partition heals it gets its share back.
#[tokio::test(start_paused = true)]
async fn a_partitioned_replica_stops_before_its_shards_are_taken() {
    for partition in [Partition::Blackholed, Partition::Refused] {
        let server = ApiServer::new();
        let ledger = Ledger::new();
        for name in ["slow", "fast", "third"] {
            server.set_latency(name, millis(20), millis(20));
        }
        // The cut-off replica's clock is the slowest, the others' faster.
        let slow = start(
            &server,
            &ledger,
            config("slow", SHARDS),
            clock(-420, 0.99),
            Controller::AcksAtOnce,
        );
        let fast = start(
            &server,
            &ledger,
            config("fast", SHARDS),
            clock(300, 1.01),
            Controller::AcksAtOnce,
        );
        let third = start(
            &server,
            &ledger,
            config("third", SHARDS),
            clock(45, 1.005),
            Controller::AcksAtOnce,
        );
        until(secs(5 * RETRY), "three replicas settle", || {
            settled(&[&slow, &fast, &third], SHARDS)
        })
        .await;
        sleep(secs(17)).await;
        let cut_off: Vec<u32> = slow.held();
        let cut = Instant::now();
        server.set_partition("slow", partition);
        until(
            secs(LEASE + 3 * RETRY),
            "the others take every shard",
            || settled(&[&fast, &third], SHARDS),
        )
        .await;
        let beliefs = ledger.runs();
        let mut margins = Vec::new();
        for &shard in &cut_off {
            let lost = beliefs
                .iter()
                .filter(|b| b.replica == "slow" && b.subject == shard)
                .filter_map(|b| b.end())
                .max()
                .unwrap();
            let taken = ledger.taken_after(shard, cut).unwrap();
            println!(
                "{partition:?}: shard {shard:2}: slow stopped at {:?}, {} took it at {:?}",
                lost - cut,
                taken.replica,
                taken.start - cut
            );
            assert!(lost < taken.start, "shard {shard}");
            margins.push(taken.start - lost);
        }
        let smallest = margins.iter().min().unwrap();
        println!("{partition:?}: smallest margin between loss and take {smallest:?}");
        assert!(*smallest >= millis(4_700));

        server.set_partition("slow", Partition::Connected);
        let took = until(
            secs(LEASE + 5 * RETRY),
            "the healed replica gets its share back",
            || settled(&[&slow, &fast, &third], SHARDS),
        )
        .await;
        println!(
            "{partition:?}: settled {took:?} after healing: {:?}",
            counts(&[&slow, &fast, &third])
        );
        ledger.assert_never_two_at_once();
    }
}

/// A controller that never acknowledges a hand-over keeps the shards it was asked to give: the
/// protocol cannot know their work stopped, so it gives them to nobody (they stay held, its
/// keys not taken), and the other replica takes none of them.
#[tokio::test(start_paused = true)]
async fn an_unacknowledged_hand_over_keeps_the_shard_with_its_holder() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let r1 = start(
        &server,
        &ledger,
        config("r1", SHARDS),
        clock_of(0),
        Controller::Never,
    );
    until(secs(10), "r1 holds every shard", || settled(&[&r1], SHARDS)).await;
    let r2 = start(
        &server,
        &ledger,
        config("r2", SHARDS),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    sleep(secs(120)).await;
    let assignment = r1.assignment();
    let giving = (0..SHARDS)
        .filter(|&s| matches!(assignment.state(s), ShardState::GivingUp(_)))
        .count();
    assert_eq!(
        (r1.held().len(), giving),
        (16, 16),
        "16 kept, 16 being given"
    );
    assert_eq!(r1.held_count(), SHARDS);
    assert_eq!(r2.held_count(), 0);
    let stats = assignment.stats();
    assert_eq!((stats.hand_overs(), stats.releases()), (0, 0));
    let (checked, _) = ledger.assert_never_two_at_once();
    assert!(checked >= SHARDS as usize);
}

/// Lease requests per replica per second, 32 and 256 shards, once settled: one write per
/// retry period (its membership Lease's renewal), and no list: the watch is one long request.
#[tokio::test(start_paused = true)]
async fn request_rate_per_replica() {
    for shards in [32u32, 256] {
        for k in [1usize, 2, 4] {
            let server = ApiServer::new();
            let ledger = Ledger::new();
            let names: Vec<String> = (1..=k).map(|i| format!("r{i}")).collect();
            let replicas: Vec<Replica> = names
                .iter()
                .map(|n| {
                    start(
                        &server,
                        &ledger,
                        config(n, shards),
                        clock(0, 1.0),
                        Controller::AcksAtOnce,
                    )
                })
                .collect();
            let all: Vec<&Replica> = replicas.iter().collect();
            until(secs(30), "settled", || settled(&all, shards)).await;
            sleep(secs(10)).await;
            let before: Vec<usize> = names.iter().map(|n| server.requests_of(n).len()).collect();
            let window = 120;
            sleep(secs(window)).await;
            let mut total = 0.0;
            for (i, n) in names.iter().enumerate() {
                let sent = &server.requests_of(n)[before[i]..];
                let writes = sent.iter().filter(|l| l.method == Method::PUT).count();
                let others = sent.len() - writes;
                let rate = writes as f64 / window as f64;
                println!(
                    "{shards} shards, {k} replicas, {n}: {} held, {rate:.2} writes/s, {others} other requests",
                    replicas[i].held_count(),
                );
                assert!(rate <= 0.55, "{rate} writes/s");
                assert!(rate >= 0.45, "{rate} writes/s: renewing");
                assert_eq!(others, 0, "no list, no other request");
                total += rate;
            }
            println!("{shards} shards, {k} replicas: {total:.2} writes/s in all");
        }
    }
}

/// An outage of the API server (503 for everyone): every replica stops by its renew deadline;
/// when the server is back each takes its own shards back at once (the records still name it),
/// without waiting for them to expire.
#[tokio::test(start_paused = true)]
async fn after_an_outage_each_replica_takes_its_own_shards_back() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let r1 = start(
        &server,
        &ledger,
        config("r1", SHARDS),
        clock_of(0),
        Controller::AcksAtOnce,
    );
    let r2 = start(
        &server,
        &ledger,
        config("r2", SHARDS),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    until(secs(5 * RETRY), "settled", || settled(&[&r1, &r2], SHARDS)).await;
    sleep(secs(5)).await;
    let (held1, held2) = (r1.held(), r2.held());
    let down = Instant::now();
    server.set_down(true);
    until(secs(11), "both stop", || {
        r1.held_count() + r2.held_count() == 0
    })
    .await;
    let stopped = down.elapsed();
    sleep(secs(30)).await;
    server.set_down(false);
    let back = until(secs(2 * RETRY + 1), "both take their shards back", || {
        settled(&[&r1, &r2], SHARDS)
    })
    .await;
    println!("stopped {stopped:?} after the outage began; back {back:?} after it ended");
    assert_eq!((r1.held(), r2.held()), (held1, held2));
    ledger.assert_never_two_at_once();
}

/// More replicas than shards: each holds at most one, the others stand by.
#[tokio::test(start_paused = true)]
async fn more_replicas_than_shards() {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let replicas: Vec<Replica> = (0..3)
        .map(|i| {
            start(
                &server,
                &ledger,
                config(&format!("r{i}"), 2),
                clock_of(i),
                Controller::AcksAtOnce,
            )
        })
        .collect();
    let all: Vec<&Replica> = replicas.iter().collect();
    until(secs(5 * RETRY), "settled", || settled(&all, 2)).await;
    let standby = replicas.iter().position(|r| r.held_count() == 0).unwrap();
    let holder = (standby + 1) % 3;
    let orphan = replicas[holder].held()[0];
    replicas[holder].kill();
    let others: Vec<&Replica> = replicas
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != holder)
        .map(|(_, r)| r)
        .collect();
    until(
        secs(LEASE + RETRY + 1),
        "the standby takes the orphan",
        || settled(&others, 2),
    )
    .await;
    assert_eq!(replicas[standby].held(), vec![orphan]);
    ledger.assert_never_two_at_once();
}

/// The hand-over handshake: the shard shows as `GivingUp` by the time the request arrives (no
/// change of its own: the request is the signal), its Lease still names the giver until the
/// controller acknowledges, and is written to the taker right after; the taker sees `Acquired`
/// only then.
#[tokio::test(start_paused = true)]
async fn a_hand_over_releases_only_after_the_acknowledgement() {
    use crate::lease::assignment::{HandOverReason, ShardChange, ShardState};
    use crate::lease::{LeaseClock, ShardLeases};

    let server = ApiServer::new();
    let ledger = Ledger::new();
    let (leases, mut events) =
        ShardLeases::new(server.client_named("r1"), config("r1", 2)).unwrap();
    let clock = clock_of(0);
    let _r1 = tokio::spawn(leases.with_clock(clock).run(std::future::pending()));
    until(secs(10), "r1 holds both shards", || {
        events.assignment.borrow().held_count() == 2
    })
    .await;
    let before = events.assignment.borrow_and_update().clone();
    let r2 = start(
        &server,
        &ledger,
        config("r2", 2),
        clock_of(1),
        Controller::AcksAtOnce,
    );
    let request = events.hand_overs.recv().await.unwrap();
    let shard = request.shard();
    assert_eq!(request.reason(), HandOverReason::Rebalance);
    // The hand-over timeout after the request, on r1's clock (1% fast: 9.9 s of tokio's).
    let deadline = clock.tokio_instant(clock.now() + secs(10));
    assert_eq!(request.deadline(), deadline);
    let now = events.assignment.borrow_and_update().clone();
    assert!(matches!(now.state(shard), ShardState::GivingUp(_)));
    assert!(!now.accepts(shard, Instant::now()) && now.may_run(shard, Instant::now()));
    assert_eq!(now.changes_since(&before), []);
    // The controller drains for 5 s: the Lease stays r1's, its membership renewed, and r2 does
    // not take it.
    let renewed = server.requests_of("r1").len();
    sleep(secs(5)).await;
    assert_eq!(stored_holder(&server, shard).as_deref(), Some("r1"));
    assert!(server.requests_of("r1").len() > renewed);
    assert_eq!(r2.held_count(), 0);
    request.acknowledge();
    let acked = Instant::now();
    until(secs(1), "given to r2", || {
        stored_holder(&server, shard).as_deref() == Some("r2")
    })
    .await;
    let after = events.assignment.borrow().clone();
    assert_eq!(after.state(shard), ShardState::NotHeld);
    assert_eq!(after.changes_since(&now), [ShardChange::Ended { shard }]);
    let took = until(secs(RETRY + 1), "r2 holds it", || r2.held() == vec![shard]).await;
    println!("given at once after the acknowledgement, held {took:?} after");
    assert!(ledger.taken_after(shard, acked).is_some());
    assert_eq!(after.stats().hand_overs(), 1);
}
