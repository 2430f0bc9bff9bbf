//! Leader election and sharding on `coordination.k8s.io/v1` Leases: which shards of the keys
//! this replica may work on, and when it must stop.
//!
//! # The protocol
//!
//! The keys are divided into a fixed number of shards ([`LeaseConfig::shards`]; a key's shard is
//! [`shard_of`] its namespace and name). Shard `i` is guarded by the Lease `{name}-shard-{i}`;
//! each replica also holds a membership Lease `{name}-member-{identity}`, so that every replica
//! knows how many are alive. All of them carry the labels [`LABEL_CONTROLLER`] and
//! [`LABEL_ROLE`], so that one list call sees them. Leader election is the one-shard case.
//!
//! Every retry period each replica renews the Leases it holds, lists the controller's Leases,
//! counts the live replicas (membership Leases not expired by its own observation), and moves
//! toward a fair share, between the floor and the ceiling of shards / replicas: below it, it
//! takes shards that are free (no holder) or expired; above it, it hands shards over. A replica
//! takes a free shard only while no live replica is below the floor, so a newcomer gets its share
//! first and nothing moves back and forth; a replica that just joined waits for its next list
//! before taking anything, so that replicas started together see each other first.
//!
//! **Time.** A replica judges another's Lease by its own clock, from the last change it saw: it
//! remembers when (on its clock) it first saw each record's resourceVersion, and counts the Lease
//! expired once that is more than the record's `leaseDurationSeconds` ago (client-go's rule). A
//! holder counts itself as holding a shard only until the start of its last successful renewal
//! plus the renew deadline, on its own clock. So clock offsets between replicas never matter,
//! only clock rates. The `renewTime` and `acquireTime` a replica writes are its wall time, for
//! people: no replica reads them. [`LeaseClock`] is the clock; tests give each replica a
//! [`SkewedClock`].
//!
//! # The controller's side
//!
//! [`ShardLeases::new`] returns the protocol and its [`ShardEvents`]: a `watch` of the
//! [`Assignment`] and an `mpsc` of [`HandOver`] requests. [`ShardLeases::run`] is the protocol's
//! task. The controller keeps these invariants:
//!
//! - **Taking keys.** It takes a key of shard `s` only while
//!   [`Assignment::accepts`]`(s, now)`: `s` is [`Held`](ShardState::Held) and its
//!   [`valid_until`](Holding::valid_until) is in the future. `valid_until` is the start of the
//!   last successful renewal plus the renew deadline (as a tokio instant); each renewal moves
//!   it forward. A source drops other keys instead of queueing them.
//! - **Taking a shard.** A shard whose [`epoch`](Holding::epoch) is new
//!   ([`ShardChange::Acquired`]) was just taken: the controller enqueues its objects (from its
//!   store, at low priority), since another replica may have dropped their events.
//! - **Losing a shard.** When `valid_until` passes without a renewal the shard is lost, even
//!   before the protocol publishes it ([`ShardChange::Ended`]): the controller stops taking its
//!   keys at once, and aborts its reconciles still running (from a task of its own, whatever
//!   polls its stream) before `valid_until` plus the lease duration minus the renew deadline
//!   (less the clock rate bound below), after which another replica may take the shard.
//! - **Handing a shard over.** For a [`HandOver`] the controller stops taking the shard's keys
//!   (the `Assignment` shows it as [`GivingUp`](ShardState::GivingUp)), removes its queued keys,
//!   lets its in-flight reconciles finish within a grace that ends before the request's
//!   [`deadline`](HandOver::deadline), aborts the rest, and then calls
//!   [`HandOver::acknowledge`]. Only then does the protocol release the Lease (an update that
//!   clears the holder), so that another replica takes the shard at its next retry period
//!   instead of after expiry. Without an acknowledgement by the deadline the Lease is not
//!   released: it lapses, and the shard is lost at its `valid_until`.
//! - **Leaving.** When [`ShardLeases::run`]'s shutdown future completes, the replica deletes its
//!   membership Lease, hands every shard over (as above) and releases what the controller
//!   acknowledged, for a fast failover. [`acknowledge_all`] is a controller with nothing to drain.
//! - **After a loss** the replica stays a candidate ([`OnLoss::Rejoin`]); with [`OnLoss::Stop`]
//!   `run` leaves as on shutdown and returns [`Ended::Lost`], for a controller that exits on a
//!   lost Lease (controller-runtime's leader election does).
//!
//! # What the protocol assumes
//!
//! - **Clock rates, not offsets.** With `r` the ratio of the fastest to the slowest replica
//!   clock, a holder's belief ends before any other replica can take its shard if
//!   `renew_deadline * r < lease_duration` (with the defaults, 10 s and 15 s, any `r` under
//!   1.5). The time the controller has to abort a lost shard's work after `valid_until` is at
//!   least `lease_duration / (1 + e) - renew_deadline / (1 - e)` for rates within `1 ± e`.
//! - **The API server's optimistic concurrency.** Every write is a replace under the
//!   resourceVersion read (or a create), so a take succeeds only if the record is still the one
//!   the taker observed expired; the API server (etcd) orders the writes to one object.
//! - **Unique identities.** Each process has its own identity; a record naming this replica that
//!   it does not hold in memory is its own (a write whose answer was lost), and it takes it back
//!   under the record's version.
//! - **A partitioned holder** (no answer, or errors) renews nothing, so it counts itself as
//!   holding only until its last successful renewal's start plus the renew deadline; the others
//!   take its shards only after they saw no change for the lease duration, later by at least
//!   the margin above. Each request gets the retry period to answer.
//!
//! # Metrics and tracing
//!
//! The [`Assignment`] carries what metrics need: [`Assignment::held_count`] (the shards-held
//! gauge; with one shard, whether this replica leads), [`Assignment::members`], and the
//! counters of [`LeaseStats`] (hand-overs, losses, acquisitions, releases, renewal failures),
//! each only growing. The protocol's events are `tracing` events (acquired, renewing failed,
//! lost, handing over, acknowledged, released, lapsed), with the `shard` as a field, inside the
//! span `lease_protocol` with the fields `controller` and `identity`.
//!
//! # Cost
//!
//! Each replica sends, every retry period, one list and one write per Lease it holds (its shards
//! and its membership Lease): with `n` shards, `k` replicas and the retry period `p`, about
//! `(n / k + 2) / p` requests per second per replica, `(n + 2k) / p` for the controller. The
//! number of shards trades this cost against balance (a replica holds at most `ceil(n / k)`).

mod assignment;
mod client;
mod clock;
mod config;
mod membership;
mod protocol;
mod shard;

pub use assignment::{
    Assignment, HandOver, HandOverReason, Holding, LeaseStats, ShardChange, ShardEvents,
    ShardState, acknowledge_all,
};
pub use client::{Created, Deleted, LeaseClient, LeaseError, Replaced};
pub use clock::{LeaseClock, LocalInstant, SkewedClock, TokioClock};
pub use config::{ConfigError, LeaseConfig, OnLoss};
pub use protocol::{Ended, ShardLeases};
pub use shard::shard_of;

/// The label on every Lease of the protocol whose value is the controller's name.
pub const LABEL_CONTROLLER: &str = "workqueue-kube/controller";
/// The label on every Lease of the protocol that says what it guards: [`ROLE_SHARD`] or
/// [`ROLE_MEMBER`].
pub const LABEL_ROLE: &str = "workqueue-kube/lease-role";
/// [`LABEL_ROLE`] of a shard's Lease.
pub const ROLE_SHARD: &str = "shard";
/// [`LABEL_ROLE`] of a replica's membership Lease.
pub const ROLE_MEMBER: &str = "member";
/// The annotation on a membership Lease with the replica's number of shards: a replica takes no
/// shard while a live replica has another number (during a rollout that changes it).
pub const ANNOTATION_SHARDS: &str = "workqueue-kube/shards";
