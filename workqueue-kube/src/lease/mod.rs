//! Leader election and sharding on `coordination.k8s.io/v1` Leases: which shards of the keys
//! this replica may work on, and until when.
//!
//! What a user sets is a [`LeaseConfig`] (the Leases' names, this replica's identity, the
//! number of shards, the timing, and [`OnLoss`]), given to
//! [`Controller::leases`](crate::controller::Controller::leases), which runs the protocol beside
//! the controller and follows what it holds. [`LeaseClock`] is the clock a replica judges time
//! by: tokio's ([`TokioClock`]) unless
//! [`Controller::lease_clock`](crate::controller::Controller::lease_clock) gives another, such
//! as a [`SkewedClock`] in tests where replicas share one process.
//!
//! # The protocol
//!
//! The keys are divided into a fixed number of shards ([`LeaseConfig::shards`]; a key's shard is
//! [`shard_of`] its namespace and name). Leader election is the one-shard case.
//!
//! **The Leases.** Each replica has a membership Lease, `{name}-member-{identity}`; each shard a
//! Lease, `{name}-shard-{i}`. All carry the labels `workqueue-kube/controller` (the controller's
//! name) and `workqueue-kube/lease-role` (`member` or `shard`): `kubectl get leases -l
//! workqueue-kube/controller={name},workqueue-kube/lease-role=shard` lists the shards' Leases.
//! Each also carries its writer's number of shards (the annotation `workqueue-kube/shards`): no
//! shard is taken or moved while a replica that may be alive has another number (during a
//! rollout that changes it, until the last replica of the old number is gone). A Lease's holder
//! is a *token*,
//! `{identity}_{instance}`: the identity the user gives ([`LeaseConfig::identity`], the pod's
//! name) and an instance drawn at random by each process, and again each time it joins after
//! losing its membership. An empty holder is a vacant Lease.
//!
//! **One write per replica.** A replica renews its own membership Lease once per retry period,
//! and nothing else: that renewal proves it alive for every shard whose Lease names it. Shard
//! Leases are written only when a shard changes hands. Every write is conditional on the
//! resourceVersion the writer last saw (or is a create), and raises a counter in the Lease, so
//! every write makes a new resourceVersion whatever the wall clock does.
//!
//! **Reading.** A replica watches the controller's Leases (by label); it lists them only when its
//! watch starts or breaks, and every list is a consistent read. A watch can stall without an
//! error (a proxy or load balancer that holds the connection open): a renewal the API server
//! stored and the watch did not show within a retry period of its answer, or a write refused
//! with 409 whose newer version the watch did not show within a retry period, proves the watch
//! stale, and the replica replaces it with a new list and watch (reported once on the
//! controller's stream, [`RunnerError::LeaseWatchStale`](crate::controller::RunnerError::LeaseWatchStale),
//! until a watch delivers again). An answer alone never extends a belief (step 5 below): it
//! proves what the membership Lease holds, not what the shards' Leases hold, which a stale view
//! may show wrong (one deleted and taken since, step 7).
//!
//! **Who holds what.** The live members (membership Leases whose record changed within their
//! lease duration, by the observer's clock, and are not leaving) each have a share of the shards,
//! within one of each other, by rendezvous hashing: every replica computes the same shares from
//! the same members, and a join or a leave moves about `shards / members` shards. A member takes
//! a free shard of its share (one write naming it) and hands over a shard of another's share:
//! its controller drains the shard (a *hand-over*), then the giver writes the taker's token into
//! the shard's Lease. With one shard, a live leader stays the leader: a joining replica never
//! takes leadership from it. A member takes or is given shards only once its membership Lease
//! says it may hold some (`workqueue-kube/held`, written by its first renewal after joining
//! that it could read back within the renew deadline, a retry period later), so replicas
//! started together see each other before they take shards, and a replica too slow to believe
//! anything is given nothing. A member that has not said so within the renew deadline and a
//! retry period of joining is no target either: the free shards it would get go to others.
//!
//! **Fencing.** A replica whose membership record another replica saw unchanged for its lease
//! duration is fenced: the observer writes its membership Lease vacant, conditional on the
//! latest resourceVersion it saw, naming the fenced token as the Lease's
//! `workqueue-kube/previous-holder`. A record is its holder and its counter (which every write
//! of the protocol raises): a third party's label or annotation makes a new resourceVersion but
//! keeps nobody alive (client-go also compares the record, not the version). An observer judges
//! a record by the longest of its own lease duration, the duration the record carries and the
//! longest it saw its holder write: a third party that lowers `leaseDurationSeconds` cannot make
//! anyone judge the holder dead sooner. A member whose record carries another duration than the
//! observer's is reported ([`RunnerError::LeaseTimingMismatch`](crate::controller::RunnerError::LeaseTimingMismatch)):
//! replicas may run different durations (a rollout that changes them) safely, each judged by
//! the duration it writes, but a third party that lowers the duration of a replica with longer
//! durations than an observer's before that observer ever saw the true one is not caught. Give
//! every replica the same durations. Every shard naming a fenced token is free. A replica that
//! finds its own membership Lease changed by another (fenced, deleted, taken over) has lost
//! every shard; it joins again under a new token ([`OnLoss::Rejoin`]) or stops
//! ([`OnLoss::Stop`]).
//!
//! **Leaving.** On shutdown a replica marks its membership Lease leaving (no shard is given to
//! it any more), hands every shard over, and vacates its membership Lease. Members' Leases left
//! vacant are deleted a lease duration later, and shard Leases beyond the number of shards
//! (after a configuration with more) once nobody may hold them.
//!
//! **Identities.** Give each process its own identity (the pod's name; never a shared default).
//! Two processes given one identity are still two holders (their instances differ): the second
//! waits for the first's membership Lease to expire, holds nothing meanwhile, and reports the
//! collision (an error event, and the metric [`IDENTITY_COLLISIONS_TOTAL`](crate::controller::IDENTITY_COLLISIONS_TOTAL)).
//! A process restarted under its identity takes its membership Lease over once it has expired
//! (a lease duration after it first saw it), or at once if its predecessor vacated it.
//!
//! # Why someone makes progress, within what bound
//!
//! A replica that renews but cannot believe (its reads fail, or come back later than the renew
//! deadline) would keep its shards from everyone while running none of their work. So:
//!
//! - a stale watch is replaced (see *Reading*): a replica whose watch stalls for good lives on
//!   a new list about every two retry periods, believing throughout, at one membership write
//!   per retry period;
//! - a replica whose membership records say it may hold shards *steps down* when a renewal the
//!   API server stored has not let it believe by the later of the renew deadline after the
//!   renewal's start and two retry periods after its answer (or its read-back): it stops
//!   renewing, reports it
//!   ([`RunnerError::LeaseSteppedDown`](crate::controller::RunnerError::LeaseSteppedDown)), is
//!   fenced by another a lease duration after its last renewal, and joins again under a new
//!   token once it reads the fence (or two lease durations after its last write, if it never
//!   does and nobody fences it).
//!
//! Hence, while another replica can read and write, the shards of a replica whose reads fail
//! or lag past the renew deadline are believed by another within **lease duration + renew
//! deadline + 3 retry periods** of the fault (31 s with the defaults), plus the round trip of
//! the slow replica's last renewal. A dead replica's shards (whatever third parties write to
//! its Leases' labels and annotations) are taken within the lease duration and two retry
//! periods of its last renewal. A replica too slow to believe is given no shard while it stays
//! that slow.
//!
//! # Why no two replicas ever believe they hold one shard at once
//!
//! A replica *believes* it holds a shard exactly while (1) its view (its watch) shows the shard's
//! Lease naming its token, (2) it is before its *deadline*: the start of its latest membership
//! renewal that its view has shown, plus the renew deadline, by its own clock, and (3) it is not
//! giving the shard away. The controller takes a shard's keys and runs its work only while it
//! believes so: no reconcile of a shard is polled past the deadline (the runner asks before
//! every poll), a lost shard's reconciles waiting are dropped within
//! `(lease_duration - renew_deadline) / 2` of it, and a reconcile whose code is still under way
//! at 5/8 of that slack (its runtime's thread blocked) ends the process, all inside the slack
//! step 3 leaves before another replica may take the shard.
//!
//! It assumes: (A1) the API server orders the writes to one Lease (etcd), refuses a write whose
//! resourceVersion precondition is stale, makes no new resourceVersion for a write that
//! changes nothing, delivers one watch's events in resourceVersion order, and serves lists
//! consistently; (A2) with `r` the largest ratio of two replicas' clock rates,
//! `renew_deadline * r < lease_duration` (with the defaults, 10 s and 15 s: any `r` under 1.5;
//! offsets do not matter). A replica judges time by tokio's clock, which reads the monotonic
//! clock (`CLOCK_MONOTONIC` on Linux): it does not advance while the machine is suspended (a
//! laptop asleep, a VM paused by its host), so a replica on a suspended machine is a clock
//! rate of zero, outside A2: after the resume it may believe for up to the renew deadline in
//! shards that moved while it slept. A process stopped by a signal or a pause of its own
//! (SIGSTOP, a debugger, a long GC) is inside A2: its clock runs on; (A3) nobody but the
//! protocol writes a Lease's holder or the protocol's annotations (deleting the Leases is
//! safe, see step 7; labels, other annotations and `leaseDurationSeconds` may be written by
//! anyone; editing a holder or the counter by hand is not safe).
//!
//! 1. *A shard's Lease names one token at a time* (A1), and a replica's belief needs its view to
//!    show its token there; a view shows the writes in the order they were made (A1), so a
//!    belief starts only after the write naming the believer.
//! 2. *Every write that takes a shard's Lease from a token `t` is one of three.* (a) `t`'s own
//!    process gives it: it stopped believing (condition 3) before it sent the write. (b)
//!    Another replica takes it because `t` is dead (step 3) or the Lease is vacant (written so by
//!    (a), or a fenced holder's). (c) The Lease vanished and another creates it (step 7). Each is
//!    conditional on the version its writer saw, so it succeeds only if nobody wrote in between
//!    (A1).
//! 3. *A fence ends every belief of the fenced token first.* Say `q` fences `t`'s membership Lease
//!    under resourceVersion `v`, having seen `t`'s record (holder and counter `c`) unchanged for
//!    the lease duration since it first saw it, `v` its latest version. The write of `t` that
//!    made counter `c` was stored before `q` first saw it, so it started before; no later write
//!    of `t` was stored before `v`, as it would have raised the counter (A3), nor after, as each
//!    is conditional on the version it read and the fence changed it. `t`'s deadline
//!    is therefore at most that write's start plus the renew deadline, and by A2 it passes before
//!    `q`'s lease duration does: at least `lease_duration / (1 + e) - renew_deadline / (1 - e)`
//!    before the fence, for clock rates within `1 ± e` (4.7 s with the defaults and 1%).
//! 4. *A token dies once.* After a loss a process joins under a new token; a token that has not
//!    joined within a lease duration of its first joining write is given up (one of its writes
//!    may have been stored and fenced unseen), so no record ever names a fenced token again.
//!    Every replica that sees a membership Lease name a token as its `previous-holder`, or
//!    replaced by another without that proof (deleted, or written over by hand), counts that
//!    token dead only after a lease duration more.
//! 5. *A renewal extends nothing unless it made a new resourceVersion*: the deadline moves only
//!    when the view shows the Lease carrying that renewal's counter, which a write that changed
//!    nothing (or failed) never does. An answer alone extends nothing.
//! 6. *Latency and loss only shorten beliefs*: a renewal answered late extends the belief from
//!    its start, and only if the watch showed it; a partitioned replica's deadline passes while
//!    the others wait a lease duration (step 3).
//! 7. *A vanished Lease is remembered.* A holder's belief in a shard is extended only by a
//!    renewal its view shows after the shard's Lease naming it, in resourceVersion order: once
//!    the Lease is deleted, later renewals extend nothing for it, so the belief ends within the
//!    renew deadline of a renewal stored before the delete. Other replicas take the shard only a
//!    lease duration after they saw it vanish (or, never having seen it, after their first list
//!    without it), or once its last holder is dead: as in step 3. A vanished membership Lease
//!    makes its holder's renewals fail, and its token is dead a lease duration after it
//!    vanished. The one exception is a first deployment: when a replica's very first list holds
//!    no shard Lease naming a holder and no membership Lease saying it may hold shards, nobody
//!    holds a shard (a member says so before it takes or is given one), and it counts the
//!    missing shard Leases as never created, free at once. So deleting every Lease of a running
//!    controller (or every shard Lease and the members' `held` marks) just as a replica starts
//!    can let that replica overlap one that ran until then, by at most the renew deadline.
//!
//! So beliefs of one shard never overlap, and an involuntary loss leaves the slack of step 3
//! (all of `lease_duration - renew_deadline`, less the clock rates' effect) between one holder's
//! deadline and the next holder's first belief, for a process stalled between its deadline and
//! the abort of its work. A hand-over leaves none: the giver's work has stopped before it writes.
//!
//! **What the deadline fences, and what not.** Work that stops by the deadline cannot overlap
//! another replica's on the same shard. A reconcile that writes after a pause it did not
//! notice (a stalled process) may still write after its shard moved: a write conditional on
//! the resourceVersion it read is refused if the new holder wrote since; a patch, a
//! server-side apply or a create is not. A reconcile reads its shard's deadline with
//! [`deadline`] (before a long computation or a write, to skip what would not finish in time);
//! one that must not write after its shard moved makes its writes conditional on the
//! resourceVersion it read. A network also delivers late: a write sent before the deadline
//! can be stored after it (a partition that heals delivers what was in flight), and only its
//! precondition fences it then.
//!
//! **Hand-overs and caches.** The taker reconciles a taken shard's objects from its own cache,
//! which may not yet show the giver's last writes. The protocol does not wait for it: a single
//! replica's cache lags its own writes in the same way, and reconciles already must read-modify-
//! write with resourceVersion preconditions (a stale read is refused with 409 and retried).
//!
//! # The controller's side
//!
//! [`Controller::leases`](crate::controller::Controller::leases) runs the protocol as a task and
//! follows what this replica holds. It takes a key of a shard only while the shard is held, not
//! being handed over, and before the deadline. A shard just taken (a new holding) has its
//! objects enqueued at the default priority, as changes are: behind the keys ready at the
//! takeover, ahead of everything queued after it and of initial lists. With `W` workers,
//! reconciles of at most `d` and `R` keys ready when `n` objects are taken, each is reconciled
//! within `(1 + ceil((R + n) / W)) * d` of the takeover, however busy the replica is with
//! requeues. No reconcile of a shard is polled past its deadline (the runner asks before
//! each poll, so a process frozen past it and thawed stops them at once), and a lost shard's
//! waiting reconciles are dropped by a task of the controller's own, whatever polls its stream.
//! A reconcile whose code is still under way past the deadline (its runtime's thread blocked)
//! ends the process before another replica may take the shard ([`OnLoss`]). For a hand-over
//! the controller stops taking the shard's keys, lets its work finish or aborts it by the
//! hand-over's deadline
//! ([`LeaseConfig::hand_over_timeout`]), and acknowledges; the shard is given away only then, and
//! kept (held, its keys not taken) while no acknowledgement comes.
//!
//! # Cost
//!
//! Each replica writes its membership Lease once per retry period (0.5 writes/s with the
//! defaults, whatever the number of shards) and keeps one watch; shard Leases are written only
//! when shards move. The number of shards trades balance against the size of a move: a replica
//! holds at most `ceil(shards / replicas)`.
//!
//! # Tracing
//!
//! The protocol's events (joined, acquired, handing over, gave away, lost, membership lost,
//! collision, another configuration alive) are `tracing` events inside the span
//! `lease_protocol` with the fields `controller` and `identity`. With the `metrics` feature the
//! controller reports the shards held ([`SHARDS_HELD`](crate::controller::SHARDS_HELD), and
//! [`LEADER`](crate::controller::LEADER) with one shard), the hand-overs
//! ([`HAND_OVERS_TOTAL`](crate::controller::HAND_OVERS_TOTAL)) and the identity collisions
//! ([`IDENTITY_COLLISIONS_TOTAL`](crate::controller::IDENTITY_COLLISIONS_TOTAL)), each labelled `controller`.

mod assignment;
mod clock;
mod config;
mod driver;
mod failures;
mod fence;
mod names;
mod protocol;
mod shard;
mod state;
#[cfg(test)]
mod tests;
mod wire;

pub(crate) use assignment::{Assignment, HandOver, ShardChange, acknowledge_all};
#[cfg(test)]
pub(crate) use assignment::{Holding, ShardState};
pub use clock::{LeaseClock, LocalInstant, SkewedClock, TokioClock};
pub use config::{ConfigError, EXIT_LOST, EXIT_UNSTOPPABLE, LeaseConfig, OnLoss};
pub(crate) use driver::Ended;
pub(crate) use failures::Report;
pub use fence::deadline;
pub(crate) use fence::scope;
pub(crate) use protocol::ShardLeases;
pub use shard::shard_of;

/// The label on every Lease of the protocol whose value is the controller's name.
const LABEL_CONTROLLER: &str = "workqueue-kube/controller";
/// The label on every Lease of the protocol that says what it guards: [`ROLE_SHARD`] or
/// [`ROLE_MEMBER`].
const LABEL_ROLE: &str = "workqueue-kube/lease-role";
/// [`LABEL_ROLE`] of a shard's Lease.
const ROLE_SHARD: &str = "shard";
/// [`LABEL_ROLE`] of a replica's membership Lease.
const ROLE_MEMBER: &str = "member";
/// The annotation on every Lease of the protocol with its writer's number of shards: no shard is
/// taken or moved while a replica that may be alive has another number (during a rollout that
/// changes it, until the last replica of the old number is gone).
const ANNOTATION_SHARDS: &str = "workqueue-kube/shards";
