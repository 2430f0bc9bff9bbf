//! What a process's client reads from the API server, counted on the client side (W17): a
//! layer over kube's client that counts, for the requests of one resource (by the last segment
//! of the path, `configmaps`), the requests, the bytes of list and of watch responses, and the
//! watch events (one JSON object per line in a watch response, bookmarks included).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

/// The counters (shared with the layer's services and bodies).
#[derive(Debug, Default)]
pub struct Traffic {
    /// Requests sent for the resource.
    pub requests: AtomicU64,
    /// Bytes of the resource's list responses (and of its other requests' answers).
    pub list_bytes: AtomicU64,
    /// Bytes of the resource's watch responses.
    pub watch_bytes: AtomicU64,
    /// Watch events received (lines of the watch responses).
    pub watch_events: AtomicU64,
}

impl Traffic {
    /// `requests list_bytes watch_bytes watch_events`, for a ledger line.
    pub fn line(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} {} {} {}",
            get(&self.requests),
            get(&self.list_bytes),
            get(&self.watch_bytes),
            get(&self.watch_events)
        )
    }
}

/// The layer: counts the traffic of the requests whose path ends with `/{resource}` (or names
/// one object of it).
#[derive(Clone, Debug)]
pub struct CountTraffic {
    resource: Arc<str>,
    traffic: Arc<Traffic>,
}

impl CountTraffic {
    /// Counts `resource`'s traffic into `traffic`.
    pub fn new(resource: &str, traffic: Arc<Traffic>) -> Self {
        CountTraffic {
            resource: Arc::from(format!("/{resource}")),
            traffic,
        }
    }
}

impl<S> Layer<S> for CountTraffic {
    type Service = Counting<S>;

    fn layer(&self, inner: S) -> Counting<S> {
        Counting {
            inner,
            layer: self.clone(),
        }
    }
}

/// A client service that counts a resource's traffic.
#[derive(Clone, Debug)]
pub struct Counting<S> {
    inner: S,
    layer: CountTraffic,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Counting<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Future: Send + 'static,
    ResB: Body<Data = Bytes> + Unpin + Send + 'static,
{
    type Response = Response<CountedBody<ResB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let uri = request.uri();
        let path = uri.path();
        let ours = path.ends_with(&*self.layer.resource)
            || path
                .rsplit_once('/')
                .is_some_and(|(parent, _)| parent.ends_with(&*self.layer.resource));
        let watch = uri.query().is_some_and(|q| q.contains("watch=true"));
        let counted = ours.then(|| {
            self.layer.traffic.requests.fetch_add(1, Ordering::Relaxed);
            (self.layer.traffic.clone(), watch)
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| CountedBody { inner, counted }))
        })
    }
}

/// A response body whose bytes (and, for a watch, lines) are counted.
pub struct CountedBody<B> {
    inner: B,
    /// The counters and whether it is a watch (`None`: not counted).
    counted: Option<(Arc<Traffic>, bool)>,
}

impl<B> std::fmt::Debug for CountedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountedBody").finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for CountedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some((traffic, watch))) = (&polled, &this.counted)
            && let Some(data) = frame.data_ref()
        {
            let bytes = data.len() as u64;
            if *watch {
                traffic.watch_bytes.fetch_add(bytes, Ordering::Relaxed);
                let lines = data.iter().filter(|b| **b == b'\n').count() as u64;
                traffic.watch_events.fetch_add(lines, Ordering::Relaxed);
            } else {
                traffic.list_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
