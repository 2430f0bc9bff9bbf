//! A tower layer that counts a client's requests: what a controller asks of the API server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tower::{Layer, Service};

/// Counts the requests that pass through it. Clones share the count.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Requests so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl<S> Layer<S> for Counter {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            count: self.clone(),
        }
    }
}

/// A service whose requests are counted.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    count: Counter,
}

impl<S: Service<R>, R> Service<R> for Counted<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.count.0.fetch_add(1, Ordering::Relaxed);
        self.inner.call(request)
    }
}

/// A client whose requests `counter` counts (kube's whole stack inside: a request that kube
/// retries on 429, 503 or 504 counts once).
pub fn client(config: kube::Config, counter: &Counter) -> kube::Client {
    kube::client::ClientBuilder::try_from(config)
        .expect("a client builder")
        .with_layer(counter)
        .build()
}
