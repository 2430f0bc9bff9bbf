//! Faults a replica process injects into its own client, switched by a file: what a proxy or a
//! load balancer between a controller and the API server does without telling anyone.
//!
//! [`WatchHang`]: while its flag file exists, every Lease watch of the client delivers nothing
//! and fails nothing (its connection stays open, as a proxy that holds the stream); what the
//! server sent meanwhile arrives, in order, once the file is removed. Lists and writes work.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

/// How often a hung watch looks at its flag file.
const POLL: Duration = Duration::from_millis(100);

/// The layer: Lease watches hang while the file `flag` exists.
#[derive(Clone, Debug)]
pub struct WatchHang {
    flag: Arc<PathBuf>,
}

impl WatchHang {
    /// Lease watches hang while `flag` exists.
    pub fn new(flag: PathBuf) -> Self {
        WatchHang {
            flag: Arc::new(flag),
        }
    }
}

impl<S> Layer<S> for WatchHang {
    type Service = Hanging<S>;

    fn layer(&self, inner: S) -> Hanging<S> {
        Hanging {
            inner,
            flag: self.flag.clone(),
        }
    }
}

/// A client service whose Lease watches hang while the flag file exists.
#[derive(Clone, Debug)]
pub struct Hanging<S> {
    inner: S,
    flag: Arc<PathBuf>,
}

fn is_lease_watch<B>(request: &Request<B>) -> bool {
    let uri = request.uri();
    uri.path().ends_with("/leases") && uri.query().is_some_and(|q| q.contains("watch=true"))
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Hanging<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Future: Send + 'static,
    ResB: Body<Data = Bytes> + Unpin + Send + 'static,
{
    type Response = Response<HungBody<ResB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let flag = is_lease_watch(&request).then(|| self.flag.clone());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| HungBody {
                inner,
                flag,
                sleep: None,
            }))
        })
    }
}

/// A response body that yields nothing while the flag file exists (`flag: None`: never hangs).
pub struct HungBody<B> {
    inner: B,
    flag: Option<Arc<PathBuf>>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> std::fmt::Debug for HungBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HungBody")
            .field("flag", &self.flag)
            .finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for HungBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(flag) = &this.flag {
            while flag.exists() {
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(POLL)));
                ready!(sleep.as_mut().poll(cx));
                this.sleep = None;
            }
        }
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
