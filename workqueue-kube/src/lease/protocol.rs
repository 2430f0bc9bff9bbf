//! The protocol task: one loop that renews, lists, takes, hands over and releases, every retry
//! period, with every request in flight at once and none blocking the others.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::ObjectMeta;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until, timeout, timeout_at};
use tracing::Instrument;

use super::assignment::{
    Assignment, HandOver, HandOverReason, Holding, LeaseStats, ShardEvents, ShardState,
};
use super::client::{Created, Deleted, LeaseClient, LeaseError, Replaced};
use super::clock::{LeaseClock, LocalInstant, TokioClock};
use super::config::{ConfigError, LeaseConfig, OnLoss};
use super::membership::{Observations, holder, plan, preference};
use super::{ANNOTATION_SHARDS, LABEL_CONTROLLER, LABEL_ROLE, ROLE_MEMBER, ROLE_SHARD};

/// Why [`ShardLeases::run`] ended. Either way every shard was handed over and released or has
/// lapsed, and the membership Lease is deleted (or could not be).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The shutdown future completed.
    Shutdown,
    /// A shard was lost and the configuration says [`OnLoss::Stop`].
    Lost {
        /// The first shard lost.
        shard: u32,
    },
}

/// One replica's side of the Lease protocol: holds a fair share of the shards' Leases and
/// tells the controller what it holds (see the [module documentation](crate::lease)).
///
/// ```no_run
/// # async fn example(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use workqueue_kube::lease::{LeaseConfig, ShardLeases, acknowledge_all};
///
/// let config = LeaseConfig::new("widgets", "widgets-system", "widgets-7d9f-x2x4q");
/// let (leases, events) = ShardLeases::new(client, config)?;
/// tokio::spawn(acknowledge_all(events.hand_overs)); // a controller with nothing to drain
/// let mut assignment = events.assignment;
/// tokio::spawn(async move {
///     while assignment.changed().await.is_ok() {
///         let held: Vec<u32> = assignment.borrow().held().map(|(shard, _)| shard).collect();
///         println!("holding {held:?}");
///     }
/// });
/// leases.run(async { tokio::signal::ctrl_c().await.unwrap() }).await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ShardLeases {
    config: Arc<LeaseConfig>,
    api: LeaseClient,
    clock: Arc<dyn LeaseClock>,
    assignment: watch::Sender<Assignment>,
    hand_overs: mpsc::UnboundedSender<HandOver>,
}

impl ShardLeases {
    /// The protocol for one replica, on `client`, with tokio's clock; and the controller's side
    /// of it. Nothing happens until [`ShardLeases::run`].
    pub fn new(
        client: kube::Client,
        config: LeaseConfig,
    ) -> Result<(Self, ShardEvents), ConfigError> {
        config.validate()?;
        let (assignment, assignment_rx) = watch::channel(Assignment::empty(config.shards));
        let (hand_overs, hand_overs_rx) = mpsc::unbounded_channel();
        let leases = ShardLeases {
            api: LeaseClient::new(client, &config.namespace),
            config: Arc::new(config),
            clock: Arc::new(TokioClock::new()),
            assignment,
            hand_overs,
        };
        let events = ShardEvents {
            assignment: assignment_rx,
            hand_overs: hand_overs_rx,
        };
        Ok((leases, events))
    }

    /// Judges time by `clock` instead of tokio's.
    pub fn with_clock(mut self, clock: impl LeaseClock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Another receiver of the [`Assignment`].
    pub fn assignment(&self) -> watch::Receiver<Assignment> {
        self.assignment.subscribe()
    }

    /// Runs the protocol until `shutdown` completes (or, with [`OnLoss::Stop`], until a loss),
    /// then leaves: deletes the membership Lease, hands every shard over and releases each one
    /// the controller acknowledged, and waits for the others to lapse.
    ///
    /// API errors are not fatal: a failed request is logged and retried the next retry period,
    /// and a shard not renewed within the renew deadline is lost. Dropping the future stops at
    /// once, releasing nothing (the Leases expire).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Ended {
        let span = tracing::info_span!(
            "lease_protocol",
            controller = %self.config.name,
            identity = %self.config.identity,
        );
        Run::new(self).main(shutdown).instrument(span).await
    }
}

/// One lease request's answer when it is a write.
enum Written {
    Stored(Box<Lease>),
    /// 409 (`Conflict` or `AlreadyExists`), or gone.
    Refused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Take,
    Renew,
    Release,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Shard(u32),
    Member,
}

/// A finished operation.
enum Done {
    Listed {
        result: Result<Vec<Lease>, LeaseError>,
        at: LocalInstant,
    },
    Wrote {
        target: Target,
        kind: Kind,
        started: LocalInstant,
        result: Result<Written, LeaseError>,
    },
    Read {
        shard: u32,
        result: Result<Option<Box<Lease>>, LeaseError>,
    },
    Acked {
        shard: u32,
        epoch: u64,
        acked: bool,
    },
    MemberDeleted,
    Collected {
        name: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Held and renewed.
    Holding,
    /// A hand-over was requested; still renewed.
    HandingOver,
    /// The hand-over was not acknowledged: no longer renewed, lost at `valid_until`.
    Lapsing,
    /// Acknowledged: to release (published as not held).
    Releasing,
}

#[derive(Debug)]
struct Held {
    /// The record as this replica last wrote it: the resourceVersion of its next write.
    record: Lease,
    /// The start of the last successful write.
    renewed_at: LocalInstant,
    valid_until: Instant,
    epoch: u64,
    stage: Stage,
}

#[derive(Debug, Default)]
struct Slot {
    held: Option<Held>,
    /// A request on this shard's Lease is in flight (at most one at a time).
    busy: bool,
}

#[derive(Debug, Default)]
struct Member {
    record: Option<Lease>,
    renewed_at: Option<LocalInstant>,
    valid_until: Option<Instant>,
    /// Since when this replica's membership is valid without a gap.
    registered_at: Option<LocalInstant>,
    busy: bool,
    gone: bool,
}

/// The last list's Leases.
#[derive(Debug, Default)]
struct View {
    shards: Vec<Option<Lease>>,
    members: Vec<Lease>,
}

struct Run {
    config: Arc<LeaseConfig>,
    api: LeaseClient,
    clock: Arc<dyn LeaseClock>,
    tx: watch::Sender<Assignment>,
    hand_overs: mpsc::UnboundedSender<HandOver>,
    selector: String,
    shard_prefix: String,
    member_name: String,
    member_prefix: String,
    order: Vec<u32>,
    slots: Vec<Slot>,
    member: Member,
    observed: Observations,
    view: Option<View>,
    list_busy: bool,
    collecting: BTreeSet<String>,
    ops: FuturesUnordered<BoxFuture<'static, Done>>,
    next_epoch: u64,
    members: u32,
    stats: LeaseStats,
    leaving: Option<Ended>,
    warned_mismatch: bool,
}

impl Run {
    fn new(leases: ShardLeases) -> Run {
        let config = leases.config;
        Run {
            selector: format!("{LABEL_CONTROLLER}={}", config.name),
            shard_prefix: format!("{}-shard-", config.name),
            member_name: config.member_lease_name(&config.identity),
            member_prefix: format!("{}-member-", config.name),
            order: preference(&config.identity, config.shards),
            slots: (0..config.shards).map(|_| Slot::default()).collect(),
            member: Member::default(),
            observed: Observations::default(),
            view: None,
            list_busy: false,
            collecting: BTreeSet::new(),
            ops: FuturesUnordered::new(),
            next_epoch: 1,
            members: 0,
            stats: LeaseStats::default(),
            leaving: None,
            warned_mismatch: false,
            api: leases.api,
            clock: leases.clock,
            tx: leases.assignment,
            hand_overs: leases.hand_overs,
            config,
        }
    }

    async fn main(mut self, shutdown: impl Future<Output = ()>) -> Ended {
        let mut shutdown = pin!(shutdown);
        let mut shutdown_seen = false;
        let mut next_tick = self.clock.now();
        loop {
            if let Some(ended) = self.finished() {
                tracing::info!(?ended, "left");
                return ended;
            }
            let tick_at = self.clock.tokio_instant(next_tick);
            let wake_at = self.next_wake();
            tokio::select! {
                biased;
                () = &mut shutdown, if !shutdown_seen => {
                    shutdown_seen = true;
                    self.leave(Ended::Shutdown);
                }
                Some(done) = self.ops.next(), if !self.ops.is_empty() => self.on_done(done),
                () = sleep_until(wake_at.unwrap_or(tick_at)), if wake_at.is_some() => self.on_wake(),
                () = sleep_until(tick_at) => {
                    next_tick = (next_tick + self.config.retry_period).max(self.clock.now());
                    self.tick();
                }
            }
        }
    }

    // Time.

    fn valid_until(&self, started: LocalInstant) -> Instant {
        self.clock
            .tokio_instant(started + self.config.renew_deadline)
    }

    /// The next instant something happens besides a tick: a held shard's validity ends, or a
    /// Lease held by another replica expires (by this replica's observation).
    fn next_wake(&self) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        let mut at = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
        for slot in &self.slots {
            if let Some(held) = &slot.held {
                at(held.valid_until);
            }
        }
        if let (None, Some(view)) = (&self.leaving, &self.view) {
            let now = self.clock.now();
            let others = view.shards.iter().flatten().chain(&view.members);
            for lease in others.filter(|l| holder(l).is_some_and(|h| h != self.config.identity)) {
                if let Some(expiry) = self.observed.expiry(lease, self.config.lease_duration)
                    && expiry >= now
                {
                    // Expired is strictly after the expiry; tokio's timers fire on milliseconds.
                    at(self.clock.tokio_instant(expiry) + Duration::from_millis(1));
                }
            }
        }
        wake
    }

    fn member_valid(&self, now: Instant) -> bool {
        self.member.valid_until.is_some_and(|v| v > now)
    }

    // Events.

    fn tick(&mut self) {
        self.expire(Instant::now());
        if self.leaving.is_none() {
            if !self.list_busy {
                self.start_list();
            }
            if !self.member.busy {
                self.start_member_write();
            }
        }
        for shard in 0..self.config.shards {
            let slot = &self.slots[shard as usize];
            let renew = slot
                .held
                .as_ref()
                .is_some_and(|h| matches!(h.stage, Stage::Holding | Stage::HandingOver));
            if renew && !slot.busy {
                self.start_renew(shard);
            }
        }
    }

    fn on_wake(&mut self) {
        self.expire(Instant::now());
        let now = self.clock.now();
        self.rebalance(now);
        self.publish();
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Listed { result, at } => {
                self.list_busy = false;
                match result {
                    Ok(leases) => self.on_listed(leases, at),
                    Err(error) => tracing::warn!(%error, "listing the Leases failed"),
                }
            }
            Done::Wrote {
                target: Target::Shard(shard),
                kind,
                started,
                result,
            } => self.on_shard_written(shard, kind, started, result),
            Done::Wrote {
                target: Target::Member,
                started,
                result,
                ..
            } => self.on_member_written(started, result),
            Done::Read { shard, result } => self.on_read(shard, result),
            Done::Acked {
                shard,
                epoch,
                acked,
            } => self.on_acked(shard, epoch, acked),
            Done::MemberDeleted => {
                self.member.busy = false;
                self.member.gone = true;
                self.member.record = None;
                self.member.valid_until = None;
            }
            Done::Collected { name } => {
                self.collecting.remove(&name);
            }
        }
        // Publishes, with no holding whose validity has passed.
        self.expire(Instant::now());
    }

    /// Ends the holdings whose validity passed.
    fn expire(&mut self, now: Instant) {
        for shard in 0..self.config.shards {
            let Some(held) = &self.slots[shard as usize].held else {
                continue;
            };
            if held.valid_until > now {
                continue;
            }
            match held.stage {
                Stage::Holding | Stage::HandingOver => {
                    self.lose(shard, "not renewed within the renew deadline");
                }
                Stage::Lapsing => {
                    tracing::info!(shard, "lapsed after an unacknowledged hand-over");
                    self.slots[shard as usize].held = None;
                }
                Stage::Releasing => self.slots[shard as usize].held = None,
            }
        }
        self.publish();
    }

    fn lose(&mut self, shard: u32, why: &str) {
        self.slots[shard as usize].held = None;
        self.stats.losses += 1;
        tracing::warn!(shard, why, "lost a shard");
        if self.config.on_loss == OnLoss::Stop {
            self.leave(Ended::Lost { shard });
        }
    }

    fn on_listed(&mut self, leases: Vec<Lease>, at: LocalInstant) {
        self.observed.observe(&leases, at);
        let mut view = View {
            shards: vec![None; self.config.shards as usize],
            members: Vec::new(),
        };
        for lease in leases {
            let Some(name) = lease.metadata.name.as_deref() else {
                continue;
            };
            if let Some(index) = name.strip_prefix(&self.shard_prefix) {
                // Shards beyond the count (from an earlier configuration) are ignored.
                if let Ok(shard) = index.parse::<u32>()
                    && shard < self.config.shards
                {
                    view.shards[shard as usize] = Some(lease);
                }
            } else if name.starts_with(&self.member_prefix) {
                view.members.push(lease);
            }
        }
        if self.member.record.is_none() && !self.member.busy && self.leaving.is_none() {
            // Ours exists (an earlier process's, or a create whose answer was lost): renew it.
            let mine = view
                .members
                .iter()
                .find(|l| l.metadata.name.as_deref() == Some(&self.member_name));
            self.member.record = mine.cloned();
        }
        self.view = Some(view);
        self.collect(at);
        self.rebalance(at);
    }

    /// Deletes the membership Leases of replicas gone for a while (expired for a lease duration
    /// more), under the version observed, so that crashed replicas do not leave them forever.
    fn collect(&mut self, now: LocalInstant) {
        let (Some(view), None) = (&self.view, &self.leaving) else {
            return;
        };
        let d = self.config.lease_duration;
        let mut doomed = Vec::new();
        for lease in &view.members {
            let (Some(name), Some(rv)) = (&lease.metadata.name, &lease.metadata.resource_version)
            else {
                continue;
            };
            let gone = self.observed.expiry(lease, d).is_some_and(|e| now > e + d);
            if *name != self.member_name && gone && !self.collecting.contains(name) {
                doomed.push((name.clone(), rv.clone()));
            }
        }
        for (name, rv) in doomed {
            self.collecting.insert(name.clone());
            let (api, limit) = (self.api.clone(), self.config.retry_period);
            self.ops.push(Box::pin(async move {
                match timeout(limit, api.delete(&name, &rv)).await {
                    Ok(Ok(Deleted::Deleted)) => tracing::info!(lease = %name, "deleted the membership Lease of a replica gone"),
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => tracing::debug!(lease = %name, %error, "could not delete a stale membership Lease"),
                    Err(_) => {}
                }
                Done::Collected { name }
            }));
        }
    }

    /// Takes and gives shards toward a fair share, by the last list and this replica's
    /// observations at `now`.
    fn rebalance(&mut self, now: LocalInstant) {
        if self.leaving.is_some() || !self.member_valid(Instant::now()) {
            return;
        }
        // A replica that just joined waits for its next list (half a retry period at least), so
        // that replicas started together see each other before they take shards.
        if self
            .member
            .registered_at
            .is_none_or(|r| now < r + self.config.retry_period / 2)
        {
            return;
        }
        let Some(view) = &self.view else {
            return;
        };
        let me = self.config.identity.as_str();
        let d = self.config.lease_duration;
        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
        let mine = self
            .slots
            .iter()
            .filter(|s| s.held.as_ref().is_some_and(|h| h.stage == Stage::Holding))
            .count();
        counts.insert(me.to_string(), mine as u32);
        let mut mismatch = None;
        for lease in &view.members {
            let Some(id) = holder(lease) else {
                continue;
            };
            if id == me || self.observed.expired(lease, d, now) {
                continue;
            }
            let theirs = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_SHARDS));
            if let Some(theirs) = theirs
                && *theirs != self.config.shards.to_string()
            {
                mismatch = Some((id.to_string(), theirs.clone()));
            }
            counts.insert(id.to_string(), 0);
        }
        if let Some((other, theirs)) = mismatch {
            if !self.warned_mismatch {
                tracing::error!(
                    other,
                    theirs,
                    ours = self.config.shards,
                    "a live replica uses another number of shards: taking no shard until it is gone"
                );
                self.warned_mismatch = true;
            }
            return;
        }
        self.warned_mismatch = false;
        // Takeable shards, this replica's own records first (after an outage each replica takes
        // its own back rather than another's), then free ones, then expired ones.
        let (mut own, mut unheld, mut expired) = (Vec::new(), Vec::new(), Vec::new());
        let mut free = 0;
        for &shard in &self.order {
            let slot = &self.slots[shard as usize];
            if slot.held.is_some() {
                continue;
            }
            let record = view.shards[shard as usize].as_ref();
            let list = match record.and_then(holder) {
                None => {
                    free += 1;
                    &mut unheld
                }
                // A record naming this replica that it does not hold: a write whose answer was
                // lost, or a holding lost and not taken since. Taking it back under its version
                // proves nobody wrote in between.
                Some(h) if h == me => &mut own,
                Some(h) => {
                    if record.is_some_and(|r| self.observed.expired(r, d, now)) {
                        free += 1;
                        &mut expired
                    } else {
                        if let Some(count) = counts.get_mut(h) {
                            *count += 1;
                        }
                        continue;
                    }
                }
            };
            if !slot.busy {
                list.push(shard);
            }
        }
        let takeable: Vec<u32> = own.into_iter().chain(unheld).chain(expired).collect();
        self.members = counts.len() as u32;
        let plan = plan(self.config.shards, me, &counts, free, takeable.len() as u32);
        let takes: Vec<(u32, Option<Lease>)> = takeable
            .iter()
            .take(plan.take as usize)
            .map(|&shard| (shard, view.shards[shard as usize].clone()))
            .collect();
        for (shard, base) in takes {
            self.start_take(shard, base);
        }
        let giving: Vec<u32> = self
            .order
            .iter()
            .rev()
            .copied()
            .filter(|&s| {
                self.slots[s as usize]
                    .held
                    .as_ref()
                    .is_some_and(|h| h.stage == Stage::Holding)
            })
            .take(plan.give as usize)
            .collect();
        for shard in giving {
            self.hand_over(shard, HandOverReason::Rebalance);
        }
    }

    fn hand_over(&mut self, shard: u32, reason: HandOverReason) {
        let Some(held) = self.slots[shard as usize].held.as_mut() else {
            return;
        };
        held.stage = Stage::HandingOver;
        let epoch = held.epoch;
        let deadline = Instant::now() + self.config.hand_over_timeout;
        let (ack, acked) = oneshot::channel();
        let request = HandOver {
            shard,
            epoch,
            deadline,
            reason,
            ack,
        };
        tracing::info!(shard, ?reason, "handing over");
        if self.hand_overs.send(request).is_err() {
            tracing::warn!(
                shard,
                "nobody receives hand-overs: the shard's Lease will lapse"
            );
        }
        self.ops.push(Box::pin(async move {
            let acked = matches!(timeout_at(deadline, acked).await, Ok(Ok(())));
            Done::Acked {
                shard,
                epoch,
                acked,
            }
        }));
        self.publish();
    }

    fn on_acked(&mut self, shard: u32, epoch: u64, acked: bool) {
        let slot = &mut self.slots[shard as usize];
        let Some(held) = slot.held.as_mut() else {
            return;
        };
        if held.epoch != epoch || held.stage != Stage::HandingOver {
            return;
        }
        if acked {
            held.stage = Stage::Releasing;
            self.stats.hand_overs += 1;
            tracing::info!(shard, "the controller acknowledged the hand-over");
            self.release_if_due(shard);
        } else {
            held.stage = Stage::Lapsing;
            self.stats.hand_over_timeouts += 1;
            tracing::warn!(
                shard,
                "the controller did not acknowledge the hand-over in time: the shard's Lease lapses instead"
            );
        }
    }

    fn leave(&mut self, ended: Ended) {
        if self.leaving.is_some() {
            return;
        }
        self.leaving = Some(ended);
        tracing::info!(?ended, "leaving");
        // Leave the membership first, so that the others count one replica less and take the
        // shards as they are released.
        if !self.member.busy {
            self.start_member_delete();
        }
        for shard in 0..self.config.shards {
            let holding = self.slots[shard as usize]
                .held
                .as_ref()
                .is_some_and(|h| h.stage == Stage::Holding);
            if holding {
                self.hand_over(shard, HandOverReason::Shutdown);
            }
        }
    }

    fn finished(&self) -> Option<Ended> {
        let ended = self.leaving?;
        let idle =
            self.slots.iter().all(|s| s.held.is_none()) && self.member.gone && !self.member.busy;
        idle.then_some(ended)
    }

    // Requests.

    fn start_list(&mut self) {
        self.list_busy = true;
        let (api, clock, limit) = (
            self.api.clone(),
            self.clock.clone(),
            self.config.retry_period,
        );
        let selector = self.selector.clone();
        self.ops.push(Box::pin(async move {
            let result = match timeout(limit, api.list(&selector)).await {
                Ok(result) => result,
                Err(_) => Err(LeaseError::TimedOut(limit)),
            };
            // Read after the answer: no earlier than any write it reflects.
            Done::Listed {
                result,
                at: clock.now(),
            }
        }));
    }

    /// Sends a write; its start is read before it leaves.
    fn start_write(&mut self, target: Target, kind: Kind, lease: Lease, create: bool) {
        let (api, limit) = (self.api.clone(), self.config.retry_period);
        let started = self.clock.now();
        self.ops.push(Box::pin(async move {
            let write = async {
                if create {
                    Ok(match api.create(&lease).await? {
                        Created::Created(stored) => Written::Stored(stored),
                        Created::Exists => Written::Refused,
                    })
                } else {
                    Ok(match api.replace(&lease).await? {
                        Replaced::Replaced(stored) => Written::Stored(stored),
                        Replaced::Conflict => Written::Refused,
                    })
                }
            };
            let result = match timeout(limit, write).await {
                Ok(result) => result,
                Err(_) => Err(LeaseError::TimedOut(limit)),
            };
            Done::Wrote {
                target,
                kind,
                started,
                result,
            }
        }));
    }

    /// A record of shard `shard` held by `holder`, written over `base`.
    fn shard_record(&self, shard: u32, base: Option<&Lease>, holder: Option<&str>) -> Lease {
        let wall = MicroTime(self.clock.wall());
        let mut lease = base.cloned().unwrap_or_default();
        let meta = &mut lease.metadata;
        meta.name = Some(self.config.shard_lease_name(shard));
        meta.namespace = Some(self.config.namespace.clone());
        let labels = meta.labels.get_or_insert_with(Default::default);
        labels.insert(LABEL_CONTROLLER.into(), self.config.name.clone());
        labels.insert(LABEL_ROLE.into(), ROLE_SHARD.into());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let previous = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
        if holder.is_some() && previous != holder {
            spec.acquire_time = Some(wall.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = holder.map(str::to_string);
        spec.lease_duration_seconds = Some(self.config.lease_duration_seconds());
        spec.renew_time = Some(wall);
        lease
    }

    fn start_take(&mut self, shard: u32, base: Option<Lease>) {
        self.slots[shard as usize].busy = true;
        let lease = self.shard_record(shard, base.as_ref(), Some(&self.config.identity));
        self.start_write(Target::Shard(shard), Kind::Take, lease, base.is_none());
    }

    fn start_renew(&mut self, shard: u32) {
        let slot = &self.slots[shard as usize];
        let Some(held) = &slot.held else {
            return;
        };
        let lease = self.shard_record(shard, Some(&held.record), Some(&self.config.identity));
        self.slots[shard as usize].busy = true;
        self.start_write(Target::Shard(shard), Kind::Renew, lease, false);
    }

    fn start_release(&mut self, shard: u32) {
        let slot = &self.slots[shard as usize];
        let Some(held) = &slot.held else {
            return;
        };
        let lease = self.shard_record(shard, Some(&held.record), None);
        self.slots[shard as usize].busy = true;
        self.start_write(Target::Shard(shard), Kind::Release, lease, false);
    }

    fn start_read(&mut self, shard: u32) {
        self.slots[shard as usize].busy = true;
        let (api, limit) = (self.api.clone(), self.config.retry_period);
        let name = self.config.shard_lease_name(shard);
        self.ops.push(Box::pin(async move {
            let result = match timeout(limit, api.get(&name)).await {
                Ok(result) => result.map(|found| found.map(Box::new)),
                Err(_) => Err(LeaseError::TimedOut(limit)),
            };
            Done::Read { shard, result }
        }));
    }

    fn start_member_write(&mut self) {
        let wall = MicroTime(self.clock.wall());
        let base = self.member.record.clone();
        let create = base.is_none();
        let mut lease = base.unwrap_or_default();
        let meta = &mut lease.metadata;
        if create {
            *meta = ObjectMeta::default();
        }
        meta.name = Some(self.member_name.clone());
        meta.namespace = Some(self.config.namespace.clone());
        let labels = meta.labels.get_or_insert_with(Default::default);
        labels.insert(LABEL_CONTROLLER.into(), self.config.name.clone());
        labels.insert(LABEL_ROLE.into(), ROLE_MEMBER.into());
        let annotations = meta.annotations.get_or_insert_with(Default::default);
        annotations.insert(ANNOTATION_SHARDS.into(), self.config.shards.to_string());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(&self.config.identity) {
            spec.holder_identity = Some(self.config.identity.clone());
            spec.acquire_time = Some(wall.clone());
        }
        spec.lease_duration_seconds = Some(self.config.lease_duration_seconds());
        spec.renew_time = Some(wall);
        self.member.busy = true;
        self.start_write(Target::Member, Kind::Renew, lease, create);
    }

    fn start_member_delete(&mut self) {
        let Some(rv) = self
            .member
            .record
            .as_ref()
            .and_then(|r| r.metadata.resource_version.clone())
        else {
            self.member.gone = true;
            return;
        };
        self.member.busy = true;
        let (api, limit, name) = (
            self.api.clone(),
            self.config.retry_period,
            self.member_name.clone(),
        );
        self.ops.push(Box::pin(async move {
            match timeout(limit, api.delete(&name, &rv)).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::warn!(%error, "could not delete the membership Lease: it expires instead"),
                Err(_) => tracing::warn!("no answer to deleting the membership Lease: it expires instead"),
            }
            Done::MemberDeleted
        }));
    }

    // Answers.

    /// A write of this replica as the holder of `shard` succeeded while it did not hold it
    /// (a take, or a renewal that landed after the holding ended).
    fn adopt(&mut self, shard: u32, record: Lease, started: LocalInstant) {
        let valid_until = self.valid_until(started);
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let leaving = self.leaving.is_some();
        self.slots[shard as usize].held = Some(Held {
            record,
            renewed_at: started,
            valid_until,
            epoch,
            // The controller never saw this holding when leaving: release it at once.
            stage: if leaving {
                Stage::Releasing
            } else {
                Stage::Holding
            },
        });
        if leaving {
            self.start_release(shard);
        } else {
            self.stats.acquisitions += 1;
            tracing::info!(shard, epoch, "acquired a shard");
        }
    }

    fn on_shard_written(
        &mut self,
        shard: u32,
        kind: Kind,
        started: LocalInstant,
        result: Result<Written, LeaseError>,
    ) {
        let index = shard as usize;
        self.slots[index].busy = false;
        let held = self.slots[index].held.is_some();
        match (kind, result) {
            (Kind::Take, Ok(Written::Stored(record))) => {
                if !held {
                    self.adopt(shard, *record, started);
                }
            }
            (Kind::Take, Ok(Written::Refused)) => {
                tracing::debug!(shard, "another replica took the shard first")
            }
            (Kind::Take, Err(error)) => tracing::debug!(shard, %error, "taking the shard failed"),
            (Kind::Renew, Ok(Written::Stored(record))) => {
                let valid_until = self.valid_until(started);
                match self.slots[index].held.as_mut() {
                    Some(held) => {
                        held.record = *record;
                        if started > held.renewed_at {
                            held.renewed_at = started;
                            held.valid_until = valid_until;
                        }
                    }
                    None => self.adopt(shard, *record, started),
                }
            }
            (Kind::Renew, Ok(Written::Refused)) => {
                if held {
                    // Changed since this replica's last write: its version is stale (a write
                    // whose answer was lost) or another replica took the shard. Read it.
                    self.start_read(shard);
                }
            }
            (Kind::Renew, Err(error)) => {
                self.stats.renew_failures += 1;
                tracing::warn!(shard, %error, "renewing the shard's Lease failed");
            }
            (Kind::Release, result) => {
                let slot = &mut self.slots[index];
                if slot
                    .held
                    .as_ref()
                    .is_some_and(|h| h.stage == Stage::Releasing)
                {
                    slot.held = None;
                }
                match result {
                    Ok(Written::Stored(_)) => {
                        self.stats.releases += 1;
                        tracing::info!(shard, "released the shard");
                    }
                    Ok(Written::Refused) => tracing::warn!(
                        shard,
                        "the shard's Lease changed before its release: it lapses instead"
                    ),
                    Err(error) => {
                        tracing::warn!(shard, %error, "releasing the shard failed: its Lease lapses instead")
                    }
                }
            }
        }
        self.release_if_due(shard);
    }

    /// Starts an acknowledged shard's release once no other request on it is in flight.
    fn release_if_due(&mut self, shard: u32) {
        let slot = &self.slots[shard as usize];
        if !slot.busy
            && slot
                .held
                .as_ref()
                .is_some_and(|h| h.stage == Stage::Releasing)
        {
            self.start_release(shard);
        }
    }

    fn on_read(&mut self, shard: u32, result: Result<Option<Box<Lease>>, LeaseError>) {
        self.slots[shard as usize].busy = false;
        let me = self.config.identity.as_str();
        match result {
            Ok(Some(record)) if holder(&record) == Some(me) => {
                if let Some(held) = self.slots[shard as usize].held.as_mut() {
                    held.record = *record;
                }
            }
            Ok(record) => {
                if self.slots[shard as usize].held.is_some() {
                    let other = record.as_deref().and_then(holder).map(str::to_string);
                    tracing::error!(
                        shard,
                        holder = ?other,
                        "the shard's Lease changed hands while this replica held it: clock rates or identities break the protocol's assumptions"
                    );
                    self.lose(shard, "taken by another replica");
                }
            }
            Err(error) => tracing::warn!(shard, %error, "reading the shard's Lease failed"),
        }
        self.release_if_due(shard);
    }

    fn on_member_written(&mut self, started: LocalInstant, result: Result<Written, LeaseError>) {
        self.member.busy = false;
        match result {
            Ok(Written::Stored(record)) => {
                if !self.member_valid(Instant::now()) {
                    self.member.registered_at = Some(started);
                    tracing::info!("joined");
                }
                self.member.record = Some(*record);
                if self.member.renewed_at.is_none_or(|r| started > r) {
                    self.member.renewed_at = Some(started);
                    self.member.valid_until = Some(self.valid_until(started));
                }
            }
            // It exists already, or changed: the next list gives its version.
            Ok(Written::Refused) => self.member.record = None,
            Err(error) => tracing::warn!(%error, "renewing the membership Lease failed"),
        }
        if self.leaving.is_some() {
            self.start_member_delete();
        }
    }

    fn publish(&mut self) {
        let shards: Arc<[ShardState]> = self
            .slots
            .iter()
            .map(|slot| match &slot.held {
                None => ShardState::NotHeld,
                Some(held) => {
                    let holding = Holding {
                        valid_until: held.valid_until,
                        epoch: held.epoch,
                    };
                    match held.stage {
                        Stage::Holding => ShardState::Held(holding),
                        Stage::HandingOver | Stage::Lapsing => ShardState::GivingUp(holding),
                        Stage::Releasing => ShardState::NotHeld,
                    }
                }
            })
            .collect();
        let next = Assignment {
            shards,
            members: self.members,
            stats: self.stats,
        };
        self.tx.send_if_modified(|current| {
            if *current == next {
                return false;
            }
            *current = next;
            true
        });
    }
}
