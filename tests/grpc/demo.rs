//! A hand-written tonic service (no protoc, no build script): `demo.Quota`
//! with unary `Cheap` and `Expensive` methods echoing a string
//! (`google.protobuf.StringValue` on the wire), a client for it, servers
//! over real TCP on 127.0.0.1, and a storage that is down.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_rate_tier::clock::Clock;
use tower_rate_tier::storage::{Decide, Op, Storage, StorageError, StorageErrorKind, StorageKey};
use tower_rate_tier::{Quota, TierIdentity, TierLimitLayer, TierUsage};

pub(crate) const CHEAP: &str = "/demo.Quota/Cheap";
pub(crate) const EXPENSIVE: &str = "/demo.Quota/Expensive";
/// Reserves 10 `points`, then as many `tokens` as its request says, through
/// the request's `TierUsage`; a refusal is its `tonic::Status`.
pub(crate) const RESERVE: &str = "/demo.Quota/Reserve";
/// Reserves 60 tokens, then 60 more it can do without (a refusal it does
/// not answer with), records 10, reserves 10 points, and answers its own
/// RESOURCE_EXHAUSTED (an upstream's quota, say).
pub(crate) const SWALLOW: &str = "/demo.Quota/Swallow";
/// Reserves 60 tokens, then 60 points, and answers with the first refusal
/// it met (the tokens').
pub(crate) const FIRST_OF_TWO: &str = "/demo.Quota/FirstOfTwo";

/// The service: both methods echo their request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Demo;

impl NamedService for Demo {
    const NAME: &'static str = "demo.Quota";
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> tower::Service<http::Request<B>> for Demo
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<String, String>::default());
            let echo = tower::service_fn(|request: tonic::Request<String>| async move {
                Ok::<_, Status>(tonic::Response::new(request.into_inner()))
            });
            let reserve = tower::service_fn(|request: tonic::Request<String>| async move {
                let usage = TierUsage::from_extensions(request.extensions())
                    .ok_or_else(|| Status::internal("no limiter in front"))?;
                let tokens: u32 = request
                    .get_ref()
                    .parse()
                    .map_err(|_| Status::invalid_argument("a number of tokens"))?;
                usage.reserve("points", 10).await?;
                usage.reserve("tokens", tokens).await?;
                Ok::<_, Status>(tonic::Response::new(request.into_inner()))
            });
            let swallow = tower::service_fn(|request: tonic::Request<String>| async move {
                let usage = TierUsage::from_extensions(request.extensions())
                    .ok_or_else(|| Status::internal("no limiter in front"))?;
                usage.reserve("tokens", 60).await?;
                let _ = usage.reserve("tokens", 60).await;
                usage.record("tokens", 10);
                usage.reserve("points", 10).await?;
                Err::<tonic::Response<String>, _>(Status::resource_exhausted("upstream quota"))
            });
            let first_of_two = tower::service_fn(|request: tonic::Request<String>| async move {
                let usage = TierUsage::from_extensions(request.extensions())
                    .ok_or_else(|| Status::internal("no limiter in front"))?;
                let tokens = usage.reserve("tokens", 60).await;
                let points = usage.reserve("points", 60).await;
                tokens?;
                points?;
                Ok::<_, Status>(tonic::Response::new(request.into_inner()))
            });
            Ok(match req.uri().path() {
                CHEAP | EXPENSIVE => grpc.unary(echo, req).await,
                FIRST_OF_TWO => grpc.unary(first_of_two, req).await,
                RESERVE => grpc.unary(reserve, req).await,
                SWALLOW => grpc.unary(swallow, req).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

/// The tests' identifier: the `x-api-key` metadata is the user, `x-plan`
/// the tier (default `free`).
pub(crate) fn api_key(headers: &http::HeaderMap) -> Option<TierIdentity> {
    let key = headers.get("x-api-key")?.to_str().ok()?;
    let plan = headers
        .get("x-plan")
        .and_then(|p| p.to_str().ok())
        .unwrap_or("free");
    Some(TierIdentity::new(key, plan))
}

/// A TCP listener on a free loopback port.
pub(crate) async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let addr = listener.local_addr().expect("a bound address");
    (listener, addr)
}

/// Serves `demo.Quota` and the health service with tonic's server under
/// `limiter`; the server stops with the test's runtime.
pub(crate) async fn serve_tonic(limiter: TierLimitLayer) -> Channel {
    let (listener, addr) = listener().await;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .layer(limiter)
        .add_service(Demo)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener));
    tokio::spawn(server);
    connect(addr).await
}

/// A client channel to `addr` (HTTP/2 over plain TCP).
pub(crate) async fn connect(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("the server accepts connections")
}

/// Calls a `demo.Quota` method as `key` on `plan`: the echoed text, or the
/// status the call ended with.
pub(crate) async fn call(
    channel: &Channel,
    method: &'static str,
    key: &str,
    plan: &str,
) -> Result<String, Status> {
    send(channel, method, key, plan, format!("hello from {key}")).await
}

/// Calls a `demo.Quota` method as `key` on `plan` with the request `text`.
pub(crate) async fn send(
    channel: &Channel,
    method: &'static str,
    key: &str,
    plan: &str,
    text: String,
) -> Result<String, Status> {
    let mut client = tonic::client::Grpc::new(channel.clone());
    client
        .ready()
        .await
        .map_err(|e| Status::new(Code::Unknown, format!("not ready: {e}")))?;
    let mut request = tonic::Request::new(text);
    request
        .metadata_mut()
        .insert("x-api-key", key.parse().expect("ASCII key"));
    request
        .metadata_mut()
        .insert("x-plan", plan.parse().expect("ASCII plan"));
    let codec = ProstCodec::<String, String>::default();
    let response = client
        .unary(request, PathAndQuery::from_static(method), codec)
        .await?;
    Ok(response.into_inner())
}

/// A storage that is down: every decision fails.
#[derive(Debug, Clone)]
pub(crate) struct Down;

impl Storage for Down {
    fn decide(&self, _: StorageKey<'_>, _: &[Quota], _: Op, _: &Arc<dyn Clock>) -> Decide {
        Decide::ready(Err(StorageError::new(
            StorageErrorKind::Unavailable,
            "connection refused",
        )))
    }
}
