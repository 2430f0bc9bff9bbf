//! Replicas of a `Controller` on Leases, each an OS process of its own, against the real
//! kube-apiserver and etcd: leader election through a `kill -9` of the leader, sharding through
//! join, leave and `kill -9`, and a leader frozen (SIGSTOP) in the middle of a reconcile.
//!
//! Each replica is this test binary run again (`workqueue_e2e::replica`): it reconciles the
//! test's ConfigMaps and appends every reconcile's start and end to one ledger file (wall clock,
//! one `O_APPEND` write per line). The test reads that file into test-support's ledger and
//! checks that no object was ever reconciled by two processes at once; the ledger fails on a
//! ledger that saw no run, and each scenario checks that it saw the runs it judges.
//!
//! The Leases are shortened (lease 3 s, renew deadline 2 s, retry 0.4 s: the defaults' ratios
//! are 15 / 10 / 2) so that a scenario takes seconds, not minutes. Wall clock: the bounds are
//! generous, and the scenarios run one at a time (they time takeovers).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use kube::ResourceExt;
use tokio::time::{Instant, sleep};
use workqueue_e2e::replica::{WRITER, fair, run_if_replica};
use workqueue_kube::lease::shard_of;
use workqueue_test_support::ledger_file::{END, Line, START};

mod scenario;

use scenario::{LEASE, RENEW, RETRY, Scenario, touch};

/// How soon after a holder stops another replica must take over: lease duration + retry
/// period + 1 s.
fn takeover_bound() -> Duration {
    LEASE + RETRY + Duration::from_secs(1)
}

/// The scenarios take the machine one at a time: they time takeovers.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Not a test: the entry of the replica processes the tests below start (this binary run again
/// with `replica_process --exact` and a replica's spec in its environment). Without a spec it
/// returns at once.
#[test]
fn replica_process() {
    run_if_replica();
}

/// Leader election with 3 processes; the leader is killed (`kill -9`) in the middle of its
/// reconciles; one standby takes over and reconciles every object again within lease duration +
/// retry period + 1 s of the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_every_object_reconciled_again() {
    let _serial = SERIAL.lock().await;
    let mut s = Scenario::new("leader-kill").await;
    const OBJECTS: usize = 20;
    let names: Vec<String> = (0..OBJECTS).map(Scenario::name).collect();
    s.create(&names).await;
    for identity in ["r1", "r2", "r3"] {
        let mut spec = s.spec(identity, 1);
        // Reconciling all the time, so that the kill lands in the middle of reconciles.
        spec.hold = Duration::from_millis(100);
        spec.concurrency = 0;
        spec.requeue = Some(Duration::from_millis(500));
        s.start(&spec);
    }
    let all = |s: &Scenario, since: Instant, by: Option<&str>| {
        let objects: HashSet<String> = s
            .completed()
            .into_iter()
            .filter(|c| c.start >= since && by.is_none_or(|r| c.replica != r))
            .map(|c| c.object)
            .collect();
        objects.len() == OBJECTS
    };
    let origin = Instant::now() - Duration::from_secs(3600);
    s.until(
        Duration::from_secs(60),
        "a leader reconciles every object",
        |s| all(s, origin, None),
    )
    .await;
    let replicas: HashSet<String> = s.runs().into_iter().map(|r| r.replica).collect();
    assert_eq!(replicas.len(), 1, "one leader reconciles: {replicas:?}");
    let leader = replicas.into_iter().next().unwrap();
    s.until(Duration::from_secs(10), "the leader is reconciling", |s| {
        s.runs()
            .iter()
            .any(|r| r.replica == leader && r.ended.is_none())
    })
    .await;
    let killed = s.kill(&leader);
    s.until(
        Duration::from_secs(60),
        "every object reconciled again by another replica",
        |s| all(s, killed, Some(&leader)),
    )
    .await;
    // Exactly: the end of the last object's first run after the kill.
    let mut first_end: HashMap<String, Instant> = HashMap::new();
    for run in s.runs() {
        if run.start >= killed && run.replica != leader {
            let end = run.ended.expect("runs counted ended");
            let e = first_end.entry(run.subject).or_insert(end);
            *e = (*e).min(end);
        }
    }
    let took = first_end.values().max().copied().unwrap() - killed;
    let successors: HashSet<String> = s
        .runs()
        .into_iter()
        .filter(|r| r.start >= killed)
        .map(|r| r.replica)
        .collect();
    println!(
        "leader {leader} killed; {successors:?} reconciled every object again {:.2} s after the kill (bound {:.1} s)",
        took.as_secs_f64(),
        takeover_bound().as_secs_f64()
    );
    assert_eq!(successors.len(), 1, "one successor: {successors:?}");
    assert!(
        took <= takeover_bound(),
        "every object reconciled again {took:?} after the kill (bound {:?})",
        takeover_bound()
    );
    sleep(Duration::from_secs(2)).await;
    let runs = s.assert_never_two_at_once();
    assert!(runs >= 2 * OBJECTS, "{runs} runs judged");
    s.shut_down();
}

/// The sharding scenario's objects and shards.
const SHARDED_OBJECTS: usize = 2000;
const SHARDS: u32 = 32;

/// One membership change of the sharding scenario, made at `changed`: every object is changed
/// at once (while shards move); the shards must settle on `replicas`, and every change be
/// reconciled; then every object is changed again, and each shard's objects must be reconciled
/// by one replica, the shards shared fairly.
async fn membership_change(
    s: &mut Scenario,
    names: &[String],
    what: &str,
    replicas: &[&str],
    changed: Instant,
) {
    // The changes while the shards move, beside the wait for them to settle.
    let touching = tokio::spawn(touch(
        s.api.clone(),
        s.ns.clone(),
        names.to_vec(),
        format!("{what}: during"),
    ));
    s.until_fair(Duration::from_secs(60), replicas, SHARDS)
        .await;
    let settled = changed.elapsed();
    let during = touching.await.expect("the changes");
    let touched = changed.elapsed();
    s.until(
        Duration::from_secs(120),
        &format!("{what}: every change made during it reconciled"),
        |s| s.not_reconciled(&during) == 0,
    )
    .await;
    println!(
        "{what}: shards fair on {replicas:?} {:.1} s after it; every object changed meanwhile (within {:.1} s), and every change reconciled {:.1} s after it",
        settled.as_secs_f64(),
        touched.as_secs_f64(),
        changed.elapsed().as_secs_f64()
    );
    sleep(Duration::from_secs(1)).await;
    let touched = Instant::now();
    let after = s.touch(names, &format!("{what}: after")).await;
    s.until(
        Duration::from_secs(120),
        &format!("{what}: every change after settling reconciled"),
        |s| s.not_reconciled(&after) == 0,
    )
    .await;
    let took = touched.elapsed();
    // Each shard's objects reconciled by one replica (the one holding it), fairly shared.
    let mut by_shard: BTreeMap<u32, HashSet<String>> = BTreeMap::new();
    for run in s.completed().into_iter().filter(|c| c.start >= touched) {
        let (ns, name) = run.object.split_once('/').unwrap();
        let shard = shard_of(Some(ns), name, SHARDS);
        by_shard.entry(shard).or_default().insert(run.replica);
    }
    let mut per_replica: BTreeMap<String, u32> = BTreeMap::new();
    for (shard, on) in &by_shard {
        assert_eq!(on.len(), 1, "{what}: shard {shard} reconciled by {on:?}");
        let replica = on.iter().next().unwrap().clone();
        *per_replica.entry(replica).or_default() += 1;
    }
    println!(
        "{what}: a change of every object after settling reconciled within {:.1} s; shards by reconciles: {per_replica:?}",
        took.as_secs_f64()
    );
    assert!(
        fair(&per_replica, replicas, SHARDS),
        "{what}: shards by reconciles {per_replica:?}"
    );
}

/// Sharding with 3 processes, 32 shards and 2,000 ConfigMaps: one replica, then two join, one
/// leaves (SIGTERM: hand-over), one is killed (`kill -9`: expiry). Every object is changed at
/// the moment of each change (while shards move) and again once the shards settled; each time
/// every object is reconciled at (at least) its new version, and after settling each shard's
/// objects are reconciled by one replica, the shards shared fairly. No object is ever
/// reconciled by two processes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_join_leave_and_die_without_two_at_once() {
    let _serial = SERIAL.lock().await;
    let mut s = Scenario::new("shards").await;
    let names: Vec<String> = (0..SHARDED_OBJECTS).map(Scenario::name).collect();
    let created = Instant::now();
    s.create(&names).await;
    println!(
        "{SHARDED_OBJECTS} ConfigMaps created in {:.1} s",
        created.elapsed().as_secs_f64()
    );
    let spec = |s: &Scenario, identity: &str| {
        let mut spec = s.spec(identity, SHARDS);
        spec.hold = Duration::from_millis(10);
        spec
    };
    let first = spec(&s, "r1");
    let started = Instant::now();
    s.start(&first);
    s.until_fair(Duration::from_secs(60), &["r1"], SHARDS).await;
    let held = started.elapsed();
    let zero: HashMap<String, u64> = names.iter().map(|n| (format!("{}/{n}", s.ns), 0)).collect();
    s.until(
        Duration::from_secs(120),
        "r1 reconciles every object",
        |s| s.not_reconciled(&zero) == 0,
    )
    .await;
    println!(
        "r1 held every shard {:.1} s after its start, and reconciled every object after {:.1} s",
        held.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    let joined = Instant::now();
    for identity in ["r2", "r3"] {
        let next = spec(&s, identity);
        s.start(&next);
    }
    membership_change(&mut s, &names, "join (r2, r3)", &["r1", "r2", "r3"], joined).await;

    let left = Instant::now();
    s.replica("r3").signal("TERM");
    let mut r3 = s.replicas.remove("r3").unwrap();
    let exited = async {
        let status = r3.exit_within(Duration::from_secs(15)).await;
        (status, left.elapsed())
    };
    let change = membership_change(&mut s, &names, "leave (r3, SIGTERM)", &["r1", "r2"], left);
    let ((status, took), ()) = tokio::join!(exited, change);
    assert!(
        status.is_some_and(|s| s.success()),
        "r3 did not exit cleanly after SIGTERM: {status:?}\n{}",
        r3.log_tail(20)
    );
    println!("r3 exited {:.1} s after SIGTERM", took.as_secs_f64());

    let killed = s.kill("r2");
    membership_change(&mut s, &names, "kill -9 (r2)", &["r1"], killed).await;

    let runs = s.assert_never_two_at_once();
    assert!(runs >= 5 * SHARDED_OBJECTS, "{runs} runs judged");
    s.shut_down();
}

/// Leader election with 3 processes; the leader is frozen (SIGSTOP) in the middle of a
/// reconcile that writes, for twice the lease duration, then continued (SIGCONT). A frozen
/// reconcile is the one overlap no lease can prevent (its run is judged to end at the freeze);
/// what can be is asserted: a successor takes over within lease duration + retry period + 1 s of
/// the stop; after SIGCONT the old leader starts no reconcile and logs its loss at once; and the
/// frozen reconcile's write, made with the resourceVersion it read, is refused (409) instead
/// of overwriting the successor's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_replaced_and_its_late_write_refused() {
    let _serial = SERIAL.lock().await;
    let mut s = Scenario::new("leader-pause").await;
    let names: Vec<String> = (0..4)
        .map(Scenario::name)
        .chain(["fenced".to_string()])
        .collect();
    s.create(&names).await;
    let fenced = format!("{}/fenced", s.ns);
    for identity in ["r1", "r2", "r3"] {
        let mut spec = s.spec(identity, 1);
        spec.hold = Duration::from_secs(1);
        spec.concurrency = 0;
        spec.requeue = Some(Duration::from_millis(200));
        spec.fenced = Some("fenced".into());
        s.start(&spec);
    }
    let writes = |s: &Scenario, by: &dyn Fn(&str) -> bool, after: Instant, answer: &str| {
        s.lines()
            .iter()
            .filter(|l| l.kind == "write" && l.subject == fenced && by(&l.replica))
            .filter(|l| s.at(l) >= after && l.detail.starts_with(answer))
            .count()
    };
    let origin = Instant::now() - Duration::from_secs(3600);
    s.until(Duration::from_secs(60), "a leader writes", |s| {
        writes(s, &|_| true, origin, "ok") > 0
    })
    .await;
    let leader = s
        .lines()
        .iter()
        .find(|l| l.kind == "write")
        .unwrap()
        .replica
        .clone();
    // Freeze the leader just after it starts reconciling the fenced object: its write is due a
    // second later.
    let starts_of_fenced = |s: &Scenario| {
        s.lines()
            .iter()
            .filter(|l| l.kind == START && l.subject == fenced && l.replica == leader)
            .count()
    };
    let before = starts_of_fenced(&s);
    s.until(
        Duration::from_secs(10),
        "the leader starts a reconcile of the fenced object",
        |s| starts_of_fenced(s) > before,
    )
    .await;
    // The process may run until the signal is delivered, at the latest when `signal` returns:
    // its runs end then in the ledger; the takeover is timed from the sending, which is earlier.
    let stop_sent = Instant::now();
    s.replica(&leader).signal("STOP");
    let stopped = Instant::now();
    let pid = s.replica(&leader).pid();
    s.reader.sync().stopped(pid, stopped);
    let frozen_start = s
        .lines()
        .iter()
        .rfind(|l| l.kind == START && l.subject == fenced && l.replica == leader)
        .map(|l| s.at(l))
        .unwrap();
    assert_eq!(
        writes(&s, &|r| r == leader, frozen_start, ""),
        0,
        "the leader wrote before it was frozen: the stop came too late"
    );
    println!(
        "{leader} frozen {:.0} ms into its reconcile of the fenced object",
        (stopped - frozen_start).as_secs_f64() * 1000.0
    );

    let is_other = |r: &str| r != leader;
    s.until(Duration::from_secs(30), "another replica takes over", |s| {
        s.runs()
            .iter()
            .any(|r| r.replica != leader && r.start >= stopped)
    })
    .await;
    let took_over = s
        .runs()
        .iter()
        .filter(|r| r.replica != leader && r.start >= stopped)
        .map(|r| r.start)
        .min()
        .unwrap()
        - stop_sent;
    println!(
        "a successor's first reconcile began {:.2} s after the stop (bound {:.1} s)",
        took_over.as_secs_f64(),
        takeover_bound().as_secs_f64()
    );
    s.until(Duration::from_secs(30), "the successor writes", |s| {
        writes(s, &is_other, stopped, "ok") > 0
    })
    .await;

    sleep((stopped + 2 * LEASE).saturating_duration_since(Instant::now())).await;
    // Its first instant awake is after the sending at the earliest.
    let resumed = Instant::now();
    s.replica(&leader).signal("CONT");
    sleep(Duration::from_secs(3)).await;
    s.sync();

    let late_starts: Vec<&Line> = s
        .lines()
        .iter()
        .filter(|l| l.replica == leader && l.kind == START && s.at(l) >= resumed)
        .collect();
    let noticed = s
        .lines()
        .iter()
        .filter(|l| l.replica == leader && l.kind == "log" && s.at(l) >= resumed)
        .find(|l| l.detail.to_lowercase().contains("lost"))
        .map(|l| (s.at(l) - resumed, l.detail.clone()));
    let late_writes: Vec<&Line> = s
        .lines()
        .iter()
        .filter(|l| l.replica == leader && l.kind == "write" && s.at(l) >= resumed)
        .collect();
    let object = s.api.get("fenced").await.unwrap();
    let writer = object.annotations().get(WRITER).cloned();
    println!(
        "after SIGCONT: {} reconciles started by {leader}; its loss logged after {:?}; its late writes: {:?}; the object's writer: {writer:?}",
        late_starts.len(),
        noticed,
        late_writes.iter().map(|l| &l.detail).collect::<Vec<_>>()
    );
    assert!(
        took_over <= takeover_bound(),
        "the successor took over {took_over:?} after the stop (bound {:?})",
        takeover_bound()
    );
    assert!(
        late_starts.is_empty(),
        "{leader} started reconciles after SIGCONT: {late_starts:?}"
    );
    // Nothing that began before the freeze is polled again after it: its runs end dropped,
    // never done (the runner asks before each poll whether the shard is still held).
    let late_ends: Vec<&Line> = s
        .lines()
        .iter()
        .filter(|l| l.replica == leader && l.kind == END && s.at(l) >= resumed)
        .collect();
    let completed_late: Vec<&&Line> = late_ends.iter().filter(|l| l.detail == "done").collect();
    println!(
        "after SIGCONT: {} of {leader}'s reconciles ended, {} of them done",
        late_ends.len(),
        completed_late.len()
    );
    assert!(
        !late_ends.is_empty(),
        "the frozen reconciles were ended after the thaw (the ledger saw them)"
    );
    assert!(
        completed_late.is_empty(),
        "{leader} ran reconciles to their end after SIGCONT: {completed_late:?}"
    );
    let (after, _) = noticed.unwrap_or_else(|| {
        panic!(
            "{leader} logged no loss after SIGCONT\n{}",
            s.replica(&leader).log_tail(30)
        )
    });
    assert!(
        after <= Duration::from_secs(1),
        "{leader} logged its loss {after:?} after SIGCONT"
    );
    assert_eq!(
        late_writes.len(),
        1,
        "the frozen write was sent once: {late_writes:?}"
    );
    assert_eq!(
        late_writes[0].detail, "409",
        "the frozen write was not refused"
    );
    assert_ne!(writer.as_deref(), Some(leader.as_str()));
    let runs = s.assert_never_two_at_once();
    assert!(runs >= 10, "{runs} runs judged");
    s.shut_down();
}

/// How soon a replica that cannot read its renewals back gives way, as the `lease` docs state
/// it: lease duration + renew deadline + 3 retry periods (plus its round trip, here nothing).
fn give_way_bound() -> Duration {
    LEASE + RENEW + 3 * RETRY
}

/// For each object, the longest time in `from..to` without a reconcile of it ending (by
/// anyone), from the completed runs.
fn longest_gap(s: &Scenario, objects: &[String], from: Instant, to: Instant) -> Duration {
    let mut ends: HashMap<&str, Vec<Instant>> = HashMap::new();
    for run in s.runs() {
        if let Some(end) = run.ended.filter(|e| *e >= from && *e <= to) {
            let subject = objects
                .iter()
                .find(|o| run.subject.ends_with(&format!("/{o}")));
            if let Some(o) = subject {
                ends.entry(o.as_str()).or_default().push(end);
            }
        }
    }
    objects
        .iter()
        .map(|o| {
            let mut times = ends.remove(o.as_str()).unwrap_or_default();
            times.sort();
            let mut last = from;
            let mut gap = Duration::ZERO;
            for t in times.into_iter().chain([to]) {
                gap = gap.max(t - last);
                last = t;
            }
            gap
        })
        .max()
        .unwrap_or_default()
}

/// Leader election with 3 processes; the Lease watches of the leader and of a standby hang
/// silently (connections open, no event, no error) for 2 minutes while their writes and lists
/// work. Each finds its watch stale, replaces it and reports it once on its stream; the objects
/// are reconciled throughout (no object waits longer than the documented bound), and never by
/// two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_watches_that_hang_silently_stop_nothing() {
    let _serial = SERIAL.lock().await;
    let mut s = Scenario::new("watch-hang").await;
    const OBJECTS: usize = 10;
    let names: Vec<String> = (0..OBJECTS).map(Scenario::name).collect();
    s.create(&names).await;
    let flag = |identity: &str| s.dir.join(format!("hang-{identity}"));
    let flags: BTreeMap<String, PathBuf> = ["r1", "r2", "r3"]
        .iter()
        .map(|i| (i.to_string(), flag(i)))
        .collect();
    for identity in ["r1", "r2", "r3"] {
        let mut spec = s.spec(identity, 1);
        spec.hold = Duration::from_millis(100);
        spec.concurrency = 0;
        spec.requeue = Some(Duration::from_millis(500));
        spec.hang_watch = Some(flags[identity].clone());
        s.start(&spec);
    }
    s.until(
        Duration::from_secs(60),
        "a leader reconciles every object",
        |s| {
            let done: HashSet<String> = s.completed().into_iter().map(|c| c.object).collect();
            done.len() == OBJECTS
        },
    )
    .await;
    let leader = s.runs()[0].replica.clone();
    let standby = ["r1", "r2", "r3"]
        .into_iter()
        .find(|r| *r != leader)
        .unwrap()
        .to_string();
    let hung = Instant::now();
    for victim in [&leader, &standby] {
        std::fs::write(&flags[victim], b"").expect("the flag file");
    }
    const HANG: Duration = Duration::from_secs(120);
    sleep(HANG).await;
    for victim in [&leader, &standby] {
        std::fs::remove_file(&flags[victim]).expect("removing the flag file");
    }
    let healed = Instant::now();
    sleep(Duration::from_secs(3)).await;
    s.sync();
    s.check_alive();
    let gap = longest_gap(&s, &names, hung, healed);
    let stale = |who: &str| {
        s.lines()
            .iter()
            .filter(|l| l.replica == who && l.kind == "item" && l.detail.contains("was stale"))
            .count()
    };
    let runs_of = |who: &str| {
        s.runs()
            .iter()
            .filter(|r| r.replica == who && r.start >= hung && r.start < healed)
            .count()
    };
    println!(
        "{leader} (leader) and {standby} (standby): Lease watches hung for {HANG:?}; longest time an object waited for a reconcile {:.2} s (bound {:.1} s); stale reports {} and {}; the leader's reconciles meanwhile {}",
        gap.as_secs_f64(),
        give_way_bound().as_secs_f64(),
        stale(&leader),
        stale(&standby),
        runs_of(&leader)
    );
    assert!(
        gap <= give_way_bound(),
        "an object waited {gap:?} for a reconcile (bound {:?})\n{}",
        give_way_bound(),
        s.logs()
    );
    // A stale watch is replaced, not given up: the leader goes on leading (without the
    // replacement it steps down and another replica takes over within the same bound).
    let all_runs = s
        .runs()
        .iter()
        .filter(|r| r.start >= hung && r.start < healed)
        .count();
    assert!(
        runs_of(&leader) * 10 >= all_runs * 9,
        "the leader ran {} of the {all_runs} reconciles during the hang",
        runs_of(&leader)
    );
    assert_eq!(stale(&leader), 1, "the leader reports its stale watch once");
    assert_eq!(
        stale(&standby),
        1,
        "the standby reports its stale watch once"
    );
    let runs = s.assert_never_two_at_once();
    assert!(runs >= 100, "{runs} runs judged");
    s.shut_down();
}

/// Leader election with 2 processes whose Leases are 6 s / 3 s / 0.8 s; a reconcile of the
/// leader blocks its runtime's thread for twice the lease duration (user code that
/// computes without yielding), on a `current_thread` runtime and on a `multi_thread` one with one
/// worker: its renewals and its watchdog starve. Its lease guard (a thread of its own) ends the
/// process with `EXIT_UNSTOPPABLE` before the standby may take over; never two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_runtime_is_blocked_exits_before_the_takeover() {
    let _serial = SERIAL.lock().await;
    const LEASE6: Duration = Duration::from_secs(6);
    const RENEW3: Duration = Duration::from_secs(3);
    const RETRY08: Duration = Duration::from_millis(800);
    for workers in [0usize, 1] {
        let mut s = Scenario::new("blocked").await;
        let names: Vec<String> = (0..4).map(Scenario::name).collect();
        s.create(&names).await;
        let flag = s.dir.join("block");
        for identity in ["r1", "r2"] {
            let mut spec = s.spec(identity, 1);
            spec.timing = Some((LEASE6, RENEW3, RETRY08));
            spec.hold = Duration::from_millis(200);
            spec.concurrency = 0;
            spec.requeue = Some(Duration::from_secs(1));
            spec.workers = workers;
            // A reconcile blocks while the flag file exists: the scenario makes it for the
            // leader's next reconcile, and removes it once one blocked.
            spec.block = Some((flag.clone(), 2 * LEASE6));
            s.start(&spec);
        }
        s.until(Duration::from_secs(60), "a leader reconciles", |s| {
            let done: HashSet<String> = s.completed().into_iter().map(|c| c.object).collect();
            done.len() == names.len()
        })
        .await;
        let leader = s.runs()[0].replica.clone();
        let standby = if leader == "r1" { "r2" } else { "r1" }.to_string();
        std::fs::write(&flag, b"").expect("the flag file");
        s.until(Duration::from_secs(30), "the leader blocks", |s| {
            s.lines()
                .iter()
                .any(|l| l.kind == "block" && l.replica == leader)
        })
        .await;
        std::fs::remove_file(&flag).expect("removing the flag file");
        let blocked_line = s
            .lines()
            .iter()
            .find(|l| l.kind == "block" && l.replica == leader)
            .cloned()
            .unwrap();
        let blocked = s.at(&blocked_line);
        // The leader exits by itself: poll for it, then close its runs at that moment.
        let mut exited = None;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            let child = s.replicas.get_mut(&leader).unwrap();
            if child.has_exited() {
                exited = Some(Instant::now());
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
        let exited = exited.unwrap_or_else(|| panic!("{leader} did not exit\n{}", s.logs()));
        let mut child = s.replicas.remove(&leader).unwrap();
        let status = child.wait_exit(Duration::from_secs(5));
        let pid = child.pid();
        s.reader.sync().stopped(pid, exited);
        let code = status.and_then(|st| st.code());
        s.until(Duration::from_secs(30), "the standby takes over", |s| {
            s.runs()
                .iter()
                .any(|r| r.replica == standby && r.start >= blocked)
        })
        .await;
        let took_over = s
            .runs()
            .iter()
            .filter(|r| r.replica == standby && r.start >= blocked)
            .map(|r| r.start)
            .min()
            .unwrap();
        let unblocked = s
            .lines()
            .iter()
            .any(|l| l.kind == "unblocked" && l.replica == leader);
        println!(
            "{} runtime: {leader} blocked its thread; it exited {:.2} s later with {code:?}; {standby} took over {:.2} s after the block; the blocked reconcile came back: {unblocked}",
            if workers == 0 {
                "current_thread"
            } else {
                "multi_thread, 1 worker"
            },
            (exited - blocked).as_secs_f64(),
            (took_over - blocked).as_secs_f64(),
        );
        assert_eq!(
            code,
            Some(workqueue_kube::lease::EXIT_UNSTOPPABLE),
            "{leader} ended with the lease guard's code\n{}",
            child.log_tail(20)
        );
        assert!(!unblocked, "the blocked reconcile never came back");
        assert!(
            exited < took_over,
            "{leader} exited before {standby}'s first reconcile"
        );
        let runs = s.assert_never_two_at_once();
        assert!(runs >= 8, "{runs} runs judged");
        s.shut_down();
    }
}
