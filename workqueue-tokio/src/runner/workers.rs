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
//! Nothing here knows on which runtime thread a task runs: a job that computes for long holds its
//! worker (and, as any task does, its runtime thread), while the other workers are tasks the
//! runtime schedules as it schedules any.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// A reconcile's whole life after its future was made: drive it, judge it, finish its lease, send
/// its end.
pub(crate) type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The jobs not yet taken by a worker.
///
/// Invariant: every push either wakes a waiting worker or leaves `ready` a permit, so a job is
/// never queued while every worker waits.
#[derive(Default)]
pub(crate) struct Pool {
    jobs: Mutex<Jobs>,
    ready: Notify,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
    closed: bool,
}

impl Pool {
    /// Queues a job for the next worker free.
    pub(crate) fn push(&self, job: Job) {
        self.jobs.lock().queue.push_back(job);
        self.ready.notify_one();
    }

    /// No more jobs: the workers end once they finish their jobs, and the jobs not yet taken are
    /// dropped (their leases end as dropped leases do; their ends are sent by their guards).
    pub(crate) fn close(&self) {
        let queued = {
            let mut jobs = self.jobs.lock();
            jobs.closed = true;
            std::mem::take(&mut jobs.queue)
        };
        drop(queued);
        self.ready.notify_waiters();
    }

    /// The next job, waiting for one; `None` once closed.
    async fn next(&self) -> Option<Job> {
        loop {
            // Registered before the queue is looked at: a push after the look wakes it.
            let mut ready = pin!(self.ready.notified());
            ready.as_mut().enable();
            {
                let mut jobs = self.jobs.lock();
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

/// A worker: runs the pool's jobs one after another until it is closed. A job catches every
/// panic of user code; one that still panics ends the worker (the dispatcher starts another).
pub(crate) async fn worker(pool: Arc<Pool>) {
    while let Some(job) = pool.next().await {
        job.await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn every_job_pushed_runs_and_close_ends_the_workers() {
        let pool = Arc::new(Pool::default());
        let ran = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..3).map(|_| tokio::spawn(worker(pool.clone()))).collect();
        for _ in 0..100 {
            let ran = ran.clone();
            pool.push(Box::pin(async move {
                tokio::task::yield_now().await;
                ran.fetch_add(1, Ordering::Relaxed);
            }));
        }
        while ran.load(Ordering::Relaxed) < 100 {
            tokio::task::yield_now().await;
        }
        pool.close();
        for w in workers {
            w.await.expect("a worker ends once closed");
        }
    }
}
