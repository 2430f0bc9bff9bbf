//! Stopping running reconciles by key, from any task: what a lost Lease needs, whatever the task
//! that polls the runner's stream is doing.
//!
//! Invariants:
//! - once [`Aborts`] exists, every reconcile the runner starts is registered before its future is
//!   first polled, and stays registered until that future is gone (returned, or dropped);
//! - [`Aborts::abort`] marks matching reconciles and wakes them; a marked reconcile's future is
//!   dropped at its next poll, before the reconcile is polled again (a poll under way when the
//!   mark is set finishes first: a synchronous computation cannot be interrupted);
//! - [`Aborts::stopped`] completes only when no registered reconcile matches: their futures are
//!   gone, so nothing they do can happen any more.

use std::collections::HashMap;
use std::fmt;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use futures_util::task::AtomicWaker;
use tokio::sync::Notify;

use super::catch;

/// A handle on a runner's running reconciles, to stop those of some keys from any task: when a
/// replica loses the Lease of a shard, say, it must stop the shard's reconciles by a deadline,
/// whether or not the application is polling the runner's stream at the time.
///
/// Made by [`Runner::abort_handle`](super::Runner::abort_handle) before the run; cheap to clone.
/// Only a runner with a handle registers its reconciles (one small allocation and a key clone
/// each): a runner without one pays nothing.
///
/// An aborted reconcile's future is dropped at once (it is not asked to stop first: its
/// [`Context`](super::Context) is not cancelled), its key is finished as an interrupted
/// reconcile is (retried, unless it no longer [belongs](super::Runner::belongs)), and the
/// runner's stream yields nothing for it. Aborting is safe at any time: a key without a running
/// reconcile is not affected, and a key started after the call is not aborted by it.
///
/// ```
/// use std::time::Duration;
/// use futures_util::StreamExt;
/// use workqueue_tokio::{CancellationToken, WorkQueue};
/// use workqueue_tokio::runner::{Action, Runner};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let queue: WorkQueue<String> = WorkQueue::new();
/// queue.add_batch(["shard-a/web".to_string(), "shard-b/db".to_string()]);
/// let runner = Runner::new(queue.clone(), |_key: String, _ctx| async {
///     tokio::time::sleep(Duration::from_secs(60)).await; // a long reconcile
///     Ok::<_, std::io::Error>(Action::await_change())
/// })
/// .workers(2);
/// let aborts = runner.abort_handle();
/// let results = tokio::spawn(runner.results(CancellationToken::new()).count());
/// tokio::time::sleep(Duration::from_secs(1)).await;
/// // Another task: shard a was lost.
/// assert_eq!(aborts.abort(|key: &String| key.starts_with("shard-a/")), 1);
/// aborts.stopped(|key: &String| key.starts_with("shard-a/")).await;
/// # queue.shut_down();
/// # assert_eq!(results.await.unwrap(), 1); // db's result; web's reconcile yielded none
/// # }
/// ```
pub struct Aborts<T> {
    registry: Arc<Registry<T>>,
}

impl<T> Aborts<T> {
    pub(super) fn new(registry: Arc<Registry<T>>) -> Self {
        registry.enabled.store(true, Ordering::Release);
        Aborts { registry }
    }

    /// Aborts the running reconciles whose keys `matches`: their futures are dropped at their
    /// next poll (at once, for one that is waiting). Returns how many were marked. A `matches`
    /// that panics matches nothing for that key (the panic is logged).
    pub fn abort(&self, mut matches: impl FnMut(&T) -> bool) -> usize {
        let running = self.registry.lock();
        let mut aborted = 0;
        for ticket in running.values() {
            if ticket.aborted.load(Ordering::Acquire) || !test(&mut matches, &ticket.key) {
                continue;
            }
            ticket.aborted.store(true, Ordering::Release);
            ticket.waker.wake();
            aborted += 1;
        }
        aborted
    }

    /// Completes once no running reconcile's key `matches`: every such future has returned or
    /// been dropped. Completes at once when none runs.
    pub async fn stopped(&self, mut matches: impl FnMut(&T) -> bool) {
        loop {
            let ended = self.registry.ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            let any = self
                .registry
                .lock()
                .values()
                .any(|ticket| test(&mut matches, &ticket.key));
            if !any {
                return;
            }
            ended.await;
        }
    }
}

/// A user predicate on a key; a panic is no match.
fn test<T>(matches: &mut impl FnMut(&T) -> bool, key: &T) -> bool {
    catch(|| matches(key)).unwrap_or_else(|message| {
        tracing::error!(panic = %message, "an abort predicate panicked; the key is not matched");
        false
    })
}

impl<T> Clone for Aborts<T> {
    fn clone(&self) -> Self {
        Aborts {
            registry: self.registry.clone(),
        }
    }
}

impl<T> fmt::Debug for Aborts<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Aborts")
            .field("running", &self.registry.lock().len())
            .finish()
    }
}

/// The running reconciles of a runner that has an [`Aborts`].
pub(super) struct Registry<T> {
    /// Whether reconciles are registered: set once an `Aborts` exists (before the run starts).
    enabled: AtomicBool,
    next: AtomicU64,
    running: Mutex<HashMap<u64, Arc<Ticket<T>>>>,
    /// Notified each time a registered reconcile ends.
    ended: Notify,
}

/// One running reconcile, shared by its job and the registry.
struct Ticket<T> {
    key: T,
    aborted: AtomicBool,
    waker: AtomicWaker,
}

impl<T> Registry<T> {
    pub(super) fn new() -> Self {
        Registry {
            enabled: AtomicBool::new(false),
            next: AtomicU64::new(0),
            running: Mutex::new(HashMap::new()),
            ended: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Ticket<T>>>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a reconcile of `key` (a clone, made only when an [`Aborts`] exists): `None`
    /// without one.
    pub(super) fn register(self: &Arc<Self>, key: impl FnOnce() -> T) -> Option<Registered<T>> {
        if !self.enabled.load(Ordering::Acquire) {
            return None;
        }
        let ticket = Arc::new(Ticket {
            key: key(),
            aborted: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, ticket.clone());
        Some(Registered {
            registry: self.clone(),
            id,
            ticket,
        })
    }
}

/// A registered reconcile: deregistered (and `stopped` waiters told) when dropped, which its job
/// does once the reconcile's future is gone.
pub(super) struct Registered<T> {
    registry: Arc<Registry<T>>,
    id: u64,
    ticket: Arc<Ticket<T>>,
}

impl<T> Registered<T> {
    /// Completes once this reconcile is aborted.
    pub(super) async fn aborted(&self) {
        poll_fn(|cx| {
            if self.ticket.aborted.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            self.ticket.waker.register(cx.waker());
            if self.ticket.aborted.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Whether this reconcile was aborted.
    pub(super) fn is_aborted(&self) -> bool {
        self.ticket.aborted.load(Ordering::Acquire)
    }
}

impl<T> Drop for Registered<T> {
    fn drop(&mut self) {
        let removed = self.registry.lock().remove(&self.id);
        drop(removed);
        self.registry.ended.notify_waiters();
    }
}
