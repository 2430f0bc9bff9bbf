//! The lease guard: a plain OS thread that ends the process when a lost shard's reconcile is
//! still running its code past the shard's deadline, which only happens when the runtime that
//! would stop it is blocked (a reconcile that computes without awaiting, on a `current_thread`
//! runtime or on one whose workers are all taken).
//!
//! Why a thread: the renewals, the watchdog and the runner's per-poll check all run on the
//! application's runtime. A reconcile that blocks its runtime's thread past the deadline cannot
//! be stopped from there: its poll is under way, and nothing interrupts a poll. Another replica
//! may take the shard `lease_duration - renew_deadline` after the deadline (step 3 of the
//! protocol's argument, less the clock-rate slack); the one way left to keep the two replicas
//! apart is to end this process before then, as controller-runtime exits on a lost leader
//! Lease.
//!
//! What it judges, and why only that:
//! - a reconcile *being polled* (its code under way), per shard, counted around every poll by
//!   [`ShardPolls::polled`]. A reconcile that waits is harmless: the runner asks the shard's
//!   deadline before each poll (`Runner::poll_while`), so a waiting reconcile of a lost shard
//!   is never polled again, even when the runtime is blocked elsewhere or the process was
//!   frozen. So a thawed process, whose waiting reconciles are due all at once, is not ended.
//! - the shard's `valid_until` as the protocol published it (read from the assignment's
//!   `watch` without any runtime: a lock held only while the protocol publishes). A blocked
//!   runtime publishes nothing, so the guard sees the deadline the replica believed last; a
//!   shard no longer published keeps its last `valid_until` seen.
//! - tokio's clock, read with the runtime's handle entered: real time in production, the
//!   paused clock in tests (so that paused time never looks like a blocked runtime).
//!
//! It ends the process once a poll of a shard's reconcile is under way at `valid_until +
//! EXIT_AFTER` of the slack, checking every `CHECK_EVERY` of it: by `valid_until + 3/4` of the
//! slack at the latest (the watchdog's abort comes at `1/2`, another replica's take at the
//! earliest at the whole slack).

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::lease::{Assignment, EXIT_UNSTOPPABLE};

/// The part of the slack (`lease_duration - renew_deadline`) after a shard's deadline at which
/// a reconcile still under way ends the process, in eighths: past the watchdog's abort (4/8),
/// with a check period (1/8) to spare before 6/8.
const EXIT_AFTER_EIGHTHS: u32 = 5;

/// Polls under way, per shard: written by the reconciles' polls (any runtime thread), read by
/// the guard's thread.
#[derive(Debug)]
pub(super) struct ShardPolls {
    /// Reconcile polls under way per shard (index: the shard).
    under_way: Box<[AtomicU32]>,
}

impl ShardPolls {
    pub(super) fn new(shards: u32) -> Arc<Self> {
        Arc::new(ShardPolls {
            under_way: (0..shards.max(1)).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// Counts a poll of a reconcile of `shard` as under way until the returned guard is dropped
    /// (the poll returned or unwound).
    fn polled(self: &Arc<Self>, shard: u32) -> PollUnderWay {
        let index = (shard as usize).min(self.under_way.len() - 1);
        self.under_way[index].fetch_add(1, Ordering::AcqRel);
        PollUnderWay {
            polls: self.clone(),
            index,
        }
    }

    fn any_under_way(&self, shard: usize) -> bool {
        self.under_way
            .get(shard)
            .is_some_and(|n| n.load(Ordering::Acquire) > 0)
    }
}

/// One poll under way (see [`ShardPolls::polled`]).
struct PollUnderWay {
    polls: Arc<ShardPolls>,
    index: usize,
}

impl Drop for PollUnderWay {
    fn drop(&mut self) {
        self.polls.under_way[self.index].fetch_sub(1, Ordering::AcqRel);
    }
}

/// `reconcile` with each of its polls counted as under way for `shard`.
pub(super) async fn counted<F: Future>(
    polls: Arc<ShardPolls>,
    shard: u32,
    reconcile: F,
) -> F::Output {
    let mut reconcile = pin!(reconcile);
    poll_fn(move |cx| {
        let _under_way = polls.polled(shard);
        reconcile.as_mut().poll(cx)
    })
    .await
}

/// The guard's thread, stopped when this is dropped (the controller's run is over).
#[derive(Debug)]
pub(super) struct LeaseGuard {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LeaseGuard {
    /// Starts the guard over `polls` and `assignment`, for the slack `lease_duration -
    /// renew_deadline`, on the runtime `handle` (whose clock it reads). `None` if the thread
    /// cannot be started (logged: the process then runs without the safety net).
    pub(super) fn start(
        polls: Arc<ShardPolls>,
        assignment: watch::Receiver<Assignment>,
        slack: Duration,
        handle: Handle,
    ) -> Option<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let watch = Watch {
            polls,
            assignment,
            last: Vec::new(),
            exit_after: slack * EXIT_AFTER_EIGHTHS / 8,
        };
        let check_every = (slack / 8).max(Duration::from_millis(1));
        let stopped = stop.clone();
        let spawned = thread::Builder::new()
            .name("workqueue-lease-guard".into())
            .spawn(move || {
                let _runtime = handle.enter();
                watch.run(&stopped, check_every);
            });
        match spawned {
            Ok(thread) => Some(LeaseGuard {
                stop,
                thread: Some(thread),
            }),
            Err(error) => {
                tracing::error!(%error, "the lease guard's thread could not be started: a blocked runtime can make two replicas run one shard at once");
                None
            }
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Not joined: a drop on the runtime must not wait for a thread's sleep.
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
        }
    }
}

/// What the guard's thread watches.
struct Watch {
    polls: Arc<ShardPolls>,
    assignment: watch::Receiver<Assignment>,
    /// The last `valid_until` seen of each shard (kept once the shard is no longer published).
    last: Vec<Option<Instant>>,
    exit_after: Duration,
}

impl Watch {
    fn run(mut self, stop: &AtomicBool, check_every: Duration) {
        while !stop.load(Ordering::Acquire) {
            if let Some(shard) = self.overdue(Instant::now()) {
                end_process(shard, self.exit_after);
            }
            thread::park_timeout(check_every);
        }
    }

    /// A shard with a reconcile's poll under way `exit_after` past its deadline, at `now`.
    fn overdue(&mut self, now: Instant) -> Option<u32> {
        let assignment = self.assignment.borrow().clone();
        let shards = assignment.shard_count() as usize;
        if self.last.len() < shards {
            self.last.resize(shards, None);
        }
        for (shard, last) in self.last.iter_mut().enumerate() {
            if let Some(holding) = assignment.state(shard as u32).holding() {
                *last = Some(holding.valid_until());
            }
            let past = last.is_some_and(|valid_until| now >= valid_until + self.exit_after);
            if past && self.polls.any_under_way(shard) {
                return Some(shard as u32);
            }
        }
        None
    }
}

/// Ends the process: a reconcile of `shard` still runs its code past the deadline.
fn end_process(shard: u32, exit_after: Duration) -> ! {
    let message = format!(
        "workqueue-kube: a reconcile of shard {shard} was still running {exit_after:?} after the \
         shard's deadline (its runtime is blocked: a reconcile computes without awaiting); the \
         process exits with status {EXIT_UNSTOPPABLE} before another replica may take the shard"
    );
    tracing::error!(shard, "{message}");
    eprintln!("{message}");
    std::process::exit(EXIT_UNSTOPPABLE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Holding, ShardState};

    fn held(shards: u32, shard: u32, valid_until: Instant) -> Assignment {
        let mut states = vec![ShardState::NotHeld; shards as usize];
        states[shard as usize] = ShardState::Held(Holding::new(valid_until, 1));
        Assignment::new(states.into(), 0, Default::default())
    }

    #[test]
    fn polls_under_way_are_counted_per_shard_until_dropped() {
        let polls = ShardPolls::new(4);
        let a = polls.polled(1);
        let b = polls.polled(1);
        assert!(polls.any_under_way(1) && !polls.any_under_way(0));
        drop(a);
        assert!(polls.any_under_way(1));
        drop(b);
        assert!(!polls.any_under_way(1));
    }

    /// Overdue: a poll under way at the deadline plus `exit_after`, not a moment before, and
    /// not without a poll under way; a shard no longer published keeps its last deadline.
    #[test]
    fn a_poll_under_way_past_the_deadline_and_the_margin_is_overdue() {
        let start = Instant::now();
        let valid_until = start + Duration::from_secs(10);
        let (publish, assignment) = watch::channel(held(4, 2, valid_until));
        let polls = ShardPolls::new(4);
        let mut watch = Watch {
            polls: polls.clone(),
            assignment,
            last: Vec::new(),
            exit_after: Duration::from_secs(3),
        };
        let at = |secs: u64, millis: u64| {
            start + Duration::from_secs(secs) + Duration::from_millis(millis)
        };
        assert_eq!(watch.overdue(at(14, 0)), None, "no poll under way");
        let poll = polls.polled(2);
        let other = polls.polled(1);
        assert_eq!(watch.overdue(at(12, 999)), None, "within the margin");
        assert_eq!(watch.overdue(at(13, 0)), Some(2));
        publish.send_replace(Assignment::empty(4));
        assert_eq!(watch.overdue(at(13, 0)), Some(2), "the last deadline seen");
        drop(poll);
        assert_eq!(
            watch.overdue(at(60, 0)),
            None,
            "shard 1 was never held here"
        );
        drop(other);
    }
}
