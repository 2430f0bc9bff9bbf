//! The controller's side of the protocol: what this replica holds (a `watch`), and the
//! hand-overs it must acknowledge (an `mpsc` of requests carrying a `oneshot`).
//!
//! A hand-over is signalled once, by its [`HandOver`] request: the controller acts on nothing
//! else. The `watch` only shows its shard as taking no keys ([`ShardState::GivingUp`]), and
//! shows it before the request is sent, so that the filters refuse the shard's keys before the
//! controller hears of the hand-over.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// One holding of a shard: from a successful take until the shard is lost or released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holding {
    /// Until when this replica may work on the shard, its deadline: the start of its latest
    /// membership renewal that made a new resourceVersion, plus the renew deadline, on its own
    /// clock, as a tokio instant (the same for every shard it holds). Moves forward with each
    /// renewal. Past it the shard is lost, whatever the protocol has published since.
    valid_until: Instant,
    /// This holding's number, distinct for each take by this replica: a shard whose epoch
    /// changed between two reads of the [`Assignment`] was lost or released, then taken again.
    epoch: u64,
}

impl Holding {
    /// The holding numbered `epoch` (the state machine's belief), valid until `valid_until`.
    pub(crate) fn new(valid_until: Instant, epoch: u64) -> Self {
        Holding { valid_until, epoch }
    }

    /// Whether the shard may still be worked on at `now`: before its deadline.
    pub(crate) fn valid_at(self, now: Instant) -> bool {
        self.valid_until > now
    }

    /// Until when this replica may work on the shard (its deadline, see the field).
    pub(crate) fn valid_until(self) -> Instant {
        self.valid_until
    }

    /// This holding's number.
    #[cfg(test)]
    pub(super) fn epoch(self) -> u64 {
        self.epoch
    }
}

/// One shard, as this replica holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ShardState {
    /// Not held: take none of its keys, run none of its reconciles.
    #[default]
    NotHeld,
    /// Held: take its keys while [`Holding::valid_at`] now.
    Held(Holding),
    /// Being handed over (its [`HandOver`] is sent right after this is published): take none
    /// of its keys; what runs may finish until the hand-over's deadline, and never past
    /// `valid_until`. No [`ShardChange`]: the request is the signal.
    GivingUp(Holding),
}

impl ShardState {
    /// The holding, held or being given up.
    pub(crate) fn holding(&self) -> Option<Holding> {
        match *self {
            ShardState::NotHeld => None,
            ShardState::Held(h) | ShardState::GivingUp(h) => Some(h),
        }
    }
}

/// Counters of one replica's protocol, for metrics. Each only grows: the driver counts through
/// the methods that name an event, and readers get the totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeaseStats {
    /// Shards taken (a gauge of the shards held is [`Assignment::held_count`]).
    acquisitions: u64,
    /// Shards lost: the deadline passed without a renewal, the membership was lost, or the
    /// shard's Lease was deleted.
    losses: u64,
    /// Hand-overs the controller acknowledged.
    hand_overs: u64,
    /// Hand-overs the controller acknowledged after their deadline.
    hand_over_timeouts: u64,
    /// Shards given away after a hand-over (their Lease written to the taker, or vacated).
    releases: u64,
    /// Collisions found: another process renews this replica's identity.
    identity_collisions: u64,
}

impl LeaseStats {
    /// A shard was taken.
    pub(super) fn acquired(&mut self) {
        self.acquisitions += 1;
    }

    /// A shard was lost.
    pub(super) fn lost(&mut self) {
        self.losses += 1;
    }

    /// The controller acknowledged a hand-over, after its deadline if `late`.
    pub(super) fn handed_over(&mut self, late: bool) {
        self.hand_overs += 1;
        self.hand_over_timeouts += u64::from(late);
    }

    /// A shard was given away.
    pub(super) fn released(&mut self) {
        self.releases += 1;
    }

    /// Another process was found renewing this replica's identity.
    pub(super) fn collided(&mut self) {
        self.identity_collisions += 1;
    }

    /// Shards lost.
    #[cfg(test)]
    pub(super) fn losses(&self) -> u64 {
        self.losses
    }

    /// Hand-overs acknowledged.
    #[cfg(any(test, feature = "metrics"))]
    pub(crate) fn hand_overs(&self) -> u64 {
        self.hand_overs
    }

    /// Hand-overs acknowledged after their deadline.
    #[cfg(test)]
    pub(super) fn hand_over_timeouts(&self) -> u64 {
        self.hand_over_timeouts
    }

    /// Shards given away.
    #[cfg(test)]
    pub(super) fn releases(&self) -> u64 {
        self.releases
    }

    /// Identity collisions found.
    #[cfg(feature = "metrics")]
    pub(crate) fn identity_collisions(&self) -> u64 {
        self.identity_collisions
    }
}

/// What one replica holds: the state of each shard, the number of live replicas it counts,
/// and its counters. Published on a `watch` by [`ShardLeases::run`](super::ShardLeases::run)
/// whenever it changes (each renewal moves a `valid_until`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Assignment {
    /// One state per shard, `0..` the number of shards.
    shards: Arc<[ShardState]>,
    members: u32,
    stats: LeaseStats,
}

impl Assignment {
    /// `shards` shards, none held, before the replica joined.
    pub(crate) fn empty(shards: u32) -> Self {
        Assignment::new(
            vec![ShardState::NotHeld; shards as usize].into(),
            0,
            LeaseStats::default(),
        )
    }

    /// The state of each shard, the live members counted and the counters.
    pub(crate) fn new(shards: Arc<[ShardState]>, members: u32, stats: LeaseStats) -> Self {
        Assignment {
            shards,
            members,
            stats,
        }
    }

    /// The number of shards.
    pub(crate) fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    /// The state of `shard` (`NotHeld` beyond the number of shards).
    pub(crate) fn state(&self, shard: u32) -> ShardState {
        self.shards.get(shard as usize).copied().unwrap_or_default()
    }

    /// Whether this replica may take a key of `shard` at `now`: held (not being handed over)
    /// and valid at `now`. The filter at the sources.
    pub(crate) fn accepts(&self, shard: u32, now: Instant) -> bool {
        matches!(self.state(shard), ShardState::Held(h) if h.valid_at(now))
    }

    /// Whether this replica may still run work of `shard` at `now`: held or being given up,
    /// and valid at `now` (the tests' check; the controller stops a shard's work itself).
    #[cfg(test)]
    pub(super) fn may_run(&self, shard: u32, now: Instant) -> bool {
        self.state(shard).holding().is_some_and(|h| h.valid_at(now))
    }

    /// The shards held (not being handed over), with their holdings.
    pub(crate) fn held(&self) -> impl Iterator<Item = (u32, Holding)> + '_ {
        self.shards.iter().enumerate().filter_map(|(i, s)| match s {
            ShardState::Held(h) => Some((i as u32, *h)),
            _ => None,
        })
    }

    /// How many shards are held (being given up or not): the shards-held gauge. With one shard,
    /// 1 is "leader".
    #[cfg(any(test, feature = "metrics"))]
    pub(crate) fn held_count(&self) -> u32 {
        self.shards.iter().filter(|s| s.holding().is_some()).count() as u32
    }

    /// The live replicas this replica counts (those shards are divided among), itself included
    /// while it is a member (0 before it joined). Read by the tests.
    #[cfg(test)]
    pub(super) fn members(&self) -> u32 {
        self.members
    }

    /// The counters (the metrics' and the tests').
    #[cfg(any(test, feature = "metrics"))]
    pub(crate) fn stats(&self) -> LeaseStats {
        self.stats
    }

    /// What changed since `before`, shard by shard in order: for a shard, `Ended` comes before
    /// `Acquired` when it was lost and taken again in between. A hand-over's start is no
    /// change (its [`HandOver`] request says it).
    pub(crate) fn changes_since(&self, before: &Assignment) -> Vec<ShardChange> {
        let mut changes = Vec::new();
        for shard in 0..self.shard_count() {
            let old_epoch = before.state(shard).holding().map(|h| h.epoch);
            let new = self.state(shard).holding();
            if old_epoch.is_some() && old_epoch != new.map(|h| h.epoch) {
                changes.push(ShardChange::Ended { shard });
            }
            if let Some(h) = new
                && old_epoch != Some(h.epoch)
            {
                changes.push(ShardChange::Acquired {
                    shard,
                    valid_until: h.valid_until,
                });
            }
        }
        changes
    }
}

/// A change of one shard between two [`Assignment`]s (see [`Assignment::changes_since`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShardChange {
    /// Taken: enqueue the shard's objects (at low priority) and take its keys until
    /// `valid_until` (and later ones as it is renewed).
    Acquired {
        /// The shard.
        shard: u32,
        /// Its validity when taken.
        valid_until: Instant,
    },
    /// No longer held: lost (stop at once: its work must not run past `valid_until`) or given
    /// away after an acknowledged hand-over (nothing of it runs any more).
    Ended {
        /// The shard.
        shard: u32,
    },
}

/// Why a shard is handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandOverReason {
    /// The shard belongs to another live replica's share.
    Rebalance,
    /// This replica is shutting down (or stopping after a loss, with [`OnLoss::Stop`](super::OnLoss::Stop)).
    Shutdown,
}

/// A request to give a shard up, sent to the controller; the protocol gives the shard away
/// (writes the taker's token into its Lease) only after [`HandOver::acknowledge`].
///
/// The controller stops taking the shard's keys (the [`Assignment`] already shows it as
/// [`ShardState::GivingUp`]), removes its queued keys, lets its in-flight reconciles finish
/// within a grace that ends before [`deadline`](HandOver::deadline), aborts the rest, and then
/// acknowledges: from then on nothing of the shard runs on this replica until it is taken again
/// (a new epoch). Dropping the request counts as acknowledging it (a controller that is gone
/// runs nothing). Until it is acknowledged the shard stays held, its keys not taken.
#[derive(Debug)]
pub(crate) struct HandOver {
    shard: u32,
    deadline: Instant,
    reason: HandOverReason,
    ack: oneshot::Sender<()>,
}

impl HandOver {
    /// A request to give `shard` up by `deadline`, and what resolves once it is acknowledged
    /// or dropped.
    pub(super) fn new(
        shard: u32,
        deadline: Instant,
        reason: HandOverReason,
    ) -> (HandOver, oneshot::Receiver<()>) {
        let (ack, acked) = oneshot::channel();
        let request = HandOver {
            shard,
            deadline,
            reason,
            ack,
        };
        (request, acked)
    }

    /// The shard.
    pub(crate) fn shard(&self) -> u32 {
        self.shard
    }

    /// By when the controller should have stopped the shard's work and acknowledged (tokio's
    /// clock).
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Why.
    pub(crate) fn reason(&self) -> HandOverReason {
        self.reason
    }

    /// Nothing of the shard runs any more, and nothing will: give it away.
    pub(crate) fn acknowledge(self) {
        let _ = self.ack.send(());
    }
}

/// The controller's side of one replica's protocol (from [`ShardLeases::new`](super::ShardLeases::new)).
#[derive(Debug)]
pub(crate) struct ShardEvents {
    /// What this replica holds, updated as it changes.
    pub(crate) assignment: tokio::sync::watch::Receiver<Assignment>,
    /// Hand-over requests, each to acknowledge once the shard's work has stopped.
    pub(crate) hand_overs: mpsc::UnboundedReceiver<HandOver>,
}

/// Acknowledges every hand-over at once, until the protocol ends: a controller with no work in
/// flight, for tests and for a replica whose work needs no draining.
pub(crate) async fn acknowledge_all(mut hand_overs: mpsc::UnboundedReceiver<HandOver>) {
    while let Some(hand_over) = hand_overs.recv().await {
        hand_over.acknowledge();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn assignment(states: &[ShardState]) -> Assignment {
        Assignment {
            shards: states.into(),
            members: 1,
            stats: LeaseStats::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn changes_follow_epochs() {
        let until = Instant::now() + Duration::from_secs(10);
        let h = |epoch| Holding::new(until, epoch);
        let before = assignment(&[
            ShardState::Held(h(1)),
            ShardState::NotHeld,
            ShardState::Held(h(2)),
            ShardState::Held(h(3)),
        ]);
        let after = assignment(&[
            ShardState::Held(h(4)),
            ShardState::Held(h(5)),
            ShardState::GivingUp(h(2)),
            ShardState::NotHeld,
        ]);
        assert_eq!(
            after.changes_since(&before),
            [
                ShardChange::Ended { shard: 0 },
                ShardChange::Acquired {
                    shard: 0,
                    valid_until: until
                },
                ShardChange::Acquired {
                    shard: 1,
                    valid_until: until
                },
                ShardChange::Ended { shard: 3 },
            ]
        );
        assert!(after.accepts(0, Instant::now()));
        assert!(!after.accepts(0, until));
        assert!(!after.accepts(2, Instant::now()));
        assert!(after.may_run(2, Instant::now()));
        assert_eq!(after.held_count(), 3);
        assert_eq!(after.held().map(|(s, _)| s).collect::<Vec<_>>(), [0, 1]);
    }
}
