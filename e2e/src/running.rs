//! A controller run as a task for a test: what its stream says, collected line by line, and a
//! graceful stop that must finish in time.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What a controller's graceful shutdown waits on ([`Running::start`] hands it out).
pub type Stopped = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// An error and its sources, in one line.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// A controller's stream, polled by a task of its own.
#[derive(Debug)]
pub struct Running {
    said: Arc<Mutex<Vec<String>>>,
    stop: oneshot::Sender<()>,
    run: JoinHandle<()>,
}

impl Running {
    /// Runs the stream `build` makes from the future its graceful shutdown should wait on
    /// (`Controller::graceful_shutdown_on`); each item is recorded as `ok <name>` or as the
    /// error with its sources.
    pub fn start<K, A, E, S>(build: impl FnOnce(Stopped) -> S) -> Running
    where
        K: Resource,
        E: std::error::Error,
        S: Stream<Item = Result<(ObjectRef<K>, A), E>> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let stream = build(Box::pin(async move {
            let _ = stopped.await;
        }));
        let said = Arc::new(Mutex::new(Vec::new()));
        let log = said.clone();
        let run = tokio::spawn(stream.for_each(move |item| {
            let line = match item {
                Ok((object, _)) => format!("ok {}", object.name),
                Err(e) => chain(&e),
            };
            log.lock().unwrap().push(line);
            async {}
        }));
        Running { said, stop, run }
    }

    /// What the stream said so far.
    pub fn said(&self) -> Vec<String> {
        self.said.lock().unwrap().clone()
    }

    /// Whether the stream ended.
    pub fn is_finished(&self) -> bool {
        self.run.is_finished()
    }

    /// Stops it; it must stop within 40 s (its shutdown grace, and a hand-over of its Leases)
    /// and must not have panicked. Returns how long it took.
    pub async fn stop(self) -> Duration {
        let start = Instant::now();
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(40), self.run)
            .await
            .expect("the controller did not stop")
            .expect("the controller's task panicked");
        start.elapsed()
    }
}
