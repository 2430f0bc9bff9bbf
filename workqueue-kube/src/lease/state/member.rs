//! This replica's own membership: joining, one renewal per retry period, the belief deadline,
//! losing it and leaving.
//!
//! Invariants:
//! - Every write of the membership Lease carries a counter never used before by this token, and
//!   `sent` maps each counter not yet seen to the local instant its write started.
//! - `confirmed` is the start of the latest write of the current token that the view has shown
//!   (the watch delivered it, or a list held it): the belief deadline is `confirmed` plus the
//!   renew deadline. An answer alone never extends it, and a write that made no new
//!   resourceVersion never shows up as a new record, so it extends nothing.
//! - A view that no longer shows the membership Lease naming the current token ends the
//!   membership (`Lost`): the token is never used again; a rejoin draws a new one.
//! - At most [`IN_FLIGHT`] writes of the membership Lease are in flight, each conditional on a
//!   resourceVersion; two under one resourceVersion are never sent within a retry period of
//!   each other, so at most one of those is stored.
//! - A write the server stored is expected in the view within a retry period of its answer
//!   (`expected`), and a write refused with 409 is expected to show the record changed
//!   (`expected_change`): past that the view is stale ([`Membership::stale`]) and the driver
//!   reads afresh (a list is a consistent read).
//! - A token whose records said it may hold shards (`held_sent`) steps down for good once a
//!   write of it that the server stored (`unseen`: answered as stored, or read back only after
//!   the renew deadline) has not made it believe (the view showing
//!   it or a later write while the belief it extends is still valid) by the later of the renew
//!   deadline after its start and two retry periods after its answer (time for a fresh read:
//!   a process that was paused finds the answers and the events that show them queued
//!   together). It renews no more, so its peers fence it a lease duration after its last
//!   stored write and take its shards; its own beliefs have ended by then (they end at
//!   `confirmed` + renew deadline, and `confirmed` is the start of an earlier write). It joins
//!   again once it reads the fence, or two lease durations after its last write if it never
//!   does (with no peer to fence it, a single replica would wait for ever). A replica that renews but cannot believe would otherwise
//!   hold its shards for ever while running none of their work.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::super::clock::LocalInstant;
use super::super::config::Settings;
use super::super::shard::fmix64;
use super::record::{Content, PROTOCOL, Rv, Token};
use super::view::Seen;

/// Where the membership stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Not a member yet: the next write makes it one, once the record is free to take.
    Joining,
    /// A member: a renewal of the current token has been seen.
    Member,
    /// Shutting down: renewals say `leaving`; the record is vacated once nothing is held.
    Leaving,
    /// The vacating write is due or out.
    Vacating,
    /// Done: nothing is held and nothing more is written.
    Left,
}

/// What an observation of the membership record changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Change {
    Joined,
    /// The membership ended: `old` is the token it had (never used again).
    Lost {
        old: Token,
    },
    Left,
    /// Another process holds this identity's record and renews it: two processes were given
    /// one identity.
    Collision {
        other: Token,
    },
    /// Its stored renewals are not shown within the renew deadline: it stopped renewing, so
    /// that another replica fences it and takes its shards.
    SteppedDown,
}

/// A write of the membership Lease to send.
#[derive(Clone, Debug)]
pub(super) struct MemberWrite {
    /// `None`: create it.
    pub(crate) rv: Option<Rv>,
    pub(crate) content: Content,
}

/// A write in flight.
#[derive(Clone, Debug)]
struct InFlight {
    counter: u64,
    start: LocalInstant,
    /// The resourceVersion it is conditional on (`None`: a create).
    under: Option<Rv>,
    vacate: bool,
}

/// At most this many writes of the membership Lease are in flight at once.
const IN_FLIGHT: usize = 5;

/// Another process's token on this identity's record, while joining waits for it to expire.
#[derive(Clone, Debug)]
struct Blocker {
    token: Token,
    /// Its counter last seen: a renewal raises it (a third party's write does not).
    counter: u64,
    renewals: u32,
}

#[derive(Debug)]
pub(super) struct Membership {
    identity: Arc<str>,
    settings: Settings,
    seed: u64,
    incarnation: u64,
    token: Token,
    /// This process's earlier tokens (each one lost): a record naming one is taken over at
    /// once, as nothing believes under it any more.
    old: Vec<Token>,
    phase: Phase,
    counter: u64,
    sent: VecDeque<(u64, LocalInstant)>,
    confirmed: Option<LocalInstant>,
    /// The resourceVersion (and counter) to write under next: the latest record of the current
    /// token known, from an answer or the view.
    base: Option<(Rv, u64)>,
    /// A resourceVersion a write was refused under (409): never written under again.
    refused: Option<Rv>,
    /// The start of the latest write of the current token known to be stored.
    stored_start: Option<LocalInstant>,
    /// The writes in flight, oldest first.
    in_flight: Vec<InFlight>,
    /// The last write's resourceVersion precondition and start.
    last_write: Option<(Option<Rv>, LocalInstant)>,
    /// When the last joining write went out (any token): one per retry period.
    last_join: Option<LocalInstant>,
    /// When the current token's first joining write went out.
    first_join: Option<LocalInstant>,
    /// Tokens given up since the state machine last asked (it buries them in its view).
    buried: Vec<Token>,
    /// Whether a write with `leaving` has been sent since shutting down began.
    leaving_sent: bool,
    blocker: Option<Blocker>,
    reported: Vec<Token>,
    /// The highest counter of the current token the view has shown.
    shown: u64,
    /// A stored write not shown yet: its counter and when its answer came plus a retry
    /// period (past that the view is stale).
    expected: Option<(u64, LocalInstant)>,
    /// A resourceVersion a write was refused under (409), expected to be replaced in the view
    /// by the instant with it.
    expected_change: Option<(Rv, LocalInstant)>,
    /// The earliest stored write not yet read back in time to believe on it (or a later one):
    /// its counter, start and the answer's arrival.
    unseen: Option<(u64, LocalInstant, LocalInstant)>,
    /// Whether a write of the current token said it may hold shards (it then says so until the
    /// token ends: peers may be waiting for it).
    held_sent: bool,
    /// Stopped renewing for good (see the invariants).
    stepped_down: bool,
}

/// At most this many unseen writes are remembered (each one is a retry period apart).
const SENT_KEPT: usize = 16;

impl Membership {
    pub(super) fn new(seed: u64, settings: Settings) -> Membership {
        Membership {
            identity: settings.identity().into(),
            token: Token::new(settings.identity(), fmix64(seed)),
            settings,
            seed,
            incarnation: 0,
            old: Vec::new(),
            phase: Phase::Joining,
            counter: 0,
            sent: VecDeque::new(),
            confirmed: None,
            base: None,
            refused: None,
            stored_start: None,
            in_flight: Vec::new(),
            last_write: None,
            last_join: None,
            first_join: None,
            buried: Vec::new(),
            leaving_sent: false,
            blocker: None,
            reported: Vec::new(),
            shown: 0,
            expected: None,
            expected_change: None,
            unseen: None,
            held_sent: false,
            stepped_down: false,
        }
    }

    pub(super) fn token(&self) -> &Token {
        &self.token
    }

    pub(super) fn identity(&self) -> &Arc<str> {
        &self.identity
    }

    pub(super) fn phase(&self) -> Phase {
        self.phase
    }

    /// Until when this replica may believe it holds what its records name it the holder of
    /// (`None`: nothing).
    pub(super) fn valid_until(&self) -> Option<LocalInstant> {
        match self.phase {
            Phase::Member | Phase::Leaving => {
                self.confirmed.map(|c| c + self.settings.renew_deadline())
            }
            Phase::Joining | Phase::Vacating | Phase::Left => None,
        }
    }

    /// Whether a member (not leaving) whose belief is valid at `now`.
    pub(super) fn serving(&self, now: LocalInstant) -> bool {
        self.phase == Phase::Member && self.valid_until().is_some_and(|v| now < v)
    }

    fn serving_or_leaving(&self, now: LocalInstant) -> bool {
        matches!(self.phase, Phase::Member | Phase::Leaving)
            && self.valid_until().is_some_and(|v| now < v)
    }

    /// Whether the view is stale: a stored write of the current token was not shown within a
    /// retry period of its answer. Reported once per write; the driver then reads afresh (a
    /// list is a consistent read, which shows it).
    pub(super) fn stale(&mut self, now: LocalInstant) -> bool {
        let stored = self.expected.is_some_and(|(_, due)| now >= due);
        let refused = self
            .expected_change
            .as_ref()
            .is_some_and(|(_, due)| now >= *due);
        if stored {
            self.expected = None;
        }
        if refused {
            self.expected_change = None;
        }
        stored || refused
    }

    /// Steps down when a stored write has not been shown within the renew deadline of its
    /// start while its records say it may hold shards (see the invariants).
    pub(super) fn step_down(&mut self, now: LocalInstant) -> Option<Change> {
        // Believing again on that write or a later one: it was read back in time.
        if let Some((_, start, _)) = self.unseen
            && self.confirmed.is_some_and(|c| c >= start)
            && self.valid_until().is_some_and(|v| now < v)
        {
            self.unseen = None;
        }
        if let Some(at) = self.give_up_at() {
            return (now >= at).then(|| self.lose());
        }
        let due = self.step_down_at()?;
        if now < due {
            return None;
        }
        self.stepped_down = true;
        Some(Change::SteppedDown)
    }

    /// When a stepped-down token is given up by its own process, if no fence was read by then:
    /// two lease durations after its last write went out, so that a peer's fence comes first
    /// where there is a peer (its beliefs ended long before).
    fn give_up_at(&self) -> Option<LocalInstant> {
        let (_, last) = self.last_write.as_ref().filter(|_| self.stepped_down)?;
        Some(*last + self.settings.lease_duration() * 2)
    }

    /// When it steps down unless the view shows its stored writes before.
    fn step_down_at(&self) -> Option<LocalInstant> {
        let (_, start, answered) = self.unseen?;
        let member = matches!(self.phase, Phase::Member | Phase::Leaving);
        (member && self.held_sent && !self.stepped_down).then(|| {
            (start + self.settings.renew_deadline())
                .max(answered + self.settings.retry_period() * 2)
        })
    }

    /// Shutting down: renewals say `leaving` from now on.
    pub(super) fn leave(&mut self) {
        match self.phase {
            Phase::Member => self.phase = Phase::Leaving,
            // Never joined: whatever write is out, its record (if any) is vacated.
            Phase::Joining => self.phase = Phase::Leaving,
            Phase::Leaving | Phase::Vacating | Phase::Left => {}
        }
    }

    /// Nothing is held any more: vacate the record (or stop, if none names this token).
    pub(super) fn vacate(&mut self) {
        if self.phase == Phase::Leaving {
            self.phase = Phase::Vacating;
        }
    }

    /// Stops at once (after a loss, when the configuration says to stop): nothing more is
    /// written.
    pub(super) fn stop(&mut self) {
        self.phase = Phase::Left;
    }

    /// Reads this identity's membership record as the view shows it now.
    pub(super) fn observe(&mut self, seen: Option<&Seen>, now: LocalInstant) -> Option<Change> {
        let record = seen.map(|s| s.record());
        if self
            .expected_change
            .as_ref()
            .is_some_and(|(rv, _)| record.is_none_or(|r| r.rv != *rv))
        {
            self.expected_change = None;
        }
        if let Some(record) = record.filter(|r| r.holder() == Some(&self.token)) {
            let counter = record.content.counter;
            self.shown = self.shown.max(counter);
            if self.expected.is_some_and(|(c, _)| c <= counter) {
                self.expected = None;
            }
            while let Some(&(c, start)) = self.sent.front() {
                if c > counter {
                    break;
                }
                self.sent.pop_front();
                if c == counter {
                    self.confirmed = Some(self.confirmed.map_or(start, |s| s.max(start)));
                    self.stored(start);
                    // Read back too late to believe on: stored, but its answers may never
                    // have come (they time out at the renew deadline too).
                    if now >= start + self.settings.renew_deadline() && self.unseen.is_none() {
                        self.unseen = Some((c, start, now));
                    }
                }
            }
            let newer = self.base.as_ref().is_none_or(|(_, c)| counter >= *c);
            if newer && self.refused.as_ref() != Some(&record.rv) {
                self.base = Some((record.rv.clone(), counter));
            }
            if self.phase == Phase::Joining && self.confirmed.is_some() {
                self.phase = Phase::Member;
                self.blocker = None;
                return Some(Change::Joined);
            }
            return None;
        }
        // Fenced (or taken over) before it ever joined: the token is dead all the same.
        let fenced = record.is_some_and(|r| r.content.previous.as_ref() == Some(&self.token));
        match self.phase {
            Phase::Member | Phase::Leaving if self.confirmed.is_some() => Some(self.lose()),
            Phase::Joining | Phase::Leaving if fenced => Some(self.lose()),
            // Vacated (or taken over): done. Unless a write of this token may still land.
            Phase::Vacating if self.in_flight.is_empty() && self.base.is_none() => {
                self.phase = Phase::Left;
                Some(Change::Left)
            }
            Phase::Joining => self.watch_blocker(seen),
            _ => None,
        }
    }

    /// Counts the renewals of another token on this identity's record.
    fn watch_blocker(&mut self, seen: Option<&Seen>) -> Option<Change> {
        let record = seen.map(|s| s.record());
        let Some(other) = record
            .and_then(|r| r.holder())
            .filter(|h| !self.old.contains(h))
        else {
            self.blocker = None;
            return None;
        };
        let counter = record.map(|r| r.content.counter)?;
        match &mut self.blocker {
            Some(b) if b.token == *other => {
                if b.counter != counter {
                    b.counter = counter;
                    b.renewals += 1;
                }
            }
            _ => {
                self.blocker = Some(Blocker {
                    token: other.clone(),
                    counter,
                    renewals: 0,
                });
            }
        }
        let b = self.blocker.as_ref()?;
        // Twice: a predecessor's last write may land after this process first looked.
        if b.renewals >= 2 && !self.reported.contains(&b.token) {
            self.reported.push(b.token.clone());
            return Some(Change::Collision {
                other: b.token.clone(),
            });
        }
        None
    }

    /// The membership ended: a new token for a rejoin.
    fn lose(&mut self) -> Change {
        let old = self.token.clone();
        self.buried.push(old.clone());
        self.old.push(old.clone());
        if self.old.len() > 4 {
            self.old.remove(0);
        }
        self.incarnation += 1;
        self.token = Token::new(&self.identity, fmix64(self.seed ^ self.incarnation));
        self.sent.clear();
        // Answers to the old token's writes are of no use any more.
        self.in_flight.clear();
        self.confirmed = None;
        self.base = None;
        self.refused = None;
        self.stored_start = None;
        self.first_join = None;
        self.shown = 0;
        self.expected = None;
        self.expected_change = None;
        self.unseen = None;
        self.held_sent = false;
        self.stepped_down = false;
        self.phase = match self.phase {
            Phase::Leaving | Phase::Vacating | Phase::Left => Phase::Left,
            Phase::Joining | Phase::Member => Phase::Joining,
        };
        Change::Lost { old }
    }

    /// The write to send now, if any (`seen`: this identity's record in the view).
    ///
    /// A renewal is due a retry period after the start of the latest one stored, at once
    /// when its answer comes later than that (a slow server is met one round trip at a
    /// time). A write not answered yet does not hold the next back for ever: a retry period
    /// after it, another goes out under the same resourceVersion, so a lost request costs one
    /// retry period, not the renew deadline; both being conditional on one resourceVersion,
    /// at most one is written. Each may take until the belief it would extend ends.
    pub(super) fn next_write(
        &mut self,
        seen: Option<&Seen>,
        synced: bool,
        now: LocalInstant,
    ) -> Option<MemberWrite> {
        if !synced || self.in_flight.len() >= IN_FLIGHT {
            return None;
        }
        let record = seen.map(|s| s.record());
        let rp = self.settings.retry_period();
        // Says it may hold shards once it could believe when it wrote: a replica whose own
        // writes come back later than the renew deadline is never given any.
        self.held_sent |= self.serving_or_leaving(now);
        let due = self.stored_start.is_none_or(|t| now >= t + rp);
        let write = match self.phase {
            Phase::Joining if self.last_join.is_none_or(|t| now >= t + rp) => {
                let write = self.join(seen, now)?;
                self.last_join = Some(now);
                write
            }
            Phase::Member | Phase::Leaving
                if !self.stepped_down
                    && (due || (self.phase == Phase::Leaving && !self.leaving_sent)) =>
            {
                let rv = self.write_base(record)?;
                let previous = record.and_then(|r| r.content.previous.clone());
                self.content(Some(rv), Some(self.token.clone()), previous, record)
            }
            Phase::Vacating => {
                let rv = self.write_base(record)?;
                self.content(Some(rv), None, Some(self.token.clone()), record)
            }
            _ => return None,
        };
        // Not twice under one resourceVersion within a retry period, answered or not (a
        // write refused at once is not retried at once).
        let recent = self
            .in_flight
            .iter()
            .map(|w| (&w.under, w.start))
            .chain(self.last_write.as_ref().map(|(u, t)| (u, *t)))
            .any(|(under, start)| *under == write.rv && now < start + rp);
        if recent {
            return None;
        }
        self.last_write = Some((write.rv.clone(), now));
        self.in_flight.push(InFlight {
            counter: write.content.counter,
            start: now,
            under: write.rv.clone(),
            vacate: write.content.holder.is_none(),
        });
        self.counter = write.content.counter;
        self.leaving_sent |= write.content.leaving;
        if write.content.holder.is_some() {
            self.sent.push_back((write.content.counter, now));
            if self.sent.len() > SENT_KEPT {
                self.sent.pop_front();
            }
        }
        Some(write)
    }

    /// The tokens this process gave up since the last call: nothing believes under them.
    pub(super) fn take_buried(&mut self) -> Vec<Token> {
        std::mem::take(&mut self.buried)
    }

    fn stored(&mut self, start: LocalInstant) {
        self.stored_start = Some(self.stored_start.map_or(start, |s| s.max(start)));
    }

    /// The first write of a token: create the record, or take it over when it is vacant, names
    /// one of this process's earlier tokens, or names another holder that has expired (this
    /// write is then the fence).
    fn join(&mut self, seen: Option<&Seen>, now: LocalInstant) -> Option<MemberWrite> {
        // A write of this token was stored: renew it (the view has not caught up).
        if let Some((rv, _)) = self.base.clone() {
            let record = seen.map(|s| s.record());
            let previous = record.and_then(|r| r.content.previous.clone());
            return Some(self.content(Some(rv), Some(self.token.clone()), previous, record));
        }
        // A token that has not joined within a lease duration of its first joining write is
        // given up: one of its writes may have been stored, fenced and collected since, and a
        // token must never hold a record twice (its first life's fence made it dead in every
        // view). Within that window no fence of it can have happened yet.
        if self
            .first_join
            .is_some_and(|t| now > t + self.settings.lease_duration())
        {
            self.lose();
        }
        self.first_join.get_or_insert(now);
        let Some(seen) = seen else {
            return Some(self.content(None, Some(self.token.clone()), None, None));
        };
        let record = seen.record();
        if self.refused.as_ref() == Some(&record.rv) {
            return None;
        }
        let previous = match record.holder() {
            None => record.content.previous.clone(),
            Some(h) if *h == self.token => record.content.previous.clone(),
            Some(h) if self.old.contains(h) || now > seen.expires() => Some(h.clone()),
            Some(_) => return None,
        };
        let rv = Some(record.rv.clone());
        Some(self.content(rv, Some(self.token.clone()), previous, Some(record)))
    }

    /// The resourceVersion to write under: the latest known of this token's records, unless a
    /// write was refused under it.
    fn write_base(&mut self, record: Option<&super::record::Record>) -> Option<Rv> {
        if self.base.is_none()
            && let Some(r) = record.filter(|r| r.holder() == Some(&self.token))
            && self.refused.as_ref() != Some(&r.rv)
        {
            self.base = Some((r.rv.clone(), r.content.counter));
        }
        self.base.as_ref().map(|(rv, _)| rv.clone())
    }

    fn content(
        &self,
        rv: Option<Rv>,
        holder: Option<Token>,
        previous: Option<Token>,
        record: Option<&super::record::Record>,
    ) -> MemberWrite {
        let before = record.map_or(0, |r| r.content.counter);
        MemberWrite {
            rv,
            content: Content {
                holder,
                previous,
                counter: self.counter.max(before) + 1,
                shards: Some(self.settings.shards()),
                protocol: Some(PROTOCOL),
                leaving: matches!(self.phase, Phase::Leaving),
                // Joining: holds nothing yet. Its first renewal as a member that could believe
                // says it may (and every later one).
                held: self.held_sent && matches!(self.phase, Phase::Member | Phase::Leaving),
                duration: self.settings.lease_duration(),
            },
        }
    }

    /// The answer to the write in flight: the stored record, `Conflict` (409), `NotFound`
    /// (404), or no answer / an error (`None`: it may or may not have been written).
    pub(super) fn answered(
        &mut self,
        counter: u64,
        answer: Answered,
        now: LocalInstant,
    ) -> Option<Change> {
        let i = self.in_flight.iter().position(|w| w.counter == counter)?;
        let write = self.in_flight.remove(i);
        let vacated = write.vacate;
        match answer {
            Answered::Stored { rv, counter } => {
                if self.base.as_ref().is_none_or(|(_, c)| counter >= *c) {
                    self.base = Some((rv, counter));
                }
                if counter > self.shown && !vacated {
                    // The earliest unshown write's: later answers do not push it back.
                    if self.expected.is_none() {
                        self.expected = Some((counter, now + self.settings.retry_period()));
                    }
                }
                if self.unseen.is_none() && !vacated {
                    self.unseen = Some((counter, write.start, now));
                }
                self.stored(write.start);
                if vacated && self.phase == Phase::Vacating {
                    self.phase = Phase::Left;
                    return Some(Change::Left);
                }
                None
            }
            Answered::Conflict { under } => {
                if self.base.as_ref().map(|(rv, _)| rv) == under.as_ref() {
                    self.base = None;
                }
                if let Some(rv) = under.clone() {
                    self.expected_change = Some((rv, now + self.settings.retry_period()));
                }
                self.refused = under;
                None
            }
            Answered::NotFound => {
                self.base = None;
                match self.phase {
                    Phase::Member | Phase::Leaving if self.confirmed.is_some() => Some(self.lose()),
                    Phase::Vacating => {
                        self.phase = Phase::Left;
                        Some(Change::Left)
                    }
                    _ => None,
                }
            }
            Answered::Unknown => None,
        }
    }

    /// The instants at which the membership has something to do by time alone (some may
    /// have passed).
    pub(super) fn next_wakes(&self, seen: Option<&Seen>) -> Vec<LocalInstant> {
        let mut wakes: Vec<LocalInstant> = self.valid_until().into_iter().collect();
        wakes.extend(self.expected.map(|(_, due)| due));
        wakes.extend(self.expected_change.as_ref().map(|(_, due)| *due));
        wakes.extend(self.step_down_at());
        wakes.extend(self.give_up_at());
        if self.in_flight.len() >= IN_FLIGHT || self.phase == Phase::Left {
            return wakes;
        }
        let rp = self.settings.retry_period();
        wakes.extend(self.stored_start.map(|t| t + rp));
        wakes.extend(self.in_flight.iter().map(|w| w.start + rp));
        wakes.extend(self.last_write.as_ref().map(|(_, t)| *t + rp));
        if self.phase == Phase::Joining {
            wakes.extend(self.last_join.map(|t| t + rp));
        }
        if self.phase == Phase::Joining
            && let Some(seen) = seen.filter(|s| s.record().holder().is_some())
        {
            // Expired is strictly after.
            wakes.push(seen.expires() + Duration::from_nanos(1));
        }
        wakes
    }
}

/// What the state machine learned from the answer to a membership write.
#[derive(Clone, Debug)]
pub(super) enum Answered {
    Stored {
        rv: Rv,
        counter: u64,
    },
    /// Refused: the record changed since `under` (or, for a create, exists).
    Conflict {
        under: Option<Rv>,
    },
    NotFound,
    Unknown,
}
