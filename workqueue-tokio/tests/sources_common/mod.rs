//! Helpers shared by the sources' test binaries.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};

use futures_util::stream::Stream;
use tokio::sync::mpsc;
use workqueue_tokio::runner::{Action, Context};

/// A stream of an mpsc receiver's messages; `dropped` is set when the stream is dropped.
pub struct Channel<T> {
    rx: mpsc::UnboundedReceiver<T>,
    dropped: Arc<AtomicBool>,
}

impl<T> Stream for Channel<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<T>> {
        self.rx.poll_recv(cx)
    }
}

impl<T> Drop for Channel<T> {
    fn drop(&mut self) {
        self.dropped.store(true, SeqCst);
    }
}

pub fn channel<T>() -> (mpsc::UnboundedSender<T>, Channel<T>, Arc<AtomicBool>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let dropped = Arc::new(AtomicBool::new(false));
    (
        tx,
        Channel {
            rx,
            dropped: dropped.clone(),
        },
        dropped,
    )
}

/// Records each reconciled key.
pub fn recording(
    log: &Arc<Mutex<Vec<String>>>,
) -> impl Fn(String, Context) -> std::future::Ready<Result<Action, String>> + Send + Sync + 'static
{
    let log = log.clone();
    move |key: String, _ctx: Context| {
        log.lock().unwrap().push(key);
        std::future::ready(Ok(Action::await_change()))
    }
}

pub fn taken(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[derive(Debug, thiserror::Error)]
#[error("watch error {0}")]
pub struct WatchError(pub u32);
