//! Where reconciles run: the dispatcher (the task that polls the runner's stream) makes each
//! reconcile's future and hands it over as a job; poller tasks give each job its first poll, and
//! a job that has to wait goes on as a task of its own. Each job sends one end back
//! ([`Ends`]).
//!
//! Why pollers: the dispatcher calls the user's reconcile function (it need not be `Send`), so it
//! must never be the one that polls a reconcile's future: a reconcile that computes before its
//! first `.await` would hold every key behind it. Why not a task per reconcile: most reconciles
//! of a level-triggered controller find their object as it should be and return at their first
//! poll; a poller finishes those without the cost of a task (a spawn, and the wake-up of an idle
//! runtime thread for each, which is most of what a task costs).
//!
//! How many pollers work at once:
//! - jobs wake a poller only when none is at work (or those at work are each in a first poll
//!   that has run for more than [`STALL`]): one poller takes a batch after another, and the
//!   common case (first polls that return at once) keeps one thread besides the dispatcher's
//!   busy, without waking others;
//! - while jobs wait, a [`watch`] thread looks every [`TICK`]: if no first poll finished since
//!   its last look (or each poller at work is in one that has run for more than [`STALL`]), the
//!   pollers at work are stalled (a reconcile computing before its first `.await`), and it
//!   spawns a helper, a poller that takes the waiting jobs and ends when there are none. A
//!   stalled poller so holds only its own job, for about a tick before help comes. The watch is
//!   a thread of its own, and the helper a new task rather than an idle poller woken: a task of
//!   the runtime's may wait in the stalled thread's queue (tokio moves tasks to a worker's own
//!   queue, where another takes them only if it is awake), while a task spawned from outside
//!   the worker threads wakes an idle one; and tokio's timers fire only when a worker thread
//!   parks on the runtime's driver. It sleeps while no job waits.
//!
//! A poller that is a task of the same runtime's worker threads as the dispatcher wakes it only
//! when it runs out of jobs, and then waits itself: tokio runs a task woken from a worker thread
//! next on that thread, where no other thread may take it, so a poller that went on to a long
//! poll right after a wake would hold the dispatcher. A dispatcher outside the worker threads (a
//! stream polled by `block_on`, as under `#[tokio::main]`) is woken as ends come.
//!
//! Waiting for the other side of a hand-off is a syscall and the other thread's wake-up, which
//! costs more than a first poll: a poller that runs out of jobs while the dispatcher is at work,
//! and a dispatcher outside the worker threads while first polls are due, spin for up to
//! [`SPIN`] first (giving the CPU away between looks), which in a busy runner is enough for the
//! other's next hand-off. Neither spins while a poller or a helper is stalled ([`Jobs::stalled`]): the
//! stalled poller holds a CPU, so the spinner may well share the CPU left with the thread it
//! waits for, and giving it away between looks hands it to any other runnable thread, often for
//! a whole scheduler tick (a millisecond), during which nothing is handed out; waiting instead,
//! each side is woken by the other's hand-off.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::catch;

/// A reconcile's whole life after its future was made: drive it, judge it, finish its lease, send
/// its end.
pub(crate) type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How often the [`watch`] looks for stalled pollers while jobs wait: short, since the jobs
/// behind a stalled poller wait up to a tick for help; a look is a lock and a few loads, and the
/// watch sleeps while no job waits.
const TICK: Duration = Duration::from_micros(250);

/// How long a first poll runs before its poller counts as stalled (a first poll that returns at
/// once takes a few microseconds): jobs handed out then wake another poller, and so does the
/// [`watch`].
const STALL: Duration = Duration::from_micros(100);

/// How long a poller (while the dispatcher is at work), or a dispatcher outside the worker
/// threads, spins for the other's next hand-off before it waits (see the module docs). A first
/// poll that returns at once, or the making of a job, takes a few microseconds.
const SPIN: Duration = Duration::from_micros(50);

/// Spins until `ready` or [`SPIN`] has passed; whether `ready` became true. It gives its CPU to
/// another thread between looks (`sched_yield`), so that when the other side of the hand-off
/// runs on the same CPU (a busy machine, or a poller stalled on the other), the spin lets it
/// make progress instead of burning its time.
pub(crate) fn spin_until(mut ready: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        for _ in 0..32 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN {
            return ready();
        }
        std::thread::yield_now();
    }
}

/// The jobs not yet given their first poll, and the pollers waiting for one.
pub(crate) struct Jobs {
    state: Mutex<JobsState>,
    /// Where the [`watch`] waits while no job waits.
    queued_again: Condvar,
    /// How many jobs wait (written under the lock; read without it to spin).
    queued: AtomicUsize,
    /// Whether the dispatcher is at work (not waiting, not handing an item to its consumer):
    /// more jobs may come any moment, and an idle poller spins for them.
    dispatching: AtomicBool,
    /// First polls finished so far (what the dispatcher compares between its looks).
    progress: AtomicU64,
    /// Where [`Busy`] times count from.
    epoch: std::time::Instant,
}

struct JobsState {
    queue: VecDeque<Job>,
    idle: Vec<Waker>,
    /// How many pollers there are (all idle: `idle.len() == pollers`).
    pollers: usize,
    /// For each poller of a multi-thread runtime: when its current first poll began.
    busy: Vec<Arc<Busy>>,
    /// For each helper alive: when its current first poll began (helpers are not pollers: they
    /// count only for [`Jobs::stalled`]).
    helping: Vec<Arc<Busy>>,
    /// Whether the [`watch`] waits on `queued_again`.
    watch_waits: bool,
    closed: bool,
}

/// What the watch found.
enum Look {
    /// No job waits.
    Idle,
    /// Jobs wait, and pollers at work make progress.
    Busy,
    /// Jobs wait, and the pollers at work are stalled.
    Stalled,
}

/// When a poller's current first poll began (nanoseconds since [`Jobs::epoch`], at least 1), or 0
/// between polls.
#[derive(Default)]
pub(crate) struct Busy(AtomicU64);

impl Jobs {
    pub(crate) fn new() -> Self {
        Jobs {
            state: Mutex::new(JobsState {
                queue: VecDeque::new(),
                idle: Vec::new(),
                pollers: 0,
                busy: Vec::new(),
                helping: Vec::new(),
                watch_waits: false,
                closed: false,
            }),
            queued_again: Condvar::new(),
            queued: AtomicUsize::new(0),
            dispatching: AtomicBool::new(false),
            progress: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        }
    }

    /// Nanoseconds since [`Jobs::epoch`], at least 1.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn lock(&self) -> MutexGuard<'_, JobsState> {
        self.state.lock()
    }

    /// Counts a poller (before it first waits); `timed`: it publishes when its first polls
    /// begin (a multi-thread runtime, where another may help it), through what this returns.
    pub(crate) fn add_poller(&self, timed: bool) -> Option<Arc<Busy>> {
        let mut state = self.lock();
        state.pollers += 1;
        timed.then(|| {
            let busy = Arc::new(Busy::default());
            state.busy.push(busy.clone());
            busy
        })
    }

    /// Uncounts a poller that died.
    pub(crate) fn remove_poller(&self) {
        let mut state = self.lock();
        state.pollers = state.pollers.saturating_sub(1);
    }

    /// Queues `batch` (emptying it), and wakes a poller if none is at work.
    pub(crate) fn push(&self, batch: &mut Vec<Job>) {
        if batch.is_empty() {
            return;
        }
        let poller = {
            let mut state = self.lock();
            state.queue.extend(batch.drain(..));
            self.queued.store(state.queue.len(), Ordering::Relaxed);
            if state.watch_waits {
                state.watch_waits = false;
                self.queued_again.notify_one();
            }
            if !state.idle.is_empty() && !self.at_work(&state) {
                state.idle.pop()
            } else {
                None
            }
        };
        if let Some(poller) = poller {
            poller.wake();
        }
    }

    /// Whether the dispatcher is at work (see [`Jobs::dispatching`]).
    pub(crate) fn set_dispatching(&self, at_work: bool) {
        self.dispatching.store(at_work, Ordering::Relaxed);
    }

    /// The next job, waiting for one; `None` once closed.
    async fn pop(&self) -> Option<Job> {
        poll_fn(|cx| {
            let mut state = self.lock();
            if let Some(job) = state.queue.pop_front() {
                self.queued.store(state.queue.len(), Ordering::Relaxed);
                return Poll::Ready(Some(job));
            }
            if state.closed {
                return Poll::Ready(None);
            }
            if !state.idle.iter().any(|w| w.will_wake(cx.waker())) {
                state.idle.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// The next job if one is queued (without waiting).
    fn try_pop(&self) -> Option<Job> {
        if self.queued.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut state = self.lock();
        let job = state.queue.pop_front();
        self.queued.store(state.queue.len(), Ordering::Relaxed);
        job
    }

    /// Whether a poller is at work that is not stalled: awake, and not in a first poll that has
    /// run for more than [`STALL`].
    fn at_work(&self, state: &JobsState) -> bool {
        let awake = state.pollers.saturating_sub(state.idle.len());
        awake > 0 && awake > self.stalled_pollers(state)
    }

    /// Whether a poller or a helper is in a first poll that has run for more than [`STALL`]:
    /// then the dispatcher and the pollers do not spin (see the module docs).
    pub(crate) fn stalled(&self) -> bool {
        let state = self.lock();
        self.stalled_in(&state.busy) + self.stalled_in(&state.helping) > 0
    }

    /// How many pollers are in a first poll that has run for more than [`STALL`].
    fn stalled_pollers(&self, state: &JobsState) -> usize {
        self.stalled_in(&state.busy)
    }

    /// How many of `busy` are in a first poll that has run for more than [`STALL`].
    fn stalled_in(&self, busy: &[Arc<Busy>]) -> usize {
        let now = self.now();
        let stall = u64::try_from(STALL.as_nanos()).unwrap_or(u64::MAX);
        busy.iter()
            .map(|b| b.0.load(Ordering::Relaxed))
            .filter(|&began| began != 0 && now.saturating_sub(began) > stall)
            .count()
    }

    /// Waits (the watch's thread) until a job waits; `false` once closed.
    fn until_queued(&self) -> bool {
        let mut state = self.lock();
        loop {
            if state.closed {
                return false;
            }
            if !state.queue.is_empty() {
                return true;
            }
            state.watch_waits = true;
            self.queued_again.wait(&mut state);
        }
    }

    /// The watch's look: whether jobs still wait, and if so, whether the pollers at work are
    /// stalled: none finished a first poll since the last look (`last`, updated), or each is in
    /// one that has run for more than [`STALL`].
    fn look(&self, last: &mut u64) -> Look {
        let progress = self.progress.load(Ordering::Relaxed);
        let moved = std::mem::replace(last, progress) != progress;
        let state = self.lock();
        if state.queue.is_empty() {
            Look::Idle
        } else if !moved || !self.at_work(&state) {
            Look::Stalled
        } else {
            Look::Busy
        }
    }

    /// First polls finished so far.
    pub(crate) fn progress(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// No more jobs: the pollers end, and the jobs not yet polled are dropped (their leases end
    /// as dropped leases do; their ends are sent by their guards).
    pub(crate) fn close(&self) {
        let (jobs, idle) = {
            let mut state = self.lock();
            state.closed = true;
            self.queued_again.notify_all();
            self.queued.store(0, Ordering::Relaxed);
            (
                std::mem::take(&mut state.queue),
                std::mem::take(&mut state.idle),
            )
        };
        drop(jobs);
        for waker in idle {
            waker.wake();
        }
    }
}

/// A poller: gives each job its first poll; one that is not finished then goes on as a task.
/// `spin`: spin for the dispatcher's next batch before waiting (a multi-thread runtime).
/// `busy`: where it publishes when its first polls begin (see [`Jobs::add_poller`]).
pub(crate) async fn poller(
    jobs: Arc<Jobs>,
    ends: Arc<dyn Flush>,
    spin: bool,
    busy: Option<Arc<Busy>>,
) {
    loop {
        let job = match jobs.try_pop() {
            Some(job) => job,
            None => {
                // Out of jobs: what ended meanwhile goes to the dispatcher (which may be waiting
                // for those ends to hand out more) as this poller waits.
                ends.flush();
                if spin
                    && !jobs.stalled()
                    && spin_until(|| {
                        jobs.queued.load(Ordering::Relaxed) > 0
                            || !jobs.dispatching.load(Ordering::Relaxed)
                    })
                    && jobs.queued.load(Ordering::Relaxed) > 0
                {
                    continue;
                }
                match jobs.pop().await {
                    Some(job) => job,
                    None => return,
                }
            }
        };
        if let Some(busy) = &busy {
            busy.0.store(jobs.now(), Ordering::Relaxed);
        }
        first_poll(job);
        if let Some(busy) = &busy {
            busy.0.store(0, Ordering::Relaxed);
        }
        jobs.progress.fetch_add(1, Ordering::Relaxed);
    }
}

/// Starts the watch: a thread that looks every [`TICK`] while jobs wait, and spawns a helper on
/// `runtime` when the pollers at work are stalled (see the module docs). It ends once the jobs
/// are closed.
pub(crate) fn watch(jobs: Arc<Jobs>, ends: Arc<dyn Flush>, runtime: tokio::runtime::Handle) {
    let spawned = std::thread::Builder::new()
        .name("workqueue-watch".into())
        .spawn(move || {
            let mut last = jobs.progress();
            while jobs.until_queued() {
                loop {
                    std::thread::sleep(TICK);
                    match jobs.look(&mut last) {
                        Look::Idle => break,
                        Look::Busy => {}
                        Look::Stalled => {
                            drop(runtime.spawn(helper(jobs.clone(), ends.clone())));
                        }
                    }
                }
            }
        });
    if let Err(error) = spawned {
        // The runner still runs: a stalled poller then holds the jobs behind it until it ends.
        tracing::error!(%error, "the runner's watch thread could not start");
    }
}

/// A helper: a poller for as long as jobs wait (see [`watch`]).
async fn helper(jobs: Arc<Jobs>, ends: Arc<dyn Flush>) {
    // It publishes its first polls' starts as pollers do, so that a stall in a helper also stops
    // the spinning (see the module docs).
    let busy = Arc::new(Busy::default());
    jobs.lock().helping.push(busy.clone());
    while let Some(job) = jobs.try_pop() {
        busy.0.store(jobs.now(), Ordering::Relaxed);
        first_poll(job);
        busy.0.store(0, Ordering::Relaxed);
        jobs.progress.fetch_add(1, Ordering::Relaxed);
    }
    jobs.lock().helping.retain(|b| !Arc::ptr_eq(b, &busy));
    ends.flush();
}

/// Polls a job once; spawns it if it has to wait.
fn first_poll(mut job: Job) {
    // A waker that does nothing is enough: a job that is not finished is spawned, and the task's
    // first poll registers its wake-ups again.
    let mut cx = Context::from_waker(Waker::noop());
    match catch(|| job.as_mut().poll(&mut cx)) {
        Ok(Poll::Ready(())) => {}
        Ok(Poll::Pending) => drop(tokio::spawn(job)),
        Err(message) => {
            // A job catches every panic of user code; this is defence in depth. The job is
            // dropped (never polled after a panic): its guard sends its end.
            tracing::error!(panic = %message, "a reconcile's job panicked");
        }
    }
}

/// What a poller needs of the ends: sending what piled up before it waits.
pub(crate) trait Flush: Send + Sync {
    fn flush(&self);
}

/// The channel of ends from the jobs to the dispatcher. An end from a job's first poll does not
/// wake the dispatcher: the poller flushes when it runs out of jobs (see the module docs); one
/// from a task (a reconcile that waited) does.
pub(crate) struct Ends<M> {
    state: Mutex<EndsState<M>>,
    /// How many ends wait (written under the lock; read without it to spin).
    queued: AtomicUsize,
    /// Whether an end from a first poll wakes a waiting dispatcher at once: only for a
    /// dispatcher outside the runtime's worker threads (see the module docs).
    eager: AtomicBool,
}

struct EndsState<M> {
    queue: VecDeque<M>,
    /// The dispatcher's waker, while it waits.
    waker: Option<Waker>,
}

impl<M> Ends<M> {
    pub(crate) fn new() -> Self {
        Ends {
            state: Mutex::new(EndsState {
                queue: VecDeque::new(),
                waker: None,
            }),
            queued: AtomicUsize::new(0),
            eager: AtomicBool::new(false),
        }
    }

    /// Whether ends from first polls wake the dispatcher at once (see [`Ends::eager`]).
    pub(crate) fn set_eager(&self, eager: bool) {
        self.eager.store(eager, Ordering::Relaxed);
    }

    /// Whether ends wait (without the lock: for spinning).
    pub(crate) fn any(&self) -> bool {
        self.queued.load(Ordering::Relaxed) > 0
    }

    fn lock(&self) -> MutexGuard<'_, EndsState<M>> {
        self.state.lock()
    }

    /// Sends an end; `from_task`: it comes from a task (a reconcile that waited), and wakes the
    /// dispatcher now.
    pub(crate) fn send(&self, end: M, from_task: bool) {
        let wake = from_task || self.eager.load(Ordering::Relaxed);
        let waker = {
            let mut state = self.lock();
            state.queue.push_back(end);
            self.queued.store(state.queue.len(), Ordering::Relaxed);
            if wake { state.waker.take() } else { None }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Moves every end received into `into`; whether there were any.
    pub(crate) fn take(&self, into: &mut VecDeque<M>) -> bool {
        if self.queued.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut state = self.lock();
        if state.queue.is_empty() {
            return false;
        }
        if into.is_empty() {
            std::mem::swap(&mut state.queue, into);
        } else {
            into.extend(state.queue.drain(..));
        }
        self.queued.store(0, Ordering::Relaxed);
        true
    }

    /// Ready once an end is waiting (for the dispatcher's wait).
    pub(crate) fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.lock();
        if state.queue.is_empty() {
            state.waker = Some(cx.waker().clone());
            Poll::Pending
        } else {
            state.waker = None;
            Poll::Ready(())
        }
    }
}

impl<M: Send> Flush for Ends<M> {
    fn flush(&self) {
        let waker = {
            let mut state = self.lock();
            if state.queue.is_empty() {
                None
            } else {
                state.waker.take()
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poller_counts_as_stalled_once_its_first_poll_ran_past_stall() {
        let jobs = Jobs::new();
        let busy = jobs
            .add_poller(true)
            .expect("a timed poller publishes its polls");
        let _untimed = jobs.add_poller(false);
        assert!(!jobs.stalled(), "no first poll runs");
        std::thread::sleep(STALL * 3);
        busy.0.store(jobs.now(), Ordering::Relaxed);
        assert!(!jobs.stalled(), "a first poll that just began");
        busy.0.store(1, Ordering::Relaxed);
        assert!(
            jobs.stalled(),
            "a first poll that began more than STALL ago"
        );
        assert!(
            jobs.at_work(&jobs.lock()),
            "the other poller is awake and not stalled"
        );
        busy.0.store(0, Ordering::Relaxed);
        assert!(!jobs.stalled(), "between first polls");
    }
}
