//! A ledger of runs: who ran what, from when until when. A run is a reconcile of one object on
//! one replica, or one replica's belief that it holds one shard ("I may run shard s until T").
//! The check the tests need from it: no subject was ever run by two holders at once.
//!
//! Times are tokio's [`Instant`]s: exact on paused time, the machine's clock otherwise.
//!
//! # Invariants
//!
//! - A run starts when it is recorded and ends at the first of: its recorded end, its
//!   `valid_until` (a holder's own bound on its belief), and its process's death.
//! - [`Ledger::assert_never_two_at_once`] judges every pair of runs of one subject, including
//!   two runs of one holder (a key reconciled twice at once by one replica is a violation too),
//!   and panics on a ledger that saw no run: a check of nothing would pass whatever the code
//!   under test did.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::{Instant, sleep};

/// How often a ledger checks the runs believed at the current instant (see [`Ledger::new`]).
const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

/// One run of `subject` by `replica`.
#[derive(Clone, Debug)]
pub struct Run<S> {
    /// Who ran it: a replica's name.
    pub replica: String,
    /// Which process of that replica (a replica restarted with its name is another process).
    pub process: usize,
    /// What was run: an object's name, a shard.
    pub subject: S,
    /// When the run was recorded as started.
    pub start: Instant,
    /// When its end was recorded (`None`: not yet, or never, as when its task was killed).
    pub ended: Option<Instant>,
    /// The holder's own bound on the run (a Lease's validity): it ends then at the latest.
    pub valid_until: Option<Instant>,
}

impl<S> Run<S> {
    /// The end of the run: its recorded end or its validity, whichever came first; `None`
    /// while it is open and unbounded.
    pub fn end(&self) -> Option<Instant> {
        match (self.ended, self.valid_until) {
            (Some(e), Some(v)) => Some(e.min(v)),
            (e, v) => e.or(v),
        }
    }

    /// Whether the run covers the instant `t`.
    pub fn covers(&self, t: Instant) -> bool {
        self.start <= t && self.end().is_none_or(|end| t < end)
    }

    /// The end, counting an open run as running until `now`.
    fn end_or(&self, now: Instant) -> Instant {
        self.end().unwrap_or(now).max(self.start)
    }
}

struct Inner<S> {
    runs: Vec<Run<S>>,
    processes: usize,
    samples: usize,
    /// What the sampler found (it runs in its own task: a panic there would go unnoticed).
    violations: Vec<String>,
}

/// The ledger. Clones share it.
#[derive(Clone)]
pub struct Ledger<S> {
    inner: Arc<Mutex<Inner<S>>>,
}

impl<S> Debug for Ledger<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Ledger")
            .field("runs", &inner.runs.len())
            .field("samples", &inner.samples)
            .finish()
    }
}

/// Ends its run when dropped (see [`Ledger::run`]).
#[derive(Debug)]
#[must_use = "the run ends when this is dropped"]
pub struct Running<S> {
    ledger: Ledger<S>,
    index: usize,
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        self.ledger.end(self.index);
    }
}

impl<S> Ledger<S> {
    fn lock(&self) -> MutexGuard<'_, Inner<S>> {
        // A panic while the lock was held was a test failing: its message is what matters.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the end of a run now (the first recorded end stands).
    pub fn end(&self, index: usize) {
        self.end_at(index, Instant::now());
    }

    /// Records the end of a run at `at` (the first recorded end stands).
    pub fn end_at(&self, index: usize, at: Instant) {
        self.lock().runs[index].ended.get_or_insert(at);
    }
}

impl<S: Clone + Eq + Hash + Debug + Send + 'static> Ledger<S> {
    /// An empty ledger that also checks, every 100 ms of tokio's clock, the runs that cover that
    /// instant as known then (a holder's `valid_until` moves on later). Must be made inside a
    /// tokio runtime (it spawns the sampler, which lives as long as the runtime).
    #[allow(clippy::new_without_default)] // it spawns a task: not what `Default` promises
    pub fn new() -> Self {
        let ledger = Ledger {
            inner: Arc::new(Mutex::new(Inner {
                runs: Vec::new(),
                processes: 0,
                samples: 0,
                violations: Vec::new(),
            })),
        };
        let sampler = ledger.clone();
        tokio::spawn(async move {
            loop {
                sleep(SAMPLE_PERIOD).await;
                sampler.check_at(Instant::now());
            }
        });
        ledger
    }

    /// A new process number (a replica, or a replica restarted with the same name).
    pub fn process(&self) -> usize {
        let mut inner = self.lock();
        inner.processes += 1;
        inner.processes
    }

    /// Records the start of a run now; returns its index (for [`Ledger::end`] and
    /// [`Ledger::valid_until`]).
    pub fn begin(&self, replica: &str, process: usize, subject: S) -> usize {
        self.begin_at(replica, process, subject, Instant::now())
    }

    /// Records the start of a run at `start` (a run read from another process's record, say);
    /// returns its index.
    pub fn begin_at(&self, replica: &str, process: usize, subject: S, start: Instant) -> usize {
        let mut inner = self.lock();
        inner.runs.push(Run {
            replica: replica.into(),
            process,
            subject,
            start,
            ended: None,
            valid_until: None,
        });
        inner.runs.len() - 1
    }

    /// Records the start of a run now, and its end when the guard is dropped (a reconcile
    /// that returns, fails or panics).
    pub fn run(&self, replica: &str, process: usize, subject: S) -> Running<S> {
        let index = self.begin(replica, process, subject);
        Running {
            ledger: self.clone(),
            index,
        }
    }

    /// Sets a run's validity: it ends then at the latest.
    pub fn valid_until(&self, index: usize, until: Instant) {
        self.lock().runs[index].valid_until = Some(until);
    }

    /// A process died at `at`: its runs end there at the latest.
    pub fn died(&self, process: usize, at: Instant) {
        for run in self.lock().runs.iter_mut() {
            if run.process == process && run.ended.is_none_or(|e| e > at) {
                run.ended = Some(at);
            }
        }
    }

    /// Every run so far.
    pub fn runs(&self) -> Vec<Run<S>> {
        self.lock().runs.clone()
    }

    /// The first run of `subject` that started at or after `since`.
    pub fn taken_after(&self, subject: S, since: Instant) -> Option<Run<S>> {
        let inner = self.lock();
        let runs = inner.runs.iter();
        runs.filter(|r| r.subject == subject && r.start >= since)
            .min_by_key(|r| r.start)
            .cloned()
    }

    /// The replicas that ran each subject from `since` on, in the order the runs started.
    pub fn started_since(&self, since: Instant) -> HashMap<S, Vec<String>> {
        let mut by_subject: HashMap<S, Vec<String>> = HashMap::new();
        for run in self.lock().runs.iter().filter(|r| r.start >= since) {
            let replicas = by_subject.entry(run.subject.clone()).or_default();
            replicas.push(run.replica.clone());
        }
        by_subject
    }

    /// Checks that no subject is covered by two runs at the instant `t`.
    fn check_at(&self, t: Instant) {
        let mut inner = self.lock();
        inner.samples += 1;
        let mut holders: HashMap<&S, Vec<(&str, usize)>> = HashMap::new();
        for run in inner.runs.iter().filter(|r| r.covers(t)) {
            let entry = holders.entry(&run.subject).or_default();
            entry.push((&run.replica, run.process));
        }
        let found: Vec<String> = holders
            .into_iter()
            .filter(|(_, holders)| holders.len() > 1)
            .map(|(subject, holders)| format!("{subject:?} run by {holders:?} at once, at {t:?}"))
            .collect();
        inner.violations.extend(found);
    }

    /// The exact check: the runs of each subject are disjoint (an open run counts until now).
    /// Panics on a violation, on a ledger without runs, and when the sampler never ran.
    /// Returns how many runs it judged, and the smallest gap between a run ending and the next
    /// run of the same subject starting in another process.
    pub fn assert_never_two_at_once(&self) -> (usize, Option<Duration>) {
        let now = Instant::now();
        let inner = self.lock();
        assert!(
            inner.violations.is_empty(),
            "{} samples found two at once, the first: {:#?}",
            inner.violations.len(),
            &inner.violations[..inner.violations.len().min(3)]
        );
        assert!(
            !inner.runs.is_empty(),
            "the ledger saw no run: nothing to judge (did the code under test run at all?)"
        );
        assert!(inner.samples > 0, "the sampler never ran");
        let mut by_subject: HashMap<&S, Vec<&Run<S>>> = HashMap::new();
        for run in &inner.runs {
            by_subject.entry(&run.subject).or_default().push(run);
        }
        let mut smallest: Option<Duration> = None;
        for (subject, runs) in by_subject {
            // By start; then each run needs checking only against those that start before it
            // ends, and the latest end so far finds an overlap with any earlier run.
            let mut runs = runs;
            runs.sort_by_key(|r| r.start);
            let mut latest: Option<&Run<S>> = None;
            for run in runs {
                if let Some(before) = latest {
                    let before_end = before.end_or(now);
                    assert!(
                        before_end <= run.start,
                        "{subject:?} run twice at once: by {} (process {}) from {:?} to {:?}, by {} (process {}) from {:?} to {:?}",
                        before.replica,
                        before.process,
                        before.start,
                        before_end,
                        run.replica,
                        run.process,
                        run.start,
                        run.end_or(now),
                    );
                    if before.process != run.process {
                        let gap = run.start - before_end;
                        smallest = Some(smallest.map_or(gap, |s| s.min(gap)));
                    }
                }
                if latest.is_none_or(|l| l.end_or(now) <= run.end_or(now)) {
                    latest = Some(run);
                }
            }
        }
        (inner.runs.len(), smallest)
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use super::*;

    fn panics(ledger: &Ledger<&'static str>) -> String {
        let caught = catch_unwind(AssertUnwindSafe(|| ledger.assert_never_two_at_once()));
        let payload = caught.expect_err("the check passed");
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    }

    #[tokio::test(start_paused = true)]
    async fn a_ledger_that_saw_no_run_fails_the_check() {
        let ledger = Ledger::<&str>::new();
        sleep(Duration::from_secs(1)).await;
        assert!(panics(&ledger).contains("saw no run"));
    }

    #[tokio::test(start_paused = true)]
    async fn runs_one_after_another_pass_with_their_gap() {
        let ledger = Ledger::new();
        let (a, b) = (ledger.process(), ledger.process());
        let first = ledger.run("r1", a, "x");
        sleep(Duration::from_secs(1)).await;
        drop(first);
        sleep(Duration::from_millis(250)).await;
        let _second = ledger.run("r2", b, "x");
        let _other = ledger.run("r1", a, "y");
        sleep(Duration::from_secs(1)).await;
        assert_eq!(
            ledger.assert_never_two_at_once(),
            (3, Some(Duration::from_millis(250)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn overlapping_runs_fail_even_on_one_replica() {
        for same_process in [false, true] {
            let ledger = Ledger::new();
            let (a, b) = (ledger.process(), ledger.process());
            // The sampler runs once before the runs, not during them: the exact check finds it.
            sleep(Duration::from_millis(150)).await;
            let _first = ledger.run("r1", a, "x");
            sleep(Duration::from_millis(10)).await;
            let _second = ledger.run("r1", if same_process { a } else { b }, "x");
            sleep(Duration::from_millis(10)).await;
            assert!(panics(&ledger).contains("\"x\" run twice at once"));
        }
    }

    /// A belief bounded by its validity ends then, even though its end was never recorded; the
    /// sampler sees an overlap that the validity later hides no more than the exact check does.
    #[tokio::test(start_paused = true)]
    async fn validity_and_death_end_runs() {
        let ledger = Ledger::new();
        let (a, b, c) = (ledger.process(), ledger.process(), ledger.process());
        let belief = ledger.begin("r1", a, "shard-0");
        ledger.valid_until(belief, Instant::now() + Duration::from_secs(1));
        sleep(Duration::from_secs(2)).await;
        let held = ledger.begin("r2", b, "shard-0");
        sleep(Duration::from_secs(1)).await;
        ledger.died(b, Instant::now());
        let _third = ledger.run("r3", c, "shard-0");
        sleep(Duration::from_secs(1)).await;
        assert_eq!(ledger.runs()[held].end(), ledger.runs()[2].start.into());
        let (runs, gap) = ledger.assert_never_two_at_once();
        assert_eq!((runs, gap), (3, Some(Duration::ZERO)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_sampler_reports_what_it_saw() {
        let ledger = Ledger::new();
        let (a, b) = (ledger.process(), ledger.process());
        let first = ledger.begin("r1", a, "x");
        let second = ledger.begin("r2", b, "x");
        sleep(Duration::from_millis(150)).await;
        // Both ended before the exact check: only the sampler saw them overlap.
        ledger.end(first);
        ledger.end(second);
        assert!(panics(&ledger).contains("samples found two at once"));
    }
}
