//! Fencing the members that stopped renewing, and collecting the Leases nobody needs.

use std::collections::BTreeSet;

use super::super::clock::LocalInstant;
use super::view::Status;
use super::{Content, LeaseName, Op, Purpose, ReplicaState, Rv};

impl ReplicaState {
    /// Fences the members whose record has not changed for its lease duration: a write under
    /// the resourceVersion seen unchanged, which makes every later renewal of theirs fail.
    pub(super) fn fence(&mut self, now: LocalInstant) {
        let me = self.member.identity().clone();
        let mut fences = Vec::new();
        for (id, seen) in self.view.members() {
            let Some(holder) = seen.record().holder() else {
                continue;
            };
            let lease = LeaseName::Member(id.clone());
            if *id == me || now <= seen.expires() || !self.may_write(&lease, &seen.record().rv, now)
            {
                continue;
            }
            let content = Content {
                holder: None,
                previous: Some(holder.clone()),
                counter: seen.record().content.counter + 1,
                leaving: false,
                held: false,
                ..seen.record().content.clone()
            };
            fences.push((lease, Op::Replace(seen.record().rv.clone(), content)));
        }
        for (lease, op) in fences {
            let deadline = now + self.config.renew_deadline();
            if let Op::Replace(rv, _) = &op {
                self.recent.insert(lease.clone(), (rv.clone(), now));
            }
            self.request(lease, op, deadline, Purpose::Fence);
        }
    }

    /// Deletes vacant membership records no shard refers to, a lease duration after they were
    /// vacated, and free shard Leases beyond the number of shards.
    pub(super) fn collect(&mut self, now: LocalInstant) {
        let me = self.member.identity().clone();
        let referenced: BTreeSet<&str> = self
            .view
            .shard_records()
            .filter_map(|s| Some(s.record().holder()?.identity()))
            .collect();
        let mut doomed = Vec::new();
        for (id, seen) in self.view.members() {
            let stale = now > seen.unchanged_for(self.config.lease_duration());
            if *id != me && seen.record().holder().is_none() && stale && !referenced.contains(&**id)
            {
                doomed.push((LeaseName::Member(id.clone()), seen.record().rv.clone()));
            }
        }
        if !self.mismatch(now) {
            for (shard, seen) in self.view.extra() {
                let free = seen
                    .record()
                    .holder()
                    .is_none_or(|h| self.view.status(h, now) == Status::Dead);
                if free {
                    doomed.push((LeaseName::Shard(shard), seen.record().rv.clone()));
                }
            }
        }
        for (lease, rv) in doomed {
            if self.may_write(&lease, &rv, now) {
                let deadline = now + self.config.renew_deadline();
                self.recent.insert(lease.clone(), (rv.clone(), now));
                self.request(lease, Op::Delete(rv), deadline, Purpose::Collect);
            }
        }
        let rp = self.config.retry_period();
        self.recent.retain(|_, (_, at)| now < *at + rp);
    }

    /// Whether a fence or a collection of `lease` under `rv` may go out now.
    fn may_write(&self, lease: &LeaseName, rv: &Rv, now: LocalInstant) -> bool {
        let recent = self
            .recent
            .get(lease)
            .is_some_and(|(under, at)| under == rv && now < *at + self.config.retry_period());
        !self.busy.contains(lease) && !recent
    }
}
