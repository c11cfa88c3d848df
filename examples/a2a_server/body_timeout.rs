//! A request body that stops coming fails: each of its frames must arrive within
//! `--body-timeout` of the one before (or of its headers). hyper bounds how long headers may
//! take (30 s), nothing bounds a body: a client that announced 100 bytes and sent none held its
//! connection, its place among `--max-in-flight`, and a graceful stop, for ever. A request
//! whose body timed out is answered 408 with a JSON-RPC error that says so (jsonrpsee, which
//! reads most bodies, would answer 500 Internal error), and its connection closes.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::CONNECTION;
use http::{HeaderValue, StatusCode};
use http_body::{Body, Frame, SizeHint};
use idem::layers::A2A_EXTENSIONS;
use jsonrpsee::server::{HttpBody, HttpResponse};
use serde_json::json;
use tokio::time::{Instant, Sleep};

use crate::front::invalid_request;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The layer: wraps every request's body.
#[derive(Clone, Copy)]
pub struct BodyTimeoutLayer {
    pub idle: Duration,
}

impl<S> tower::Layer<S> for BodyTimeoutLayer {
    type Service = BodyTimeoutService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyTimeoutService {
            inner,
            idle: self.idle,
        }
    }
}

/// The service of [`BodyTimeoutLayer`].
#[derive(Clone)]
pub struct BodyTimeoutService<S> {
    inner: S,
    idle: Duration,
}

impl<S, B> tower::Service<http::Request<B>> for BodyTimeoutService<S>
where
    S: tower::Service<http::Request<HttpBody>, Response = HttpResponse>,
    S::Future: Unpin,
    B: Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = HttpResponse;
    type Error = S::Error;
    type Future = Answer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (idle, timed_out) = (self.idle, Arc::new(AtomicBool::new(false)));
        let body = |body| HttpBody::new(IdleTimeout::new(body, idle, timed_out.clone()));
        let inner = self.inner.call(request.map(body));
        Answer {
            inner,
            idle,
            timed_out,
        }
    }
}

/// The inner service's answer, or the 408 if the request's body timed out meanwhile.
pub struct Answer<F> {
    inner: F,
    idle: Duration,
    timed_out: Arc<AtomicBool>,
}

impl<F, E> Future for Answer<F>
where
    F: Future<Output = Result<HttpResponse, E>> + Unpin,
{
    type Output = Result<HttpResponse, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        match (answer, self.timed_out.load(Ordering::Relaxed)) {
            (Ok(inner), true) => Poll::Ready(Ok(timed_out(self.idle, &inner))),
            (answer, _) => Poll::Ready(answer),
        }
    }
}

/// The 408, with the extensions the inner answer echoed (the idempotency layer echoes its
/// activation on every answer, this one included).
fn timed_out(idle: Duration, inner: &HttpResponse) -> HttpResponse {
    let data = json!({"reason": silence(idle)});
    let mut response = invalid_request(StatusCode::REQUEST_TIMEOUT, data);
    let headers = response.headers_mut();
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    for echoed in inner.headers().get_all(A2A_EXTENSIONS) {
        headers.append(A2A_EXTENSIONS, echoed.clone());
    }
    response
}

fn silence(idle: Duration) -> String {
    format!(
        "the request's body sent nothing for {} s",
        idle.as_secs_f64()
    )
}

/// A body whose next frame is due within `idle`.
struct IdleTimeout<B> {
    body: B,
    idle: Duration,
    due: Pin<Box<Sleep>>,
    /// Set when it timed out: the request is then answered 408.
    timed_out: Arc<AtomicBool>,
}

impl<B> IdleTimeout<B> {
    fn new(body: B, idle: Duration, timed_out: Arc<AtomicBool>) -> Self {
        Self {
            body,
            idle,
            due: Box::pin(tokio::time::sleep(idle)),
            timed_out,
        }
    }
}

impl<B> Body for IdleTimeout<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = Instant::now() + this.idle;
                this.due.as_mut().reset(next);
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => match this.due.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.timed_out.store(true, Ordering::Relaxed);
                    Poll::Ready(Some(Err(silence(this.idle).into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
