//! The dispatcher: the task that polls a runner's stream (or awaits `Runner::run`). It reads
//! the runner's sources into the queue ([`super::feed`]), takes due keys from the queue while it
//! may, calls the user's reconcile function (here, so that it need not be `Send`) and hands each
//! future to the worker tasks as a job ([`super::workers`]); it judges failures with the user's
//! error policy (here too), and runs the one shutdown sequence.
//!
//! It is a loop over named steps: the ends that came back ([`Dispatcher::collect_ends`]), the
//! keys it may take now ([`Dispatcher::take_ready`]), the items these made, whether the run is
//! over ([`Dispatcher::is_over`]), and else a wait for the next [`Event`] and its handler.
//!
//! Invariants:
//! - a key is taken only while intake is open (the shutdown token is not cancelled and the run
//!   is not stopping), the readiness gate is open, and fewer than `limit` reconciles run or are
//!   held; a lease taken while the gate closed meanwhile is held, and dispatched only if all of
//!   that still holds when the gate opens (else it is put back);
//! - `running` counts the jobs pushed to the pool whose [`End`] has not come back: every job
//!   sends exactly one; there are at least as many workers as running jobs (up to the limit);
//! - the run ends only once `running` is 0 and nothing is held.

use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::hash::{BuildHasher, Hash};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::OptionFuture;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workqueue_core::Lease;

use super::catch::catch;
use super::engine::{End, Engine};
use super::feed::Sources;
use super::report::Report;
use super::workers::{self, Pool};
use super::{Action, Context, Error, Failure, Reconcile, Runner, Settings};

/// How long the dispatcher stops taking keys after the queue's `get` panicked (a key whose
/// `Clone` always panics would otherwise make it spin).
const GET_PANIC_PAUSE: Duration = Duration::from_millis(100);

/// One item of a runner's stream.
pub(super) type Item<T, E> = Result<(T, Action), Error<T, E>>;

/// Where the dispatcher is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Taking keys as they come due.
    Running,
    /// Every source ended (a stream that ends with its sources): keys due or waiting are still
    /// taken, re-adds are dropped, and the queue is shut down once it has nothing left.
    Draining,
    /// No key is taken any more; running reconciles finish (with a shutdown, within the
    /// graces).
    Stopping,
}

/// Where a shutdown is in its sequence: the reconciles running when it began may finish within
/// the shutdown grace; then their contexts are cancelled, and after the cancel grace their
/// futures are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shutdown {
    /// No shutdown (the run may still be stopping: its queue was shut down).
    None,
    /// Until the deadline: the shutdown grace, then the cancel grace.
    Grace(Option<Instant>),
    Cancelled(Option<Instant>),
    /// Futures dropped: the jobs end as interrupted.
    HardStopped,
}

/// What woke the dispatcher.
enum Event<T> {
    Ends,
    Shutdown,
    Gate(Result<(), watch::error::RecvError>),
    /// Sources were read; whether the last one ended.
    Source(bool),
    Worker(Option<Result<(), JoinError>>),
    Lease(std::thread::Result<Option<Lease<T>>>),
    Deadline,
}

pub(super) struct Dispatcher<T, R, C, S, P>
where
    R: Reconcile<T, C>,
{
    engine: Arc<Engine<T, R::Error, C, S>>,
    reconcile: R,
    policy: P,
    sources: Sources<T>,
    /// The last event was a read of the sources: the next wait reads them last.
    just_read: bool,
    pool: Arc<Pool>,
    /// The ends taken from the workers (empty between turns; kept for its buffer).
    inbox: Vec<End<T, R::Error, C>>,
    /// Jobs pushed in this turn (see [`super::workers`] for the wakes they get).
    turn_jobs: usize,
    /// The runtime's worker threads: how many workers can run at once.
    threads: usize,
    /// Whether the runtime is multi-threaded: a worker woken during a turn may start at once.
    multi_thread: bool,
    workers: JoinSet<()>,
    gate: Option<watch::Receiver<bool>>,
    /// The gate's sender is gone: its value no longer changes.
    gate_final: bool,
    phase: Phase,
    shutdown: Shutdown,
    running: usize,
    settings: Settings,
    held: Vec<Lease<T>>,
    /// Items for the stream, in the order they came.
    items: VecDeque<Item<T, R::Error>>,
    /// Until when intake pauses after a panicking `get`.
    get_paused: Option<Instant>,
    /// The queue was found shut down and empty while reconciles ran: `get` is not awaited again
    /// until one ends (its finish may queue its key again: a key added while it ran).
    queue_empty: bool,
    worker_panics: u64,
    ended: bool,
    /// Marks intake closed as soon as the shutdown token is cancelled.
    intake_watcher: Option<tokio_util::task::AbortOnDropHandle<()>>,
}

impl<T, R, C, S, P> Dispatcher<T, R, C, S, P>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Reconcile<T, C>,
    P: FnMut(&T, &Failure<R::Error>, &Context<C>) -> Action,
{
    /// The dispatcher of `runner`'s run; `items`: whether it yields items (and ends with its
    /// sources).
    pub(super) fn new(
        runner: Runner<T, R, C, S, P>,
        shutdown: CancellationToken,
        items: bool,
    ) -> Self {
        let Runner {
            queue,
            reconcile,
            policy,
            context,
            sources,
            gate,
            settings,
            rules,
        } = runner;
        let names = sources.iter().map(|s| s.name().clone()).collect();
        let engine = Engine::new(queue, context, settings, rules, shutdown, items, names);
        Dispatcher {
            engine: Arc::new(engine),
            reconcile,
            policy,
            sources: Sources::new(sources),
            just_read: false,
            pool: Arc::new(Pool::default()),
            inbox: Vec::new(),
            turn_jobs: 0,
            threads: 1,
            multi_thread: false,
            workers: JoinSet::new(),
            gate,
            gate_final: false,
            phase: Phase::Running,
            shutdown: Shutdown::None,
            running: 0,
            settings,
            held: Vec::new(),
            items: VecDeque::new(),
            get_paused: None,
            queue_empty: false,
            worker_panics: 0,
            ended: false,
            intake_watcher: None,
        }
    }

    /// The next item; `None` once the run is over. In a run without items (`Runner::run`), it
    /// returns `None` only then.
    pub(super) async fn next(&mut self) -> Option<Item<T, R::Error>> {
        if self.ended {
            return None;
        }
        self.start();
        loop {
            // The ends first (they free slots), then new work, and only then the items: the
            // workers get their next jobs before the consumer gets its results.
            self.collect_ends();
            self.take_ready();
            // The turn's first job was woken as it was pushed on a multi-thread runtime.
            let pushed = std::mem::take(&mut self.turn_jobs);
            let unwoken = pushed - usize::from(self.multi_thread && pushed > 0);
            self.pool.end_turn(unwoken, self.threads);
            if let Some(item) = self.items.pop_front() {
                return Some(item);
            }
            if self.is_over() {
                self.end().await;
                return None;
            }
            let event = self.wait().await;
            self.handle(event);
        }
    }

    /// What the run did (once it is over).
    pub(super) fn report(&self) -> Report {
        let queue = self.engine.queue();
        let outage = (
            queue.parked_len(),
            queue.parked_dropped_at_shutdown(),
            queue.core.outage_openings(),
        );
        self.engine
            .counters()
            .report(queue.len(), self.worker_panics, outage)
    }

    /// Starts the metrics and the intake watcher (at the first poll: nothing runs before).
    fn start(&mut self) {
        if self.intake_watcher.is_some() || self.ended {
            return;
        }
        let limit = self.settings.workers;
        let metrics_limit = if limit == usize::MAX { 0 } else { limit };
        if let Err(message) = catch(|| self.engine.metrics().start(metrics_limit)) {
            tracing::error!(panic = %message, "the metrics recorder panicked; the runner goes on");
        }
        self.intake_watcher = Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
            self.engine.intake_watcher(),
        )));
        let runtime = tokio::runtime::Handle::current();
        self.threads = runtime.metrics().num_workers().max(1);
        self.multi_thread = runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
    }

    /// Starts workers until there are as many as running jobs (see [`super::workers`]).
    fn staff(&mut self) {
        while !self.ended && self.workers.len() < self.running {
            let ends = self.engine.ends().clone();
            self.workers.spawn(workers::worker(self.pool.clone(), ends));
        }
    }

    // ---- the steps ------------------------------------------------------------------------------

    /// Handles the ends that came back (failures go to the error policy); their items wait in
    /// `items`.
    fn collect_ends(&mut self) {
        self.engine.ends().take(&mut self.inbox);
        let mut inbox = std::mem::take(&mut self.inbox);
        for end in inbox.drain(..) {
            self.running -= 1;
            self.queue_empty = false;
            let item = match end {
                End::Finished(item) => item.map(Ok),
                End::Failed(failed) => self.engine.judge(*failed, &mut self.policy),
            };
            self.items.extend(item);
        }
        self.inbox = inbox;
    }

    /// Takes the keys it may now (held ones first), and hands their jobs to the workers. A key
    /// that failed before its reconcile could start leaves its item in `items`.
    fn take_ready(&mut self) {
        while self.may_take() {
            let lease = match self.held.pop() {
                Some(lease) => lease,
                None => match catch(|| self.engine.queue().try_get()) {
                    Ok(Some(lease)) => lease,
                    Ok(None) => break,
                    Err(message) => {
                        self.get_panicked(&message);
                        break;
                    }
                },
            };
            if let Some(item) = self.dispatch(lease) {
                self.items.push_back(item);
            }
        }
    }

    /// Whether the run is over: stopping, with nothing running or held. A run that ends with its
    /// sources shuts its queue down once that has nothing left (the queue's end then stops it).
    fn is_over(&mut self) -> bool {
        if self.phase == Phase::Draining && self.running == 0 && self.held.is_empty() {
            let counts = self.engine.queue().counts();
            if counts.ready == 0 && counts.waiting == 0 && counts.processing == 0 {
                self.engine.queue().shut_down();
            }
        }
        self.phase == Phase::Stopping && self.running == 0 && self.held.is_empty()
    }

    /// Waits for the next event.
    async fn wait(&mut self) -> Event<T> {
        let take = self.may_take();
        let deadline = self.deadline();
        let watch_shutdown = matches!(self.shutdown, Shutdown::None);
        let watch_gate = self.gate.is_some() && !self.gate_final;
        // Sources are read while intake is open: first (a read is cheap when nothing is ready,
        // and at most one batch a source when something is), but last right after a read, so
        // that sources always ready hold back no other event, and no other event them.
        let read = self.sources.open() && !self.engine.intake_closed();
        let Dispatcher {
            engine,
            gate,
            sources,
            workers,
            just_read,
            ..
        } = self;
        let (read_first, read_last) = match (read, *just_read) {
            (false, _) => (None, None),
            (true, false) => (Some(sources), None),
            (true, true) => (None, Some(sources)),
        };
        let ends = engine.ends();
        tokio::select! {
            biased;
            Some(last) = OptionFuture::from(read_first.map(|s| s.feed(engine))) => Event::Source(last),
            () = poll_fn(|cx| ends.poll_ready(cx)) => Event::Ends,
            () = engine.intake().cancelled(), if watch_shutdown => Event::Shutdown,
            Some(changed) = OptionFuture::from(gate.as_mut().map(|g| g.changed())), if watch_gate => {
                Event::Gate(changed)
            }
            joined = workers.join_next(), if !workers.is_empty() => Event::Worker(joined),
            got = AssertUnwindSafe(engine.queue().get()).catch_unwind(), if take => Event::Lease(got),
            Some(()) = OptionFuture::from(deadline.map(tokio::time::sleep_until)) => Event::Deadline,
            Some(last) = OptionFuture::from(read_last.map(|s| s.feed(engine))) => Event::Source(last),
        }
    }

    /// Handles an event; an item it makes waits in `items`.
    fn handle(&mut self, event: Event<T>) {
        self.just_read = matches!(event, Event::Source(_));
        let item = match event {
            Event::Ends => None,
            Event::Shutdown => {
                self.on_shutdown();
                None
            }
            Event::Gate(changed) => self.on_gate(changed),
            Event::Source(last) => {
                self.on_source(last);
                None
            }
            Event::Worker(joined) => {
                self.on_worker(joined);
                None
            }
            Event::Lease(got) => self.on_lease(got),
            Event::Deadline => {
                self.on_deadline();
                None
            }
        };
        self.items.extend(item);
    }

    // ---- the handlers ---------------------------------------------------------------------------

    /// Starts a reconcile of `lease`'s key, unless the key no longer belongs here or intake
    /// stopped. An item when it failed before it could start.
    fn dispatch(&mut self, lease: Lease<T>) -> Option<Item<T, R::Error>> {
        if !self.engine.belongs(lease.key()) {
            self.engine.discard(lease);
            return None;
        }
        if self.engine.intake_closed() {
            // Shutdown began on another thread since `may_take`: no reconcile starts after it.
            self.engine.put_back(lease);
            return None;
        }
        let reconcile = &mut self.reconcile;
        match self
            .engine
            .start(lease, |key, ctx| reconcile.reconcile(key, ctx))
        {
            Ok(job) => {
                // On a current-thread runtime no worker starts while this turn goes on.
                let wake = self.multi_thread && self.turn_jobs == 0;
                self.pool.push(job, wake);
                self.turn_jobs += 1;
                self.running += 1;
                self.staff();
                None
            }
            Err(failed) => self.engine.judge(*failed, &mut self.policy),
        }
    }

    fn on_shutdown(&mut self) {
        self.engine.close_intake();
        self.begin_stopping();
        self.shutdown = Shutdown::Grace(Instant::now().checked_add(self.settings.shutdown_grace));
    }

    /// The gate changed, or its sender went. A gate closed for good before it opened ends the
    /// run, with an error item.
    fn on_gate(
        &mut self,
        changed: Result<(), watch::error::RecvError>,
    ) -> Option<Item<T, R::Error>> {
        if changed.is_ok() {
            return None;
        }
        self.gate_final = true;
        if self.gate_open() || self.phase == Phase::Stopping {
            return None;
        }
        tracing::error!("the readiness gate's sender was dropped before it opened; the run ends");
        self.begin_stopping();
        Some(Err(Error::Readiness))
    }

    /// Sources were read into the queue; `last`: the last of them ended.
    fn on_source(&mut self, last: bool) {
        // A stream of items ends with its sources.
        if last && self.engine.yields_items() && self.phase == Phase::Running {
            self.phase = Phase::Draining;
            self.engine.drain();
        }
    }

    fn on_worker(&mut self, joined: Option<Result<(), JoinError>>) {
        // Jobs catch the panics of user code; this is defence in depth.
        if let Some(Err(error)) = joined {
            self.worker_panics += 1;
            tracing::error!(%error, "a worker task failed; starting another");
            self.staff();
        }
    }

    /// A key came due while the dispatcher waited: it starts now if it still may, is held while
    /// the gate is closed, and is put back once the run is stopping.
    fn on_lease(
        &mut self,
        got: std::thread::Result<Option<Lease<T>>>,
    ) -> Option<Item<T, R::Error>> {
        match got {
            Ok(Some(lease)) if self.may_take() => self.dispatch(lease),
            Ok(Some(lease)) if self.phase == Phase::Stopping || self.engine.intake_closed() => {
                self.engine.put_back(lease);
                None
            }
            Ok(Some(lease)) => {
                self.held.push(lease);
                None
            }
            Ok(None) if self.running > 0 => {
                // Shut down and empty, but a reconcile that ends may queue its key again.
                self.queue_empty = true;
                None
            }
            Ok(None) => {
                // The queue was shut down and is empty, and nothing runs: the run ends.
                self.begin_stopping();
                None
            }
            Err(payload) => {
                self.get_panicked(&workqueue_core::panic_message(&*payload));
                None
            }
        }
    }

    /// A deadline passed: the end of a pause after a panicking `get`, or the next step of a
    /// shutdown.
    fn on_deadline(&mut self) {
        let now = Instant::now();
        if self.get_paused.is_some_and(|until| until <= now) {
            self.get_paused = None;
        }
        match self.shutdown {
            Shutdown::Grace(Some(at)) if at <= now => {
                self.engine.abort();
                self.shutdown = Shutdown::Cancelled(now.checked_add(self.settings.cancel_grace));
            }
            Shutdown::Cancelled(Some(at)) if at <= now => {
                if self.running > 0 {
                    tracing::warn!(
                        running = self.running,
                        "reconciles still running after the shutdown and cancel graces are dropped"
                    );
                }
                self.engine.hard_stop();
                self.shutdown = Shutdown::HardStopped;
            }
            _ => {}
        }
    }

    // ---- helpers --------------------------------------------------------------------------------

    fn begin_stopping(&mut self) {
        self.phase = Phase::Stopping;
        for lease in std::mem::take(&mut self.held) {
            self.engine.put_back(lease);
        }
    }

    fn get_panicked(&mut self, message: &str) {
        self.engine.get_panicked(message);
        self.get_paused = Instant::now().checked_add(GET_PANIC_PAUSE);
    }

    fn gate_open(&self) -> bool {
        self.gate.as_ref().is_none_or(|gate| *gate.borrow())
    }

    /// Whether a key may be taken now.
    fn may_take(&self) -> bool {
        self.phase != Phase::Stopping
            && !self.queue_empty
            && self.get_paused.is_none()
            && self.running + self.held.len() < self.settings.workers
            && self.gate_open()
            && !self.engine.intake_closed()
    }

    /// The next deadline: the end of a `get` pause, or the next step of a shutdown while
    /// reconciles still run.
    fn deadline(&self) -> Option<Instant> {
        let step = match self.shutdown {
            Shutdown::Grace(at) | Shutdown::Cancelled(at) if self.running > 0 => at,
            _ => None,
        };
        match (self.get_paused, step) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Ends the run: drops the sources, stops the workers and waits for them.
    async fn end(&mut self) {
        self.ended = true;
        self.intake_watcher = None;
        self.sources.close();
        self.pool.close();
        while let Some(joined) = self.workers.join_next().await {
            if let Err(error) = joined {
                self.worker_panics += 1;
                tracing::error!(%error, "a worker task failed during shutdown");
            }
        }
    }
}

/// A dropped dispatcher (a stream dropped before it ended): running reconciles are dropped at
/// their next poll, jobs not yet taken with the pool; the sources are dropped, and workers
/// aborted with their task set. Their leases end as dropped or interrupted leases do.
impl<T, R, C, S, P> Drop for Dispatcher<T, R, C, S, P>
where
    R: Reconcile<T, C>,
{
    fn drop(&mut self) {
        self.engine.hard_stop();
        self.pool.close();
        self.sources.close();
    }
}

impl<T, R, C, S, P> fmt::Debug for Dispatcher<T, R, C, S, P>
where
    R: Reconcile<T, C>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("phase", &self.phase)
            .field("running", &self.running)
            .field("limit", &self.settings.workers)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::WorkQueue;
    use crate::runner::Runner;

    /// The interleaving a multi-thread runtime allows: a key is leased as the gate closes (on
    /// another thread), so its lease is held; then shutdown begins, then the gate opens. The held
    /// lease is put back, and its reconcile never starts: nothing starts once shutdown began.
    #[tokio::test(start_paused = true)]
    async fn a_held_lease_never_starts_once_shutdown_began() {
        let queue: WorkQueue<&'static str> = WorkQueue::new();
        let (gate_tx, gate) = watch::channel(true);
        let started = Arc::new(AtomicU32::new(0));
        let reconcile = {
            let started = started.clone();
            move |_key: &'static str, _ctx: Context| {
                started.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, ()>(Action::await_change()) }
            }
        };
        let shutdown = CancellationToken::new();
        let runner = Runner::new(queue.clone(), reconcile).readiness(gate);
        let mut dispatcher = Dispatcher::new(runner, shutdown.clone(), true);
        dispatcher.start();
        queue.add("a");
        let lease = queue.try_get().expect("a is due");
        gate_tx.send_replace(false);
        dispatcher.handle(Event::Lease(Ok(Some(lease))));
        assert_eq!(dispatcher.held.len(), 1, "leased as the gate closed: held");
        shutdown.cancel();
        dispatcher.handle(Event::Shutdown);
        gate_tx.send_replace(true);
        let next = tokio::time::timeout(Duration::from_secs(60), dispatcher.next()).await;
        assert!(matches!(next, Ok(None)), "the run ends");
        assert_eq!(started.load(Ordering::SeqCst), 0, "no reconcile started");
        assert_eq!(queue.len(), 1, "the held key was put back");
    }
}
