//! Identification from the request body (feature `buffered-body`):
//! [`BufferedTierLimitLayer`].
//!
//! [`TierLimitLayer::buffer_body(true)`](crate::TierLimitLayer::buffer_body)
//! returns a [`BufferedTierLimitLayer`]: it reads the body (up to
//! [`max_body_size`](BufferedTierLimitLayer::max_body_size), default 64 KiB,
//! within [`body_timeout`](BufferedTierLimitLayer::body_timeout), default
//! 10 s), hands it to
//! [`TierIdentifier::identify_with_body`](crate::TierIdentifier::identify_with_body),
//! and passes its data on intact to the inner service (its trailers are
//! dropped: the body is rebuilt from its bytes). The request body type must
//! be buildable from [`Bytes`] (axum's `Body` is; hyper's `Incoming` is not:
//! map it to a `Full<Bytes>` or axum `Body` first).
//!
//! | body | answer |
//! | --- | --- |
//! | larger than the limit (declared or streamed) | 413, identifier and inner service not called |
//! | stalls longer than the timeout | 408 |
//! | fails mid-stream | 400 |
//!
//! A gRPC request (feature `grpc`) is first identified by its headers
//! ([`TierIdentifier::identify_parts`](crate::TierIdentifier::identify_parts)):
//! when they identify it, it is not buffered and streams untouched; when
//! they do not, it is buffered and identified from its body like any other
//! request (the identifier is then asked twice), and the refusals above
//! answer in gRPC form. An identifier given as a closure over the headers
//! reads no body, and its gRPC requests are never buffered. Every refusal
//! carries `Cache-Control: no-store`; a limiter further out counts these
//! answers (they are no refusals for want of quota), so an outer
//! header-keyed or per-address limit throttles a client sending bodies that
//! cannot be read.
//!
//! A body is read before its client is known: a tier's concurrency limit
//! counts requests from their identification on, not the reads before it.
//! A client may hold as many reads as it opens requests, each at most
//! `max_body_size` for at most `body_timeout`: bound connections and
//! streams in the server, or put a header-keyed limiter outside this one.
//! Over HTTP (not gRPC) the identifier is asked with
//! [`identify_with_body`](crate::TierIdentifier::identify_with_body), whose
//! default asks [`identify`](crate::TierIdentifier::identify) with the
//! headers, not `identify_parts`.
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use axum::{Router, body::Body, routing::post};
//! use bytes::Bytes;
//! use http::{HeaderMap, Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_rate_tier::{Quota, RateTier, TierIdentifier, TierIdentity, TierLimitLayer};
//!
//! /// The API key is the body's `key=` form field.
//! struct KeyInBody;
//!
//! #[tower_rate_tier::async_trait]
//! impl TierIdentifier for KeyInBody {
//!     async fn identify(&self, _headers: &HeaderMap) -> Option<TierIdentity> {
//!         None
//!     }
//!     async fn identify_with_body(&self, _headers: &HeaderMap, body: &Bytes) -> Option<TierIdentity> {
//!         let key = std::str::from_utf8(body).ok()?.strip_prefix("key=")?;
//!         Some(TierIdentity::new(key, "free"))
//!     }
//! }
//!
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(1)).build();
//! let app = Router::new()
//!     .route("/", post(|body: String| async move { body })) // the body arrives intact
//!     .layer(TierLimitLayer::new(tiers).identifier(KeyInBody).buffer_body(true).max_body_size(1024));
//! let send = |body: String| app.clone().oneshot(Request::post("/").body(Body::from(body)).unwrap());
//!
//! assert_eq!(send("key=ada".into()).await.unwrap().status(), StatusCode::OK);
//! assert_eq!(send("key=ada".into()).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(send("key=bob".into()).await.unwrap().status(), StatusCode::OK);
//! assert_eq!(send("x".repeat(2048)).await.unwrap().status(), StatusCode::PAYLOAD_TOO_LARGE);
//! # }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use tower_layer::Layer;
use tower_service::Service;

use super::admit;
use super::config::{Identify, LayerConfig};
use super::future::ResponseFuture;
use super::layer::TierLimitLayer;
use super::service::{Start, TierLimitService, serve};
use crate::body::ResponseBody;
use crate::problem::problem;

impl TierLimitLayer {
    /// Buffers request bodies so the identifier can read them (see
    /// [`BufferedTierLimitLayer`]). `false` gives a layer that behaves like this one.
    pub fn buffer_body(self, buffer: bool) -> BufferedTierLimitLayer {
        BufferedTierLimitLayer { layer: self, buffer }
    }
}

/// A [`TierLimitLayer`] that buffers request bodies for identification.
#[derive(Clone, Debug)]
pub struct BufferedTierLimitLayer {
    layer: TierLimitLayer,
    buffer: bool,
}

impl BufferedTierLimitLayer {
    /// The largest body buffered (default 64 KiB); larger bodies get 413.
    /// The buffer grows as the body's data arrives: a client that declares
    /// a large `Content-Length` and sends less holds at most 64 KiB before
    /// its data, whatever this limit.
    pub fn max_body_size(mut self, bytes: usize) -> Self {
        self.layer.configure().body.max = bytes;
        self
    }

    /// How long reading the body may take (default 10 s); slower bodies get
    /// 408.
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.layer.configure().body.timeout = timeout;
        self
    }
}

impl<S> Layer<S> for BufferedTierLimitLayer {
    type Service = BufferedTierLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferedTierLimitService {
            inner: self.layer.layer(inner),
            buffer: self.buffer,
        }
    }
}

/// The service of [`BufferedTierLimitLayer`].
#[derive(Clone)]
pub struct BufferedTierLimitService<S> {
    inner: TierLimitService<S>,
    buffer: bool,
}

impl<S: fmt::Debug> fmt::Debug for BufferedTierLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferedTierLimitService")
            .field("inner", &self.inner)
            .field("buffer", &self.buffer)
            .finish()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A refusal of the body (413, 408, 400), counted, in the request's
/// protocol (gRPC's for a gRPC request).
fn refuse(
    config: &LayerConfig,
    request: &http::HeaderMap,
    status: StatusCode,
    detail: &str,
) -> Response<Bytes> {
    #[cfg(feature = "metrics")]
    if let Some(counters) = &config.metrics {
        counters.count(None, crate::metrics::Outcome::BodyRejected);
    }
    admit::answer(config, request, problem(status, detail, serde_json::Value::Null))
}

const TOO_LARGE: &str = "the request body is larger than the limit";

impl<S, ReqB, ResB> Service<Request<ReqB>> for BufferedTierLimitService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: HttpBody + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if !self.buffer {
            return self.inner.call(req);
        }
        // A gRPC stream that its headers identify is not buffered; one they
        // do not identify is buffered and identified from its body like any
        // other request. (An identifier without a body method reads headers
        // only: its gRPC streams are never buffered.)
        #[cfg(feature = "grpc")]
        let headers_first = crate::grpc::is_grpc(req.headers());
        #[cfg(not(feature = "grpc"))]
        let headers_first = false;
        if headers_first && !matches!(self.inner.config.identify, Identify::Async(_)) {
            return self.inner.call(req);
        }
        let limits = self.inner.config.body;
        // A body that says it is too large is refused without reading it
        // (a gRPC request only once its headers did not identify it).
        let declares_too_large = req.body().size_hint().lower() > limits.max as u64
            || declared_length(&req) > Some(limits.max as u64);
        if declares_too_large && !headers_first {
            let mut answer = refuse(
                &self.inner.config,
                req.headers(),
                StatusCode::PAYLOAD_TOO_LARGE,
                TOO_LARGE,
            );
            crate::body::mark_answer(&mut answer);
            return ResponseFuture::answer(answer);
        }
        let (parts, body) = req.into_parts();
        let config = self.inner.config.clone();
        // The inner service is called later: take the one that was polled
        // ready and leave a clone.
        let clone = self.inner.inner.clone();
        let inner = std::mem::replace(&mut self.inner.inner, clone);
        // The body is read first; then the request takes the limiter's one
        // serve path, with the identity the body gave.
        ResponseFuture::boxed(Box::pin(async move {
            if headers_first {
                let identity = admit::identify(&config, &parts).await;
                if identity.is_some() {
                    return serve(config, inner, Start::Identified(identity), parts, body).await;
                }
                if declares_too_large {
                    let refusal = refuse(&config, &parts.headers, StatusCode::PAYLOAD_TOO_LARGE, TOO_LARGE);
                    return Ok(crate::body::answer(refusal));
                }
            }
            let read = tokio::time::timeout(limits.timeout, read_body(body, limits.max)).await;
            let bytes = match read {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(unread)) => {
                    let (status, detail) = match unread {
                        Unread::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, TOO_LARGE),
                        Unread::Failed => (StatusCode::BAD_REQUEST, "the request body could not be read"),
                    };
                    return Ok(crate::body::answer(refuse(
                        &config,
                        &parts.headers,
                        status,
                        detail,
                    )));
                }
                Err(_) => {
                    let refusal = refuse(
                        &config,
                        &parts.headers,
                        StatusCode::REQUEST_TIMEOUT,
                        "the request body was not received in time",
                    );
                    return Ok(crate::body::answer(refusal));
                }
            };
            let identity = match &config.identify {
                Identify::Async(identifier) => identifier.identify_with_body(&parts.headers, &bytes).await,
                _ => admit::identify(&config, &parts).await,
            };
            serve(
                config,
                inner,
                Start::Identified(identity),
                parts,
                ReqB::from(bytes),
            )
            .await
        }))
    }
}

/// The most a body's buffer takes before its data arrives (it grows as
/// the data comes, up to the limit).
const PREALLOCATED_MAX: u64 = 64 * 1024;

/// Why a body was not read.
enum Unread {
    /// It holds more than the limit.
    TooLarge,
    /// Reading it failed.
    Failed,
}

/// Reads `body` whole, at most `max` bytes, into one buffer: each data
/// frame is copied in as it arrives, so a body sent in many small frames
/// holds its size, not a buffer per frame (nor the transport's buffers they
/// would share). Trailers are dropped. Each frame spends a unit of the
/// task's tokio budget, so that a body always ready with frames that add
/// nothing (empty data, trailers) still yields, and the read's deadline
/// is checked. The length the client declares is trusted for at most
/// [`PREALLOCATED_MAX`] bytes up front: a request that declares a large
/// body and sends none holds no more than that.
async fn read_body<B: HttpBody>(body: B, max: usize) -> Result<Bytes, Unread> {
    let mut body = std::pin::pin!(body);
    let hint = body
        .size_hint()
        .exact()
        .unwrap_or(0)
        .min(max as u64)
        .min(PREALLOCATED_MAX);
    let mut out = BytesMut::with_capacity(usize::try_from(hint).unwrap_or(0));
    loop {
        tokio::task::coop::consume_budget().await;
        let Some(frame) = body.frame().await else {
            break;
        };
        let Ok(data) = frame.map_err(|_| Unread::Failed)?.into_data() else {
            continue;
        };
        if data.remaining() > max - out.len() {
            return Err(Unread::TooLarge);
        }
        out.put(data);
    }
    Ok(out.freeze())
}

/// The `Content-Length` a request declares, if any.
fn declared_length<B>(req: &Request<B>) -> Option<u64> {
    req.headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}
