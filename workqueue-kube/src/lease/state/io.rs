//! The state machine's vocabulary with its driver: the writes it asks for, the answers it
//! reads, and the decisions it tells the controller.

use super::super::clock::LocalInstant;
use super::{Content, LeaseName, Record, Rv, Token};

/// Why a replica stopped taking part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Shut down: every shard was handed over and the membership vacated.
    Shutdown,
    /// A shard was lost and the configuration says stop.
    Lost { shard: u32 },
    /// The membership was lost and the configuration says stop.
    LostMembership,
}

/// Why a shard is handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Another live member is its target.
    Rebalance,
    /// This replica is leaving.
    Shutdown,
}

/// What the state machine tells its driver and controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The membership was taken under `token`.
    Joined { token: Token },
    /// A belief began: take the shard's keys (and enqueue its objects).
    Acquired { shard: u32, epoch: u64 },
    /// Stop taking the shard's keys, let its work finish or abort it by `deadline` (the
    /// hand-over timeout after the request), then report [`ReplicaState::drained`].
    HandOver {
        shard: u32,
        epoch: u64,
        reason: Reason,
        deadline: LocalInstant,
    },
    /// Drained and being given away: nothing of it runs.
    Released { shard: u32, epoch: u64 },
    /// The belief ended without a hand-over: stop its work at once.
    Lost { shard: u32, epoch: u64 },
    /// The membership ended under `token` (taken over, fenced or deleted).
    MembershipLost { token: Token },
    /// Another process renews this identity's membership: two processes share an identity.
    Collision { other: Token },
    /// A possibly live holder runs another number of shards (or another protocol): no shard
    /// is taken or moved while it may be alive.
    Mismatch {
        holder: Token,
        shards: Option<u32>,
        protocol: Option<u32>,
    },
    /// A write the server stored was not shown by the view within a retry period: the watch
    /// is stale. The driver reads afresh (a new list and watch).
    WatchStale,
    /// Stored renewals were not shown within the renew deadline (reads fail, or come back too
    /// late): this replica stopped renewing so that another fences it and takes its shards.
    SteppedDown,
    /// A member's record carries a lease duration unlike this replica's (another
    /// configuration, or a third party's edit). Expiry is judged by the longer of the two.
    Timing {
        holder: Token,
        duration: std::time::Duration,
    },
    /// Leaving took past its limit (the hand-over timeout plus the renew deadline after a
    /// shutdown, a retry period after a loss): it stops waiting for drains and answers, writes
    /// nothing more, and [`Decision::Ended`] follows. What it held
    /// ends by time; its membership Lease expires instead of being vacated.
    GaveUp,
    /// Done: nothing held, nothing more to write (or, after [`Decision::GaveUp`], nothing more
    /// that will be written).
    Ended(Ending),
}

/// A write for the driver to perform, with resourceVersion preconditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) id: u64,
    pub(crate) lease: LeaseName,
    pub(crate) op: Op,
    /// Past this (local) instant the answer is of no use: the driver gives up and answers
    /// [`Answer::Unknown`].
    pub(crate) deadline: LocalInstant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Create the Lease (409 if it exists).
    Create(Content),
    /// Replace the Lease if it is still at the resourceVersion (409 if not, 404 if gone).
    Replace(Rv, Content),
    /// Delete the Lease if it is still at the resourceVersion.
    Delete(Rv),
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Done: the stored record (`None` for a delete).
    Done(Option<Record>),
    /// 409: it changed since the resourceVersion, or (a create) it exists.
    Conflict,
    /// 404.
    NotFound,
    /// No answer by the deadline, or an error: it may or may not have been written.
    Unknown,
}

#[derive(Clone, Debug)]
pub(crate) enum Output {
    Request(Request),
    Decision(Decision),
}
