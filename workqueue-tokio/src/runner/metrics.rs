//! controller-runtime's controller metrics, emitted by the runner through the `metrics` facade.
//!
//! With the `metrics` feature (on by default), a [`Runner`](super::Runner) emits, labelled
//! `controller` (the queue's name, or `"unnamed"`):
//!
//! | metric | kind | what |
//! |---|---|---|
//! | [`RECONCILE_TOTAL`] | counter | reconciles, by `result`: `success`, `error`, `requeue`, `requeue_after` (all four zeroed at the start) |
//! | [`RECONCILE_ERRORS_TOTAL`] | counter | failed reconciles: errors, panics, timeouts, given up or not |
//! | [`TERMINAL_RECONCILE_ERRORS_TOTAL`] | counter | failures the error policy gave up on (`Action::await_change()`) |
//! | [`RECONCILE_PANICS_TOTAL`] | counter | reconciles that panicked |
//! | [`RECONCILE_TIMEOUTS_TOTAL`] | counter | reconciles that timed out |
//! | [`RECONCILE_TIME_SECONDS`] | histogram | how long reconciles took ([`RECONCILE_TIME_BUCKETS`]) |
//! | [`ACTIVE_WORKERS`] | gauge | workers reconciling now |
//! | [`MAX_CONCURRENT_RECONCILES`] | gauge | the runner's number of workers |
//! | [`RECONCILE_REASONS_TOTAL`] | counter | reconciles, by `reason` the key was queued for: `source:NAME`, `requeue`, `retry`, `direct` (added to the queue directly), `unknown` (the key panicked); a reconcile counts once for each reason in its set |
//!
//! These are controller-runtime's names, labels and values, so its dashboards and alerts work
//! unchanged. The `result` of a success is `requeue_after` for `Action::requeue(d)` with
//! `d > 0`, `requeue` for `Action::backoff()` (a rate-limited requeue, as controller-runtime's
//! `Requeue: true`), else `success`, whatever priority the requeue asks for.
//! Every failure is `result="error"` and counts in [`RECONCILE_ERRORS_TOTAL`], as
//! controller-runtime counts them: a panic also counts in [`RECONCILE_PANICS_TOTAL`], a timeout
//! in [`RECONCILE_TIMEOUTS_TOTAL`], and a failure the policy gave up on in
//! [`TERMINAL_RECONCILE_ERRORS_TOTAL`] (controller-runtime's `TerminalError`). There are no other
//! `result` values. A reconcile interrupted at shutdown counts in no `result` (its key is
//! retried).
//!
//! One difference, on purpose: controller-runtime's `TerminalError` does not `Forget` the key, so
//! its failure count persists and the next event's failure starts at a long backoff; a give-up
//! here forgets the key (rate limiter and the runner's failure count), so that the next event
//! for it, usually a fix, starts afresh.
//!
//! The queue's own `workqueue_*` metrics (see `workqueue_core::metrics`) are labelled `name`;
//! a runner's queue is labelled `controller` as well, with the same value, as controller-runtime
//! labels them.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "metrics")]
use super::action::Failure;
use super::action::Reconciled;
#[cfg(feature = "metrics")]
use super::reasons::Label;
use super::reasons::ReasonSet;

/// The label that carries the controller's (queue's) name (the queue's metrics carry it too).
pub use workqueue_core::metrics::CONTROLLER_LABEL;
/// The label of [`RECONCILE_TOTAL`] that carries the result.
pub const RESULT_LABEL: &str = "result";
/// The `controller` label of a runner whose queue has no name.
pub const UNNAMED: &str = "unnamed";
/// Counter: reconciles per controller and result.
pub const RECONCILE_TOTAL: &str = "controller_runtime_reconcile_total";
/// Counter: reconcile errors per controller.
pub const RECONCILE_ERRORS_TOTAL: &str = "controller_runtime_reconcile_errors_total";
/// Counter: reconcile errors the error policy gave up on, per controller (controller-runtime's
/// terminal errors).
pub const TERMINAL_RECONCILE_ERRORS_TOTAL: &str =
    "controller_runtime_terminal_reconcile_errors_total";
/// Counter: reconcile panics per controller.
pub const RECONCILE_PANICS_TOTAL: &str = "controller_runtime_reconcile_panics_total";
/// Counter: reconcile timeouts per controller.
pub const RECONCILE_TIMEOUTS_TOTAL: &str = "controller_runtime_reconcile_timeouts_total";
/// Histogram: seconds per reconcile, per controller.
pub const RECONCILE_TIME_SECONDS: &str = "controller_runtime_reconcile_time_seconds";
/// Gauge: workers reconciling now, per controller.
pub const ACTIVE_WORKERS: &str = "controller_runtime_active_workers";
/// Gauge: maximum concurrent reconciles (workers), per controller.
pub const MAX_CONCURRENT_RECONCILES: &str = "controller_runtime_max_concurrent_reconciles";

/// The label of [`RECONCILE_REASONS_TOTAL`] that carries the reason.
pub const REASON_LABEL: &str = "reason";
/// Counter: reconciles per controller and reason the key was queued for (ours: controller-runtime
/// has no such metric).
pub const RECONCILE_REASONS_TOTAL: &str = "controller_reconcile_reasons_total";

/// The `result` values of [`RECONCILE_TOTAL`] (controller-runtime's four).
pub const RESULTS: [&str; 4] = ["success", "error", "requeue", "requeue_after"];

/// controller-runtime's buckets for [`RECONCILE_TIME_SECONDS`].
pub const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// The runner's metrics (a no-op without the `metrics` feature).
#[derive(Debug)]
pub(super) struct RunnerMetrics {
    #[cfg(feature = "metrics")]
    controller: metrics::SharedString,
    /// The `reason` label of each source, by index (built once: no formatting per reconcile).
    #[cfg(feature = "metrics")]
    sources: Vec<metrics::SharedString>,
}

#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (name, help) in [
            (
                RECONCILE_TOTAL,
                "Total number of reconciliations per controller",
            ),
            (
                RECONCILE_ERRORS_TOTAL,
                "Total number of reconciliation errors per controller",
            ),
            (
                TERMINAL_RECONCILE_ERRORS_TOTAL,
                "Total number of terminal reconciliation errors per controller",
            ),
            (
                RECONCILE_PANICS_TOTAL,
                "Total number of reconciliation panics per controller",
            ),
            (
                RECONCILE_TIMEOUTS_TOTAL,
                "Total number of reconciliation timeouts per controller",
            ),
            (
                RECONCILE_REASONS_TOTAL,
                "Total number of reconciliations per controller and reason the key was queued for",
            ),
        ] {
            describe_counter!(name, Unit::Count, help);
        }
        for (name, help) in [
            (
                ACTIVE_WORKERS,
                "Number of currently used workers per controller",
            ),
            (
                MAX_CONCURRENT_RECONCILES,
                "Maximum number of concurrent reconciles per controller",
            ),
        ] {
            describe_gauge!(name, Unit::Count, help);
        }
        describe_histogram!(
            RECONCILE_TIME_SECONDS,
            Unit::Seconds,
            "Length of time per reconciliation per controller"
        );
    });
}

impl RunnerMetrics {
    pub(super) fn new(controller: Option<&str>, sources: &[Arc<str>]) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (controller, sources);
        RunnerMetrics {
            #[cfg(feature = "metrics")]
            controller: controller.unwrap_or(UNNAMED).to_owned().into(),
            #[cfg(feature = "metrics")]
            sources: sources
                .iter()
                .map(|name| format!("source:{name}").into())
                .collect(),
        }
    }

    /// A key was handed out for `reasons`.
    pub(super) fn queued_for(&self, reasons: &ReasonSet) {
        #[cfg(feature = "metrics")]
        reasons.for_each_label(|label| {
            let reason: metrics::SharedString = match label {
                Label::Direct => "direct".into(),
                Label::Unknown => "unknown".into(),
                Label::Requeue => "requeue".into(),
                Label::Retry => "retry".into(),
                Label::Source(i) => match self.sources.get(i) {
                    Some(name) => name.clone(),
                    None => "unknown".into(),
                },
            };
            metrics::counter!(
                RECONCILE_REASONS_TOTAL,
                CONTROLLER_LABEL => self.controller.clone(),
                REASON_LABEL => reason
            )
            .increment(1);
        });
        #[cfg(not(feature = "metrics"))]
        let _ = reasons;
    }

    /// The run started with `workers` workers: sets the maximum and zeroes every counter.
    pub(super) fn start(&self, workers: usize) {
        #[cfg(feature = "metrics")]
        {
            use metrics::{counter, gauge};
            describe();
            let c = || self.controller.clone();
            gauge!(MAX_CONCURRENT_RECONCILES, CONTROLLER_LABEL => c()).set(workers as f64);
            gauge!(ACTIVE_WORKERS, CONTROLLER_LABEL => c()).set(0.0);
            for result in RESULTS {
                counter!(RECONCILE_TOTAL, CONTROLLER_LABEL => c(), RESULT_LABEL => result)
                    .increment(0);
            }
            for name in [
                RECONCILE_ERRORS_TOTAL,
                TERMINAL_RECONCILE_ERRORS_TOTAL,
                RECONCILE_PANICS_TOTAL,
                RECONCILE_TIMEOUTS_TOTAL,
            ] {
                counter!(name, CONTROLLER_LABEL => c()).increment(0);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = workers;
    }

    /// A worker started (`+1`) or stopped (`-1`) reconciling.
    pub(super) fn active(&self, delta: f64) {
        #[cfg(feature = "metrics")]
        metrics::gauge!(ACTIVE_WORKERS, CONTROLLER_LABEL => self.controller.clone())
            .increment(delta);
        #[cfg(not(feature = "metrics"))]
        let _ = delta;
    }

    /// A reconcile ended with `verdict` after `elapsed` (nothing for one interrupted at
    /// shutdown).
    pub(super) fn reconciled<E>(&self, verdict: &Reconciled<E>, elapsed: Duration) {
        let Some(result) = verdict.result() else {
            return;
        };
        #[cfg(feature = "metrics")]
        {
            use metrics::{counter, histogram};
            let c = || self.controller.clone();
            histogram!(RECONCILE_TIME_SECONDS, CONTROLLER_LABEL => c())
                .record(elapsed.as_secs_f64());
            counter!(RECONCILE_TOTAL, CONTROLLER_LABEL => c(), RESULT_LABEL => result).increment(1);
            if let Reconciled::Failed(failure, _) = verdict {
                counter!(RECONCILE_ERRORS_TOTAL, CONTROLLER_LABEL => c()).increment(1);
                if verdict.given_up() {
                    counter!(TERMINAL_RECONCILE_ERRORS_TOTAL, CONTROLLER_LABEL => c()).increment(1);
                }
                match failure {
                    Failure::Timeout => {
                        counter!(RECONCILE_TIMEOUTS_TOTAL, CONTROLLER_LABEL => c()).increment(1);
                    }
                    Failure::Panic(_) => {
                        counter!(RECONCILE_PANICS_TOTAL, CONTROLLER_LABEL => c()).increment(1);
                    }
                    Failure::Error(_) => {}
                }
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (result, elapsed);
    }
}
