//! Failed Lease requests, told to whoever runs the protocol: each kind once, until a request of
//! that kind succeeds again.
//!
//! A failed request is retried by the protocol on its own (a renewal at the next retry period,
//! the watch after a pause), so a failure that lasts (a missing RBAC permission, an API server
//! away) would otherwise be told every retry period: one report per verb until that verb works
//! again says the same without flooding the controller's stream.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

/// One failed Lease request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RequestFailed {
    /// The request's verb, as RBAC names it: `create`, `update`, `delete`, `list` or `watch`.
    pub(crate) verb: &'static str,
    /// The Lease's name, or for `list` and `watch` the label selector.
    pub(crate) lease: String,
    /// What the API server (or the client, when it did not answer) said.
    pub(crate) message: String,
}

impl fmt::Display for RequestFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.verb, self.lease, self.message)
    }
}

/// What the protocol tells whoever runs it (the controller puts each on its stream).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Report {
    /// A request failed (each verb once, until it succeeds again).
    Failed(RequestFailed),
    /// The watch did not show a write the server stored within a retry period: it was
    /// replaced by a new list and watch. Told once until a watch delivers again.
    WatchStale {
        /// The label selector of the watch.
        selector: String,
    },
    /// Stored renewals were not shown within the renew deadline: this replica stopped
    /// renewing so that another takes its shards over.
    SteppedDown,
    /// A member's record carries a lease duration unlike this replica's.
    Timing {
        /// The member's holder token.
        holder: String,
        /// The duration its record carries.
        duration: std::time::Duration,
        /// This replica's.
        ours: std::time::Duration,
    },
}

/// Where reports are told.
pub(super) type Tell = Arc<dyn Fn(Report) + Send + Sync>;

/// The verbs failing now; invariant: a verb is in `failing` from its first failure that was
/// told until a request with that verb succeeds.
pub(super) struct Failures {
    failing: BTreeSet<&'static str>,
    tell: Option<Tell>,
}

impl Failures {
    pub(super) fn new(tell: Option<Tell>) -> Self {
        Failures {
            failing: BTreeSet::new(),
            tell,
        }
    }

    /// A request failed: told (and logged as a warning) if its verb was not failing already,
    /// logged at debug level otherwise.
    pub(super) fn failed(&mut self, failure: RequestFailed) {
        if !self.failing.insert(failure.verb) {
            tracing::debug!(
                verb = failure.verb,
                lease = %failure.lease,
                error = %failure.message,
                "a Lease request failed again"
            );
            return;
        }
        tracing::warn!(
            verb = failure.verb,
            lease = %failure.lease,
            error = %failure.message,
            "a Lease request failed"
        );
        if let Some(tell) = &self.tell {
            tell(Report::Failed(failure));
        }
    }

    /// A request with `verb` succeeded (or was answered: a conflict is an answer).
    pub(super) fn succeeded(&mut self, verb: &'static str) {
        self.failing.remove(verb);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn failure(verb: &'static str) -> RequestFailed {
        RequestFailed {
            verb,
            lease: "c-member-a".into(),
            message: "forbidden".into(),
        }
    }

    #[test]
    fn each_verb_is_told_once_until_it_succeeds_again() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let tell: Tell = {
            let told = told.clone();
            Arc::new(move |r: Report| match r {
                Report::Failed(f) => told.lock().unwrap().push(f.verb),
                other => panic!("only failures are told here: {other:?}"),
            })
        };
        let mut failures = Failures::new(Some(tell));
        failures.failed(failure("update"));
        failures.failed(failure("update"));
        failures.failed(failure("create"));
        failures.succeeded("create");
        failures.failed(failure("update"));
        failures.succeeded("update");
        failures.failed(failure("update"));
        failures.failed(failure("create"));
        assert_eq!(
            *told.lock().unwrap(),
            ["update", "create", "update", "create"]
        );
    }

    #[test]
    fn without_a_listener_failures_are_only_logged() {
        let mut failures = Failures::new(None);
        failures.failed(failure("list"));
        failures.succeeded("list");
    }

    #[test]
    fn the_display_names_verb_lease_and_message() {
        assert_eq!(
            failure("update").to_string(),
            "update c-member-a: forbidden"
        );
    }
}
