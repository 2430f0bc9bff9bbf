//! The protocol in the simulated world: scripted scenarios, each with its expected outcome,
//! and the property tests over random worlds.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::sim::{Fault, Plan, World};
use super::{Content, Decision, Ending, LeaseName, Op, PROTOCOL, Token};

pub(super) const S: u64 = 1_000_000_000;
pub(super) const MS: u64 = 1_000_000;

pub(super) fn settle(plan: Plan, secs: u64) -> World {
    let mut world = World::new(plan);
    world.run_until(secs * S);
    world
}

/// The checks every world must pass: never two holders, every fence after its holder's
/// deadline by the slack, and after the faults, every shard held. Returns the number of
/// belief intervals checked.
fn check(world: &mut World) -> usize {
    world.run();
    let beliefs = world.ledger.assert_never_two_at_once();
    world.ledger.assert_fences_leave(world.plan.margin());
    let plan = &world.plan;
    let bound = 2 * plan.lease_duration + plan.renew_deadline + 4 * plan.retry_period;
    let from = plan.quiet_from() * MS + bound.as_nanos() as u64;
    assert!(
        from < world.now(),
        "the world ran long enough after its faults"
    );
    let unheld = world.ledger.unheld(plan.shards, from, world.now());
    assert!(
        unheld.iter().all(|&u| u == 0),
        "after the faults, shards went unheld (ns each): {unheld:?}"
    );
    assert!(beliefs > 0, "the world held nothing");
    beliefs
}

/// Runs until `done` holds (checking every 100 ms), up to `limit` from now; returns how long.
pub(super) fn until(
    world: &mut World,
    limit: Duration,
    mut done: impl FnMut(&World) -> bool,
) -> Option<u64> {
    let start = world.now();
    while !done(world) {
        if world.now() - start > limit.as_nanos() as u64 {
            return None;
        }
        world.run_until(world.now() + 100 * MS);
    }
    Some(world.now() - start)
}

pub(super) fn all_held(world: &World) -> bool {
    let held: usize = world.held().iter().map(Vec::len).sum();
    held == world.plan.shards as usize
}

pub(super) fn writes_between(
    before: &[BTreeMap<&str, u64>],
    after: &[BTreeMap<&str, u64>],
) -> Vec<BTreeMap<String, u64>> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            a.iter()
                .map(|(k, v)| (k.to_string(), v - b.get(k).copied().unwrap_or(0)))
                .filter(|(_, v)| *v > 0)
                .collect()
        })
        .collect()
}

#[test]
fn one_replica_takes_every_shard() {
    let world = settle(Plan::new(1, 4), 5);
    assert_eq!(world.held(), vec![vec![0, 1, 2, 3]]);
}

#[test]
fn replicas_split_the_shards_within_one_of_each_other() {
    let mut world = settle(Plan::new(3, 32), 20);
    let counts: Vec<usize> = world.held().iter().map(Vec::len).collect();
    assert_eq!(counts.iter().sum::<usize>(), 32, "{counts:?}");
    assert!(counts.iter().all(|&c| c == 10 || c == 11), "{counts:?}");
    check(&mut world);
}

#[test]
fn steady_state_is_one_membership_write_per_replica_per_retry_period() {
    for shards in [32, 256] {
        let mut world = settle(Plan::new(3, shards), 60);
        assert!(all_held(&world));
        let before = world.writes();
        world.run_until(660 * S);
        let writes = writes_between(&before, &world.writes());
        for (replica, w) in writes.iter().enumerate() {
            let total: u64 = w.values().sum();
            let per_second = total as f64 / 600.0;
            eprintln!("{shards} shards, replica {replica}: {per_second:.3} writes/s {w:?}");
            assert!(per_second <= 0.55, "{shards} shards: {w:?}");
            assert_eq!(
                w.keys().collect::<Vec<_>>(),
                ["member"],
                "{shards} shards: {w:?}"
            );
        }
    }
}

#[test]
fn a_killed_member_is_fenced_and_its_shards_taken_after_its_deadline() {
    let mut plan = Plan::new(2, 8);
    plan.faults = vec![(
        30_000,
        Fault::Crash {
            replica: 1,
            down: 1_000_000,
        },
    )];
    let mut world = settle(plan, 30);
    let took = until(&mut world, Duration::from_secs(30), |w| {
        w.held()[0].len() == 8
    });
    let took = took.expect("the survivor never held every shard");
    // Fenced a lease duration after the last renewal it saw, then one write per shard.
    assert!(took <= 19 * S, "took {} ms", took / MS);
    assert!(took >= 13 * S, "took {} ms", took / MS);
    world.plan.calm = 0;
    world.run();
    world.ledger.assert_never_two_at_once();
    let (fences, slack) = world.ledger.assert_fences_leave(world.plan.margin());
    assert_eq!(fences, 1);
    assert!(slack.unwrap() >= world.plan.margin());
}

#[test]
fn a_single_replica_restarted_under_its_identity_holds_every_shard_again() {
    for shards in [32, 256] {
        let mut plan = Plan::new(1, shards);
        plan.faults = vec![(
            30_000,
            Fault::Crash {
                replica: 0,
                down: 4_900,
            },
        )];
        let mut world = settle(plan, 29);
        let process = world.process(0);
        world.run_until(34_900 * MS);
        assert_ne!(world.process(0), process, "restarted");
        // Lease duration + 2 retry periods from the restart.
        let took = until(&mut world, Duration::from_secs(19), all_held);
        let took = took.expect("the restarted replica did not hold every shard in time");
        eprintln!(
            "{shards} shards: every shard held again {} ms after the restart",
            took / MS
        );
        world.plan.calm = 60_000;
        check(&mut world);
    }
}

#[test]
fn a_replica_restarted_beside_another_rejoins_its_share() {
    let mut plan = Plan::new(2, 32);
    plan.faults = vec![(
        30_000,
        Fault::Crash {
            replica: 0,
            down: 4_900,
        },
    )];
    let mut world = settle(plan, 29);
    let share = world.held()[0].len();
    assert!(share == 16, "{:?}", world.held());
    world.run_until(35 * S);
    let took = until(&mut world, Duration::from_secs(20), |w| {
        w.held()[0].len() == share
    });
    let took = took.expect("the restarted replica did not get its share back within 20 s");
    eprintln!("its share back {} ms after the restart", took / MS);
    check(&mut world);
}

#[test]
fn two_processes_given_one_identity_never_both_hold_and_the_collision_is_reported() {
    let mut plan = Plan::new(2, 8);
    plan.identities = 1;
    plan.calm = 600_000;
    let mut world = World::new(plan);
    let beliefs = check(&mut world);
    let joined: Vec<usize> = world
        .decisions
        .iter()
        .filter(|(_, _, d)| matches!(d, Decision::Joined { .. }))
        .map(|(_, p, _)| *p)
        .collect();
    assert_eq!(joined.len(), 1, "one process joined: {joined:?}");
    let collisions = world
        .decisions
        .iter()
        .filter(|(_, p, d)| matches!(d, Decision::Collision { .. }) && *p != joined[0])
        .count();
    assert_eq!(collisions, 1, "the other reported the collision once");
    eprintln!("{beliefs} beliefs over 10 minutes, one holder");
}

#[test]
fn two_seconds_of_latency_each_way_keeps_every_shard() {
    for shards in [32, 256] {
        let mut world = settle(Plan::new(3, shards), 40);
        assert!(all_held(&world));
        world.set_latency((2_000, 2_000));
        let from = world.now();
        world.run_until(from + 600 * S);
        world.plan.calm = 0;
        world.ledger.finish(world.now());
        world.ledger.assert_never_two_at_once();
        let unheld = world.ledger.unheld(shards, from, world.now());
        assert!(
            unheld.iter().all(|&u| u == 0),
            "{shards} shards: {unheld:?}"
        );
        let lost = world
            .decisions
            .iter()
            .filter(|(t, _, d)| *t > from && matches!(d, Decision::Lost { .. }))
            .count();
        assert_eq!(lost, 0);
    }
}

#[test]
fn a_graceful_shutdown_hands_every_shard_over_without_waiting_for_expiry() {
    let mut plan = Plan::new(2, 8);
    plan.drain = 500;
    let mut world = settle(plan, 30);
    world.inject(Fault::Shutdown {
        replica: 1,
        down: 1_000_000,
    });
    let took = until(&mut world, Duration::from_secs(10), |w| {
        w.held()[0].len() == 8
    });
    let took = took.expect("the survivor did not take over within 10 s");
    assert!(took < 3 * S, "took {} ms", took / MS);
    assert!(!world.alive()[1], "the leaver ended");
    world.run_until(world.now() + 20 * S);
    world.ledger.finish(world.now());
    world.ledger.assert_never_two_at_once();
    assert_eq!(world.ledger.fences.len(), 1, "only its own vacating write");
}

/// Drains that outlast the hand-over timeout plus the renew deadline: the leaver gives up
/// leaving then (its shards end by time, its membership Lease expires), and the survivor takes
/// every shard, never two at once.
#[test]
fn a_shutdown_whose_drains_do_not_end_gives_up_in_time() {
    let mut plan = Plan::new(2, 8);
    plan.drain = 600_000;
    let limit = (plan.hand_over_timeout + plan.renew_deadline).as_nanos() as u64;
    let mut world = settle(plan, 30);
    let (asked, leaver) = (world.now(), world.process(1));
    world.inject(Fault::Shutdown {
        replica: 1,
        down: 1_000_000,
    });
    let took = until(&mut world, Duration::from_secs(60), |w| {
        w.held()[0].len() == 8
    });
    assert!(took.is_some(), "the survivor did not take over within 60 s");
    let ends: Vec<(u64, &Decision)> = world
        .decisions
        .iter()
        .filter(|(_, p, d)| *p == leaver && matches!(d, Decision::GaveUp | Decision::Ended(_)))
        .map(|(t, _, d)| (*t - asked, d))
        .collect();
    assert_eq!(
        ends,
        [
            (limit, &Decision::GaveUp),
            (limit, &Decision::Ended(Ending::Shutdown))
        ]
    );
    assert!(!world.alive()[1], "the leaver ended");
    world.ledger.finish(world.now());
    world.ledger.assert_never_two_at_once();
}

#[test]
fn leader_election_keeps_a_live_leader() {
    let mut plan = Plan::new(3, 1);
    plan.faults = vec![
        (
            10,
            Fault::Crash {
                replica: 1,
                down: 20_000,
            },
        ),
        (
            10,
            Fault::Crash {
                replica: 2,
                down: 40_000,
            },
        ),
    ];
    let mut world = settle(plan, 120);
    let leaders: Vec<usize> = world
        .decisions
        .iter()
        .filter(|(_, _, d)| matches!(d, Decision::Acquired { .. }))
        .map(|(_, p, _)| *p)
        .collect();
    assert_eq!(
        leaders.len(),
        1,
        "one leader for the whole run: {leaders:?}"
    );
    assert!(world.believes(0, 0));
    world.inject(Fault::Shutdown {
        replica: 0,
        down: 1_000_000,
    });
    let took = until(&mut world, Duration::from_secs(10), |w| {
        w.believes(1, 0) || w.believes(2, 0)
    });
    assert!(took.expect("no new leader") < 3 * S);
}

#[test]
fn a_shard_lease_deleted_during_a_hand_over_is_not_taken_before_its_holder_stopped() {
    // r1 joins late, so r0 hands half the shards over to it, with drains of a few seconds.
    // Just then a third party deletes every shard Lease and r0 stalls (its watch with it): r0
    // believes it holds the shards it is draining until its deadline, so r1 must not take
    // them until then, though it is their target and sees them gone.
    let mut plan = Plan::new(2, 8);
    plan.drain = 4_000;
    plan.faults = vec![(
        10,
        Fault::Crash {
            replica: 1,
            down: 30_000,
        },
    )];
    let mut world = settle(plan, 30);
    let r0 = world.process(0);
    let handing = until(&mut world, Duration::from_secs(10), |w| {
        w.decisions
            .iter()
            .any(|(_, p, d)| *p == r0 && matches!(d, Decision::HandOver { .. }))
    });
    handing.expect("r0 hands shards over to r1");
    assert_eq!(world.held()[0].len(), 8, "r0 still holds what it drains");
    world.inject(Fault::Stall {
        replica: 0,
        ms: 8_000,
    });
    for shard in 0..8 {
        world.write_delete(&LeaseName::Shard(shard));
    }
    world.plan.calm = 60_000;
    // The injected faults, for the liveness bound.
    let now = world.now() / MS;
    world.plan.faults = vec![(
        now,
        Fault::Stall {
            replica: 0,
            ms: 8_000,
        },
    )];
    let beliefs = check(&mut world);
    assert!(beliefs > 8);
}

#[test]
fn a_dead_members_lease_is_collected() {
    let mut plan = Plan::new(2, 4);
    plan.faults = vec![(
        20_000,
        Fault::Crash {
            replica: 1,
            down: 10_000_000,
        },
    )];
    let mut world = settle(plan, 20);
    assert!(world.stored(&LeaseName::Member("r1".into())).is_some());
    // Fenced a lease duration after its last renewal, collected a lease duration later.
    world.run_until(20 * S + 2 * 15 * S + 5 * S);
    assert_eq!(world.stored(&LeaseName::Member("r1".into())), None);
    assert!(world.stored(&LeaseName::Member("r0".into())).is_some());
}

fn record(holder: Option<&str>, shards: u32, counter: u64) -> Content {
    Content {
        holder: holder.and_then(Token::parse),
        previous: None,
        counter,
        shards: Some(shards),
        protocol: Some(PROTOCOL),
        leaving: false,
        held: false,
        duration: Duration::from_secs(15),
    }
}

#[test]
fn shard_leases_beyond_the_number_of_shards_are_removed() {
    let mut world = World::new(Plan::new(2, 4));
    for shard in 4..7 {
        let answer = world.write(&LeaseName::Shard(shard), &Op::Create(record(None, 7, 1)));
        assert!(matches!(answer, super::Answer::Done(_)));
    }
    world.run_until(20 * S);
    let names = world.stored_names();
    assert!(
        !names
            .iter()
            .any(|n| matches!(n, LeaseName::Shard(s) if *s >= 4)),
        "{names:?}"
    );
    assert!(all_held(&world));
}

#[test]
fn nothing_is_taken_while_a_replica_with_another_number_of_shards_is_alive() {
    let mut world = World::new(Plan::new(2, 4));
    let old = LeaseName::Member("old".into());
    let mut content = record(Some("old_1"), 8, 1);
    let super::Answer::Done(Some(mut stored)) = world.write(&old, &Op::Create(content.clone()))
    else {
        panic!("created");
    };
    // The old replica renews for a minute, then dies.
    for _ in 0..30 {
        world.run_until(world.now() + 2 * S);
        content.counter += 1;
        let super::Answer::Done(Some(next)) =
            world.write(&old, &Op::Replace(stored.rv.clone(), content.clone()))
        else {
            panic!("renewed");
        };
        stored = next;
        assert_eq!(world.held(), vec![Vec::<u32>::new(), vec![]]);
    }
    let mismatches = world
        .decisions
        .iter()
        .filter(|(_, _, d)| matches!(d, Decision::Mismatch { .. }))
        .count();
    assert_eq!(mismatches, 2, "each replica reports it once");
    let took = until(&mut world, Duration::from_secs(25), all_held);
    let took = took.expect("taken once the old replica's lease was fenced");
    assert!(
        took > 13 * S,
        "only after the lease duration: {} ms",
        took / MS
    );
}

fn fault() -> impl Strategy<Value = (u64, Fault)> {
    let replica = 0usize..4;
    let at = 0u64..120_000;
    let kind = prop_oneof![
        (replica.clone(), 0u64..8_000).prop_map(|(replica, down)| Fault::Crash { replica, down }),
        (replica.clone(), 0u64..8_000)
            .prop_map(|(replica, down)| Fault::Shutdown { replica, down }),
        (replica.clone(), 0u64..40_000).prop_map(|(replica, ms)| Fault::Partition { replica, ms }),
        (replica.clone(), 0u64..40_000).prop_map(|(replica, ms)| Fault::Refuse { replica, ms }),
        (replica.clone(), 0u64..12_000).prop_map(|(replica, ms)| Fault::Stall { replica, ms }),
        replica
            .clone()
            .prop_map(|replica| Fault::BreakWatch { replica }),
        (0usize..64).prop_map(|pick| Fault::Delete { pick }),
        (replica.clone(), 0u64..60_000).prop_map(|(replica, ms)| Fault::HangWatch { replica, ms }),
        (replica.clone(), 0u64..60_000).prop_map(|(replica, ms)| Fault::ReadsFail { replica, ms }),
        (replica, 0u64..60_000, 0u64..7_000).prop_map(|(replica, ms, each_way)| Fault::Slow {
            replica,
            ms,
            each_way
        }),
    ];
    (at, kind)
}

fn plan() -> impl Strategy<Value = Plan> {
    (
        1usize..=4,
        prop_oneof![Just(1u32), Just(2), Just(5), Just(8)],
        // Up to 2 s each way: the latency the protocol keeps every shard held under (with
        // the default timing, anything under 2.5 s: a renewal every round trip, confirmed a
        // round trip later, within the renew deadline).
        (0u64..1_000, 0u64..=1_000),
        0u32..100,
        0i64..=20_000,
        0u64..3_000,
        any::<u64>(),
        prop::collection::vec(fault(), 0..12),
    )
        .prop_map(
            |(replicas, shards, (lo, spread), drops, ppm, drain, seed, faults)| {
                let mut plan = Plan::new(replicas, shards);
                plan.latency = (lo, lo + spread);
                plan.drops = drops;
                plan.ppm = ppm;
                plan.drain = drain;
                plan.seed = seed;
                plan.faults = faults
                    .into_iter()
                    .map(|(t, mut f)| {
                        match &mut f {
                            Fault::Crash { replica, .. }
                            | Fault::Shutdown { replica, .. }
                            | Fault::Partition { replica, .. }
                            | Fault::Refuse { replica, .. }
                            | Fault::Stall { replica, .. }
                            | Fault::HangWatch { replica, .. }
                            | Fault::ReadsFail { replica, .. }
                            | Fault::Slow { replica, .. }
                            | Fault::BreakWatch { replica } => *replica %= replicas,
                            Fault::Delete { .. } => {}
                        }
                        (t, f)
                    })
                    .collect();
                plan
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn never_two_holders_and_every_shard_held_after_the_faults(plan in plan()) {
        let mut world = World::new(plan);
        check(&mut world);
    }
}

mod by_hand {
    //! One replica driven event by event, for what the simulated world cannot make happen.

    use super::super::{
        Answer, Decision, Ending, LeaseName, Op, Output, Reason, Record, ReplicaState, Request, Rv,
    };
    use super::*;
    use crate::lease::clock::LocalInstant;
    use crate::lease::config::{OnLoss, Settings};

    fn at(ms: u64) -> LocalInstant {
        LocalInstant::from_duration(Duration::from_millis(ms))
    }

    fn replica(shards: u32, on_loss: OnLoss) -> ReplicaState {
        let timing = [15, 10, 2, 10].map(Duration::from_secs);
        ReplicaState::new(Settings::unchecked("a", shards, timing, on_loss), 7)
    }

    fn outputs(state: &mut ReplicaState) -> (Vec<Request>, Vec<Decision>) {
        let (mut requests, mut decisions) = (Vec::new(), Vec::new());
        while let Some(out) = state.poll() {
            match out {
                Output::Request(r) => requests.push(r),
                Output::Decision(d) => decisions.push(d),
            }
        }
        (requests, decisions)
    }

    fn stored(rv: &str, op: &Op) -> Record {
        let content = match op {
            Op::Create(c) | Op::Replace(_, c) => c.clone(),
            Op::Delete(_) => panic!("a delete"),
        };
        Record {
            rv: Rv::new(rv),
            content,
        }
    }

    fn find(requests: &[Request], lease: &LeaseName) -> Request {
        let found = requests.iter().find(|r| r.lease == *lease);
        found
            .unwrap_or_else(|| panic!("no write of {lease:?}: {requests:?}"))
            .clone()
    }

    /// A member holding its one shard: joined at 20 ms, its renewal started at 2,020 ms (the
    /// first to say it may hold shards) confirmed (deadline 12,020 ms), its record at rv 3,
    /// then the shard taken.
    fn holding() -> ReplicaState {
        holding_on_loss(OnLoss::Rejoin)
    }

    /// [`holding`], doing `on_loss` after a loss.
    fn holding_on_loss(on_loss: OnLoss) -> ReplicaState {
        let member = LeaseName::Member("a".into());
        let mut state = replica(1, on_loss);
        state.listed(Vec::new(), at(0));
        let (requests, _) = outputs(&mut state);
        let create = find(&requests, &member);
        let record = stored("1", &create.op);
        assert!(!record.content.held);
        state.answered(create.id, Answer::Done(Some(record.clone())), at(10));
        state.applied(member.clone(), record, at(20));
        let (requests, decisions) = outputs(&mut state);
        assert!(decisions.contains(&Decision::Joined {
            token: state.token().clone()
        }));
        assert!(requests.is_empty(), "nothing taken at once: {requests:?}");
        state.tick(at(2_020));
        let (requests, _) = outputs(&mut state);
        assert_eq!(requests.len(), 1, "{requests:?}");
        let renewal = find(&requests, &member);
        let record = stored("3", &renewal.op);
        assert!(record.content.held);
        state.answered(renewal.id, Answer::Done(Some(record.clone())), at(2_040));
        state.applied(member, record, at(2_040));
        assert_eq!(state.deadline(), Some(at(12_020)));
        let (requests, _) = outputs(&mut state);
        let take = find(&requests, &LeaseName::Shard(0));
        state.applied(take.lease.clone(), stored("9", &take.op), at(2_050));
        assert!(state.believes(0, at(2_050)));
        outputs(&mut state);
        state
    }

    #[test]
    fn a_renewal_that_makes_no_new_version_extends_nothing() {
        let mut state = holding();
        state.tick(at(4_020));
        let (requests, _) = outputs(&mut state);
        let renewal = &requests[0];
        assert!(matches!(&renewal.op, Op::Replace(rv, _) if *rv == Rv::new("3")));
        // The server answers 200 with the record unchanged (what it does for a write that
        // changes nothing): no new resourceVersion, no watch event.
        let unchanged = stored("3", &Op::Create(record(None, 1, 1)));
        state.answered(renewal.id, Answer::Done(Some(unchanged)), at(4_050));
        assert_eq!(state.deadline(), Some(at(12_020)), "not extended");
        assert!(state.believes(0, at(12_019)));
        assert!(!state.believes(0, at(12_020)));
        // Only the watch's record of that write extends it.
        state.applied(
            LeaseName::Member("a".into()),
            stored("4", &renewal.op),
            at(4_100),
        );
        assert_eq!(state.deadline(), Some(at(14_020)));
    }

    #[test]
    fn a_renewal_answered_late_but_within_the_deadline_keeps_the_shard() {
        let mut state = holding();
        state.tick(at(4_020));
        let (requests, _) = outputs(&mut state);
        let renewal = requests[0].clone();
        // Nothing for eight seconds: still held, and no second write under the same version
        // before a retry period has passed.
        for ms in (4_100..11_900).step_by(100) {
            state.tick(at(ms));
            assert!(state.believes(0, at(ms)));
        }
        let (requests, _) = outputs(&mut state);
        assert!(
            requests.len() <= 4,
            "a retry per retry period: {requests:?}"
        );
        state.applied(
            LeaseName::Member("a".into()),
            stored("4", &renewal.op),
            at(11_950),
        );
        state.answered(
            renewal.id,
            Answer::Done(Some(stored("4", &renewal.op))),
            at(11_960),
        );
        assert!(state.believes(0, at(13_000)));
        assert_eq!(state.deadline(), Some(at(14_020)));
    }

    /// Ticks at each wake-up up to `until`: the decisions, each with its instant.
    fn run(state: &mut ReplicaState, from: u64, until: u64) -> Vec<(LocalInstant, Decision)> {
        let (mut now, mut decided) = (at(from), Vec::new());
        while let Some(wake) = state.next_wake(now).filter(|&w| w <= at(until)) {
            now = wake;
            state.tick(now);
            decided.extend(outputs(state).1.into_iter().map(|d| (now, d)));
        }
        decided
    }

    #[test]
    fn a_shutdown_gives_up_leaving_after_the_hand_over_timeout_and_the_renew_deadline() {
        let mut state = holding();
        state.shut_down(at(5_000));
        let (_, decisions) = outputs(&mut state);
        let hand_over = Decision::HandOver {
            shard: 0,
            epoch: 1,
            reason: Reason::Shutdown,
            deadline: at(15_000),
        };
        assert!(decisions.contains(&hand_over), "{decisions:?}");
        // Never acknowledged, nothing answered: it gives up at 5 + 10 + 10 s, not before.
        let decided = run(&mut state, 5_000, 30_000);
        let ends: Vec<_> = decided
            .iter()
            .filter(|(_, d)| matches!(d, Decision::GaveUp | Decision::Ended(_)))
            .cloned()
            .collect();
        let end = Decision::Ended(Ending::Shutdown);
        assert_eq!(
            ends,
            [(at(25_000), Decision::GaveUp), (at(25_000), end.clone())]
        );
        assert_eq!(run(&mut state, 25_000, 60_000), []);
        // A drain reported at that instant comes too late: the shard is not given away.
        let mut late = holding();
        late.shut_down(at(5_000));
        outputs(&mut late);
        late.drained(0, at(25_000));
        let (requests, decisions) = outputs(&mut late);
        assert_eq!((requests, decisions), (vec![], vec![Decision::GaveUp, end]));
    }

    #[test]
    fn a_loss_with_stop_gives_up_leaving_a_retry_period_later() {
        let mut state = holding_on_loss(OnLoss::Stop);
        // No renewal answered: the belief ends at its deadline, 12,020 ms, and the vacating
        // write is never answered.
        let decided = run(&mut state, 2_050, 30_000);
        let lost = decided
            .iter()
            .find(|(_, d)| matches!(d, Decision::Lost { .. }))
            .map(|(t, _)| *t);
        assert_eq!(lost, Some(at(12_020)));
        let ends: Vec<_> = decided
            .iter()
            .filter(|(_, d)| matches!(d, Decision::GaveUp | Decision::Ended(_)))
            .cloned()
            .collect();
        let end = Decision::Ended(Ending::Lost { shard: 0 });
        assert_eq!(ends, [(at(14_020), Decision::GaveUp), (at(14_020), end)]);
    }

    #[test]
    fn a_holder_that_sees_its_membership_taken_stops_at_once_and_rejoins_with_a_new_token() {
        let mut state = holding();
        let old = state.token().clone();
        let mut fenced = record(None, 1, 5);
        fenced.previous = Some(old.clone());
        state.applied(
            LeaseName::Member("a".into()),
            Record {
                rv: Rv::new("9"),
                content: fenced,
            },
            at(5_000),
        );
        assert!(!state.believes(0, at(5_000)));
        let (requests, decisions) = outputs(&mut state);
        assert!(decisions.contains(&Decision::Lost { shard: 0, epoch: 1 }));
        assert!(decisions.contains(&Decision::MembershipLost { token: old.clone() }));
        assert_ne!(state.token(), &old);
        // Rejoins over its own fenced record at once, naming the old token as gone.
        let join = requests
            .iter()
            .find(|r| r.lease == LeaseName::Member("a".into()))
            .expect("a join");
        let Op::Replace(rv, content) = &join.op else {
            panic!("{join:?}")
        };
        assert_eq!(rv, &Rv::new("9"));
        assert_eq!(content.holder.as_ref(), Some(state.token()));
        assert_eq!(content.previous.as_ref(), Some(&old));
    }
}

#[test]
fn replicas_started_together_settle_with_few_hand_overs() {
    for (replicas, shards) in [(3, 32), (4, 256)] {
        let world = settle(Plan::new(replicas, shards), 30);
        let hand_overs = world
            .decisions
            .iter()
            .filter(|(_, _, d)| matches!(d, Decision::HandOver { .. }))
            .count();
        assert_eq!(hand_overs, 0, "{replicas} replicas, {shards} shards");
        assert!(all_held(&world));
    }
}

/// The figures behind the property test: how many random worlds, beliefs and fences it judged
/// (`cargo test -p workqueue-kube --lib census -- --ignored --nocapture`).
#[test]
#[ignore = "prints figures; the property test above is the check"]
fn census() {
    use proptest::test_runner::{Config as RunnerConfig, TestRunner};
    let cases = 2_000;
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        ..RunnerConfig::default()
    });
    let totals = std::cell::RefCell::new((0usize, 0usize, u64::MAX, 0usize));
    runner
        .run(&plan(), |plan| {
            let faults = plan.faults.len();
            let mut world = World::new(plan);
            let beliefs = check(&mut world);
            let (fences, slack) = world.ledger.assert_fences_leave(world.plan.margin());
            let mut t = totals.borrow_mut();
            t.0 += beliefs;
            t.1 += fences;
            t.2 = t.2.min(slack.unwrap_or(u64::MAX));
            t.3 += faults;
            Ok(())
        })
        .unwrap();
    let (beliefs, fences, slack, faults) = totals.into_inner();
    println!(
        "{cases} worlds, {faults} faults: {beliefs} beliefs judged, 0 overlaps; {fences} \
         fences of a holder that had held something, the smallest slack {} ms",
        slack / MS
    );
}
