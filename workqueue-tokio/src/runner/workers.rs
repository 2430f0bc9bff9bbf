//! Where reconciles run: worker tasks, as client-go's workers are goroutines. The dispatcher
//! (the task that polls the runner's stream) calls the user's reconcile function, wraps the
//! future it returns into a job (the reconcile under the runner's limits, then the finish of its
//! lease) and pushes the job to the [`Pool`]; each worker task takes the next job, awaits it to
//! its end, and takes the next.
//!
//! Why the dispatcher does not await the futures itself: it calls the reconcile function (which
//! need not be `Send`), so a reconcile that computes before its first `.await` would hold every
//! key behind it. Why not a task per reconcile: a spawn costs an allocation and, when the
//! runtime's threads are idle, the wake-up of one, for every reconcile; a worker that finishes a
//! job takes the next one queued without either.
//!
//! How many: the dispatcher starts a worker whenever more jobs are in flight (queued or running)
//! than there are workers, so that no job waits for a worker while the limit allows it to run;
//! workers are kept until the run ends. There are at most as many as reconciles may run at once,
//! and no more than ever ran at once.
//!
//! Wakes: as many workers as the runtime has threads are woken for a turn's jobs, and one more
//! whenever a worker's job has to wait while jobs are queued. A reconcile that returns at once
//! needs no other worker (the one awake takes the next job), one that waits hands the queue to
//! another, and one that computes before its first `.await` holds only its worker while the
//! others run on the runtime's other threads. The dispatcher queues each job as it makes it (a
//! worker at work takes it at once), wakes one worker for the first job of a turn (on a
//! multi-thread runtime, where it may start at once) and the others once the turn's jobs are
//! made: a worker woken early on the dispatcher's CPU finishes what is queued and waits, instead
//! of waking the dispatcher for every job.
//!
//! Hand-overs come in batches the other way too, as follows.
//!
//! Ends: a job sends its end to the dispatcher through [`Ends`] without waking it; a worker wakes
//! it when it is about to wait (for the next job, or inside a job that waits). While a worker has
//! queued jobs to run, the slots its ends freed could be used only by an idle worker, and an idle
//! worker has woken the dispatcher before it waited. So the dispatcher is woken about once per
//! batch of jobs rather than once per reconcile, which matters most where threads are scarce
//! (other processes on the CPUs, a CPU quota): each wake is another thread to be scheduled.
//!
//! Nothing here knows on which runtime thread a task runs: a job that computes for long holds its
//! worker (and, as any task does, its runtime thread), while the other workers are tasks the
//! runtime schedules as it schedules any.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::sync::Notify;

// std's locks, not `parking_lot`'s: those spin with `sched_yield` before they park, which where
// other processes share the CPUs hands the CPU away while the holder waits to run.

/// A reconcile's whole life after its future was made: drive it, judge it, finish its lease, send
/// its end.
pub(super) type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The jobs not yet taken by a worker.
///
/// Invariant: a job is never left queued while every worker waits. A worker looks at the queue
/// after it registers for `ready` and before it waits, and takes jobs until the queue is empty;
/// the dispatcher's turn ends with a wake after its last push whenever jobs are still queued
/// ([`Pool::end_turn`]); each wake reaches a waiting worker or leaves `ready` a permit.
#[derive(Default)]
pub(super) struct Pool {
    jobs: Mutex<Jobs>,
    ready: Notify,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
    closed: bool,
}

impl Pool {
    fn lock_jobs(&self) -> MutexGuard<'_, Jobs> {
        // Nothing panics while it is held.
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a job for the next worker free; `wake`: wakes a waiting worker for it now (else
    /// [`Pool::wake`] does later).
    pub(super) fn push(&self, job: Job, wake: bool) {
        self.lock_jobs().queue.push_back(job);
        if wake {
            self.ready.notify_one();
        }
    }

    /// Wakes up to `n` waiting workers, for jobs pushed without a wake.
    fn wake(&self, n: usize) {
        for _ in 0..n {
            self.ready.notify_one();
        }
    }

    /// The end of a dispatcher's turn that pushed `unwoken` jobs without a wake: if jobs are
    /// still queued, wakes up to `threads - 1` more workers, and at least one. That one matters:
    /// the worker woken for the turn's first job may have run it on another thread and gone back
    /// to waiting before the others were pushed; without a wake after the last push, they would
    /// wait for the next turn, which may never come (every slot taken by them).
    pub(super) fn end_turn(&self, unwoken: usize, threads: usize) {
        if unwoken > 0 && self.queued() {
            self.wake(unwoken.min(threads.saturating_sub(1).max(1)));
        }
    }

    /// No more jobs: the workers end once they finish their jobs, and the jobs not yet taken are
    /// dropped (their leases end as dropped leases do; their ends are sent by their guards).
    pub(super) fn close(&self) {
        let queued = {
            let mut jobs = self.lock_jobs();
            jobs.closed = true;
            std::mem::take(&mut jobs.queue)
        };
        drop(queued);
        self.ready.notify_waiters();
    }

    /// Whether jobs are queued.
    fn queued(&self) -> bool {
        !self.lock_jobs().queue.is_empty()
    }

    /// The next job if one is queued.
    fn try_next(&self) -> Option<Job> {
        self.lock_jobs().queue.pop_front()
    }

    /// The next job, waiting for one; `None` once closed.
    async fn next(&self) -> Option<Job> {
        loop {
            // Registered before the queue is looked at: a push after the look wakes it.
            let mut ready = pin!(self.ready.notified());
            ready.as_mut().enable();
            {
                let mut jobs = self.lock_jobs();
                if let Some(job) = jobs.queue.pop_front() {
                    return Some(job);
                }
                if jobs.closed {
                    return None;
                }
            }
            ready.await;
        }
    }
}

/// A worker: runs the pool's jobs one after another until it is closed, and wakes the
/// dispatcher for the ends that wait before it waits itself (see the module docs). A job catches
/// every panic of user code; one that still panics ends the worker (the dispatcher starts
/// another).
pub(super) async fn worker<M: Send>(pool: Arc<Pool>, ends: Arc<Ends<M>>) {
    loop {
        let mut job = match pool.try_next() {
            Some(job) => job,
            None => {
                ends.wake();
                match pool.next().await {
                    Some(job) => job,
                    None => return,
                }
            }
        };
        poll_fn(|cx| {
            let polled = job.as_mut().poll(cx);
            if polled.is_pending() {
                ends.wake();
                if pool.queued() {
                    pool.wake(1);
                }
            }
            polled
        })
        .await;
    }
}

/// The ends of jobs on their way to the dispatcher, which is woken only by [`Ends::wake`] (see
/// the module docs).
pub(super) struct Ends<M> {
    queue: Mutex<Vec<M>>,
    dispatcher: AtomicWaker,
}

impl<M> Ends<M> {
    pub(super) fn new() -> Self {
        Ends {
            queue: Mutex::new(Vec::new()),
            dispatcher: AtomicWaker::new(),
        }
    }

    fn lock_queue(&self) -> MutexGuard<'_, Vec<M>> {
        // Nothing panics while it is held.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds an end, without waking the dispatcher.
    pub(super) fn push(&self, end: M) {
        self.lock_queue().push(end);
    }

    /// Wakes the dispatcher if ends wait.
    pub(super) fn wake(&self) {
        if !self.lock_queue().is_empty() {
            self.dispatcher.wake();
        }
    }

    /// Moves the ends that wait into `into` (empty: the buffers are swapped, so neither side
    /// allocates again in a steady run).
    pub(super) fn take(&self, into: &mut Vec<M>) {
        std::mem::swap(&mut *self.lock_queue(), into);
    }

    /// Ready once ends wait; the dispatcher's waker is kept for [`Ends::wake`].
    pub(super) fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.dispatcher.register(cx.waker());
        if self.lock_queue().is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interleaving behind the rule of [`Pool::end_turn`]: the worker woken for a turn's
    /// first job runs it and waits again before the turn's next job is pushed; the end of the
    /// turn wakes it for that one.
    #[tokio::test]
    async fn a_job_pushed_after_the_woken_worker_went_back_to_waiting_runs() {
        let pool = Arc::new(Pool::default());
        let ends = Arc::new(Ends::new());
        let worker = tokio::spawn(worker(pool.clone(), ends.clone()));
        let job = |i: u32| -> Job {
            let ends = ends.clone();
            Box::pin(async move { ends.push(i) })
        };
        let ended = |n: usize| {
            let ends = ends.clone();
            async move {
                let mut all = Vec::new();
                while all.len() < n {
                    poll_fn(|cx| ends.poll_ready(cx)).await;
                    let mut taken = Vec::new();
                    ends.take(&mut taken);
                    all.extend(taken);
                }
                all
            }
        };
        pool.push(job(0), true);
        assert_eq!(ended(1).await, [0], "the woken worker ran the first job");
        tokio::task::yield_now().await; // it waits again
        pool.push(job(1), false);
        pool.end_turn(1, 1);
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), ended(1)).await;
        assert_eq!(second.expect("the second job ran"), [1]);
        pool.close();
        worker.await.unwrap();
    }

    #[tokio::test]
    async fn every_job_pushed_runs_and_close_ends_the_workers() {
        let pool = Arc::new(Pool::default());
        let ends = Arc::new(Ends::new());
        let workers: Vec<_> = (0..3)
            .map(|_| tokio::spawn(worker(pool.clone(), ends.clone())))
            .collect();
        for i in 0..100 {
            let ends = ends.clone();
            let job = Box::pin(async move {
                tokio::task::yield_now().await;
                ends.push(i);
            });
            pool.push(job, i % 2 == 0);
        }
        pool.wake(50);
        let mut ended = Vec::new();
        while ended.len() < 100 {
            poll_fn(|cx| ends.poll_ready(cx)).await;
            let mut taken = Vec::new();
            ends.take(&mut taken);
            ended.extend(taken);
        }
        ended.sort_unstable();
        assert_eq!(ended, (0..100).collect::<Vec<_>>());
        pool.close();
        for w in workers {
            w.await.expect("a worker ends once closed");
        }
    }
}
