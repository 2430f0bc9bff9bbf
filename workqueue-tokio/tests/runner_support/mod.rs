//! Fixtures shared by the runner's test binaries (`runner_*.rs`): the queue, a log of
//! reconciles on tokio's paused clock, and the report's checks.
#![allow(dead_code)] // each test binary uses part of them

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{ms, secs};
use tokio::time::Instant;
use workqueue_ratelimit::ExponentialFailure;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Report};

pub type Key = &'static str;

/// A queue with client-go's per-item controller backoff: 5 ms doubling to 1000 s.
pub fn queue() -> WorkQueue<Key> {
    WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(ms(5), secs(1000)))
        .build()
}

/// One reconcile as the test saw it: key, virtual time since the test's start, attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub key: Key,
    pub at: Duration,
    pub attempt: u32,
}

pub fn run(key: Key, at: Duration, attempt: u32) -> Run {
    Run { key, at, attempt }
}

/// A shared log of reconciles (and of anything else a test records).
#[derive(Debug)]
pub struct Log<E> {
    pub start: Instant,
    pub entries: Arc<Mutex<Vec<E>>>,
}

impl<E> Clone for Log<E> {
    fn clone(&self) -> Self {
        Log {
            start: self.start,
            entries: self.entries.clone(),
        }
    }
}

impl<E: Clone> Log<E> {
    pub fn new(start: Instant) -> Self {
        Log {
            start,
            entries: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn push(&self, e: E) {
        self.entries.lock().unwrap().push(e);
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn get(&self) -> Vec<E> {
        self.entries.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

impl Log<Run> {
    pub fn record(&self, key: Key, ctx: &Context) -> usize {
        let mut entries = self.entries.lock().unwrap();
        entries.push(run(key, self.start.elapsed(), ctx.rate_limited_retries()));
        entries.iter().filter(|r| r.key == key).count()
    }
}

/// Records when it is dropped (to see a reconcile's future being dropped).
pub struct DropProbe(pub Log<(Key, Duration)>, pub Key);

impl Drop for DropProbe {
    fn drop(&mut self) {
        self.0.push((self.1, self.0.elapsed()));
    }
}

/// A reconcile that fails its first `failures` runs of each key, then succeeds.
pub fn fail_first(
    log: &Log<Run>,
    failures: usize,
) -> impl Fn(Key, Context) -> std::future::Ready<Result<Action, &'static str>> + Send + Sync + 'static
{
    let log = log.clone();
    move |key, ctx| {
        let n = log.record(key, &ctx);
        std::future::ready(if n <= failures {
            Err("transient")
        } else {
            Ok(Action::await_change())
        })
    }
}

pub fn assert_report(
    report: &Report,
    (processed, retried, given_up, errors): (u64, u64, u64, u64),
    (panics, timeouts, interrupted, still_queued): (u64, u64, u64, usize),
) {
    let got = (
        (
            report.processed,
            report.retried,
            report.given_up,
            report.errors,
        ),
        (
            report.panics,
            report.timeouts,
            report.interrupted,
            report.still_queued,
        ),
    );
    assert_eq!(
        got,
        (
            (processed, retried, given_up, errors),
            (panics, timeouts, interrupted, still_queued)
        ),
        "((processed, retried, given_up, errors), (panics, timeouts, interrupted, still_queued)) of {report:?}"
    );
}
