//! One replica's view of the controller's Leases, as its list and watch deliver them, with the
//! memory that makes absence safe to read.
//!
//! Invariants:
//! - Every record carries `since`, the local instant this replica first saw its current
//!   protocol record: its holder and counter, which every write of the protocol changes and
//!   nothing else does (A3). A member record is expired once `since + duration` has passed
//!   without such a change (client-go's rule, which compares the record, not its
//!   resourceVersion; the observer's own clock, never the record's times). A third party's
//!   label or annotation makes a new resourceVersion but keeps nobody alive.
//! - `duration` is never below this replica's own lease duration nor below the longest
//!   duration this replica saw the same holder write: a third party that lowers a record's
//!   `leaseDurationSeconds` cannot make an observer judge its holder dead sooner than the
//!   holder's own configuration promises.
//! - A holder token is [`Status::Live`] while its identity's member record names it,
//!   [`Status::Dead`] once a member record's history proves it stopped (the record names it as
//!   `previous`, or this replica saw it happen), and [`Status::Vanishing`] otherwise: no member
//!   record names it and none proves it stopped (its record was deleted, or this replica never
//!   saw it), so it counts as alive for one lease duration from the moment this replica first
//!   saw that.
//! - A shard Lease that vanished is remembered with its last holder for one lease duration;
//!   one absent from a list (a relist, or the first list) counts as held by an unknown holder
//!   for one lease duration, except in a first list where nobody may hold a shard (a first
//!   deployment: no shard Lease names a holder, no member says it may hold one).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::super::clock::LocalInstant;
use super::LeaseName;
use super::record::{Record, Token};

/// A record and when this replica first saw it. Only the view makes one, from the records
/// it saw before: the instants and the duration follow the record's history.
#[derive(Clone, Debug)]
pub(super) struct Seen {
    record: Record,
    /// When this replica first saw the record's holder and counter.
    since: LocalInstant,
    /// When this replica first saw the record name its holder.
    holder_since: LocalInstant,
    /// The lease duration it judges the record by (see the invariants).
    duration: Duration,
}

impl Seen {
    /// The record.
    pub(super) fn record(&self) -> &Record {
        &self.record
    }

    /// When a member record expires, unless it changes before.
    pub(super) fn expires(&self) -> LocalInstant {
        self.unchanged_for(self.duration)
    }

    /// When the record (its holder and counter) will have been unchanged for `duration`,
    /// unless it changes before.
    pub(super) fn unchanged_for(&self, duration: Duration) -> LocalInstant {
        self.since + duration
    }

    /// When the record will have named its holder for `duration`, unless it changes before.
    pub(super) fn holder_for(&self, duration: Duration) -> LocalInstant {
        self.holder_since + duration
    }

    /// Whether `record` is the same protocol record as this one (a third party's write does
    /// not change it).
    fn same_record(&self, record: &Record) -> bool {
        self.record.content.holder == record.content.holder
            && self.record.content.counter == record.content.counter
    }
}

/// A shard's Lease in the view.
#[derive(Clone, Debug)]
pub(super) enum ShardSeen {
    Present(Seen),
    /// Not in the view. Free once `free_from` has passed, or at once when `last`, the holder it
    /// vanished from, is dead.
    Absent {
        free_from: LocalInstant,
        last: Option<Token>,
    },
}

/// Whether a holder may still believe it holds what its records name it the holder of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    /// Its member record names it; `expires` is that record's expiry by this replica's clock.
    Live { expires: LocalInstant },
    /// It cannot hold anything: its member record was fenced, vacated or rejoined over it.
    Dead,
    /// No member record names it and none proves it stopped: dead once `until` has passed.
    Vanishing { until: LocalInstant },
}

/// The view.
#[derive(Debug)]
pub(super) struct View {
    lease_duration: Duration,
    synced: bool,
    members: BTreeMap<Arc<str>, Seen>,
    shards: Vec<ShardSeen>,
    /// Shard Leases beyond this replica's number of shards (from a configuration with more).
    extra: BTreeMap<u32, Seen>,
    /// Holders known to have stopped, with when this replica learned it.
    dead: HashMap<Token, LocalInstant>,
    /// Holders no member record names, with when this replica first saw that.
    vanished: HashMap<Token, LocalInstant>,
}

impl View {
    pub(super) fn new(shards: u32, lease_duration: Duration) -> View {
        View {
            lease_duration,
            synced: false,
            members: BTreeMap::new(),
            // Until the first list, everything is unknown: never free.
            shards: vec![
                ShardSeen::Absent {
                    free_from: LocalInstant::from_duration(Duration::MAX / 2),
                    last: None,
                };
                shards as usize
            ],
            extra: BTreeMap::new(),
            dead: HashMap::new(),
            vanished: HashMap::new(),
        }
    }

    /// Whether a list has arrived.
    pub(super) fn synced(&self) -> bool {
        self.synced
    }

    pub(super) fn member(&self, identity: &str) -> Option<&Seen> {
        self.members.get(identity)
    }

    pub(super) fn members(&self) -> impl Iterator<Item = (&Arc<str>, &Seen)> {
        self.members.iter()
    }

    pub(super) fn shard(&self, shard: u32) -> &ShardSeen {
        &self.shards[shard as usize]
    }

    /// The shard Leases beyond this replica's number of shards.
    pub(super) fn extra(&self) -> impl Iterator<Item = (u32, &Seen)> {
        self.extra.iter().map(|(&i, seen)| (i, seen))
    }

    /// The present shard records, extra ones included.
    pub(super) fn shard_records(&self) -> impl Iterator<Item = &Seen> {
        let shards = self.shards.iter().filter_map(|s| match s {
            ShardSeen::Present(seen) => Some(seen),
            ShardSeen::Absent { .. } => None,
        });
        shards.chain(self.extra.values())
    }

    /// The holder of a shard's record (`None`: vacant or absent).
    pub(super) fn shard_holder(&self, shard: u32) -> Option<&Token> {
        match self.shard(shard) {
            ShardSeen::Present(seen) => seen.record.holder(),
            ShardSeen::Absent { .. } => None,
        }
    }

    // Status.

    pub(super) fn status(&self, token: &Token, now: LocalInstant) -> Status {
        if let Some(member) = self.members.get(token.identity()) {
            if member.record.holder() == Some(token) {
                return Status::Live {
                    expires: member.expires(),
                };
            }
            if member.record.content.previous.as_ref() == Some(token) {
                return Status::Dead;
            }
        }
        if self.dead.contains_key(token) {
            return Status::Dead;
        }
        let since = self.vanished.get(token).copied().unwrap_or(now);
        let until = since + self.lease_duration;
        if now > until {
            Status::Dead
        } else {
            Status::Vanishing { until }
        }
    }

    /// Whether nobody can believe it holds `shard` by its record: vacant, held by a dead
    /// holder, or absent long enough.
    pub(super) fn shard_free(&self, shard: u32, now: LocalInstant) -> bool {
        match self.shard(shard) {
            ShardSeen::Present(seen) => seen
                .record
                .holder()
                .is_none_or(|h| self.status(h, now) == Status::Dead),
            ShardSeen::Absent { free_from, last } => {
                now > *free_from
                    || last
                        .as_ref()
                        .is_some_and(|h| self.status(h, now) == Status::Dead)
            }
        }
    }

    /// The next instant at which a shard may become free by time alone.
    pub(super) fn next_free(&self, now: LocalInstant) -> Option<LocalInstant> {
        if !self.synced {
            return None;
        }
        let mut next: Option<LocalInstant> = None;
        let mut at = |t: LocalInstant| {
            if t >= now {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for shard in &self.shards {
            match shard {
                ShardSeen::Present(seen) => {
                    if let Some(h) = seen.record.holder()
                        && let Status::Vanishing { until } = self.status(h, now)
                    {
                        at(until);
                    }
                }
                ShardSeen::Absent { free_from, .. } => at(*free_from),
            }
        }
        next
    }

    /// A holder this replica knows has stopped (its own earlier incarnation).
    pub(super) fn bury(&mut self, token: Token, now: LocalInstant) {
        self.dead.insert(token, now);
    }

    // Events.

    /// A full list (the first, or after the watch broke): replaces the view. What changed
    /// unseen while the watch was broken is judged as the invariants say.
    pub(super) fn listed(&mut self, records: Vec<(LeaseName, Record)>, now: LocalInstant) {
        // A first deployment: nobody may hold a shard (no shard Lease names a holder, no member
        // says it may hold one), so a missing shard Lease was never created.
        let first_deployment = !self.synced
            && records.iter().all(|(name, r)| match name {
                LeaseName::Member(_) => r.holder().is_none() || !r.content.held,
                LeaseName::Shard(_) => r.holder().is_none(),
            });
        let mut members = BTreeMap::new();
        let mut shards: Vec<Option<Seen>> = vec![None; self.shards.len()];
        let mut extra = BTreeMap::new();
        for (name, record) in records {
            match name {
                LeaseName::Member(id) => {
                    let seen = self.seen(self.members.get(&id), record, now);
                    members.insert(id, seen);
                }
                LeaseName::Shard(i) => {
                    let before = match self.shards.get(i as usize) {
                        Some(ShardSeen::Present(seen)) => Some(seen),
                        _ => self.extra.get(&i),
                    };
                    let seen = self.seen(before, record, now);
                    match shards.get_mut(i as usize) {
                        Some(slot) => *slot = Some(seen),
                        None => {
                            extra.insert(i, seen);
                        }
                    }
                }
            }
        }
        let old = std::mem::replace(&mut self.members, members);
        for (id, before) in &old {
            let after = self.members.get(id).map(|s| s.record.clone());
            self.member_changed(Some(&before.record), after.as_ref(), now);
        }
        let new: Vec<Record> = self.members.values().map(|s| s.record.clone()).collect();
        for record in &new {
            self.member_changed(None, Some(record), now);
        }
        let free_from = if first_deployment {
            now
        } else {
            now + self.lease_duration
        };
        self.shards = shards
            .into_iter()
            .map(|seen| match seen {
                Some(seen) => ShardSeen::Present(seen),
                None => ShardSeen::Absent {
                    free_from,
                    last: None,
                },
            })
            .collect();
        self.extra = extra;
        self.synced = true;
        self.note_orphans(now);
    }

    /// A watch event: `record` is the Lease's new version.
    pub(super) fn applied(&mut self, name: LeaseName, record: Record, now: LocalInstant) {
        match name {
            LeaseName::Member(id) => {
                let before = self.members.get(&id).map(|s| s.record.clone());
                let seen = self.seen(self.members.get(&id), record.clone(), now);
                self.members.insert(id, seen);
                self.member_changed(before.as_ref(), Some(&record), now);
            }
            LeaseName::Shard(i) => {
                let seen = match self.shards.get(i as usize) {
                    Some(ShardSeen::Present(before)) => self.seen(Some(before), record, now),
                    Some(ShardSeen::Absent { .. }) => self.seen(None, record, now),
                    None => self.seen(self.extra.get(&i), record, now),
                };
                match self.shards.get_mut(i as usize) {
                    Some(slot) => *slot = ShardSeen::Present(seen),
                    None => {
                        self.extra.insert(i, seen);
                    }
                }
            }
        }
        self.note_orphans(now);
    }

    /// A watch event: the Lease was deleted.
    pub(super) fn deleted(&mut self, name: LeaseName, now: LocalInstant) {
        match name {
            LeaseName::Member(id) => {
                if let Some(before) = self.members.remove(&id) {
                    self.member_changed(Some(&before.record), None, now);
                }
            }
            LeaseName::Shard(i) => match self.shards.get_mut(i as usize) {
                Some(slot) => {
                    let last = match slot {
                        ShardSeen::Present(seen) => seen.record.content.holder.clone(),
                        ShardSeen::Absent { last, .. } => last.clone(),
                    };
                    *slot = ShardSeen::Absent {
                        free_from: now + self.lease_duration,
                        last,
                    };
                }
                None => {
                    self.extra.remove(&i);
                }
            },
        }
        self.note_orphans(now);
    }

    /// Forgets what no record refers to any more, a while after it was learned.
    pub(super) fn prune(&mut self, now: LocalInstant) {
        let keep = self.lease_duration * 2;
        let referenced: Vec<Token> = self
            .shards
            .iter()
            .filter_map(|s| match s {
                ShardSeen::Present(seen) => seen.record.content.holder.clone(),
                ShardSeen::Absent { last, .. } => last.clone(),
            })
            .chain(
                self.extra
                    .values()
                    .filter_map(|s| s.record.holder().cloned()),
            )
            .collect();
        let stale = |token: &Token, at: &LocalInstant| {
            now.saturating_duration_since(*at) > keep && !referenced.contains(token)
        };
        self.dead.retain(|t, at| !stale(t, at));
        self.vanished.retain(|t, at| !stale(t, at));
    }

    /// `record` with its first sight, kept from `before` when the protocol record is the same
    /// (only its resourceVersion or fields the protocol does not write changed), and the
    /// duration it is judged by.
    fn seen(&self, before: Option<&Seen>, record: Record, now: LocalInstant) -> Seen {
        let since = match before {
            Some(b) if b.same_record(&record) => b.since,
            _ => now,
        };
        // The longest duration its holder was seen to write: a third party's lower value does
        // not shorten it.
        let before_duration = before
            .filter(|b| b.record.content.holder == record.content.holder)
            .map_or(Duration::ZERO, |b| b.duration);
        let duration = record
            .content
            .duration
            .max(self.lease_duration)
            .max(before_duration);
        let holder_since = before
            .filter(|b| b.record.content.holder == record.content.holder)
            .map_or(now, |b| b.holder_since);
        Seen {
            record,
            since,
            holder_since,
            duration,
        }
    }

    /// Learns from a member record's change what it proves about its holders.
    fn member_changed(
        &mut self,
        before: Option<&Record>,
        after: Option<&Record>,
        now: LocalInstant,
    ) {
        if let Some(previous) = after.and_then(|r| r.content.previous.clone()) {
            self.dead.entry(previous).or_insert(now);
        }
        let Some(old) = before.and_then(|r| r.content.holder.clone()) else {
            return;
        };
        if after.is_some_and(|r| r.holder() == Some(&old)) || self.dead.contains_key(&old) {
            return;
        }
        // Replaced without a proof that it stopped (deleted, or written over by hand): it may
        // still believe until it notices, so it is remembered as alive for a lease duration.
        self.vanished.entry(old).or_insert(now);
    }

    /// Holders named by shard records that no member record names are vanishing from the first
    /// time this replica sees them.
    fn note_orphans(&mut self, now: LocalInstant) {
        let mut orphans = Vec::new();
        for seen in self.shard_records() {
            let Some(holder) = seen.record.holder() else {
                continue;
            };
            let named = self
                .members
                .get(holder.identity())
                .is_some_and(|m| m.record.holder() == Some(holder));
            if !named && !self.dead.contains_key(holder) && !self.vanished.contains_key(holder) {
                orphans.push(holder.clone());
            }
        }
        for token in orphans {
            self.vanished.insert(token, now);
        }
    }
}
