//! A controller's side of the Lease protocol ([`crate::lease`]): which keys it may take, what it
//! does when it takes a shard, and how it stops a shard's work when it loses or gives it up.
//!
//! The rule for keys is the assignment's ([`owns`]): a key belongs here while its shard is held,
//! not being handed over, and before its `valid_until`. The runner applies it at the sources, when
//! it leases a key, and when a reconcile ends (a key of a shard no longer held is finished
//! without a re-add: another replica runs it now). The rule for running reconciles
//! ([`may_run`]) is asked before every poll of one: its shard held or being handed over, and
//! before its `valid_until`; past it the reconcile is dropped unpolled, as an abort drops it, so
//! that a process frozen past its deadline and thawed polls none of its shard's reconciles
//! again, whenever the watchdog gets to run.
//!
//! The rest is the [`Watchdog`], a task of its own, so that nothing it does waits for the
//! application to poll the controller's stream:
//! - a shard taken has its objects enqueued (another replica may have dropped their events), from
//!   the store when it holds a complete list, else once the list under way completed (the keys
//!   of that list that came before the shard was taken were not taken), at
//!   the default priority 0, as changes are ([`TAKEN_PRIORITY`]): the failover already delayed
//!   them by a lease duration or more, so they go behind the keys ready at the takeover and ahead
//!   of every key queued after it (requeues included) and of initial lists and resyncs
//!   (`LOW_PRIORITY`). With `W` workers, reconciles that take at most `d` and `R` keys ready (of
//!   any priority) when `n` objects are taken, each of them is reconciled within
//!   `(1 + ceil((R + n) / W)) * d` of the takeover, however busy the replica is with requeues.
//!   (At `LOW_PRIORITY`, where they were before, steady requeues kept them waiting until aging,
//!   `Config::max_ready_wait`, 60 s.) Their re-adds keep priority 0, as a change's do;
//! - a shard lost (its `valid_until` passed without a renewal, or the protocol says so) or handed
//!   over has its queued keys dropped, and its reconciles still running are aborted (their
//!   futures dropped: a `Controller`'s reconcile has no token to watch) at the latest `margin`
//!   after `valid_until` (a lost shard: the time the protocol leaves before another replica may
//!   take it), or shortly before the hand-over's deadline;
//! - a hand-over is acknowledged only once nothing of the shard runs;
//! - a protocol that ends on a lost Lease (`OnLoss::Stop`) shuts the controller down; with
//!   `OnLoss::Exit` a lost shard ends the process.
//!
//! Neither the rule nor the watchdog can stop a reconcile whose poll does not return (it
//! computes without awaiting, and its runtime runs nothing else): for that, the lease guard
//! (`super::guard`), a thread of its own, ends the process before another replica may take the
//! shard.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, OptionFuture};
use futures_util::stream::{FuturesUnordered, StreamExt};
use kube::Client;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workqueue_tokio::runner::Aborts;
use workqueue_tokio::{AddOptions, WorkQueue};

use super::divided::Listed;
use super::error::RunnerError;
use super::guard::{LeaseGuard, ShardPolls};
use super::reports::Reports;
use crate::lease::{
    Assignment, EXIT_LOST, Ended, HandOver, LeaseClock, LeaseConfig, OnLoss, Report, ShardChange,
    ShardLeases, shard_of,
};

/// The priority a taken shard's objects are queued at: a change's (see the module docs for the
/// bound it gives). Not above it: a re-add keeps the priority its key was handed out at, so a
/// taken object that requeues would stay ahead of every change for the rest of its life.
const TAKEN_PRIORITY: i32 = 0;

/// How long before a hand-over's deadline the shard's remaining reconciles are aborted, so that
/// the acknowledgement reaches the protocol in time.
const ACK_MARGIN: Duration = Duration::from_millis(500);

/// A controller's Lease protocol, ready to start.
pub(super) struct Leases {
    protocol: ShardLeases,
    assignment: watch::Receiver<Assignment>,
    hand_overs: mpsc::UnboundedReceiver<HandOver>,
    /// How long a lost shard's reconciles may run after its `valid_until`.
    margin: Duration,
    /// `lease_duration - renew_deadline`: how long after a loss another replica may take the
    /// shard (the guard's bound).
    slack: Duration,
    on_loss: OnLoss,
    /// The reconciles' polls under way, per shard (for the guard).
    polls: Arc<ShardPolls>,
    /// With divided caches, the shards whose list the store holds: a key is taken only once
    /// its shard is listed (`None`: the store holds every shard's objects).
    listed: Option<watch::Receiver<Listed>>,
}

impl Leases {
    /// The Lease protocol of a controller, on `client`, or why it cannot run.
    pub(super) fn new<QE: Send + 'static>(
        client: Option<Client>,
        config: LeaseConfig,
        clock: Option<Arc<dyn LeaseClock>>,
        reports: Reports<QE>,
    ) -> Result<Self, RunnerError> {
        let client = client.ok_or(RunnerError::LeasesNeedAClient)?;
        // Within the time the protocol leaves between a loss and another replica's take, less
        // the clock-rate slack it assumes.
        let slack = config.lease_duration.saturating_sub(config.renew_deadline);
        let margin = slack / 2;
        let (on_loss, polls) = (config.on_loss, ShardPolls::new(config.shards));
        let (protocol, events) = ShardLeases::new(client, config).map_err(RunnerError::Leases)?;
        let protocol = match clock {
            Some(clock) => protocol.with_clock(SharedClock(clock)),
            None => protocol,
        };
        // A failed Lease request goes on the controller's stream (each verb once, until it works
        // again): a missing permission must not look like a replica that holds nothing.
        let protocol = protocol.with_reports(Arc::new(move |report: Report| {
            reports.send(match report {
                Report::Failed(failed) => RunnerError::LeaseRequestFailed {
                    verb: failed.verb,
                    lease: failed.lease,
                    message: failed.message,
                },
                Report::WatchStale { selector } => RunnerError::LeaseWatchStale { selector },
                Report::SteppedDown => RunnerError::LeaseSteppedDown,
                Report::Timing {
                    holder,
                    duration,
                    ours,
                } => RunnerError::LeaseTimingMismatch {
                    holder,
                    lease_duration: duration,
                    ours,
                },
            });
        }));
        Ok(Leases {
            protocol,
            assignment: events.assignment,
            hand_overs: events.hand_overs,
            margin,
            slack,
            on_loss,
            polls,
            listed: None,
        })
    }

    /// Divides the cache by the shards held (`super::divided`): the assignment the main watch
    /// follows, and where it publishes the shards its store holds the list of, which from now
    /// on a key's shard must be among to be taken.
    pub(super) fn divide(&mut self) -> (watch::Receiver<Assignment>, watch::Sender<Listed>) {
        let (listed, reader) = watch::channel(Listed::new());
        self.listed = Some(reader);
        (self.assignment.clone(), listed)
    }

    /// What each reconcile runs in: the scope [`lease::deadline`](crate::lease::deadline)
    /// answers in, and the count of its polls under way that the guard reads.
    pub(super) fn scope<K: Resource>(&self) -> ReconcileScope<K> {
        ReconcileScope {
            assignment: self.assignment.clone(),
            polls: self.polls.clone(),
            _key: std::marker::PhantomData,
        }
    }

    /// The rule for the runner: whether a key's shard is held now (and, with divided caches,
    /// listed).
    pub(super) fn owns<K: Resource>(
        &self,
    ) -> impl Fn(&ObjectRef<K>) -> bool + Send + Sync + use<K> {
        let (assignment, listed) = (self.assignment.clone(), self.listed.clone());
        move |key| owns(&assignment.borrow(), listed.as_ref(), key)
    }

    /// The rule for running reconciles, asked before each of their polls: whether a key's
    /// shard is still held (or being handed over) and before its `valid_until`. Past it a
    /// reconcile is not polled again, whether or not the watchdog has run since (a process
    /// frozen past its deadline and thawed stops at the next poll).
    pub(super) fn may_run<K: Resource>(
        &self,
    ) -> impl Fn(&ObjectRef<K>) -> bool + Send + Sync + use<K> {
        let assignment = self.assignment.clone();
        move |key| may_run(&assignment.borrow(), key)
    }

    /// The watchdog over this protocol (which it starts), for a controller whose reconciles
    /// `aborts` stops, whose keys `queue` holds and whose objects `store` holds (complete while
    /// `gate` reads `true`). `shutdown` is
    /// the controller's graceful shutdown: the protocol hands every shard over once it is
    /// cancelled, and cancels it itself when it ends on a lost Lease.
    pub(super) fn watchdog<K>(
        self,
        aborts: Aborts<ObjectRef<K>>,
        queue: WorkQueue<ObjectRef<K>>,
        store: Store<K>,
        gate: watch::Receiver<bool>,
        dyntype: K::DynamicType,
        shutdown: CancellationToken,
    ) -> Watchdog<K>
    where
        K: Resource + Clone + Send + Sync + 'static,
        K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
    {
        let protocol = tokio::spawn(self.protocol.run(shutdown.clone().cancelled_owned()));
        let guard = LeaseGuard::start(
            self.polls.clone(),
            self.assignment.clone(),
            self.slack,
            tokio::runtime::Handle::current(),
        );
        let metrics = ShardMetrics::new(queue.name().unwrap_or("unnamed"));
        let seen = self.assignment.borrow().clone();
        metrics.emit(&seen);
        let listed_seen = self.listed.as_ref().map(|l| l.borrow().clone());
        Watchdog {
            assignment: self.assignment,
            seen,
            listed: self.listed,
            listed_seen,
            gate,
            taken_while_listing: BTreeSet::new(),
            hand_overs: Some(self.hand_overs),
            stopping: HashMap::new(),
            settling: FuturesUnordered::new(),
            margin: self.margin,
            aborts,
            queue,
            store,
            dyntype,
            metrics,
            protocol: Some(protocol),
            shutdown,
            on_loss: self.on_loss,
            _guard: guard,
        }
    }
}

/// What each reconcile of a controller on Leases runs in (see [`Leases::scope`]).
pub(super) struct ReconcileScope<K> {
    assignment: watch::Receiver<Assignment>,
    polls: Arc<ShardPolls>,
    _key: std::marker::PhantomData<fn(&K)>,
}

impl<K: Resource> ReconcileScope<K> {
    /// `reconcile`, of `key`, in the scope `lease::deadline` reads, each of its polls counted
    /// as under way for the guard.
    pub(super) fn wrap<F: std::future::Future>(
        &self,
        key: &ObjectRef<K>,
        reconcile: F,
    ) -> impl std::future::Future<Output = F::Output> + use<F, K> {
        let shard = key_shard(key, self.assignment.borrow().shard_count());
        super::guard::counted(
            self.polls.clone(),
            shard,
            crate::lease::scope(self.assignment.clone(), shard, reconcile),
        )
    }
}

/// The shard of `key` among `shards` (at least one): the one rule the source filter, the
/// watchdog and `lease::deadline` share.
fn key_shard<K: Resource>(key: &ObjectRef<K>, shards: u32) -> u32 {
    shard_of(key.namespace.as_deref(), &key.name, shards.max(1))
}

/// Whether `key`'s shard is held and valid now, by `assignment`, and its objects are in the
/// store (always without divided caches; else when `listed` names it).
fn owns<K: Resource>(
    assignment: &Assignment,
    listed: Option<&watch::Receiver<Listed>>,
    key: &ObjectRef<K>,
) -> bool {
    let shard = key_shard(key, assignment.shard_count());
    assignment.accepts(shard, Instant::now()) && is_listed(listed, shard)
}

/// Whether the store holds `shard`'s objects: always without divided caches (`listed` is
/// `None`); else when `listed` names it.
fn is_listed(listed: Option<&watch::Receiver<Listed>>, shard: u32) -> bool {
    listed.is_none_or(|listed| listed.borrow().contains(&shard))
}

/// Whether a running reconcile of `key` may be polled now, by `assignment`: its shard held or
/// being given up (a hand-over lets work finish until its own deadline, which the watchdog
/// enforces) and before its `valid_until`.
fn may_run<K: Resource>(assignment: &Assignment, key: &ObjectRef<K>) -> bool {
    assignment
        .state(key_shard(key, assignment.shard_count()))
        .holding()
        .is_some_and(|holding| holding.valid_at(Instant::now()))
}

/// A shard whose work is stopping.
#[derive(Debug)]
struct Stopping {
    /// When its reconciles still running are aborted (`None`: they were).
    abort_at: Option<Instant>,
    /// The hand-over to acknowledge once nothing of the shard runs (none for a lost shard).
    hand_over: Option<HandOver>,
}

/// What the protocol told the watchdog.
enum Event {
    Changed,
    /// The shards listed changed (`None`: they no longer change).
    Listed(Option<()>),
    /// The gate changed.
    Gate,
    HandOver(HandOver),
    HandOversClosed,
    Deadline,
    /// Nothing of this shard runs any more.
    Settled(u32),
    ProtocolEnded(Option<Ended>),
    /// The controller's run is over.
    Finish,
}

/// The task that keeps a controller's work within the shards it holds (see the module docs).
pub(super) struct Watchdog<K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash,
{
    assignment: watch::Receiver<Assignment>,
    /// The assignment as last handled (for its changes).
    seen: Assignment,
    /// With divided caches, the shards whose list the store holds (`Leases::divide`), and
    /// those as last handled (a shard is enqueued once it is both held and listed).
    listed: Option<watch::Receiver<Listed>>,
    listed_seen: Option<Listed>,
    /// Whether the store holds a complete list (the main watch's gate: closed while a list is
    /// under way).
    gate: watch::Receiver<bool>,
    /// The shards taken while a list was under way: the keys of that list's objects that came
    /// before were not taken (their shard was not held), and the store does not hold them yet,
    /// so their objects are enqueued once the gate opens.
    taken_while_listing: BTreeSet<u32>,
    hand_overs: Option<mpsc::UnboundedReceiver<HandOver>>,
    stopping: HashMap<u32, Stopping>,
    /// For each hand-over waiting for its shard's reconciles: completes with the shard when none
    /// runs.
    settling: FuturesUnordered<BoxFuture<'static, u32>>,
    margin: Duration,
    aborts: Aborts<ObjectRef<K>>,
    queue: WorkQueue<ObjectRef<K>>,
    store: Store<K>,
    dyntype: K::DynamicType,
    metrics: ShardMetrics,
    protocol: Option<JoinHandle<Ended>>,
    shutdown: CancellationToken,
    on_loss: OnLoss,
    /// The lease guard's thread, stopped when the watchdog is dropped (its run is over).
    _guard: Option<LeaseGuard>,
}

impl<K> Watchdog<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    /// Runs until `finish` completes (the controller's run is over), then has the protocol
    /// leave (a run that ended by itself, its watches gone, was not shut down) and acknowledges
    /// every hand-over until the protocol ends (it releases the Leases acknowledged: a fast
    /// failover). Dropping it (a forced stop) aborts the protocol: the Leases lapse.
    pub(super) async fn run(mut self, finish: oneshot::Receiver<()>) {
        let mut finish = std::pin::pin!(finish);
        loop {
            match self.next_event(finish.as_mut()).await {
                Event::Changed => self.on_assignment(),
                Event::Listed(Some(())) => self.on_listed(),
                Event::Listed(None) => self.listed_seen = None,
                Event::Gate => self.on_gate(),
                Event::HandOver(hand_over) => self.on_hand_over(hand_over),
                Event::HandOversClosed => self.hand_overs = None,
                Event::Deadline => self.on_time(),
                Event::Settled(shard) => self.on_settled(shard),
                Event::ProtocolEnded(ended) => self.on_protocol_ended(ended),
                Event::Finish => break,
            }
        }
        self.shutdown.cancel();
        self.acknowledge_until_the_protocol_ends().await;
    }

    async fn next_event(&mut self, finish: std::pin::Pin<&mut oneshot::Receiver<()>>) -> Event {
        let deadline = self.next_deadline();
        let Watchdog {
            assignment,
            listed,
            listed_seen,
            gate,
            taken_while_listing,
            hand_overs,
            settling,
            protocol,
            ..
        } = self;
        // Watched until its sender is gone (`listed_seen` is then `None`).
        let listed = listed.as_mut().filter(|_| listed_seen.is_some());
        tokio::select! {
            biased;
            _ = finish => Event::Finish,
            // Once the protocol is gone, its assignment no longer changes.
            Ok(()) = assignment.changed() => Event::Changed,
            Some(changed) = OptionFuture::from(listed.map(|l| l.changed())) => {
                Event::Listed(changed.ok())
            }
            Ok(()) = gate.changed(), if !taken_while_listing.is_empty() => Event::Gate,
            Some(hand_over) = OptionFuture::from(hand_overs.as_mut().map(|rx| rx.recv())) => {
                match hand_over {
                    Some(hand_over) => Event::HandOver(hand_over),
                    None => Event::HandOversClosed,
                }
            }
            Some(shard) = settling.next(), if !settling.is_empty() => Event::Settled(shard),
            Some(()) = OptionFuture::from(deadline.map(tokio::time::sleep_until)) => Event::Deadline,
            ended = joined(protocol) => Event::ProtocolEnded(ended),
        }
    }

    /// The shard of `key`.
    fn shard_of(&self, key: &ObjectRef<K>) -> u32 {
        key_shard(key, self.seen.shard_count())
    }

    /// A predicate on the keys of `shard`.
    fn keys_of(&self, shard: u32) -> impl Fn(&ObjectRef<K>) -> bool + Send + 'static + use<K> {
        let count = self.seen.shard_count();
        move |key: &ObjectRef<K>| key_shard(key, count) == shard
    }

    /// The assignment changed: enqueues the objects of each shard taken, stops each shard that
    /// ended, and updates the metrics.
    fn on_assignment(&mut self) {
        let now = self.assignment.borrow_and_update().clone();
        let mut acquired = Vec::new();
        for change in now.changes_since(&self.seen) {
            match change {
                ShardChange::Acquired { shard, .. } => {
                    // A new holding: whatever still runs of an earlier one is aborted now (it
                    // cannot be acknowledged any more).
                    if self.stopping.remove(&shard).is_some() {
                        let aborted = self.aborts.abort(self.keys_of(shard));
                        if aborted > 0 {
                            tracing::warn!(
                                shard,
                                aborted,
                                "reconciles of an earlier holding of a shard taken again were aborted"
                            );
                        }
                    }
                    acquired.push(shard);
                }
                ShardChange::Ended { shard } => {
                    self.exit_on_loss(shard);
                    tracing::warn!(shard, "shard lost: its reconciles are aborted");
                    self.stop(shard, Instant::now(), None);
                }
            }
        }
        self.seen = now;
        if !*self.gate.borrow() {
            self.taken_while_listing.extend(acquired.iter().copied());
        }
        // With divided caches, a shard's objects are enqueued once it is listed too.
        acquired.retain(|shard| is_listed(self.listed.as_ref(), *shard));
        if !acquired.is_empty() {
            self.enqueue(&acquired);
        }
        self.metrics.emit(&self.seen);
        // A shard stopped above may be due for its abort now.
        self.on_time();
    }

    /// The shards listed changed (divided caches): enqueues the objects of each held shard
    /// just listed. Keys of a shard not yet listed were not taken (they did not belong), so
    /// this is where the shard's work starts.
    fn on_listed(&mut self) {
        let Some(listed) = &mut self.listed else {
            return;
        };
        let now = listed.borrow_and_update().clone();
        let before = self.listed_seen.replace(now.clone()).unwrap_or_default();
        let held: Vec<u32> = now
            .difference(&before)
            .copied()
            .filter(|&shard| self.seen.accepts(shard, Instant::now()))
            .collect();
        if !held.is_empty() {
            self.enqueue(&held);
        }
    }

    /// The gate changed: once it is open (a list completed), enqueues the objects of the shards
    /// taken while it was closed and still held.
    fn on_gate(&mut self) {
        if !*self.gate.borrow_and_update() {
            return;
        }
        let now = Instant::now();
        let taken: Vec<u32> = std::mem::take(&mut self.taken_while_listing)
            .into_iter()
            .filter(|&shard| {
                self.seen.accepts(shard, now) && is_listed(self.listed.as_ref(), shard)
            })
            .collect();
        if !taken.is_empty() {
            self.enqueue(&taken);
        }
    }

    /// Enqueues the objects of the shards just taken, at [`TAKEN_PRIORITY`].
    fn enqueue(&self, shards: &[u32]) {
        let keys: Vec<ObjectRef<K>> = self
            .store
            .state()
            .iter()
            .map(|object| ObjectRef::from_obj_with(&**object, self.dyntype.clone()))
            .filter(|key| shards.contains(&self.shard_of(key)))
            .collect();
        tracing::info!(shards = ?shards, objects = keys.len(), "shards taken");
        self.queue
            .add_batch_with(keys, AddOptions::new().priority(TAKEN_PRIORITY));
    }

    /// A hand-over began: the shard's work stops; it is acknowledged once none runs, and what
    /// still runs shortly before the deadline is aborted.
    fn on_hand_over(&mut self, hand_over: HandOver) {
        let shard = hand_over.shard();
        let abort_at = hand_over
            .deadline()
            .checked_sub(ACK_MARGIN)
            .unwrap_or_else(Instant::now);
        self.stop(shard, abort_at, Some(hand_over));
        let aborts = self.aborts.clone();
        let keys = self.keys_of(shard);
        self.settling.push(Box::pin(async move {
            aborts.stopped(keys).await;
            shard
        }));
        self.on_time();
    }

    /// Stops `shard`'s work: its queued keys are dropped (the runner takes none of them any
    /// more: they no longer belong here), its reconciles still running are aborted at
    /// `abort_at`.
    fn stop(&mut self, shard: u32, abort_at: Instant, hand_over: Option<HandOver>) {
        let stopping = self.stopping.entry(shard).or_insert(Stopping {
            abort_at: Some(abort_at),
            hand_over: None,
        });
        stopping.abort_at = stopping.abort_at.map(|at| at.min(abort_at));
        if hand_over.is_some() {
            stopping.hand_over = hand_over;
        }
        let keys = self.keys_of(shard);
        let dropped = self.queue.retain(|key| !keys(key));
        tracing::info!(shard, keys = dropped, "keys of a shard given up dropped");
    }

    /// Stops each held shard whose `valid_until` passed (lost by time: the protocol publishes it
    /// later), and aborts the reconciles of each stopping shard past its abort time.
    fn on_time(&mut self) {
        let now = Instant::now();
        let lost: Vec<(u32, Instant)> = self
            .seen
            .held()
            .filter(|(shard, _)| !self.stopping.contains_key(shard))
            .filter(|(_, holding)| !holding.valid_at(now))
            .map(|(shard, holding)| (shard, holding.valid_until()))
            .collect();
        for (shard, valid_until) in lost {
            self.exit_on_loss(shard);
            tracing::warn!(
                shard,
                "shard lost (not renewed in time): its reconciles are aborted"
            );
            self.stop(shard, valid_until + self.margin, None);
        }
        let due: Vec<u32> = self
            .stopping
            .iter()
            .filter(|(_, s)| s.abort_at.is_some_and(|at| at <= now))
            .map(|(shard, _)| *shard)
            .collect();
        for shard in due {
            let aborted = self.aborts.abort(self.keys_of(shard));
            if aborted > 0 {
                tracing::warn!(
                    shard,
                    aborted,
                    "reconciles of a shard given up were aborted"
                );
            }
            if let Some(stopping) = self.stopping.get_mut(&shard) {
                stopping.abort_at = None;
            }
        }
        // A lost shard whose reconciles were aborted has nothing left to wait for.
        self.stopping
            .retain(|_, s| s.abort_at.is_some() || s.hand_over.is_some());
    }

    /// With [`OnLoss::Exit`], ends the process: `shard` was lost.
    fn exit_on_loss(&self, shard: u32) {
        if self.on_loss == OnLoss::Exit {
            let message = format!(
                "workqueue-kube: shard {shard} was lost; the process exits with status \
                 {EXIT_LOST} (OnLoss::Exit)"
            );
            tracing::error!(shard, "{message}");
            eprintln!("{message}");
            std::process::exit(EXIT_LOST);
        }
    }

    /// Nothing of `shard` runs any more: its hand-over is acknowledged.
    fn on_settled(&mut self, shard: u32) {
        let Some(stopping) = self.stopping.get_mut(&shard) else {
            return;
        };
        if let Some(hand_over) = stopping.hand_over.take() {
            let reason = hand_over.reason();
            tracing::info!(shard, ?reason, "shard drained; hand-over acknowledged");
            hand_over.acknowledge();
        }
        self.stopping.remove(&shard);
    }

    /// The protocol ended by itself: with `OnLoss::Stop`, on a lost shard; the controller stops
    /// too, so that the process can exit.
    fn on_protocol_ended(&mut self, ended: Option<Ended>) {
        if let Some(Ended::Lost { shard }) = ended {
            tracing::warn!(?shard, "a Lease was lost: the controller shuts down");
            self.shutdown.cancel();
        }
    }

    /// The next deadline: the earliest `valid_until` of a shard held, or abort time of a
    /// stopping shard.
    fn next_deadline(&self) -> Option<Instant> {
        let valid = self
            .seen
            .held()
            .filter(|(shard, _)| !self.stopping.contains_key(shard))
            .map(|(_, holding)| holding.valid_until());
        let aborts = self.stopping.values().filter_map(|s| s.abort_at);
        valid.chain(aborts).min()
    }

    /// Nothing runs any more: every hand-over is acknowledged, and those that come until the
    /// protocol ends, so that it releases the Leases for a fast failover.
    async fn acknowledge_until_the_protocol_ends(&mut self) {
        for (_, stopping) in self.stopping.drain() {
            if let Some(hand_over) = stopping.hand_over {
                hand_over.acknowledge();
            }
        }
        let (Some(protocol), Some(hand_overs)) = (self.protocol.take(), self.hand_overs.take())
        else {
            return;
        };
        let acknowledge = crate::lease::acknowledge_all(hand_overs);
        tokio::select! {
            _ = protocol => {}
            () = acknowledge => {}
        }
    }
}

/// A dropped watchdog (a forced stop, a dropped stream) is a dead replica: its Lease protocol
/// stops too (its Leases lapse; nothing is released).
impl<K: Resource + 'static> Drop for Watchdog<K>
where
    K::DynamicType: Eq + std::hash::Hash,
{
    fn drop(&mut self) {
        if let Some(protocol) = self.protocol.take() {
            protocol.abort();
        }
    }
}

async fn joined(protocol: &mut Option<JoinHandle<Ended>>) -> Option<Ended> {
    match protocol {
        Some(handle) => {
            let ended = handle.await.ok();
            *protocol = None;
            ended
        }
        None => std::future::pending().await,
    }
}

/// An `Arc` of a clock, as a clock.
#[derive(Debug)]
struct SharedClock(Arc<dyn LeaseClock>);

impl LeaseClock for SharedClock {
    fn now(&self) -> crate::lease::LocalInstant {
        self.0.now()
    }
    fn tokio_instant(&self, local: crate::lease::LocalInstant) -> tokio::time::Instant {
        self.0.tokio_instant(local)
    }
    fn wall(&self) -> k8s_openapi::jiff::Timestamp {
        self.0.wall()
    }
}

/// Describes the Lease metrics to the recorder, once per process.
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        describe_gauge!(
            super::SHARDS_HELD,
            Unit::Count,
            "Shards this replica holds, per controller"
        );
        describe_gauge!(
            super::LEADER,
            "Whether this replica leads (1) or not (0), for a controller on one shard"
        );
        describe_counter!(
            super::HAND_OVERS_TOTAL,
            Unit::Count,
            "Shards this replica handed over to another, per controller"
        );
        describe_counter!(
            super::IDENTITY_COLLISIONS_TOTAL,
            Unit::Count,
            "Other processes found renewing this replica's membership Lease, per controller"
        );
    });
}

/// The shard-held metrics of a controller (with the `metrics` feature).
#[derive(Debug)]
struct ShardMetrics {
    #[cfg(feature = "metrics")]
    controller: Arc<str>,
}

impl ShardMetrics {
    fn new(controller: &str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = controller;
        #[cfg(feature = "metrics")]
        describe();
        ShardMetrics {
            #[cfg(feature = "metrics")]
            controller: Arc::from(controller),
        }
    }

    /// Emits the gauges and counters of `assignment`.
    fn emit(&self, assignment: &Assignment) {
        #[cfg(feature = "metrics")]
        {
            let controller = self.controller.to_string();
            let held = f64::from(assignment.held_count());
            metrics::gauge!(super::SHARDS_HELD, "controller" => controller.clone()).set(held);
            if assignment.shard_count() == 1 {
                metrics::gauge!(super::LEADER, "controller" => controller.clone()).set(held);
            }
            let stats = assignment.stats();
            metrics::counter!(super::HAND_OVERS_TOTAL, "controller" => controller.clone())
                .absolute(stats.hand_overs());
            metrics::counter!(super::IDENTITY_COLLISIONS_TOTAL, "controller" => controller)
                .absolute(stats.identity_collisions());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = assignment;
    }
}
