//! Liveness of the protocol with its driver, on the scripted API server and tokio's paused
//! clock, under the faults that stop progress without an error (issue 33): a Lease watch that
//! hangs with its connection open, reads that fail while writes work, latency past the renew
//! deadline. Each checks from the replicas' published beliefs that no two ever believe they
//! hold one shard at once, that it judged the beliefs the scenario makes, and a bound on
//! progress.

use tokio::time::{Instant, sleep};
use workqueue_test_support::apiserver::{ApiServer, Partition};

use crate::lease::Report;

use super::support::*;

const LEASE: u64 = 15;
const RENEW: u64 = 10;
const RETRY: u64 = 2;

/// The bound the `lease` docs state for a replica that renews but cannot read its renewals
/// back: lease duration + renew deadline + 3 retry periods, plus its writes' round trip.
fn bound(round_trip: u64) -> std::time::Duration {
    secs(LEASE + RENEW + 3 * RETRY + round_trip)
}

fn three(server: &ApiServer, ledger: &Ledger, shards: u32) -> Vec<Replica> {
    (0..3)
        .map(|i| {
            start(
                server,
                ledger,
                config(&format!("r{}", i + 1), shards),
                clock_of(i),
                Controller::AcksAtOnce,
            )
        })
        .collect()
}

/// The index of the replica holding the most shards.
fn busiest(replicas: &[Replica]) -> usize {
    (0..replicas.len())
        .max_by_key(|&i| replicas[i].held_count())
        .unwrap()
}

fn held_by_all(replicas: &[Replica]) -> u32 {
    replicas.iter().map(Replica::held_count).sum()
}

fn stale_reports(replica: &Replica) -> usize {
    let reports = replica.reports.lock().unwrap();
    reports
        .iter()
        .filter(|r| matches!(r, Report::WatchStale { .. }))
        .count()
}

fn writes_of(server: &ApiServer, name: &str, since: Instant) -> Vec<String> {
    server
        .requests_of(name)
        .into_iter()
        .filter(|r| r.is_write() && r.at >= since)
        .map(|r| r.uri)
        .collect()
}

/// V1: a replica's Lease watch hangs silently for 5 minutes while its writes and lists work:
/// the stale watch is found and replaced, and reported once; every shard stays held, by the
/// same replicas, and the replica writes its membership Lease once per retry period (one on
/// the holder of the shards, one on a standby of leader election).
#[tokio::test(start_paused = true)]
async fn a_watch_that_hangs_silently_is_replaced_and_reported_once() {
    for (shards, victim_is_holder) in [(8, true), (1, true), (1, false)] {
        let server = ApiServer::new();
        let ledger = Ledger::new();
        let replicas = three(&server, &ledger, shards);
        until(secs(30), "settled", || held_by_all(&replicas) == shards).await;
        sleep(secs(5)).await;
        let victim = if victim_is_holder {
            busiest(&replicas)
        } else {
            (0..3).find(|&i| replicas[i].held_count() == 0).unwrap()
        };
        let name = replicas[victim].name.clone();
        let held: Vec<Vec<u32>> = replicas.iter().map(Replica::held).collect();
        let from = Instant::now();
        server.set_partition(&name, Partition::WatchesHang);
        for _ in 0..300 {
            sleep(secs(1)).await;
            let now: Vec<Vec<u32>> = replicas.iter().map(Replica::held).collect();
            assert_eq!(now, held, "{shards} shards, {name}: moved or lost");
        }
        assert_eq!(
            stale_reports(&replicas[victim]),
            1,
            "{shards} shards, {name}: the stale watch is told once"
        );
        let writes = writes_of(&server, &name, from);
        let own = format!("{CONTROLLER}-member-{name}");
        assert!(
            writes.iter().all(|uri| uri.contains(&own)),
            "{name} wrote only its own membership Lease: {writes:?}"
        );
        // One per retry period: 150 in 300 s.
        assert!(
            (140..=160).contains(&writes.len()),
            "{shards} shards, {name}: {} writes",
            writes.len()
        );
        server.set_partition(&name, Partition::Connected);
        let (beliefs, _) = ledger.assert_never_two_at_once();
        assert!(beliefs >= shards as usize);
        println!(
            "{shards} shards, {name} ({}): 5 minutes of a hung watch, nothing moved, {} writes",
            if victim_is_holder {
                "holder"
            } else {
                "standby"
            },
            writes.len()
        );
    }
}

/// The V2 scenario: 3 replicas on `shards` shards; `fault` is put on the busiest one's link
/// (given its name). Within the bound (`round_trip`: the fault's, in seconds) every shard is
/// held by the others, and stays with them for 2 minutes; never two at once. Returns the
/// replicas and the faulty one's index.
async fn others_take_over(
    shards: u32,
    round_trip: u64,
    fault: impl FnOnce(&ApiServer, &str),
) -> (Vec<Replica>, usize) {
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let replicas = three(&server, &ledger, shards);
    until(secs(30), "settled", || held_by_all(&replicas) == shards).await;
    sleep(secs(5)).await;
    let victim = busiest(&replicas);
    fault(&server, &replicas[victim].name);
    let others = |rs: &[Replica]| {
        (0..3)
            .filter(|&i| i != victim)
            .map(|i| rs[i].held_count())
            .sum::<u32>()
    };
    let took = until(bound(round_trip), "the others hold every shard", || {
        others(&replicas) == shards
    })
    .await;
    // And it stays that way while the fault lasts.
    for _ in 0..120 {
        sleep(secs(1)).await;
        assert_eq!(others(&replicas), shards, "{shards} shards");
    }
    let (beliefs, _) = ledger.assert_never_two_at_once();
    assert!(beliefs > shards as usize);
    println!("{shards} shards: taken over {took:?} after the fault began");
    (replicas, victim)
}

/// V2: the holder's reads fail (lists and watches) while its writes work: it steps down
/// (reported), and within the bound every shard is held by the others.
#[tokio::test(start_paused = true)]
async fn a_holder_whose_reads_fail_steps_down_within_the_bound() {
    for shards in [1, 8] {
        let (replicas, victim) = others_take_over(shards, 0, |server, name| {
            server.set_partition(name, Partition::ReadsFail)
        })
        .await;
        let stepped = replicas[victim]
            .reports
            .lock()
            .unwrap()
            .contains(&Report::SteppedDown);
        assert!(stepped, "{} reported its step-down", replicas[victim].name);
    }
}

/// V2: 6 s of latency each way on the holder (past the renew deadline): within the bound its
/// shards are held by replicas that can, and stay there while it is that slow.
#[tokio::test(start_paused = true)]
async fn a_holder_slower_than_the_renew_deadline_gives_way_within_the_bound() {
    for shards in [1, 8] {
        others_take_over(shards, 12, |server, name| {
            server.set_latency(name, secs(6), secs(6))
        })
        .await;
    }
}
