//! What a controller's stream reports besides the runner's results, on one path: every producer
//! (a trigger's error, a `watches` mapper's panic, a Lease report) sends into one channel, which
//! the stream reads in one place (`applier`'s `State::next`), ahead of the runner's results.
//!
//! A trigger's error is never dropped (kube-runtime's applier yields each one). The runner's
//! reports are bounded: while [`REPORTS`] of them wait for the consumer, later ones are dropped
//! (each was logged when it happened), so a consumer that falls behind holds no growing backlog
//! of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use super::error::{Error, RunnerError};

/// How many of the runner's reports wait for the consumer at most.
const REPORTS: usize = 64;

/// One report: a trigger's error, or the runner's.
enum Report<QE> {
    Queue(QE),
    Runner(RunnerError),
}

/// Where the producers send what the stream reports.
pub(super) struct Reports<QE> {
    tx: mpsc::UnboundedSender<Report<QE>>,
    /// The runner's reports sent and not yet received: at most [`REPORTS`].
    waiting: Arc<AtomicUsize>,
}

/// Where the stream reads the reports.
pub(super) struct Inbox<QE> {
    rx: mpsc::UnboundedReceiver<Report<QE>>,
    waiting: Arc<AtomicUsize>,
}

/// A new path: its senders and its one reader.
pub(super) fn channel<QE>() -> (Reports<QE>, Inbox<QE>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let waiting = Arc::new(AtomicUsize::new(0));
    let inbox = Inbox {
        rx,
        waiting: waiting.clone(),
    };
    (Reports { tx, waiting }, inbox)
}

impl<QE> Clone for Reports<QE> {
    fn clone(&self) -> Self {
        Reports {
            tx: self.tx.clone(),
            waiting: self.waiting.clone(),
        }
    }
}

impl<QE> Reports<QE> {
    /// A trigger's error, reported as [`Error::QueueError`].
    pub(super) fn queue_error(&self, error: QE) {
        let _ = self.tx.send(Report::Queue(error));
    }

    /// One of the runner's reports, reported as [`Error::RunnerError`] unless [`REPORTS`] wait.
    pub(super) fn send(&self, report: RunnerError) {
        let room = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < REPORTS).then_some(n + 1)
            });
        if room.is_ok() {
            let _ = self.tx.send(Report::Runner(report));
        }
    }
}

impl<QE: 'static> Inbox<QE> {
    /// The next report, as the stream's item; `None` once every sender is gone. Cancel-safe.
    pub(super) async fn recv<E: 'static>(&mut self) -> Option<Error<E, QE>> {
        Some(match self.rx.recv().await? {
            Report::Queue(error) => Error::QueueError(error),
            Report::Runner(report) => {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                Error::RunnerError(report)
            }
        })
    }
}
