//! Clients and the network between them and the server: each client's name, its latency and
//! partitions, and the log of what each one sent.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

use super::ApiServer;
use super::wire::{Body, BoxError, Gr, Route};

/// A client's link to the server (see `ApiServer::set_partition`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Partition {
    /// Requests reach the server.
    #[default]
    Connected,
    /// The server is unreachable and the network says so: each request fails at once with a
    /// transport error (kube: `kube::Error::Service`), and open watches break.
    Refused,
    /// Packets are lost: requests and open watches hang without an answer, and fail with a
    /// transport error when the partition heals. A client with its own timeouts (as a leader
    /// elector's renew deadline) sees those fire first.
    Blackholed,
    /// Watches stall silently: their connections stay open, nothing arrives and nothing
    /// fails (a proxy that holds the stream). What they hold back arrives, in order, once the
    /// link is connected again. Every other request, lists included, works.
    WatchesHang,
    /// Reads fail: every GET (lists and watches) fails at once with a transport error, and open
    /// watches break. Writes work.
    ReadsFail,
}

/// One request as a client sent it.
#[derive(Clone, Debug)]
pub struct Logged {
    /// The name of the client that sent it (`"default"` for `ApiServer::client()`).
    pub client: String,
    /// The HTTP method.
    pub method: Method,
    /// Path and query.
    pub uri: String,
    /// The resource the path names (`None`: a path the server does not route).
    pub resource: Option<String>,
    /// When the client sent it (tokio's clock).
    pub at: Instant,
    /// Whether it reached the server (a partition or latency in progress: not yet, or never).
    pub reached: bool,
    /// The HTTP status the server answered (it may still have been lost on the way back).
    pub status: Option<u16>,
}

impl Logged {
    /// Whether this request was to a resource (`"leases"`, or `"leases.coordination.k8s.io"`).
    pub fn is_to(&self, resource: &str) -> bool {
        self.gr().is_some_and(|gr| gr.is(resource))
    }

    fn gr(&self) -> Option<Gr> {
        Route::parse(self.uri.split('?').next().unwrap_or("")).map(|r| r.gr)
    }

    /// Whether it was a write (any method but GET).
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }
}

/// One named client's link to the server.
#[derive(Debug)]
pub(crate) struct ClientLink {
    pub name: String,
    pub partition: watch::Sender<Partition>,
    /// Latency before a request reaches the server, and before its answer (and each watch
    /// event) reaches the client.
    latency: Mutex<(Duration, Duration)>,
}

impl ClientLink {
    pub fn new(name: &str) -> ClientLink {
        ClientLink {
            name: name.into(),
            partition: watch::Sender::new(Partition::Connected),
            latency: Mutex::new((Duration::ZERO, Duration::ZERO)),
        }
    }

    pub fn latency(&self) -> (Duration, Duration) {
        *self.latency.lock().unwrap()
    }

    pub fn set_latency(&self, to_server: Duration, to_client: Duration) {
        *self.latency.lock().unwrap() = (to_server, to_client);
    }

    /// The transport error a partitioned client gets: at once when refused; when blackholed,
    /// once the partition heals.
    pub async fn fail(&self, how: Partition) -> BoxError {
        let kind = match how {
            Partition::Blackholed => {
                let mut rx = self.partition.subscribe();
                let _ = rx.wait_for(|p| *p != Partition::Blackholed).await;
                io::ErrorKind::ConnectionReset
            }
            _ => io::ErrorKind::ConnectionRefused,
        };
        let error = io::Error::new(
            kind,
            format!(
                "client {:?} is partitioned from the API server ({how:?})",
                self.name
            ),
        );
        Box::new(error)
    }

    /// Passes if the link is up now for a request with `method`; otherwise the error the
    /// client sees.
    async fn cross(&self, method: &Method) -> Result<(), BoxError> {
        let now = *self.partition.borrow();
        match now {
            Partition::Connected | Partition::WatchesHang => Ok(()),
            Partition::ReadsFail if *method != Method::GET => Ok(()),
            other => Err(self.fail(other).await),
        }
    }
}

impl ApiServer {
    pub(crate) fn link(&self, name: &str) -> Arc<ClientLink> {
        let mut inner = self.lock();
        let links = &mut inner.clients;
        links
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(ClientLink::new(name)))
            .clone()
    }

    /// A `kube::Client` whose requests go through the named link.
    pub(crate) fn client_on(&self, link: Arc<ClientLink>) -> kube::Client {
        let server = self.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let (server, link) = (server.clone(), link.clone());
            async move { server.call(&link, request).await }
        });
        kube::Client::new(service, "default")
    }

    async fn call(
        &self,
        link: &Arc<ClientLink>,
        request: Request<kube::client::Body>,
    ) -> Result<Response<Body>, BoxError> {
        let entry = {
            let mut inner = self.lock();
            inner.log.push(Logged {
                client: link.name.clone(),
                method: request.method().clone(),
                uri: request.uri().to_string(),
                resource: Route::parse(request.uri().path()).map(|r| r.gr.plural),
                at: Instant::now(),
                reached: false,
                status: None,
            });
            inner.log.len() - 1
        };
        let method = request.method().clone();
        let (to_server, to_client) = link.latency();
        if !to_server.is_zero() {
            sleep(to_server).await;
        }
        link.cross(&method).await?;
        self.lock().log[entry].reached = true;
        let response = self.handle(link, request).await;
        self.lock().log[entry].status = Some(response.status().as_u16());
        if !to_client.is_zero() {
            sleep(to_client).await;
        }
        link.cross(&method).await?;
        Ok(response)
    }
}
