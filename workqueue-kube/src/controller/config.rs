//! How a [`Controller`](super::Controller) runs: kube-runtime's options, and what the queue adds.

use std::hash::Hash;
use std::time::Duration;

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use workqueue_tokio::ratelimit::OutageConfig;
use workqueue_tokio::runner::{Reconcile, Runner};
use workqueue_tokio::{AddOptions, WorkQueue};

/// A controller's options: kube-runtime's `debounce` and `concurrency` with kube-runtime's
/// meaning, and the queue's own (per-key backoff, fairness, aging, outage detection).
///
/// ```
/// use std::time::Duration;
/// use workqueue_kube::controller::Config;
///
/// let config = Config::default()
///     .concurrency(16)
///     .debounce(Duration::from_secs(1))
///     .per_key_backoff(true)
///     .fair_namespaces(true);
/// # let _ = config;
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    debounce: Duration,
    concurrency: u16,
    per_key_backoff: bool,
    fair_namespaces: bool,
    max_ready_wait: Option<Duration>,
    outage: Option<OutageConfig>,
    shutdown_grace: Duration,
}

impl Default for Config {
    /// Unbounded concurrency, no debounce, the error policy's delays as given, priorities and
    /// aging (60 s) on, fairness and outage detection off, a 30 s shutdown grace.
    fn default() -> Self {
        Config {
            debounce: Duration::ZERO,
            concurrency: 0,
            per_key_backoff: false,
            fair_namespaces: false,
            max_ready_wait: Some(Duration::from_secs(60)),
            outage: None,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

impl Config {
    /// Trailing-edge debounce: a trigger for an object waits `debounce`, and each later trigger
    /// for it moves its reconcile to that trigger's time plus `debounce`, so a burst of changes
    /// is reconciled once, `debounce` after the last. A trigger for an object that is already
    /// due (queued) or being reconciled is merged as usual. Zero (the default) runs triggers at
    /// once.
    ///
    /// As in kube-runtime, an object updated more often than every `debounce` is not reconciled
    /// until its updates pause.
    #[must_use]
    pub fn debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }

    /// How many reconciles may run at once; 0 (the default) is unbounded, as in kube-runtime. An
    /// object is never reconciled twice at once, whatever this is.
    #[must_use]
    pub fn concurrency(mut self, concurrency: u16) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Per-key exponential backoff for failures: when the error policy answers
    /// `Action::requeue(d)`, the object waits the rate limiter's delay for it (5 ms doubling to
    /// 1000 s with the default limiter, reset by a success), and at least `d`. Off by default,
    /// as in kube-runtime, where `requeue(d)` from the error policy waits exactly `d`.
    #[must_use]
    pub fn per_key_backoff(mut self, enabled: bool) -> Self {
        self.per_key_backoff = enabled;
        self
    }

    /// Serves the objects of each namespace in turn (round-robin across the namespaces that have
    /// objects due), so one busy namespace cannot delay the others. Off by default.
    #[must_use]
    pub fn fair_namespaces(mut self, enabled: bool) -> Self {
        self.fair_namespaces = enabled;
        self
    }

    /// Aging: an object due for longer than `max_wait` is served before any that is not,
    /// whatever their priorities, so the low-priority objects of an initial list are not starved
    /// by a steady stream of changes. `None` turns it off. Default: 60 s.
    #[must_use]
    pub fn max_ready_wait(mut self, max_wait: Option<Duration>) -> Self {
        self.max_ready_wait = max_wait;
        self
    }

    /// Outage-aware retries: when failures are widespread (the API server, or a dependency, is
    /// down), failing objects are parked instead of retried on their own backoff, one probe at a
    /// time finds out when it is back, and the first success releases them all, paced. Off by
    /// default; `OutageConfig::default()` is the usual choice.
    #[must_use]
    pub fn outage_detection(mut self, config: OutageConfig) -> Self {
        self.outage = Some(config);
        self
    }

    /// How long running reconciles may go on after a graceful shutdown began before they are
    /// dropped. Default 30 s. kube-runtime waits for them without a limit; `Duration::MAX` does
    /// too.
    #[must_use]
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// The controller's queue, named `name` (in metrics and spans), with these options.
    pub(super) fn queue<K>(&self, name: &str) -> WorkQueue<ObjectRef<K>>
    where
        K: Resource + 'static,
        K::DynamicType: Eq + Hash + Clone + Send + Sync,
    {
        let mut queue = WorkQueue::builder().name(name);
        if let Some(wait) = self.max_ready_wait {
            queue = queue.max_ready_wait(wait);
        }
        if self.fair_namespaces {
            queue = queue.fairness(|key: &ObjectRef<K>| key.namespace.clone());
        }
        if let Some(outage) = self.outage {
            queue = queue.outage_detection(outage);
        }
        queue.build()
    }

    /// `runner` with these options: the concurrency, the shutdown grace, the per-key backoff; no
    /// cancel grace (a controller's reconcile sees no cancellation: stopping one is dropping
    /// it) and no failure log (the stream reports every failure; the caller logs them, as
    /// kube-runtime's do).
    pub(super) fn runner<T, R, C, S, P>(
        &self,
        runner: Runner<T, R, C, S, P>,
    ) -> Runner<T, R, C, S, P>
    where
        R: Reconcile<T, C>,
    {
        let workers = match self.concurrency {
            0 => usize::MAX,
            n => usize::from(n),
        };
        runner
            .workers(workers)
            .shutdown_grace(self.shutdown_grace)
            .cancel_grace(Duration::ZERO)
            .failure_log(None)
            .per_key_backoff(self.per_key_backoff)
    }

    /// How a trigger's key is added: after the debounce, as a debounce (each later trigger
    /// moves the reconcile to its own time plus the debounce); at once without one.
    pub(super) fn trigger(&self, opts: AddOptions) -> AddOptions {
        if self.debounce.is_zero() {
            return opts;
        }
        opts.after(self.debounce).debounced(true)
    }
}
