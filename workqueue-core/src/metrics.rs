//! Queue metrics: client-go's names, labels and buckets, through the `metrics` facade.
//!
//! With the `metrics` feature (on by default), a *named* queue emits, labelled `name`:
//!
//! | metric | kind | what |
//! |---|---|---|
//! | [`DEPTH`] | gauge | keys that are dirty (queued, or re-added while processing), per `priority` |
//! | [`ADDS_TOTAL`] | counter | adds that made a key newly dirty (incl. due delayed keys) |
//! | [`QUEUE_DURATION_SECONDS`] | histogram | first add since the last get, to get |
//! | [`WORK_DURATION_SECONDS`] | histogram | get to finish |
//! | [`UNFINISHED_WORK_SECONDS`] | gauge | sum of the ages of the keys being processed |
//! | [`LONGEST_RUNNING_PROCESSOR_SECONDS`] | gauge | the oldest of those ages |
//! | [`RETRIES_TOTAL`] | counter | delayed and rate-limited adds (incl. delay 0) not rejected by shutdown |
//! | [`WAITING_DEPTH`] | gauge | keys waiting for their delay (not in client-go) |
//! | [`RATE_LIMITER_DELAY_SECONDS`] | histogram | delays the rate limiter chose (not in client-go) |
//! | [`OLDEST_READY_SECONDS`] | gauge | how long the longest-waiting queued key has waited (not in client-go) |
//!
//! [`DEPTH`] carries a second label, [`PRIORITY_LABEL`], as controller-runtime's priority queue
//! (its default queue since v0.23) does: the priority in decimal, `"0"` for every key of a queue
//! that uses no priorities. Summing over it gives client-go's depth, so dashboards that sum or
//! select by `name` keep working, and there is one series per priority, never a second unlabelled
//! one beside them. Cardinality is capped as controller-runtime caps it: the first
//! 25 distinct priorities get a value each (0 is always one of them, so a queue's
//! depth series exists from its first emission), and keys at any later one are counted under
//! [`EXCEEDED_CARDINALITY_LIMIT`]. Unlike controller-runtime, which moves *every* later
//! change of every priority to the overflow value (so the gauge of a priority seen earlier can
//! stay stuck high while the overflow goes negative), each series here stays exact: a priority that
//! has a value keeps it, and the overflow value is the number of keys at the other priorities.
//!
//! A queue records what its operations do in its own per-key timing, and sends it to the
//! recorder in batches: every 64 operations, at every refresh, and at shutdown. So a value can be
//! up to 64 operations or one refresh period (500 ms) behind the queue, far less than a scrape
//! interval, and a named queue costs what the recording costs, not a recorder call per
//! operation. Retries and rate-limiter delays are sent as they happen.
//!
//! The two "unfinished" gauges and the oldest-ready gauge are refreshed every 500 ms
//! by one process-wide thread, joined by a named queue when it is built and holding only weak
//! references to queues (a queue leaves it when it shuts down), so they stay fresh even when
//! every worker is stuck; call the queue's `refresh_metrics()` to flush and refresh at once
//! (tests on a `ManualClock` do). The thread is started on demand and exits when no named queue
//! is left; a process that wants no such thread drives `refresh_metrics()` itself and turns the
//! thread off with `Builder::metrics_refresh_thread(false)`.
//!
//! Each queue caches its handles for the recorder in effect. Every emission checks which recorder
//! that is (the lookup the `metrics` macros make) and registers new handles when it changed, so a
//! recorder installed after a queue was built still receives its metrics, while an emission to
//! an unchanged recorder builds no key and allocates nothing. (Recorders are told apart by
//! address: a local recorder dropped and replaced by another at the same address, while one queue
//! emits to both, keeps receiving the first one's handles.) An unnamed queue, or the feature off, emits nothing and keeps no
//! per-key timing. The library installs no exporter: the binary does (see the `prometheus`
//! example of `workqueue-tokio`, which sets [`DURATION_BUCKETS`] for the histograms).

/// The label that carries the queue's name.
pub const NAME_LABEL: &str = "name";
/// The label that carries the controller's name on a runner's queue (the queue's name), as
/// controller-runtime labels its queues' metrics.
pub const CONTROLLER_LABEL: &str = "controller";
/// The label of [`DEPTH`] that carries the keys' priority (controller-runtime).
pub const PRIORITY_LABEL: &str = "priority";
/// The [`PRIORITY_LABEL`] value for keys at priorities beyond the first 25 (controller-runtime's
/// value and cap).
pub const EXCEEDED_CARDINALITY_LIMIT: &str = "exceeded_cardinality_limit";
/// Gauge: current depth of the queue (client-go).
pub const DEPTH: &str = "workqueue_depth";
/// Counter: adds handled by the queue (client-go).
pub const ADDS_TOTAL: &str = "workqueue_adds_total";
/// Histogram: seconds a key stays in the queue before it is requested (client-go).
pub const QUEUE_DURATION_SECONDS: &str = "workqueue_queue_duration_seconds";
/// Histogram: seconds processing a key takes (client-go).
pub const WORK_DURATION_SECONDS: &str = "workqueue_work_duration_seconds";
/// Gauge: seconds of work in progress not yet observed by the work duration (client-go).
pub const UNFINISHED_WORK_SECONDS: &str = "workqueue_unfinished_work_seconds";
/// Gauge: seconds the longest-running processor has been running (client-go).
pub const LONGEST_RUNNING_PROCESSOR_SECONDS: &str = "workqueue_longest_running_processor_seconds";
/// Counter: retries handled by the queue (client-go).
pub const RETRIES_TOTAL: &str = "workqueue_retries_total";
/// Gauge: keys waiting for their delay (this crate).
pub const WAITING_DEPTH: &str = "workqueue_waiting_depth";
/// Histogram: delays chosen by the rate limiter, in seconds (this crate).
pub const RATE_LIMITER_DELAY_SECONDS: &str = "workqueue_rate_limiter_delay_seconds";
/// Gauge: seconds the longest-waiting queued key has waited since its first add after it was last
/// handed out, that is, the queue duration it would record if handed out now; 0 when no key is
/// queued (this crate). Refreshed with the "unfinished" gauges. A value that keeps growing beyond
/// the time a worker takes to reach the back of the queue means keys are starving: low priorities
/// under steady load without `max_ready_wait`, or too few workers.
pub const OLDEST_READY_SECONDS: &str = "workqueue_oldest_ready_seconds";
/// Gauge: keys parked by the outage detector (this crate; only with outage detection on), as of
/// the latest finished key.
pub const PARKED_KEYS: &str = "workqueue_parked_keys";
/// Counter: times the outage detector opened (this crate; only with outage detection on).
pub const OUTAGE_OPENINGS_TOTAL: &str = "workqueue_outage_openings_total";

/// Buckets for the queue and work durations ([`QUEUE_DURATION_SECONDS`] and
/// [`WORK_DURATION_SECONDS`]): controller-runtime's
/// `ExponentialBuckets(10e-9, 10, 12)`, 10 ns to 1000 s.
///
/// client-go's own provider (component-base) uses the first 10 (up to 10 s). We use
/// controller-runtime's because a controller's keys routinely wait, and its reconciles run,
/// longer than 10 s: low-priority keys behind a busy queue, aging limits of minutes, reconciles
/// that call slow APIs. Above the top bucket a histogram only counts, so client-go's buckets
/// would hide exactly the waits that matter. The 10 shared buckets have the same bounds, so a
/// client-go dashboard's `le` values all still exist.
pub const DURATION_BUCKETS: [f64; 12] = [
    1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0,
];
/// Buckets for [`RATE_LIMITER_DELAY_SECONDS`]: 1 ms to the default limiter's 1000 s cap.
pub const RATE_LIMITER_DELAY_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 1000.0,
];

#[cfg(feature = "metrics")]
pub(crate) use tuning::{FLUSH_EVERY, REFRESH_PERIOD};

/// The numbers the module docs give, as the code uses them (`FLUSH_EVERY` is also in the
/// unstable seam, for the tests of batching).
pub(crate) mod tuning {
    /// How often the process-wide refresher updates the "unfinished work" gauges, and sends what
    /// a queue's operations recorded since its last flush (the module docs' 500 ms).
    #[cfg(feature = "metrics")]
    pub const REFRESH_PERIOD: std::time::Duration = std::time::Duration::from_millis(500);

    /// A named queue sends what its operations recorded to the recorder every `FLUSH_EVERY`
    /// operations (the module docs' 64), at every refresh, and at shutdown: in batches, a named
    /// queue costs what recording into its own timing costs, not a recorder call per operation
    /// (ARCHITECTURE.md).
    pub const FLUSH_EVERY: u32 = 64;
}

#[cfg(feature = "metrics")]
pub(crate) use emit::{QueueMetrics, RefreshMetrics};

#[cfg(feature = "metrics")]
pub(crate) mod emit {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, Once, OnceLock, Weak};

    use parking_lot::Mutex as HandlesLock;
    use std::time::Duration;

    use metrics::{
        Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder, SharedString, Unit,
        describe_counter, describe_gauge, describe_histogram,
    };

    use super::*;
    use crate::state::QueueState;

    /// Something the refresher thread refreshes.
    pub(crate) trait RefreshMetrics: Send + Sync {
        fn refresh_metrics(&self);
    }

    /// A context the refresh runs in (a tokio queue enters its runtime to read its clock).
    type Context = Box<dyn Fn(&dyn Fn()) + Send + Sync>;

    /// What the `metrics` macros would pass as metadata from this module.
    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    /// One queue's handles, registered with one recorder.
    struct Handles {
        /// The address of the recorder they were registered with.
        recorder: usize,
        /// Whether they carry the `controller` label.
        controller: bool,
        adds: Counter,
        /// One gauge per priority value, registered when the value is first emitted.
        depth: Vec<(Option<i32>, Gauge)>,
        queue_duration: Histogram,
        work_duration: Histogram,
        waiting_depth: Gauge,
        retries: Counter,
        limiter_delay: Histogram,
        unfinished: Gauge,
        longest: Gauge,
        oldest_ready: Gauge,
    }

    /// The labels of every metric of queue `name`: `name`, and `controller` (the same value) for
    /// a runner's queue, as controller-runtime labels them.
    fn labels(name: &Arc<str>, controller: bool) -> Vec<Label> {
        let value = || SharedString::from(Arc::clone(name));
        let mut labels = vec![Label::new(NAME_LABEL, value())];
        if controller {
            labels.push(Label::new(CONTROLLER_LABEL, value()));
        }
        labels
    }

    fn recorder_id(r: &dyn Recorder) -> usize {
        (r as *const dyn Recorder).cast::<()>() as usize
    }

    impl Handles {
        fn register(r: &dyn Recorder, name: &Arc<str>, controller: bool) -> Self {
            let key = |metric: &'static str| Key::from_parts(metric, labels(name, controller));
            Handles {
                recorder: recorder_id(r),
                controller,
                adds: r.register_counter(&key(ADDS_TOTAL), &METADATA),
                depth: Vec::new(),
                queue_duration: r.register_histogram(&key(QUEUE_DURATION_SECONDS), &METADATA),
                work_duration: r.register_histogram(&key(WORK_DURATION_SECONDS), &METADATA),
                waiting_depth: r.register_gauge(&key(WAITING_DEPTH), &METADATA),
                retries: r.register_counter(&key(RETRIES_TOTAL), &METADATA),
                limiter_delay: r.register_histogram(&key(RATE_LIMITER_DELAY_SECONDS), &METADATA),
                unfinished: r.register_gauge(&key(UNFINISHED_WORK_SECONDS), &METADATA),
                longest: r.register_gauge(&key(LONGEST_RUNNING_PROCESSOR_SECONDS), &METADATA),
                oldest_ready: r.register_gauge(&key(OLDEST_READY_SECONDS), &METADATA),
            }
        }

        /// The depth gauge for `priority` (`None`: the overflow value), registered on first use.
        fn depth(&mut self, r: &dyn Recorder, name: &Arc<str>, priority: Option<i32>) -> &Gauge {
            let i = match self.depth.iter().position(|(p, _)| *p == priority) {
                Some(i) => i,
                None => {
                    let value = match priority {
                        Some(p) => SharedString::from(p.to_string()),
                        None => SharedString::const_str(EXCEEDED_CARDINALITY_LIMIT),
                    };
                    let mut labels = labels(name, self.controller);
                    labels.push(Label::new(PRIORITY_LABEL, value));
                    let gauge = r.register_gauge(&Key::from_parts(DEPTH, labels), &METADATA);
                    self.depth.push((priority, gauge));
                    self.depth.len() - 1
                }
            };
            &self.depth[i].1
        }
    }

    /// The metrics of one named queue.
    pub(crate) struct QueueMetrics {
        name: Arc<str>,
        /// Handles for the recorder the queue last emitted to (see the module documentation).
        handles: HandlesLock<Option<Handles>>,
        /// Handles were registered with a new recorder: the next emission sends every gauge,
        /// not only what changed.
        resend: AtomicBool,
        /// The queue belongs to a runner: its metrics carry the `controller` label too.
        controller: AtomicBool,
        id: u64,
        registered: AtomicBool,
        context: OnceLock<Context>,
    }

    fn describe() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            describe_gauge!(DEPTH, Unit::Count, "Current depth of workqueue");
            describe_counter!(
                ADDS_TOTAL,
                Unit::Count,
                "Total number of adds handled by workqueue"
            );
            describe_histogram!(
                QUEUE_DURATION_SECONDS,
                Unit::Seconds,
                "How long in seconds an item stays in workqueue before being requested"
            );
            describe_histogram!(
                WORK_DURATION_SECONDS,
                Unit::Seconds,
                "How long in seconds processing an item from workqueue takes"
            );
            describe_gauge!(
                UNFINISHED_WORK_SECONDS,
                Unit::Seconds,
                "How many seconds of work has been done that is in progress and hasn't been \
                 observed by work_duration. Large values indicate stuck threads. One can deduce \
                 the number of stuck threads by observing the rate at which this increases."
            );
            describe_gauge!(
                LONGEST_RUNNING_PROCESSOR_SECONDS,
                Unit::Seconds,
                "How many seconds has the longest running processor for workqueue been running"
            );
            describe_counter!(
                RETRIES_TOTAL,
                Unit::Count,
                "Total number of retries handled by workqueue"
            );
            describe_gauge!(
                WAITING_DEPTH,
                Unit::Count,
                "Current number of keys waiting for their delay in workqueue"
            );
            describe_histogram!(
                RATE_LIMITER_DELAY_SECONDS,
                Unit::Seconds,
                "Delays in seconds chosen by the workqueue's rate limiter"
            );
            describe_gauge!(
                OLDEST_READY_SECONDS,
                Unit::Seconds,
                "How many seconds the longest-waiting queued item of workqueue has waited"
            );
        });
    }

    impl QueueMetrics {
        pub(crate) fn new(name: Arc<str>) -> Self {
            static NEXT_ID: AtomicU64 = AtomicU64::new(0);
            QueueMetrics {
                name,
                handles: HandlesLock::new(None),
                resend: AtomicBool::new(false),
                controller: AtomicBool::new(false),
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                registered: AtomicBool::new(false),
                context: OnceLock::new(),
            }
        }

        /// Runs `f` with the handles for the recorder in effect, registering them if it changed.
        fn with_handles(&self, f: impl FnOnce(&mut Handles, &dyn Recorder)) {
            describe();
            metrics::with_recorder(|r| {
                let mut cache = self.handles.lock();
                let controller = self.controller.load(Ordering::Relaxed);
                let handles = match &mut *cache {
                    Some(h) if h.recorder == recorder_id(r) && h.controller == controller => h,
                    stale => {
                        self.resend.store(true, Ordering::Relaxed);
                        stale.insert(Handles::register(r, &self.name, controller))
                    }
                };
                f(handles, r);
            });
        }

        /// One operation happened: every [`FLUSH_EVERY`] operations, sends what changed (see
        /// [`QueueMetrics::flush`]). Called under the queue's lock.
        #[inline]
        pub(crate) fn emit<T, S>(&self, state: &mut QueueState<T, S>) {
            let Some(t) = state.timing_mut() else { return };
            t.unflushed += 1;
            if t.unflushed >= FLUSH_EVERY {
                self.flush(state);
            }
        }

        /// Sends what changed in `state` since the last flush: the adds, the depths that
        /// changed, the observations, and the waiting depth if it changed (every gauge after a
        /// recorder change). Called under the queue's lock (see `QueueCore::emit` for why).
        pub(crate) fn flush<T, S>(&self, state: &mut QueueState<T, S>) {
            let waiting = state.counts().waiting;
            let Some(t) = state.timing_mut() else { return };
            t.unflushed = 0;
            self.with_handles(|h, r| {
                // A plain load first: a swap is a locked instruction on every emission.
                let all = self.resend.load(Ordering::Relaxed)
                    && self.resend.swap(false, Ordering::Relaxed);
                let adds = t.take_adds();
                if adds > 0 {
                    h.adds.increment(adds);
                }
                t.take_changed_depths(all, |label, depth| {
                    h.depth(r, &self.name, label).set(depth as f64);
                });
                for d in t.drain_queue_latencies() {
                    h.queue_duration.record(d.as_secs_f64());
                }
                for d in t.drain_work_durations() {
                    h.work_duration.record(d.as_secs_f64());
                }
                if all || t.last_waiting != Some(waiting) {
                    t.last_waiting = Some(waiting);
                    h.waiting_depth.set(waiting as f64);
                }
            });
        }

        pub(crate) fn retry(&self) {
            self.with_handles(|h, _| h.retries.increment(1));
        }

        pub(crate) fn limiter_delay(&self, delay: Duration) {
            self.with_handles(|h, _| h.limiter_delay.record(delay.as_secs_f64()));
        }

        /// Sets the gauges the refresher keeps fresh.
        pub(crate) fn refresh(&self, total: Duration, longest: Duration, oldest_ready: Duration) {
            self.with_handles(|h, _| {
                h.unfinished.set(total.as_secs_f64());
                h.longest.set(longest.as_secs_f64());
                h.oldest_ready.set(oldest_ready.as_secs_f64());
            });
        }

        /// From now on, the queue's metrics carry the `controller` label as well (a runner's
        /// queue). The next emission registers them again with it.
        pub(crate) fn label_controller(&self) {
            self.controller.store(true, Ordering::Relaxed);
        }

        /// Runs `refresh` in the queue's refresh context, if it set one.
        pub(crate) fn in_context(&self, refresh: &dyn Fn()) {
            match self.context.get() {
                Some(ctx) => ctx(refresh),
                None => refresh(),
            }
        }

        pub(crate) fn set_context(&self, ctx: Context) {
            let _ = self.context.set(ctx);
        }

        /// Registers the queue with the refresher, once (never again after `deregister`).
        #[inline]
        pub(crate) fn register(&self, queue: impl FnOnce() -> Weak<dyn RefreshMetrics>) {
            if !self.registered.load(Ordering::Relaxed)
                && !self.registered.swap(true, Ordering::AcqRel)
            {
                registry::register(self.id, queue());
            }
        }

        pub(crate) fn deregister(&self) {
            self.registered.store(true, Ordering::Release);
            registry::deregister(self.id);
        }
    }

    impl std::fmt::Debug for QueueMetrics {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("QueueMetrics")
                .field("name", &self.name)
                .finish_non_exhaustive()
        }
    }

    /// How many named queues the process-wide refresher keeps fresh (a queue joins when it is
    /// built and leaves at shutdown, or when it is dropped). For tests (the unstable seam's
    /// `refreshed_queues`).
    pub fn refreshed_queues() -> usize {
        registry::len()
    }

    /// The process-wide refresher: a weak registry of named queues and the thread that refreshes
    /// them every [`REFRESH_PERIOD`]. The thread starts with the first registration and exits
    /// when no queue is left (the next registration starts a new one).
    mod registry {
        use super::*;

        struct Registry {
            queues: Vec<(u64, Weak<dyn RefreshMetrics>)>,
            running: bool,
        }

        static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
            queues: Vec::new(),
            running: false,
        });

        fn lock() -> std::sync::MutexGuard<'static, Registry> {
            REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
        }

        pub(super) fn register(id: u64, queue: Weak<dyn RefreshMetrics>) {
            let mut r = lock();
            r.queues.push((id, queue));
            if !r.running {
                r.running = std::thread::Builder::new()
                    .name("workqueue-metrics".into())
                    .spawn(run)
                    .is_ok();
            }
        }

        pub(super) fn deregister(id: u64) {
            lock().queues.retain(|(i, _)| *i != id);
        }

        pub(super) fn len() -> usize {
            let mut r = lock();
            r.queues.retain(|(_, q)| q.strong_count() > 0);
            r.queues.len()
        }

        fn run() {
            loop {
                std::thread::sleep(REFRESH_PERIOD);
                let live: Vec<Arc<dyn RefreshMetrics>> = {
                    let mut r = lock();
                    r.queues.retain(|(_, q)| q.strong_count() > 0);
                    if r.queues.is_empty() {
                        r.running = false;
                        return;
                    }
                    r.queues.iter().filter_map(|(_, q)| q.upgrade()).collect()
                };
                for queue in live {
                    // A queue's clock is user code: a panic must not stop the refresher.
                    let _ = catch_unwind(AssertUnwindSafe(|| queue.refresh_metrics()));
                }
            }
        }
    }
}
