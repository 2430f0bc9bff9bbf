//! A controller's side of the Lease protocol ([`crate::lease`]): which keys it may take, what it
//! does when it takes a shard, and how it stops a shard's work when it loses or gives it up.
//!
//! Invariants (the protocol's contract, kept here):
//! - a key is taken only while its shard is accepted ([`Assignment::accepts`]: held, not being
//!   handed over, and before its `valid_until`), at the sources and again at dispatch;
//! - once a shard's `valid_until` passes without a renewal, or a hand-over of it begins, its
//!   queued keys are dropped, its in-flight reconciles are asked to stop (their contexts are
//!   cancelled) and are aborted at the latest `margin` after `valid_until` (a lost shard) or
//!   shortly before the hand-over's deadline; a hand-over is acknowledged only once nothing of
//!   the shard runs;
//! - a lease of a shard that is no longer held is finished without a re-add: the shard's keys
//!   are another replica's now.

use std::collections::HashMap;
#[cfg(feature = "metrics")]
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, Id};
use tokio::time::Instant;

use crate::lease::{Assignment, HandOver, ShardChange, shard_of};

/// How long before a hand-over's deadline the shard's remaining reconciles are aborted, so that
/// the acknowledgement reaches the protocol in time.
const ACK_MARGIN: Duration = Duration::from_millis(500);

/// A shard whose work is stopping.
#[derive(Debug)]
struct Stopping {
    /// When its reconciles still running are aborted.
    abort_at: Instant,
    /// The hand-over to acknowledge once nothing of the shard runs (none for a lost shard).
    hand_over: Option<HandOver>,
}

/// The dispatcher's view of the shards.
#[derive(Debug)]
pub(crate) struct Shards {
    assignment: watch::Receiver<Assignment>,
    /// The assignment as last handled (for its changes).
    seen: Assignment,
    hand_overs: Option<mpsc::UnboundedReceiver<HandOver>>,
    /// In-flight reconciles: their shard and their task. (A `Controller`'s reconcile sees no
    /// cancellation token: stopping one is aborting it.)
    tasks: HashMap<Id, (u32, AbortHandle)>,
    stopping: HashMap<u32, Stopping>,
    /// Shards whose keys are to be dropped from the queue (they stopped since the last call of
    /// [`Shards::take_dropped`]).
    to_drop: Vec<u32>,
    /// How long after a lost shard's `valid_until` its reconciles may run: within the time the
    /// protocol leaves before another replica can take it.
    margin: Duration,
}

/// What the protocol told the dispatcher.
#[derive(Debug)]
pub(crate) enum ShardEvent {
    Changed,
    HandOver(HandOver),
    HandOversClosed,
}

/// What the dispatcher must do after an assignment change.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// Shards just taken: enqueue their objects.
    pub(crate) acquired: Vec<u32>,
}

impl Shards {
    pub(crate) fn new(
        assignment: watch::Receiver<Assignment>,
        hand_overs: mpsc::UnboundedReceiver<HandOver>,
        margin: Duration,
    ) -> Self {
        let seen = assignment.borrow().clone();
        Shards {
            assignment,
            seen,
            hand_overs: Some(hand_overs),
            tasks: HashMap::new(),
            stopping: HashMap::new(),
            to_drop: Vec::new(),
            margin,
        }
    }

    /// The shard of `key`.
    pub(crate) fn shard<K: kube::Resource>(&self, key: &ObjectRef<K>) -> u32 {
        shard_of(
            key.namespace.as_deref(),
            &key.name,
            self.seen.shard_count().max(1),
        )
    }

    /// Whether a key of `shard` may be taken now.
    pub(crate) fn accepts(&self, shard: u32) -> bool {
        !self.stopping.contains_key(&shard)
            && self.assignment.borrow().accepts(shard, Instant::now())
    }

    /// Records a reconcile of `shard` started as the task `id`.
    pub(crate) fn started(&mut self, id: Id, shard: u32, task: AbortHandle) {
        self.tasks.insert(id, (shard, task));
    }

    /// Who owns which keys, for the reconciles' tasks.
    pub(crate) fn owner(&self) -> Owner {
        Owner(self.assignment.clone())
    }

    /// A task ended (finished or aborted): acknowledges its shard's hand-over if it was the last.
    pub(crate) fn ended(&mut self, id: Id) {
        if let Some((shard, _)) = self.tasks.remove(&id) {
            self.settle(shard);
        }
    }

    /// Acknowledges `shard`'s hand-over once none of its reconciles runs.
    fn settle(&mut self, shard: u32) {
        if self.tasks.values().any(|(s, _)| *s == shard) {
            return;
        }
        if let Some(stopping) = self.stopping.remove(&shard)
            && let Some(hand_over) = stopping.hand_over
        {
            tracing::info!(shard, "shard drained; hand-over acknowledged");
            hand_over.acknowledge();
        }
    }

    /// Stops `shard`'s work: no key of it is taken any more; its reconciles still running are
    /// aborted at `abort_at`.
    fn stop(&mut self, shard: u32, abort_at: Instant, hand_over: Option<HandOver>) {
        if !self.stopping.contains_key(&shard) {
            self.to_drop.push(shard);
        }
        let stopping = self.stopping.entry(shard).or_insert(Stopping {
            abort_at,
            hand_over: None,
        });
        stopping.abort_at = stopping.abort_at.min(abort_at);
        if hand_over.is_some() {
            stopping.hand_over = hand_over;
        }
        self.settle(shard);
    }

    /// Handles a changed assignment: what was taken (to enqueue) and what ended (to stop).
    pub(crate) fn on_change(&mut self) -> Changes {
        let now = self.assignment.borrow_and_update().clone();
        let mut changes = Changes::default();
        for change in now.changes_since(&self.seen) {
            match change {
                ShardChange::Acquired { shard, .. } => {
                    // A new holding: whatever was stopping of an earlier one has been aborted
                    // or is aborted now (it cannot be acknowledged any more).
                    if self.stopping.contains_key(&shard) {
                        self.abort(shard);
                        self.stopping.remove(&shard);
                    }
                    changes.acquired.push(shard);
                }
                ShardChange::Ended { shard } => {
                    let abort_at = Instant::now();
                    self.stop(shard, abort_at, None);
                }
                ShardChange::GivingUp { .. } => {}
            }
        }
        self.seen = now;
        changes
    }

    /// Begins a hand-over: the shard's work stops, and it is acknowledged once none runs.
    pub(crate) fn hand_over(&mut self, hand_over: HandOver) {
        let shard = hand_over.shard();
        let abort_at = hand_over
            .deadline()
            .checked_sub(ACK_MARGIN)
            .unwrap_or_else(Instant::now);
        self.stop(shard, abort_at, Some(hand_over));
    }

    /// The shards whose keys the queue must drop: those that stopped since the last call.
    pub(crate) fn take_dropped(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.to_drop)
    }

    /// The shards whose work must stop now: lost by time (their `valid_until` passed; the
    /// protocol publishes it later), or stopping past their abort time.
    pub(crate) fn on_time(&mut self) {
        let now = Instant::now();
        let assignment = self.assignment.borrow().clone();
        let mut shards: Vec<u32> = self.tasks.values().map(|(s, _)| *s).collect();
        shards.sort_unstable();
        shards.dedup();
        for shard in shards {
            if self.stopping.contains_key(&shard) {
                continue;
            }
            let valid_until = assignment.state(shard).holding().map(|h| h.valid_until);
            if valid_until.is_none_or(|v| v <= now) {
                let abort_at = valid_until.unwrap_or(now) + self.margin;
                tracing::warn!(shard, "shard lost: its reconciles are stopped");
                self.stop(shard, abort_at, None);
            }
        }
        let due: Vec<u32> = self
            .stopping
            .iter()
            .filter(|(_, s)| s.abort_at <= now)
            .map(|(shard, _)| *shard)
            .collect();
        for shard in due {
            self.abort(shard);
        }
    }

    /// Aborts the reconciles of `shard` still running.
    fn abort(&mut self, shard: u32) {
        for (s, task) in self.tasks.values() {
            if *s == shard {
                task.abort();
            }
        }
    }

    /// When [`Shards::on_time`] must run next: the earliest `valid_until` of a shard with work in
    /// flight, or abort time of a stopping shard.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let assignment = self.assignment.borrow();
        let valid = self
            .tasks
            .values()
            .filter(|(s, _)| !self.stopping.contains_key(s))
            .filter_map(|(s, _)| assignment.state(*s).holding().map(|h| h.valid_until));
        let aborts = self
            .stopping
            .iter()
            .filter(|(s, _)| self.tasks.values().any(|(t, _)| t == *s))
            .map(|(_, st)| st.abort_at);
        valid.chain(aborts).min()
    }

    /// The protocol's next news: a changed assignment or a hand-over request (never, once the
    /// protocol is gone).
    pub(crate) async fn next_event(&mut self) -> ShardEvent {
        let changed = async {
            if self.assignment.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let hand_over = async {
            match &mut self.hand_overs {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = changed => ShardEvent::Changed,
            hand_over = hand_over => match hand_over {
                Some(hand_over) => ShardEvent::HandOver(hand_over),
                None => ShardEvent::HandOversClosed,
            },
        }
    }

    /// The protocol dropped its side of the hand-overs.
    pub(crate) fn hand_overs_closed(&mut self) {
        self.hand_overs = None;
    }

    /// Acknowledges every hand-over still waiting, and those that come until the protocol ends
    /// (nothing runs any more: the controller is stopping).
    pub(crate) fn acknowledge_everything(&mut self) {
        for (_, stopping) in self.stopping.drain() {
            if let Some(hand_over) = stopping.hand_over {
                hand_over.acknowledge();
            }
        }
        if let Some(rx) = &mut self.hand_overs {
            while let Ok(hand_over) = rx.try_recv() {
                hand_over.acknowledge();
            }
        }
    }

    /// The receiver of hand-overs, for the wait at the end of a run.
    pub(crate) fn take_hand_overs(&mut self) -> Option<mpsc::UnboundedReceiver<HandOver>> {
        self.hand_overs.take()
    }

    /// The assignment now (for the metrics).
    pub(crate) fn assignment(&self) -> Assignment {
        self.assignment.borrow().clone()
    }
}

/// Which keys this replica owns now (a reconcile's task asks it as it finishes).
#[derive(Debug, Clone)]
pub(crate) struct Owner(watch::Receiver<Assignment>);

impl Owner {
    /// Whether `key`'s shard is held and valid now (a lease of a shard given up or lost is
    /// finished without a re-add).
    pub(crate) fn owns<K: kube::Resource>(&self, key: &ObjectRef<K>) -> bool {
        let assignment = self.0.borrow();
        let shard = shard_of(
            key.namespace.as_deref(),
            &key.name,
            assignment.shard_count().max(1),
        );
        assignment.accepts(shard, Instant::now())
    }
}

/// The filter at the sources: keeps the keys whose shard this replica accepts now.
pub(crate) fn source_filter<K: kube::Resource>(
    assignment: watch::Receiver<Assignment>,
) -> impl FnMut(&ObjectRef<K>) -> bool + Clone + Send + 'static {
    move |key| {
        let assignment = assignment.borrow();
        let shard = shard_of(
            key.namespace.as_deref(),
            &key.name,
            assignment.shard_count().max(1),
        );
        assignment.accepts(shard, Instant::now())
    }
}

/// The shard-held metrics of a controller (with the `metrics` feature).
#[derive(Debug)]
pub(crate) struct ShardMetrics {
    #[cfg(feature = "metrics")]
    controller: Arc<str>,
}

impl ShardMetrics {
    pub(crate) fn new(controller: &str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = controller;
        ShardMetrics {
            #[cfg(feature = "metrics")]
            controller: Arc::from(controller),
        }
    }

    /// Emits the gauges and counters of `assignment`.
    pub(crate) fn emit(&self, assignment: &Assignment) {
        #[cfg(feature = "metrics")]
        {
            let controller = self.controller.to_string();
            let held = f64::from(assignment.held_count());
            metrics::gauge!(super::SHARDS_HELD, "controller" => controller.clone()).set(held);
            if assignment.shard_count() == 1 {
                metrics::gauge!(super::LEADER, "controller" => controller.clone()).set(held);
            }
            let stats = assignment.stats();
            metrics::counter!(super::HAND_OVERS_TOTAL, "controller" => controller)
                .absolute(stats.hand_overs);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = assignment;
    }
}
