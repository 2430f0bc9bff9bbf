//! A simulated world for the protocol: replicas whose clocks run at different rates, one
//! linearizable Lease store, requests and watch events with random latencies, drops,
//! partitions, stalls, crashes and restarts under the same identity, graceful shutdowns,
//! duplicate identities and deletes of Leases by a third party. Time is simulated (nanoseconds
//! of "real" time); each replica sees only its own clock.

mod clock;
mod ledger;
mod store;

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::config::{OnLoss, Settings};
use super::{Answer, Decision, LeaseName, Op, Output, ReplicaState, Request};
pub(crate) use clock::{Rng, SimClock};
pub(crate) use ledger::{Fence, Ledger};
use store::{Change, Store};

const MS: u64 = 1_000_000;

/// A fault, at a time of the plan.
#[derive(Clone, Debug)]
pub(super) enum Fault {
    /// The process dies; a new one with the same identity starts `down` ms later.
    Crash { replica: usize, down: u64 },
    /// The process shuts down gracefully; a new one starts `down` ms after it ended.
    Shutdown { replica: usize, down: u64 },
    /// Its requests, answers and watch are lost for `ms` ms; then it relists.
    Partition { replica: usize, ms: u64 },
    /// Its requests fail at once for `ms` ms (connection refused); its watch is broken.
    Refuse { replica: usize, ms: u64 },
    /// The process runs nothing for `ms` ms (a GC pause, SIGSTOP).
    Stall { replica: usize, ms: u64 },
    /// Its watch breaks; it relists a second later.
    BreakWatch { replica: usize },
    /// A third party deletes one of the Leases (the `pick`-th, in name order).
    Delete { pick: usize },
    /// Its watch delivers nothing for `ms` ms, with no error (a connection held open by a
    /// proxy); what it holds back arrives afterwards, in order. Lists and writes work.
    HangWatch { replica: usize, ms: u64 },
    /// Its reads fail for `ms` ms: its watch is broken and every list fails (retried every
    /// second); its writes work.
    ReadsFail { replica: usize, ms: u64 },
    /// `each_way` ms more latency on everything it sends and receives, for `ms` ms.
    Slow {
        replica: usize,
        ms: u64,
        each_way: u64,
    },
}

impl Fault {
    /// When the fault's effects end, from its start.
    fn lasts(&self) -> u64 {
        match *self {
            Fault::Crash { down, .. } | Fault::Shutdown { down, .. } => down,
            Fault::Partition { ms, .. }
            | Fault::Refuse { ms, .. }
            | Fault::Stall { ms, .. }
            | Fault::HangWatch { ms, .. }
            | Fault::ReadsFail { ms, .. }
            | Fault::Slow { ms, .. } => ms,
            Fault::BreakWatch { .. } => 2_000,
            Fault::Delete { .. } => 0,
        }
    }
}

/// What a simulation runs.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    replicas: usize,
    /// Replica `r` has identity `r % identities`: fewer identities than replicas share some.
    pub(super) identities: usize,
    pub(crate) shards: u32,
    pub(super) lease_duration: Duration,
    pub(super) renew_deadline: Duration,
    pub(super) retry_period: Duration,
    /// Each way, per request and per watch event, uniform in this range (ms).
    pub(super) latency: (u64, u64),
    /// Requests lost on the way there or back, per mille, until the last fault's effects end
    /// (lost requests are a fault too).
    pub(super) drops: u32,
    /// The largest clock rate deviation, in parts per million either way.
    pub(super) ppm: i64,
    /// A hand-over's drain takes up to this long (ms).
    pub(super) drain: u64,
    /// The hand-over's deadline, after its request.
    pub(super) hand_over_timeout: Duration,
    pub(super) seed: u64,
    /// Faults at times (ms).
    pub(super) faults: Vec<(u64, Fault)>,
    /// How long the world runs after the last fault's effects end (ms).
    pub(super) calm: u64,
    /// Replicas configured with other durations: lease duration, renew deadline and retry
    /// period, by replica.
    pub(super) timing: BTreeMap<usize, (Duration, Duration, Duration)>,
}

impl Plan {
    pub(super) fn new(replicas: usize, shards: u32) -> Plan {
        Plan {
            replicas,
            identities: replicas,
            shards,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            latency: (1, 20),
            drops: 0,
            ppm: 0,
            drain: 0,
            hand_over_timeout: Duration::from_secs(10),
            seed: 1,
            faults: Vec::new(),
            calm: 60_000,
            timing: BTreeMap::new(),
        }
    }

    /// When the last fault's effects end (ms).
    pub(super) fn quiet_from(&self) -> u64 {
        self.faults
            .iter()
            .map(|(t, f)| t + f.lasts())
            .max()
            .unwrap_or(0)
    }

    /// The smallest slack the fence argument promises between a fenced holder's last belief
    /// deadline and the fence, with clock rates within `ppm` (ns).
    pub(super) fn margin(&self) -> u64 {
        let ld = Duration::from_secs(self.lease_duration.as_secs_f64().ceil() as u64);
        let e = self.ppm as f64 / 1e6;
        let m =
            ld.as_nanos() as f64 / (1.0 + e) - self.renew_deadline.as_nanos() as f64 / (1.0 - e);
        // Integer rounding of the clocks: a microsecond.
        (m.max(0.0) as u64).saturating_sub(1_000)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watch {
    Broken,
    Relisting,
    Live,
}

#[derive(Debug)]
struct Replica {
    identity: String,
    clock: SimClock,
    /// The process (a new number for each start).
    process: usize,
    state: Option<ReplicaState>,
    partitioned_until: u64,
    refused_until: u64,
    stalled_until: u64,
    hung_until: u64,
    reads_fail_until: u64,
    slow_until: u64,
    slow_each_way: u64,
    watch: Watch,
    /// Bumped whenever the watch breaks: deliveries of an older one are dropped.
    watch_gen: u64,
    watch_last: u64,
    wake_gen: u64,
    /// Writes sent, by kind, for the load figures.
    writes: BTreeMap<&'static str, u64>,
    /// Restart this long (ms) after the running process ends (a graceful shutdown's).
    restart: Option<u64>,
}

#[derive(Clone, Debug)]
enum Ev {
    Start {
        replica: usize,
    },
    Tick {
        replica: usize,
        process: usize,
        generation: u64,
    },
    Commit {
        replica: usize,
        process: usize,
        request: Request,
        drop_answer: bool,
    },
    Answer {
        replica: usize,
        process: usize,
        id: u64,
        answer: Answer,
    },
    Relist {
        replica: usize,
        process: usize,
        generation: u64,
    },
    Listed {
        replica: usize,
        process: usize,
        generation: u64,
        records: Vec<(LeaseName, super::Record)>,
    },
    Deliver {
        replica: usize,
        process: usize,
        generation: u64,
        change: Change,
    },
    Drained {
        replica: usize,
        process: usize,
        shard: u32,
    },
    Fault(Fault),
}

impl Ev {
    /// The replica whose process handles it (not the store's events).
    fn replica(&self) -> Option<usize> {
        match self {
            Ev::Tick { replica, .. }
            | Ev::Answer { replica, .. }
            | Ev::Listed { replica, .. }
            | Ev::Deliver { replica, .. }
            | Ev::Drained { replica, .. } => Some(*replica),
            _ => None,
        }
    }
}

/// The world.
#[derive(Debug)]
pub(super) struct World {
    pub(super) plan: Plan,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    store: Store,
    replicas: Vec<Replica>,
    processes: usize,
    rng: Rng,
    pub(super) ledger: Ledger,
    /// Every decision, with its time and process.
    pub(super) decisions: Vec<(u64, usize, Decision)>,
    /// Every request and answer, with its time and process (for debugging a failed case).
    trace: Vec<(u64, usize, String)>,
}

impl World {
    pub(super) fn new(plan: Plan) -> World {
        let mut rng = Rng::new(plan.seed);
        let replicas = (0..plan.replicas)
            .map(|r| {
                let ppm = if plan.ppm == 0 {
                    0
                } else {
                    rng.between(0, 2 * plan.ppm as u64) as i64 - plan.ppm
                };
                Replica {
                    identity: format!("r{}", r % plan.identities.max(1)),
                    clock: SimClock {
                        offset: rng.between(0, 3_600_000) * MS,
                        ppm,
                    },
                    process: 0,
                    state: None,
                    partitioned_until: 0,
                    refused_until: 0,
                    stalled_until: 0,
                    hung_until: 0,
                    reads_fail_until: 0,
                    slow_until: 0,
                    slow_each_way: 0,
                    watch: Watch::Broken,
                    watch_gen: 0,
                    watch_last: 0,
                    wake_gen: 0,
                    writes: BTreeMap::new(),
                    restart: None,
                }
            })
            .collect();
        let mut world = World {
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            store: Store::default(),
            replicas,
            processes: 0,
            rng,
            ledger: Ledger::default(),
            decisions: Vec::new(),
            trace: Vec::new(),
            plan,
        };
        for r in 0..world.plan.replicas {
            let at = world.rng.between(0, 3) * MS;
            world.at(at, Ev::Start { replica: r });
        }
        for (t, fault) in world.plan.faults.clone() {
            world.at(t * MS, Ev::Fault(fault));
        }
        world
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((t.max(self.now), self.seq), ev);
    }

    fn latency(&mut self) -> u64 {
        let (lo, hi) = self.plan.latency;
        self.rng.between(lo * MS, hi * MS)
    }

    /// The latency one way to or from `replica`, with its `Slow` fault's.
    fn latency_of(&mut self, replica: usize) -> u64 {
        let r = &self.replicas[replica];
        let extra = if r.slow_until > self.now {
            r.slow_each_way * MS
        } else {
            0
        };
        self.latency() + extra
    }

    pub(super) fn now(&self) -> u64 {
        self.now
    }

    /// Runs until `until` (ns).
    pub(super) fn run_until(&mut self, until: u64) {
        let mut budget: u64 = 2_000_000;
        while let Some(entry) = self.queue.first_entry() {
            budget -= 1;
            if budget < 20 {
                eprintln!("runaway at {} ms: {:?}", self.now / MS, entry.get());
            }
            assert!(
                budget > 0,
                "the simulation ran away at {} ms",
                self.now / MS
            );
            let (t, _) = *entry.key();
            if t > until {
                break;
            }
            let ev = entry.remove();
            self.now = t;
            if let Some(r) = ev.replica()
                && self.replicas[r].stalled_until > t
            {
                let resume = self.replicas[r].stalled_until;
                self.at(resume, ev);
                continue;
            }
            self.handle(ev);
        }
        self.now = self.now.max(until);
    }

    /// Runs the plan to its end and closes the ledger.
    pub(super) fn run(&mut self) {
        let end = (self.plan.quiet_from() + self.plan.calm) * MS;
        self.run_until(end);
        self.ledger.finish(end);
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Start { replica } => self.start(replica),
            Ev::Fault(fault) => self.fault(fault),
            Ev::Commit {
                replica,
                process,
                request,
                drop_answer,
            } => self.commit(replica, process, request, drop_answer),
            Ev::Relist {
                replica,
                process,
                generation,
            } => self.relist(replica, process, generation),
            Ev::Tick {
                replica,
                process,
                generation,
            } => {
                if self.replicas[replica].wake_gen == generation {
                    self.step(replica, process, |s, now| s.tick(now));
                }
            }
            Ev::Answer {
                replica,
                process,
                id,
                answer,
            } => {
                if answer != Answer::Unknown && self.replicas[replica].partitioned_until > self.now
                {
                    return;
                }
                self.trace
                    .push((self.now, process, format!("answer {id}: {answer:?}")));
                self.step(replica, process, |s, now| s.answered(id, answer, now))
            }
            Ev::Listed {
                replica,
                process,
                generation,
                records,
            } => {
                if self.replicas[replica].watch_gen == generation {
                    self.step(replica, process, |s, now| s.listed(records, now));
                }
            }
            Ev::Deliver {
                replica,
                process,
                generation,
                change,
            } => {
                if self.replicas[replica].watch_gen == generation {
                    self.step(replica, process, |s, now| match change {
                        Change::Applied(lease, record) => s.applied(lease, record, now),
                        Change::Deleted(lease) => s.deleted(lease, now),
                    });
                }
            }
            Ev::Drained {
                replica,
                process,
                shard,
            } => self.step(replica, process, |s, now| s.drained(shard, now)),
        }
    }

    fn start(&mut self, replica: usize) {
        self.processes += 1;
        let process = self.processes;
        let seed = self.rng.next();
        let plan = &self.plan;
        let r = &mut self.replicas[replica];
        let (lease_duration, renew_deadline, retry_period) = plan
            .timing
            .get(&replica)
            .copied()
            .unwrap_or((plan.lease_duration, plan.renew_deadline, plan.retry_period));
        let timing = [
            lease_duration,
            renew_deadline,
            retry_period,
            plan.hand_over_timeout,
        ];
        let config = Settings::unchecked(&r.identity, plan.shards, timing, OnLoss::Rejoin);
        r.process = process;
        r.state = Some(ReplicaState::new(config, seed));
        self.break_watch(replica, 0);
        self.step(replica, process, |s, now| s.tick(now));
    }

    /// The watch breaks; a relist starts after `delay`.
    fn break_watch(&mut self, replica: usize, delay: u64) {
        let r = &mut self.replicas[replica];
        r.watch = Watch::Relisting;
        r.watch_gen += 1;
        let (process, generation) = (r.process, r.watch_gen);
        let t = self.now + delay + self.latency_of(replica);
        self.at(
            t,
            Ev::Relist {
                replica,
                process,
                generation,
            },
        );
    }

    fn relist(&mut self, replica: usize, process: usize, generation: u64) {
        let r = &self.replicas[replica];
        if r.process != process || r.watch_gen != generation || r.state.is_none() {
            return;
        }
        // A failed list is retried after a pause; a partitioned one after the partition.
        let retry = if r.reads_fail_until > self.now {
            Some(self.now + 1_000 * MS)
        } else {
            (r.partitioned_until > self.now).then_some(r.partitioned_until)
        };
        if let Some(t) = retry {
            self.at(
                t,
                Ev::Relist {
                    replica,
                    process,
                    generation,
                },
            );
            return;
        }
        let records = self.store.list();
        let t = self.now + self.latency_of(replica);
        let r = &mut self.replicas[replica];
        r.watch = Watch::Live;
        r.watch_last = t;
        self.at(
            t,
            Ev::Listed {
                replica,
                process,
                generation,
                records,
            },
        );
    }

    fn fault(&mut self, fault: Fault) {
        match fault {
            Fault::Crash { replica, down } => {
                let r = &mut self.replicas[replica];
                if r.state.take().is_some() {
                    self.ledger.died(r.process, self.now);
                    r.watch = Watch::Broken;
                    r.watch_gen += 1;
                    self.at(self.now + down * MS, Ev::Start { replica });
                }
            }
            Fault::Shutdown { replica, down } => {
                let process = self.replicas[replica].process;
                if self.replicas[replica].state.is_some() {
                    // The restart is scheduled when it ends.
                    self.replicas[replica].stalled_until = 0;
                    self.step(replica, process, |s, now| s.shut_down(now));
                    self.restart_after_end(replica, down);
                }
            }
            Fault::Partition { replica, ms } => {
                let r = &mut self.replicas[replica];
                r.partitioned_until = r.partitioned_until.max(self.now + ms * MS);
                if r.state.is_some() {
                    self.break_watch(replica, 0);
                }
            }
            Fault::Refuse { replica, ms } => {
                let r = &mut self.replicas[replica];
                r.refused_until = r.refused_until.max(self.now + ms * MS);
                r.partitioned_until = r.partitioned_until.max(self.now + ms * MS);
                if r.state.is_some() {
                    self.break_watch(replica, 0);
                }
            }
            Fault::Stall { replica, ms } => {
                let r = &mut self.replicas[replica];
                r.stalled_until = r.stalled_until.max(self.now + ms * MS);
            }
            Fault::BreakWatch { replica } => {
                if self.replicas[replica].state.is_some() {
                    self.break_watch(replica, 1_000 * MS);
                }
            }
            Fault::HangWatch { replica, ms } => {
                let r = &mut self.replicas[replica];
                r.hung_until = r.hung_until.max(self.now + ms * MS);
            }
            Fault::ReadsFail { replica, ms } => {
                let r = &mut self.replicas[replica];
                r.reads_fail_until = r.reads_fail_until.max(self.now + ms * MS);
                if r.state.is_some() {
                    self.break_watch(replica, 0);
                }
            }
            Fault::Slow {
                replica,
                ms,
                each_way,
            } => {
                let r = &mut self.replicas[replica];
                r.slow_until = r.slow_until.max(self.now + ms * MS);
                r.slow_each_way = each_way;
            }
            Fault::Delete { pick } => {
                let names = self.store.names();
                if !names.is_empty() {
                    let lease = names[pick % names.len()].clone();
                    self.store.delete(&lease);
                    self.fan_out();
                }
            }
        }
    }

    fn restart_after_end(&mut self, replica: usize, down: u64) {
        let r = &mut self.replicas[replica];
        if r.state.as_ref().is_some_and(|s| s.ended()) {
            r.state = None;
            self.ledger.died(r.process, self.now);
            r.watch = Watch::Broken;
            r.watch_gen += 1;
            self.at(self.now + down * MS, Ev::Start { replica });
        } else {
            r.restart = Some(down);
        }
    }

    fn commit(&mut self, replica: usize, process: usize, request: Request, drop_answer: bool) {
        let before = self.store.get(&request.lease).cloned();
        let answer = self.store.write(&request.lease, &request.op);
        if let (LeaseName::Member(_), Some(before), Answer::Done(Some(after))) =
            (&request.lease, &before, &answer)
            && let Some(old) = before.holder()
            && after.holder() != Some(old)
        {
            self.ledger.fences.push(Fence {
                at: self.now,
                token: old.clone(),
                writer: process,
            });
        }
        self.fan_out();
        let r = &self.replicas[replica];
        if drop_answer || r.process != process {
            return;
        }
        let t = self.now + self.latency_of(replica);
        self.at(
            t,
            Ev::Answer {
                replica,
                process,
                id: request.id,
                answer,
            },
        );
    }

    /// Schedules the new log entries on every live watch, in order.
    fn fan_out(&mut self) {
        let Some(change) = self.store.log.last().cloned() else {
            return;
        };
        for replica in 0..self.replicas.len() {
            let r = &self.replicas[replica];
            if r.watch != Watch::Live
                || r.state.is_none()
                || r.partitioned_until > self.now
                || r.reads_fail_until > self.now
            {
                continue;
            }
            let hung_until = r.hung_until;
            let t = (self.now + self.latency_of(replica))
                .max(hung_until)
                .max(self.replicas[replica].watch_last);
            let r = &mut self.replicas[replica];
            r.watch_last = t;
            let (process, generation) = (r.process, r.watch_gen);
            self.at(
                t,
                Ev::Deliver {
                    replica,
                    process,
                    generation,
                    change: change.clone(),
                },
            );
        }
    }

    /// Runs `f` on the replica's state if `process` is still the one running, then sends its
    /// outputs and records its beliefs.
    fn step(
        &mut self,
        replica: usize,
        process: usize,
        f: impl FnOnce(&mut ReplicaState, super::LocalInstant),
    ) {
        let r = &mut self.replicas[replica];
        if r.process != process {
            return;
        }
        let Some(state) = r.state.as_mut() else {
            return;
        };
        let local = r.clock.local(self.now);
        f(state, local);
        let mut outputs = Vec::new();
        while let Some(out) = state.poll() {
            outputs.push(out);
        }
        for out in outputs {
            match out {
                Output::Request(request) => self.send(replica, process, request),
                Output::Decision(decision) => self.decide(replica, process, decision),
            }
        }
        self.record(replica);
        self.schedule_tick(replica);
    }

    fn send(&mut self, replica: usize, process: usize, request: Request) {
        self.trace.push((self.now, process, format!("{request:?}")));
        let kind = match (&request.lease, &request.op) {
            (LeaseName::Member(_), Op::Delete(_)) | (LeaseName::Shard(_), Op::Delete(_)) => {
                "delete"
            }
            (LeaseName::Member(id), _) if **id == *self.replicas[replica].identity => "member",
            (LeaseName::Member(_), _) => "fence",
            (LeaseName::Shard(_), _) => "shard",
        };
        *self.replicas[replica].writes.entry(kind).or_default() += 1;
        let r = &self.replicas[replica];
        let deadline = r.clock.real(request.deadline);
        let partitioned = r.partitioned_until > self.now;
        let drops = if self.now < self.plan.quiet_from() * MS {
            self.plan.drops
        } else {
            0
        };
        let lost_there = partitioned || self.rng.chance(drops);
        let lost_back = self.rng.chance(drops);
        let refused = r.refused_until > self.now;
        self.at(
            if refused { self.now } else { deadline },
            Ev::Answer {
                replica,
                process,
                id: request.id,
                answer: Answer::Unknown,
            },
        );
        if !lost_there {
            let t = self.now + self.latency_of(replica);
            self.at(
                t,
                Ev::Commit {
                    replica,
                    process,
                    request,
                    drop_answer: lost_back,
                },
            );
        }
    }

    fn decide(&mut self, replica: usize, process: usize, decision: Decision) {
        match &decision {
            Decision::HandOver { shard, .. } => {
                let t = self.now + self.rng.between(0, self.plan.drain) * MS;
                let shard = *shard;
                self.at(
                    t,
                    Ev::Drained {
                        replica,
                        process,
                        shard,
                    },
                );
            }
            Decision::WatchStale => {
                // The driver replaces the watch: a new list, then the watch from it.
                self.break_watch(replica, 0);
            }
            Decision::Ended(_) => {
                let r = &mut self.replicas[replica];
                if let Some(down) = r.restart.take() {
                    r.state = None;
                    self.ledger.died(process, self.now);
                    r.watch = Watch::Broken;
                    r.watch_gen += 1;
                    self.at(self.now + down * MS, Ev::Start { replica });
                }
            }
            _ => {}
        }
        self.decisions.push((self.now, process, decision));
    }

    /// Records what the replica's process believes now.
    fn record(&mut self, replica: usize) {
        let r = &self.replicas[replica];
        let Some(state) = &r.state else {
            return;
        };
        let local = r.clock.local(self.now);
        let until = state.deadline().map(|d| r.clock.real(d));
        let token = state.token().clone();
        for shard in 0..self.plan.shards {
            let believed = state.believes(shard, local);
            // What the controller reads (`believes`) and what the watchdog acts on (the
            // deadline) agree: nothing is believed at or past the deadline.
            assert!(
                !believed || until.is_some_and(|u| u > self.now),
                "process {} believes it holds shard {shard} at {} ms, past its deadline {:?}",
                r.process,
                self.now / MS,
                until.map(|u| u / MS)
            );
            self.ledger.observe(
                r.process,
                &token,
                shard,
                until.filter(|_| believed),
                self.now,
            );
        }
    }

    fn schedule_tick(&mut self, replica: usize) {
        let r = &mut self.replicas[replica];
        let Some(state) = &r.state else {
            return;
        };
        let local = r.clock.local(self.now);
        let Some(wake) = state.next_wake(local) else {
            return;
        };
        r.wake_gen += 1;
        let (process, generation) = (r.process, r.wake_gen);
        let t = r.clock.real(wake).max(self.now + 1);
        self.at(
            t,
            Ev::Tick {
                replica,
                process,
                generation,
            },
        );
    }

    /// The processes alive now, by replica.
    pub(super) fn alive(&self) -> Vec<bool> {
        self.replicas.iter().map(|r| r.state.is_some()).collect()
    }

    /// Writes sent by each replica, by kind.
    pub(super) fn writes(&self) -> Vec<BTreeMap<&'static str, u64>> {
        self.replicas.iter().map(|r| r.writes.clone()).collect()
    }

    /// Whether the replica's process believes it holds `shard` now.
    pub(super) fn believes(&self, replica: usize, shard: u32) -> bool {
        let r = &self.replicas[replica];
        r.state
            .as_ref()
            .is_some_and(|s| s.believes(shard, r.clock.local(self.now)))
    }

    /// The shards each replica believes it holds now.
    pub(super) fn held(&self) -> Vec<Vec<u32>> {
        (0..self.replicas.len())
            .map(|r| {
                (0..self.plan.shards)
                    .filter(|&s| self.believes(r, s))
                    .collect()
            })
            .collect()
    }

    /// A fault now.
    pub(super) fn inject(&mut self, fault: Fault) {
        self.fault(fault);
    }

    /// A Lease as stored now.
    pub(super) fn stored(&self, lease: &LeaseName) -> Option<super::Record> {
        self.store.get(lease).cloned()
    }

    /// The Leases stored now.
    pub(super) fn stored_names(&self) -> Vec<LeaseName> {
        self.store.names()
    }

    /// A write by a third party (a person with kubectl), seen by every watch.
    pub(super) fn write(&mut self, lease: &LeaseName, op: &Op) -> Answer {
        let answer = self.store.write(lease, op);
        if matches!(answer, Answer::Done(_)) {
            self.fan_out();
        }
        answer
    }

    /// A third party's write that the protocol does not read (a label or an annotation): a new
    /// resourceVersion, the same record.
    pub(super) fn touch(&mut self, lease: &LeaseName) {
        if self.store.touch(lease) {
            self.fan_out();
        }
    }

    /// A delete by a third party, unconditional.
    pub(super) fn write_delete(&mut self, lease: &LeaseName) {
        if self.store.delete(lease) {
            self.fan_out();
        }
    }

    /// The process running as `replica` now (0: none yet).
    pub(super) fn process(&self, replica: usize) -> usize {
        self.replicas[replica].process
    }

    /// Sets a replica's latency range (ms), from now on.
    pub(super) fn set_latency(&mut self, latency: (u64, u64)) {
        self.plan.latency = latency;
    }
}
