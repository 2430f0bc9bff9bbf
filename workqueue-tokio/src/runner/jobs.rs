//! Where reconciles run: the dispatcher (the task that polls the runner's stream) makes each
//! reconcile's future and hands it over as a job; a few poller tasks give each job its first
//! poll, and a job that has to wait goes on as a task of its own. Each job sends one [`End`]
//! back.
//!
//! Why pollers: the dispatcher calls the user's reconcile function (it need not be `Send`), so it
//! must never be the one that polls a reconcile's future. A reconcile that computes before its
//! first `.await` would hold every other key behind it. A poller that meets such a job holds
//! only that job; the others take the rest. Why not a task per reconcile: most reconciles of a
//! level-triggered controller find their object as it should be and return at their first poll;
//! a poller finishes those without the cost of a task (a spawn, and the wake-up of an idle
//! runtime thread for each).
//!
//! Two rules keep a stalled poller from holding anything but its own job:
//! - a batch of jobs wakes as many idle pollers as it has jobs, so jobs never wait behind a
//!   busy poller while another is idle;
//! - a poller that woke another task (the dispatcher, with an [`End`]; a job it spawned) yields
//!   before it polls another job: tokio runs a task woken from a worker thread next on that
//!   thread, and no other thread may take it from there, so a long poll right after the wake
//!   would hold it.
//!
//! Ends are batched: one from a job's first poll wakes the dispatcher only once enough have
//! piled up, or when the pollers run out of jobs (they flush before they wait); one from a task
//! (a reconcile that waited) wakes it at once.

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use super::catch;

/// A reconcile's whole life after its future was made: drive it, judge it, finish its lease, send
/// its [`End`].
pub(crate) type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

thread_local! {
    /// Whether an `End` sent on this thread woke the dispatcher since the last look.
    static WOKE: Cell<bool> = const { Cell::new(false) };
}

/// The jobs not yet given their first poll, and the pollers waiting for one.
pub(crate) struct Jobs {
    state: Mutex<JobsState>,
}

struct JobsState {
    queue: VecDeque<Job>,
    idle: Vec<Waker>,
    closed: bool,
}

impl Jobs {
    pub(crate) fn new() -> Self {
        Jobs {
            state: Mutex::new(JobsState {
                queue: VecDeque::new(),
                idle: Vec::new(),
                closed: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, JobsState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `batch` (emptying it) and wakes as many idle pollers as it has jobs.
    pub(crate) fn push(&self, batch: &mut Vec<Job>) {
        if batch.is_empty() {
            return;
        }
        let mut woken = Vec::new();
        {
            let mut state = self.lock();
            let n = batch.len().min(state.idle.len());
            let at = state.idle.len() - n;
            woken.extend(state.idle.drain(at..));
            state.queue.extend(batch.drain(..));
        }
        for waker in woken {
            waker.wake();
        }
    }

    /// The next job, waiting for one; `None` once closed.
    async fn pop(&self) -> Option<Job> {
        poll_fn(|cx| {
            let mut state = self.lock();
            if let Some(job) = state.queue.pop_front() {
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

    /// No more jobs: the pollers end, and the jobs not yet polled are dropped (their leases end
    /// as dropped leases do; their `End`s are sent by their guards).
    pub(crate) fn close(&self) {
        let (jobs, idle) = {
            let mut state = self.lock();
            state.closed = true;
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
pub(crate) async fn poller(jobs: std::sync::Arc<Jobs>, ends: std::sync::Arc<dyn Flush>) {
    let multi_thread = matches!(
        tokio::runtime::Handle::current().runtime_flavor(),
        tokio::runtime::RuntimeFlavor::MultiThread
    );
    loop {
        let job = match poll_now(&jobs) {
            Some(job) => job,
            None => {
                // Out of jobs: whatever ended meanwhile goes to the dispatcher before this
                // poller waits (it may be waiting for those ends to hand out more).
                ends.flush();
                match jobs.pop().await {
                    Some(job) => job,
                    None => return,
                }
            }
        };
        WOKE.set(false);
        let spawned = first_poll(job);
        if multi_thread && (spawned || WOKE.replace(false)) {
            tokio::task::yield_now().await;
        }
    }
}

/// The next job if one is queued (without waiting).
fn poll_now(jobs: &Jobs) -> Option<Job> {
    jobs.lock().queue.pop_front()
}

/// Polls a job once; spawns it if it has to wait. Whether it was spawned.
fn first_poll(mut job: Job) -> bool {
    // A waker that does nothing is enough: a job that is not finished is spawned, and the task's
    // first poll registers its wake-ups again.
    let mut cx = Context::from_waker(Waker::noop());
    match catch(|| job.as_mut().poll(&mut cx)) {
        Ok(Poll::Ready(())) => false,
        Ok(Poll::Pending) => {
            drop(tokio::spawn(job));
            true
        }
        Err(message) => {
            // A job catches every panic of user code; this is defence in depth. The job is
            // dropped (never polled after a panic): its guard sends its end.
            tracing::error!(panic = %message, "a reconcile's job panicked");
            false
        }
    }
}

/// What a poller needs of the ends: sending what piled up before it waits.
pub(crate) trait Flush: Send + Sync {
    fn flush(&self);
}

/// The channel of [`End`]s from the jobs to the dispatcher.
pub(crate) struct Ends<M> {
    state: Mutex<EndsState<M>>,
}

struct EndsState<M> {
    queue: VecDeque<M>,
    /// The dispatcher's waker, while it waits.
    waker: Option<Waker>,
    /// How many ends from first polls wake a waiting dispatcher.
    batch: usize,
}

impl<M> Ends<M> {
    pub(crate) fn new(batch: usize) -> Self {
        Ends {
            state: Mutex::new(EndsState {
                queue: VecDeque::new(),
                waker: None,
                batch: batch.max(1),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, EndsState<M>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends an end; `now`: wake the dispatcher whatever the batch (an end from a task).
    pub(crate) fn send(&self, end: M, now: bool) {
        let waker = {
            let mut state = self.lock();
            state.queue.push_back(end);
            if now || state.queue.len() >= state.batch {
                state.waker.take()
            } else {
                None
            }
        };
        wake(waker);
    }

    /// Moves every end received into `into`; whether there were any.
    pub(crate) fn take(&self, into: &mut VecDeque<M>) -> bool {
        let mut state = self.lock();
        if state.queue.is_empty() {
            return false;
        }
        if into.is_empty() {
            std::mem::swap(&mut state.queue, into);
        } else {
            into.extend(state.queue.drain(..));
        }
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
        wake(waker);
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
        WOKE.set(true);
    }
}
