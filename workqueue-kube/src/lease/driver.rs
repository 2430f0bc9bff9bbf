//! The thin driver of the protocol's state machine: a watch of the controller's Leases, the
//! writes it asks for (each with its deadline), ticks at its wake-ups, and what it decides,
//! published to the controller. Every rule is the state machine's; this file only moves
//! events in and requests out, reading the clock as each event arrives.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, FuturesUnordered, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until, timeout_at};

use super::LABEL_CONTROLLER;
use super::assignment::{Assignment, HandOver, HandOverReason, Holding, LeaseStats, ShardState};
use super::clock::LeaseClock;
use super::config::Settings;
use super::failures::{Failures, Report, RequestFailed, Tell};
use super::names::{LeaseName, Names};
use super::state::{Answer, Decision, Ending, Op, Output, Reason, Record, ReplicaState, Request};
use super::wire::{from_lease, to_lease};

/// How long the watch waits after its first error before it tries again; the pause doubles with
/// each error in a row, up to the retry period, and starts again after an event.
const WATCH_RETRY: Duration = Duration::from_millis(500);

/// Why [`ShardLeases::run`](super::ShardLeases::run) ended. Either way nothing is held any more: every shard was handed
/// over, or its belief ended by time; the membership Lease was vacated, or expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The shutdown future completed.
    Shutdown,
    /// A shard (or the membership) was lost and the configuration says
    /// [`OnLoss::Stop`](super::OnLoss::Stop).
    Lost {
        /// The first shard lost; `None` when the membership was lost while no shard was
        /// believed.
        shard: Option<u32>,
    },
}

/// The answer to one request, by id, with its verb and, if it failed, what was said.
type Answered = (u64, Answer, &'static str, Option<(String, String)>);

pub(super) struct Driver {
    config: Settings,
    names: Names,
    api: Api<Lease>,
    clock: Arc<dyn LeaseClock>,
    state: ReplicaState,
    assignment: watch::Sender<Assignment>,
    hand_overs: mpsc::UnboundedSender<HandOver>,
    requests: FuturesUnordered<BoxFuture<'static, Answered>>,
    /// Hand-overs sent to the controller: each resolves (with its shard and whether it came
    /// after its deadline) when acknowledged or dropped.
    acks: FuturesUnordered<BoxFuture<'static, (u32, bool)>>,
    stats: LeaseStats,
    ended: Option<Ended>,
    first_lost: Option<u32>,
    failures: Failures,
    tell: Option<Tell>,
    /// The watch is to be replaced (the state machine found it stale).
    rewatch: bool,
    /// A stale watch was told and no watch delivered since: told once per episode.
    stale_told: bool,
}

/// A seed for the instance ids: random per process.
fn seed() -> u64 {
    RandomState::new().hash_one((SystemTime::now(), std::process::id()))
}

impl Driver {
    pub(super) fn new(
        config: Settings,
        api: Api<Lease>,
        clock: Arc<dyn LeaseClock>,
        assignment: watch::Sender<Assignment>,
        hand_overs: mpsc::UnboundedSender<HandOver>,
        tell: Option<Tell>,
    ) -> Driver {
        Driver {
            names: Names::new(config.name()),
            state: ReplicaState::new(config.clone(), seed()),
            config,
            api,
            clock,
            assignment,
            hand_overs,
            requests: FuturesUnordered::new(),
            acks: FuturesUnordered::new(),
            stats: LeaseStats::default(),
            ended: None,
            first_lost: None,
            failures: Failures::new(tell.clone()),
            tell,
            rewatch: false,
            stale_told: false,
        }
    }

    /// Runs until the state machine ends: after `shutdown` or a loss with `OnLoss::Stop`, once
    /// it has left or given up leaving.
    pub(super) async fn run(mut self, shutdown: impl Future<Output = ()>) -> Ended {
        let mut shutdown = pin!(shutdown);
        let mut shutdown_seen = false;
        let mut watch = self.watch();
        let mut watch_started = Instant::now();
        let mut listing: Option<Vec<(LeaseName, Record)>> = None;
        let mut watch_paused: Option<Instant> = None;
        let mut watch_retry = WATCH_RETRY;
        loop {
            self.flush();
            if let Some(ended) = self.ended {
                return ended;
            }
            // A stale watch: a new one, which lists first (a consistent read); a pause of the
            // old one's errors does not hold it back. Not while the list of a new one is under
            // way (it shows what the stale one did not), unless that list takes past the renew
            // deadline itself.
            let listing_now =
                listing.is_some() && watch_started.elapsed() < self.config.renew_deadline();
            if std::mem::take(&mut self.rewatch) && !listing_now {
                watch = self.watch();
                watch_started = Instant::now();
                listing = None;
                watch_paused = None;
            }
            let now = self.clock.now();
            // A millisecond late: tokio's timers fire on milliseconds, and the clock's
            // conversion rounds down; a tick before the wake-up would find nothing due.
            let wake = self
                .state
                .next_wake(now)
                .map(|t| self.clock.tokio_instant(t) + Duration::from_millis(1));
            tokio::select! {
                biased;
                () = &mut shutdown, if !shutdown_seen => {
                    shutdown_seen = true;
                    self.state.shut_down(self.clock.now());
                }
                Some((id, answer, verb, failed)) = self.requests.next(), if !self.requests.is_empty() => {
                    match failed {
                        None => self.failures.succeeded(verb),
                        Some(failure) => self.failures.failed(RequestFailed {
                            verb,
                            lease: failure.0,
                            message: failure.1,
                        }),
                    }
                    self.state.answered(id, answer, self.clock.now());
                }
                Some((shard, late)) = self.acks.next(), if !self.acks.is_empty() => {
                    self.stats.handed_over(late);
                    self.state.drained(shard, self.clock.now());
                }
                () = sleep_until(watch_paused.unwrap_or_else(Instant::now)), if watch_paused.is_some() => {
                    watch_paused = None;
                }
                event = watch.next(), if watch_paused.is_none() => match event {
                    Some(Ok(event)) => {
                        watch_retry = WATCH_RETRY;
                        self.on_watch(event, &mut listing);
                    }
                    Some(Err(error)) => {
                        let verb = match error {
                            watcher::Error::InitialListFailed(_) => "list",
                            _ => "watch",
                        };
                        self.failures.failed(RequestFailed {
                            verb,
                            lease: self.selector(),
                            message: error.to_string(),
                        });
                        watch_paused = Some(Instant::now() + watch_retry);
                        watch_retry = (watch_retry * 2).min(self.config.retry_period().max(WATCH_RETRY));
                    }
                    None => {
                        watch = self.watch();
                        watch_started = Instant::now();
                    }
                },
                () = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    self.state.tick(self.clock.now());
                }
            }
        }
    }

    /// The label selector of this controller's Leases.
    fn selector(&self) -> String {
        format!("{LABEL_CONTROLLER}={}", self.config.name())
    }

    fn watch(&self) -> BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>> {
        // A relist is a consistent read (the default): a view never goes back in time.
        let config = watcher::Config::default().labels(&self.selector());
        watcher(self.api.clone(), config).boxed()
    }

    fn on_watch(
        &mut self,
        event: watcher::Event<Lease>,
        listing: &mut Option<Vec<(LeaseName, Record)>>,
    ) {
        let duration = self.config.lease_duration();
        let read = |lease: &Lease| from_lease(&self.names, lease, duration);
        match event {
            watcher::Event::Init => *listing = Some(Vec::new()),
            watcher::Event::InitApply(lease) => {
                if let (Some(list), Some(record)) = (listing.as_mut(), read(&lease)) {
                    list.push(record);
                }
            }
            watcher::Event::InitDone => {
                self.failures.succeeded("list");
                let records = listing.take().unwrap_or_default();
                self.state.listed(records, self.clock.now());
            }
            watcher::Event::Apply(lease) => {
                self.failures.succeeded("watch");
                self.stale_told = false;
                if let Some((name, record)) = read(&lease) {
                    self.state.applied(name, record, self.clock.now());
                }
            }
            watcher::Event::Delete(lease) => {
                self.failures.succeeded("watch");
                self.stale_told = false;
                let name = lease
                    .metadata
                    .name
                    .as_deref()
                    .and_then(|n| self.names.parse(n));
                if let Some(name) = name {
                    self.state.deleted(name, self.clock.now());
                }
            }
        }
    }

    /// Performs what the state machine asked for, and publishes what this replica holds.
    fn flush(&mut self) {
        while let Some(output) = self.state.poll() {
            match output {
                Output::Request(request) => self.send(request),
                Output::Decision(decision) => self.decide(decision),
            }
        }
        self.publish();
    }

    fn send(&mut self, request: Request) {
        let api = self.api.clone();
        let name = self.names.name(&request.lease);
        let deadline = self.clock.tokio_instant(request.deadline);
        let body = match &request.op {
            Op::Create(content) => Some((None, content)),
            Op::Replace(rv, content) => Some((Some(rv), content)),
            Op::Delete(_) => None,
        }
        .map(|(rv, content)| {
            let wall = self.clock.wall();
            to_lease(
                &self.names,
                self.config.name(),
                self.config.namespace(),
                &request.lease,
                rv,
                content,
                wall,
            )
        });
        let (id, op) = (request.id, request.op);
        let verb = match op {
            Op::Create(_) => "create",
            Op::Replace(..) => "update",
            Op::Delete(_) => "delete",
        };
        let names = self.names.clone();
        let duration = self.config.lease_duration();
        self.requests.push(Box::pin(async move {
            let read = |lease: &Lease| from_lease(&names, lease, duration).map(|(_, r)| r);
            let write = perform(&api, &name, &op, body, read);
            let (answer, failed) = timeout_at(deadline, write).await.unwrap_or_else(|_| {
                let message = "no answer before the belief it would extend ended".to_string();
                (Answer::Unknown, Some(message))
            });
            (id, answer, verb, failed.map(|message| (name, message)))
        }));
    }

    fn decide(&mut self, decision: Decision) {
        match decision {
            Decision::Joined { token } => tracing::info!(%token, "joined"),
            Decision::Acquired { shard, epoch } => {
                self.stats.acquired();
                tracing::info!(shard, epoch, "acquired a shard");
            }
            Decision::HandOver {
                shard,
                epoch,
                reason,
                deadline,
            } => self.hand_over(shard, epoch, reason, self.clock.tokio_instant(deadline)),
            Decision::Released { shard, .. } => {
                self.stats.released();
                tracing::info!(shard, "gave the shard away");
            }
            Decision::Lost { shard, epoch } => {
                self.stats.lost();
                self.first_lost.get_or_insert(shard);
                tracing::warn!(shard, epoch, "lost a shard");
            }
            Decision::MembershipLost { token } => {
                tracing::warn!(%token, "the membership ended: its Lease was taken over, fenced or deleted");
            }
            Decision::Collision { other } => {
                tracing::error!(
                    %other,
                    "another process renews this replica's membership Lease: two processes were given one identity; this one takes nothing while the other lives"
                );
                self.stats.collided();
            }
            Decision::Mismatch {
                holder,
                shards,
                protocol,
            } => tracing::error!(
                %holder,
                ?shards,
                ?protocol,
                ours = self.config.shards(),
                "a replica that may be alive runs another number of shards or another protocol: no shard moves until it is gone"
            ),
            Decision::WatchStale => {
                self.rewatch = true;
                if !std::mem::replace(&mut self.stale_told, true) {
                    tracing::warn!(
                        "the Lease watch did not show a renewal the API server stored within the retry period: it is replaced by a new list and watch"
                    );
                    self.tell(Report::WatchStale {
                        selector: self.selector(),
                    });
                } else {
                    tracing::debug!("the Lease watch is stale again: a new list and watch");
                }
            }
            Decision::SteppedDown => {
                tracing::error!(
                    renew_deadline = ?self.config.renew_deadline(),
                    "renewals the API server stored were not read back within the renew deadline: this replica stopped renewing, so that another replica takes its shards over; it joins again once it reads its membership Lease"
                );
                self.tell(Report::SteppedDown);
            }
            Decision::Timing { holder, duration } => {
                let ours = self.config.lease_duration();
                tracing::warn!(
                    %holder,
                    ?duration,
                    ?ours,
                    "a member's Lease carries another lease duration: expiry is judged by the longer of the two"
                );
                self.tell(Report::Timing {
                    holder: holder.to_string(),
                    duration,
                    ours,
                });
            }
            Decision::GaveUp => {
                tracing::warn!("could not leave in time: the membership Lease expires instead");
            }
            Decision::Ended(ending) => self.ended = Some(self.ended_by(ending)),
        }
    }

    fn tell(&self, report: Report) {
        if let Some(tell) = &self.tell {
            tell(report);
        }
    }

    fn ended_by(&self, ending: Ending) -> Ended {
        match ending {
            Ending::Shutdown => Ended::Shutdown,
            Ending::Lost { shard } => Ended::Lost { shard: Some(shard) },
            Ending::LostMembership => Ended::Lost {
                shard: self.first_lost,
            },
        }
    }

    /// Asks the controller to drain `shard` by `deadline`; it is given away once the request is
    /// acknowledged or dropped (a dropped request: nothing of the shard runs), or at once when
    /// nobody receives hand-overs.
    fn hand_over(&mut self, shard: u32, epoch: u64, reason: Reason, deadline: Instant) {
        let reason = match reason {
            Reason::Rebalance => HandOverReason::Rebalance,
            Reason::Shutdown => HandOverReason::Shutdown,
        };
        let (request, acked) = HandOver::new(shard, deadline, reason);
        tracing::info!(shard, epoch, ?reason, "handing over");
        // The shard shows as taking no keys before the controller hears of the hand-over.
        self.publish();
        if self.hand_overs.send(request).is_err() {
            self.state.drained(shard, self.clock.now());
            return;
        }
        self.acks.push(Box::pin(async move {
            let _ = acked.await;
            (shard, Instant::now() > deadline)
        }));
    }

    fn publish(&mut self) {
        let now = self.clock.now();
        let deadline = self.state.deadline().map(|d| self.clock.tokio_instant(d));
        let shards: Arc<[ShardState]> = (0..self.config.shards())
            .map(|shard| {
                let (Some(epoch), Some(valid_until)) = (self.state.epoch(shard), deadline) else {
                    return ShardState::NotHeld;
                };
                let holding = Holding::new(valid_until, epoch);
                if self.state.accepts(shard, now) {
                    ShardState::Held(holding)
                } else if self.state.believes(shard, now) {
                    ShardState::GivingUp(holding)
                } else {
                    ShardState::NotHeld
                }
            })
            .collect();
        let next = Assignment::new(shards, self.state.members() as u32, self.stats);
        self.assignment.send_if_modified(|current| {
            if *current == next {
                return false;
            }
            *current = next;
            true
        });
    }
}

/// One write against the API server, as the state machine reads its answer.
async fn perform(
    api: &Api<Lease>,
    name: &str,
    op: &Op,
    body: Option<Lease>,
    read: impl Fn(&Lease) -> Option<Record>,
) -> (Answer, Option<String>) {
    let status = |e: &kube::Error| match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    };
    let result = match (op, body) {
        (Op::Create(_), Some(lease)) => api.create(&PostParams::default(), &lease).await.map(Some),
        (Op::Replace(..), Some(lease)) => api
            .replace(name, &PostParams::default(), &lease)
            .await
            .map(Some),
        (Op::Delete(rv), _) => {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(rv.as_str().to_string()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            api.delete(name, &params).await.map(|_| None)
        }
        _ => return (Answer::Unknown, None),
    };
    match result {
        Ok(stored) => (Answer::Done(stored.and_then(|lease| read(&lease))), None),
        Err(e) => match status(&e) {
            // Answers of the protocol's (the request was allowed and judged).
            Some(409) => (Answer::Conflict, None),
            Some(404) => (Answer::NotFound, None),
            _ => (Answer::Unknown, Some(e.to_string())),
        },
    }
}
