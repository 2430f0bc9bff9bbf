//! The Lease protocol of one replica as a plain state machine: Lease records and write answers
//! in, with `now` on the replica's own clock; Lease writes and decisions out. No clock reads, no
//! I/O, no tasks: the driver performs the writes, feeds the list and watch, and calls
//! [`ReplicaState::tick`] at [`ReplicaState::next_wake`]. The safety argument is in the
//! [`lease`](crate::lease) module's documentation; each rule it relies on is stated where it
//! is kept.
//!
//! A replica believes it holds shard `i` at local instant `now` exactly when:
//! 1. its view shows shard `i`'s Lease naming its current token,
//! 2. `now` is before its belief deadline: the start of its latest membership renewal that its
//!    view has shown, plus the renew deadline, and
//! 3. it is not giving the shard away (from the moment its controller reported the shard
//!    drained until its view shows the Lease changed).

mod io;
mod member;
mod record;
mod shares;
mod slots;
mod targets;
mod upkeep;
mod view;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_liveness;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use std::time::Duration;

use super::clock::LocalInstant;
use super::config::{OnLoss, Settings};
use member::{Answered, Change, Membership, Phase};
use slots::Slot;
use targets::Targets;
use view::View;

use super::names::LeaseName;
pub(crate) use io::{Answer, Decision, Ending, Op, Output, Reason, Request};
pub(crate) use record::{Content, PROTOCOL, Record, Rv, Token};

/// What a request in flight is for.
#[derive(Clone, Debug)]
enum Purpose {
    Member {
        under: Option<Rv>,
        counter: u64,
    },
    /// A take or a gift.
    Shard,
    Fence,
    Collect,
}

/// One replica's protocol.
#[derive(Debug)]
pub(super) struct ReplicaState {
    config: Settings,
    view: View,
    member: Membership,
    slots: Vec<Slot>,
    targets: Targets,
    /// Requests in flight, and the Leases they write: one at a time for a shard Lease or another
    /// member's (`busy`); this replica's membership Lease is the membership's to pace (up to
    /// `member::IN_FLIGHT` renewals, at most one stored per resourceVersion).
    requests: HashMap<u64, (LeaseName, Purpose)>,
    busy: BTreeSet<LeaseName>,
    next_id: u64,
    next_epoch: u64,
    out: VecDeque<Output>,
    /// Set once shutting down (or stopping after a loss): why it will end.
    ending: Option<Ending>,
    /// Set with `ending`: when leaving gives up ([`Decision::GaveUp`]) if it has not ended by
    /// then. No event at or past it is taken in.
    give_up: Option<LocalInstant>,
    ended: bool,
    mismatched: BTreeSet<Token>,
    /// The holders whose lease duration unlike ours was reported.
    timing_reported: BTreeSet<Token>,
    /// The last fence or collection of each Lease: its precondition and when; not repeated
    /// within a retry period (a write refused at once is not retried at once).
    recent: BTreeMap<LeaseName, (Rv, LocalInstant)>,
}

impl ReplicaState {
    /// A replica that has seen nothing yet. `seed` makes its instance ids (random per process).
    pub(super) fn new(config: Settings, seed: u64) -> ReplicaState {
        ReplicaState {
            view: View::new(config.shards(), config.lease_duration()),
            member: Membership::new(seed, config.clone()),
            slots: vec![Slot::default(); config.shards() as usize],
            targets: Targets::default(),
            requests: HashMap::new(),
            busy: BTreeSet::new(),
            next_id: 0,
            next_epoch: 1,
            out: VecDeque::new(),
            ending: None,
            give_up: None,
            ended: false,
            mismatched: BTreeSet::new(),
            timing_reported: BTreeSet::new(),
            recent: BTreeMap::new(),
            config,
        }
    }

    // Events.

    /// A full list of the controller's Leases (the first, or after the watch broke).
    pub(super) fn listed(&mut self, records: Vec<(LeaseName, Record)>, now: LocalInstant) {
        self.view.listed(records, now);
        self.settle(now);
    }

    /// A watch event: the Lease's new version.
    pub(super) fn applied(&mut self, lease: LeaseName, record: Record, now: LocalInstant) {
        self.view.applied(lease, record, now);
        self.settle(now);
    }

    /// A watch event: the Lease was deleted.
    pub(super) fn deleted(&mut self, lease: LeaseName, now: LocalInstant) {
        self.view.deleted(lease, now);
        self.settle(now);
    }

    /// The answer to request `id`.
    pub(super) fn answered(&mut self, id: u64, answer: Answer, now: LocalInstant) {
        if self.gave_up(now) {
            return;
        }
        // Every event settles: what is due now is done now (next_wake reports only later
        // instants).
        let Some((lease, purpose)) = self.requests.remove(&id) else {
            self.settle(now);
            return;
        };
        self.busy.remove(&lease);
        match purpose {
            Purpose::Member { under, counter } => {
                let answered = match answer {
                    Answer::Done(Some(record)) => Answered::Stored {
                        rv: record.rv,
                        counter: record.content.counter,
                    },
                    Answer::Done(None) | Answer::Unknown => Answered::Unknown,
                    Answer::Conflict => Answered::Conflict { under },
                    Answer::NotFound => Answered::NotFound,
                };
                if let Some(change) = self.member.answered(counter, answered, now) {
                    self.on_member_change(change);
                }
            }
            Purpose::Shard | Purpose::Fence | Purpose::Collect => {}
        }
        self.settle(now);
    }

    /// The controller stopped all work of `shard` after a [`Decision::HandOver`].
    pub(super) fn drained(&mut self, shard: u32, now: LocalInstant) {
        if self.gave_up(now) {
            return;
        }
        let Some(slot) = self.slots.get_mut(shard as usize) else {
            return self.settle(now);
        };
        let rv = match self.view.shard(shard) {
            view::ShardSeen::Present(seen)
                if seen.record().holder() == Some(self.member.token()) =>
            {
                Some(seen.record().rv.clone())
            }
            _ => None,
        };
        let Some(epoch) = slot.drained(rv) else {
            return self.settle(now);
        };
        self.out
            .push_back(Output::Decision(Decision::Released { shard, epoch }));
        self.settle(now);
    }

    /// Time passed (the driver calls it at [`ReplicaState::next_wake`], or whenever).
    pub(super) fn tick(&mut self, now: LocalInstant) {
        self.view.prune(now);
        self.settle(now);
    }

    /// Leave: hand every shard over, then vacate the membership.
    pub(super) fn shut_down(&mut self, now: LocalInstant) {
        if self.ending.is_none() {
            self.ending = Some(Ending::Shutdown);
            self.member.leave();
        }
        self.settle(now);
    }

    // Outputs and queries.

    /// The next output, oldest first.
    pub(super) fn poll(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// Whether this replica believes it holds `shard` at `now`.
    pub(super) fn believes(&self, shard: u32, now: LocalInstant) -> bool {
        let Some(slot) = self.slots.get(shard as usize) else {
            return false;
        };
        slot.giving().is_none()
            && self.view.shard_holder(shard) == Some(self.member.token())
            && self.member.valid_until().is_some_and(|v| now < v)
    }

    /// The number of `shard`'s current belief (`None`: not believed).
    pub(super) fn epoch(&self, shard: u32) -> Option<u64> {
        self.slots.get(shard as usize)?.epoch()
    }

    /// The belief deadline (`None`: nothing may be believed).
    pub(super) fn deadline(&self) -> Option<LocalInstant> {
        self.member.valid_until()
    }

    /// The shards whose keys this replica takes at `now`: believed and not being handed over.
    pub(super) fn accepts(&self, shard: u32, now: LocalInstant) -> bool {
        self.believes(shard, now) && self.slots[shard as usize].idle()
    }

    /// The live members this replica counts (itself included when it serves).
    pub(super) fn members(&self) -> usize {
        self.targets.members().len()
    }

    #[cfg(test)]
    fn token(&self) -> &Token {
        self.member.token()
    }

    #[cfg(test)]
    fn ended(&self) -> bool {
        self.ended
    }

    /// When [`ReplicaState::tick`] is next due: something happens by time alone then.
    pub(super) fn next_wake(&self, now: LocalInstant) -> Option<LocalInstant> {
        let me = self.view.member(self.member.identity());
        let mut wake = None;
        let mut at = |t: LocalInstant| {
            if t > now {
                wake = Some(wake.map_or(t, |w: LocalInstant| w.min(t)));
            }
        };
        for t in self.member.next_wakes(me) {
            at(t);
        }
        if let Some(t) = self.view.next_free(now) {
            at(t + Duration::from_nanos(1));
        }
        for (_, seen) in self.view.members() {
            // An expiry changes who is eligible and who may be fenced; a vacant record is
            // collected a lease duration after it was vacated.
            let at_ = match seen.record().holder() {
                Some(_) => seen.expires(),
                None => seen.unchanged_for(self.config.lease_duration()),
            };
            at(at_ + Duration::from_nanos(1));
            if seen.record().holder().is_some() && !seen.record().content.held {
                // A member not saying it may hold shards stops being a target then.
                let grace = self.config.renew_deadline() + self.config.retry_period();
                at(seen.holder_for(grace) + Duration::from_nanos(1));
            }
        }
        for slot in &self.slots {
            if let Some(t) = slot.retry_at() {
                at(t);
            }
        }
        for (_, t) in self.recent.values() {
            at(*t + self.config.retry_period());
        }
        if let Some(t) = self.give_up {
            at(t);
        }
        wake
    }

    // The rules, applied after every event.

    fn settle(&mut self, now: LocalInstant) {
        if self.gave_up(now) {
            return;
        }
        let me = self.view.member(self.member.identity()).cloned();
        if let Some(change) = self.member.observe(me.as_ref(), now) {
            self.on_member_change(change);
        }
        if let Some(change) = self.member.step_down(now) {
            self.on_member_change(change);
        }
        if self.member.stale(now) {
            self.out.push_back(Output::Decision(Decision::WatchStale));
        }
        self.report_timing();
        self.bury(now);
        self.settle_gifts(now);
        self.update_beliefs(now);
        self.leave_when_empty(now);
        self.write_membership(now);
        self.give(now);
        if self.member.serving(now) && self.ending.is_none() {
            self.rebalance(now);
        }
        if self.view.synced() && self.member.phase() != Phase::Left {
            self.fence(now);
        }
        if self.member.serving(now) {
            self.collect(now);
        }
        if let (Some(ending), None) = (self.ending, self.give_up) {
            // Leaving is bounded: the drains and the vacating write after a shutdown; after a
            // loss nothing is left to drain (the belief ended), a retry period to vacate.
            let limit = match ending {
                Ending::Shutdown => self.config.hand_over_timeout() + self.config.renew_deadline(),
                Ending::Lost { .. } | Ending::LostMembership => self.config.retry_period(),
            };
            self.give_up = Some(now + limit);
        }
        if self.member.phase() == Phase::Left && !self.ended {
            self.ended = true;
            let ending = self.ending.unwrap_or(Ending::Shutdown);
            self.out
                .push_back(Output::Decision(Decision::Ended(ending)));
        }
    }

    /// Whether it has ended; ends it first if leaving is past its limit: nothing is written
    /// any more, and the membership Lease expires instead of being vacated.
    fn gave_up(&mut self, now: LocalInstant) -> bool {
        if let (false, Some(ending), Some(at)) = (self.ended, self.ending, self.give_up)
            && now >= at
        {
            self.ended = true;
            self.out.push_back(Output::Decision(Decision::GaveUp));
            self.out
                .push_back(Output::Decision(Decision::Ended(ending)));
        }
        self.ended
    }

    /// Reports each holder whose record carries a lease duration unlike this replica's, once.
    fn report_timing(&mut self) {
        let ours = self.config.lease_duration();
        let mut found = Vec::new();
        for (_, seen) in self.view.members() {
            if let Some(holder) = seen.record().holder()
                && seen.record().content.duration != ours
                && !self.timing_reported.contains(holder)
            {
                found.push((holder.clone(), seen.record().content.duration));
            }
        }
        for (holder, duration) in found {
            self.timing_reported.insert(holder.clone());
            self.out
                .push_back(Output::Decision(Decision::Timing { holder, duration }));
        }
    }

    fn on_member_change(&mut self, change: Change) {
        let decision = match change {
            Change::Joined => Decision::Joined {
                token: self.member.token().clone(),
            },
            Change::Lost { old } => {
                if self.config.on_loss() == OnLoss::Stop || self.ending.is_some() {
                    self.ending.get_or_insert(Ending::LostMembership);
                    self.member.stop();
                }
                Decision::MembershipLost { token: old }
            }
            Change::Left => return,
            Change::Collision { other } => Decision::Collision { other },
            Change::SteppedDown => Decision::SteppedDown,
        };
        self.out.push_back(Output::Decision(decision));
    }

    /// Starts and ends beliefs as the three conditions say.
    fn update_beliefs(&mut self, now: LocalInstant) {
        let mut lost = None;
        for shard in 0..self.config.shards() {
            let believes = self.believes(shard, now);
            let slot = &mut self.slots[shard as usize];
            match (slot.epoch(), believes) {
                (None, true) => {
                    let epoch = self.next_epoch;
                    self.next_epoch += 1;
                    slot.believe(epoch);
                    self.out
                        .push_back(Output::Decision(Decision::Acquired { shard, epoch }));
                }
                (Some(epoch), false) => {
                    slot.lose();
                    self.out
                        .push_back(Output::Decision(Decision::Lost { shard, epoch }));
                    lost.get_or_insert(shard);
                }
                _ => {}
            }
        }
        if let Some(shard) = lost
            && self.config.on_loss() == OnLoss::Stop
            && self.ending.is_none()
        {
            self.ending = Some(Ending::Lost { shard });
            self.member.leave();
        }
        if self.ending.is_some() {
            for shard in 0..self.config.shards() {
                self.hand_over(shard, Reason::Shutdown, now);
            }
        }
    }

    fn hand_over(&mut self, shard: u32, reason: Reason, now: LocalInstant) {
        if let Some(epoch) = self.slots[shard as usize].drain() {
            self.out.push_back(Output::Decision(Decision::HandOver {
                shard,
                epoch,
                reason,
                deadline: now + self.config.hand_over_timeout(),
            }));
        }
    }

    /// Leaving, once nothing is held or drained: vacate the membership.
    fn leave_when_empty(&mut self, _now: LocalInstant) {
        if self.member.phase() != Phase::Leaving {
            return;
        }
        let empty = self.slots.iter().all(|s| s.epoch().is_none());
        if empty {
            self.member.vacate();
        }
    }

    /// The tokens this process gave up are dead in its own view at once.
    fn bury(&mut self, now: LocalInstant) {
        for token in self.member.take_buried() {
            self.view.bury(token, now);
        }
    }

    fn write_membership(&mut self, now: LocalInstant) {
        let me = self.view.member(self.member.identity()).cloned();
        let write = self.member.next_write(me.as_ref(), self.view.synced(), now);
        self.bury(now);
        let Some(write) = write else {
            return;
        };
        let lease = LeaseName::Member(self.member.identity().clone());
        let deadline = now + self.config.renew_deadline();
        let under = write.rv.clone();
        let counter = write.content.counter;
        let op = match write.rv {
            Some(rv) => Op::Replace(rv, write.content),
            None => Op::Create(write.content),
        };
        self.request(lease, op, deadline, Purpose::Member { under, counter });
    }

    fn request(&mut self, lease: LeaseName, op: Op, deadline: LocalInstant, purpose: Purpose) {
        let id = self.next_id;
        self.next_id += 1;
        self.busy.insert(lease.clone());
        self.requests.insert(id, (lease.clone(), purpose));
        self.out.push_back(Output::Request(Request {
            id,
            lease,
            op,
            deadline,
        }));
    }
}
