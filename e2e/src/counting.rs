//! A tower layer that counts a client's requests: what a controller asks of the API server.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Method, Request};
use tower::{Layer, Service};

/// Records the requests that pass through it (method and path). Clones share the record.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<Mutex<Vec<(Method, String)>>>);

impl Counter {
    /// Requests so far.
    pub fn get(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Requests so far with this method whose path contains `path`.
    pub fn count(&self, method: &Method, path: &str) -> usize {
        let requests = self.0.lock().unwrap();
        let matching = requests
            .iter()
            .filter(|(m, p)| m == method && p.contains(path));
        matching.count()
    }

    /// The requests from the `from`-th on, by method and path with the object's name cut off
    /// (`PATCH /api/v1/namespaces/ns/configmaps/*`): how many of each.
    pub fn breakdown(&self, from: usize) -> std::collections::BTreeMap<String, usize> {
        let requests = self.0.lock().unwrap();
        let mut counts = std::collections::BTreeMap::new();
        for (method, path) in requests.iter().skip(from) {
            let path = match path.rsplit_once("/configmaps/") {
                Some((head, _)) => format!("{head}/configmaps/*"),
                None => path.clone(),
            };
            *counts.entry(format!("{method} {path}")).or_insert(0) += 1;
        }
        counts
    }

    /// Every request so far, one line each: for failure messages.
    pub fn log(&self) -> Vec<String> {
        let requests = self.0.lock().unwrap();
        requests.iter().map(|(m, p)| format!("{m} {p}")).collect()
    }
}

impl<S> Layer<S> for Counter {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counter: self.clone(),
        }
    }
}

/// A service whose requests are recorded.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    counter: Counter,
}

impl<S: Service<Request<B>>, B> Service<Request<B>> for Counted<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        let path = request.uri().path().to_string();
        let entry = (request.method().clone(), path);
        self.counter.0.lock().unwrap().push(entry);
        self.inner.call(request)
    }
}

/// A client whose requests `counter` records (kube's whole stack inside: a request that kube
/// retries on 429, 503 or 504 counts once).
pub fn client(config: kube::Config, counter: &Counter) -> kube::Client {
    kube::client::ClientBuilder::try_from(config)
        .expect("a client builder")
        .with_layer(counter)
        .build()
}
