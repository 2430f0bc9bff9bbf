//! Who holds what: the members eligible for shares, each shard's target, and the moves toward
//! them: takes of free shards and gifts of drained ones.

use std::sync::Arc;

use super::super::clock::LocalInstant;
use super::targets::Targets;
use super::view::{self, Seen, Status};
use super::{
    Content, Decision, LeaseName, Op, Output, PROTOCOL, Purpose, Reason, ReplicaState, Rv, Token,
};

impl ReplicaState {
    /// The members eligible as targets: live by this replica's clock, not leaving, on this
    /// number of shards and protocol, and saying they may hold shards, or joined within the
    /// renew deadline and a retry period (a member says so at its first renewal that it could
    /// read back in time: one that cannot is never a target for long, so the free shards it
    /// would get are taken by others); this replica itself while it serves.
    fn eligible(&self, now: LocalInstant) -> Vec<Arc<str>> {
        let me = self.member.identity();
        let mut out = Vec::new();
        for (id, seen) in self.view.members() {
            let c = &seen.record().content;
            let ok = if id == me {
                seen.record().holder() == Some(self.member.token()) && self.member.serving(now)
            } else {
                let grace = self.config.renew_deadline() + self.config.retry_period();
                c.holder.is_some()
                    && !c.leaving
                    && now <= seen.expires()
                    && (c.held || now <= seen.holder_for(grace))
                    && c.shards == Some(self.config.shards())
                    && c.protocol == Some(PROTOCOL)
            };
            if ok {
                out.push(id.clone());
            }
        }
        out
    }

    /// The token of member `id` if its record says it may hold shards: it takes or is given
    /// a shard only then. Its first renewal after joining says so, a retry period after it
    /// joined, so replicas started together see each other before they take shards, and a
    /// first list in which no member says so proves that nobody holds any.
    fn ready(&self, id: &str) -> Option<Token> {
        let seen = self.view.member(id)?;
        let holder = seen.record().holder()?;
        let mine = id == &**self.member.identity();
        let ours = !mine || holder == self.member.token();
        (ours && seen.record().content.held).then(|| holder.clone())
    }

    /// Whether a holder that may be alive runs another configuration (reported once each).
    pub(super) fn mismatch(&mut self, now: LocalInstant) -> bool {
        let mine = (Some(self.config.shards()), Some(PROTOCOL));
        let mut found = Vec::new();
        for (_, seen) in self.view.members() {
            let c = &seen.record().content;
            if let Some(h) = &c.holder
                && (c.shards, c.protocol) != mine
            {
                found.push((h.clone(), c.shards, c.protocol));
            }
        }
        for seen in self.view.shard_records() {
            let c = &seen.record().content;
            if let Some(h) = &c.holder
                && (c.shards, c.protocol) != mine
                && self.view.status(h, now) != Status::Dead
            {
                found.push((h.clone(), c.shards, c.protocol));
            }
        }
        let any = !found.is_empty();
        for (holder, shards, protocol) in found {
            if self.mismatched.insert(holder.clone()) {
                self.out.push_back(Output::Decision(Decision::Mismatch {
                    holder,
                    shards,
                    protocol,
                }));
            }
        }
        any
    }

    /// The member `shard` should go to. With one shard (leader election) a live, eligible
    /// holder stays the target: a joining replica never takes leadership from a live leader.
    fn target(&self, shard: u32, eligible: &[Arc<str>]) -> Option<Arc<str>> {
        if self.config.shards() == 1
            && let Some(holder) = self.view.shard_holder(shard)
            && let Some(id) = eligible.iter().find(|id| ***id == *holder.identity())
            && self
                .view
                .member(id)
                .is_some_and(|m| m.record().holder() == Some(holder))
        {
            return Some(id.clone());
        }
        self.targets.of(shard).map(Arc::from)
    }

    /// Takes the free shards whose target is this replica and hands over the held ones whose
    /// target is another.
    pub(super) fn rebalance(&mut self, now: LocalInstant) {
        if self.mismatch(now) {
            return;
        }
        let eligible = self.refresh_targets(now);
        let me = self.member.identity().clone();
        let ready = self.ready(&me).is_some();
        for shard in 0..self.config.shards() {
            let Some(target) = self.target(shard, &eligible) else {
                continue;
            };
            let slot = &self.slots[shard as usize];
            if slot.epoch().is_some() {
                if target != me && self.ready(&target).is_some() {
                    self.hand_over(shard, Reason::Rebalance, now);
                }
            } else if target == me
                && ready
                && slot.idle()
                && self.may_write_shard(shard, now)
                && self.view.shard_free(shard, now)
            {
                self.take(shard, now);
            }
        }
    }

    fn shard_content(&self, holder: Option<Token>, before: Option<&Seen>) -> Content {
        Content {
            holder,
            previous: None,
            counter: before.map_or(0, |s| s.record().content.counter) + 1,
            shards: Some(self.config.shards()),
            protocol: Some(PROTOCOL),
            leaving: false,
            held: false,
            duration: self.config.lease_duration(),
        }
    }

    fn take(&mut self, shard: u32, now: LocalInstant) {
        let before = match self.view.shard(shard) {
            view::ShardSeen::Present(seen) => Some(seen.clone()),
            view::ShardSeen::Absent { .. } => None,
        };
        let content = self.shard_content(Some(self.member.token().clone()), before.as_ref());
        let under = before.map(|seen| seen.record().rv.clone());
        self.write_shard(shard, under, content, now);
    }

    /// The eligible members, with the targets recomputed if they changed.
    fn refresh_targets(&mut self, now: LocalInstant) -> Vec<Arc<str>> {
        let eligible = self.eligible(now);
        if self.targets.members() != eligible.as_slice() {
            self.targets = Targets::compute(eligible.clone(), self.config.shards());
        }
        eligible
    }

    /// Whether a write of shard `shard`'s Lease may go out now (one in flight, and no
    /// duplicate of one the view has not caught up with).
    fn may_write_shard(&self, shard: u32, now: LocalInstant) -> bool {
        let rv = match self.view.shard(shard) {
            view::ShardSeen::Present(seen) => Some(&seen.record().rv),
            view::ShardSeen::Absent { .. } => None,
        };
        !self.busy.contains(&LeaseName::Shard(shard))
            && self.slots[shard as usize].may_write(rv, now)
    }

    fn write_shard(&mut self, shard: u32, under: Option<Rv>, content: Content, now: LocalInstant) {
        let op = match under.clone() {
            Some(rv) => Op::Replace(rv, content),
            None => Op::Create(content),
        };
        self.slots[shard as usize].sent(under, now + self.config.retry_period());
        let deadline = now + self.config.renew_deadline();
        self.request(LeaseName::Shard(shard), op, deadline, Purpose::Shard);
    }

    /// Shards being given away: done once the view shows their Lease changed, and taken back
    /// when this replica is their target again (not leaving).
    pub(super) fn settle_gifts(&mut self, now: LocalInstant) {
        let eligible = self.refresh_targets(now);
        let me = self.member.identity().clone();
        for shard in 0..self.config.shards() {
            let Some(rv) = self.slots[shard as usize].giving() else {
                continue;
            };
            let unchanged = matches!(
                self.view.shard(shard),
                view::ShardSeen::Present(seen) if seen.record().rv == *rv
            );
            // Taken back only if no write to give it was ever sent: one may still land.
            let never_sent = !self.slots[shard as usize].sent_under(rv);
            let mine_again = self.ending.is_none()
                && never_sent
                && self.target(shard, &eligible).is_some_and(|t| t == me);
            if !unchanged || mine_again {
                self.slots[shard as usize].stop_giving();
            }
        }
    }

    /// Writes the shards being given away to their target once it is ready, or, with no other
    /// target and not leaving, releases them as vacant.
    pub(super) fn give(&mut self, now: LocalInstant) {
        let eligible = self.refresh_targets(now);
        let me = self.member.identity().clone();
        for shard in 0..self.config.shards() {
            if self.slots[shard as usize].giving().is_none() || !self.may_write_shard(shard, now) {
                continue;
            }
            let view::ShardSeen::Present(seen) = self.view.shard(shard).clone() else {
                continue;
            };
            let target = self.target(shard, &eligible).filter(|t| *t != me);
            let to = target.as_deref().and_then(|t| self.ready(t));
            if to.is_none() && (target.is_some() || self.ending.is_some()) {
                // Its target is not ready yet: wait. Leaving: vacating the membership frees it.
                continue;
            }
            let content = self.shard_content(to, Some(&seen));
            self.write_shard(shard, Some(seen.record().rv.clone()), content, now);
        }
    }
}
