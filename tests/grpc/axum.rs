//! tonic services routed inside an axum app under the app's one limiter
//! (axum's `http2` serves the gRPC client): gRPC and HTTP callers spend one
//! quota per key, each refused in its own protocol; gRPC-Web gets gRPC's
//! answer over HTTP/1.1; a body-buffering limiter lets gRPC streams through
//! unbuffered.

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::Code;
use tonic::service::Routes;
use tonic::transport::Channel;
use tower_rate_tier::{Quota, RateTier, TierLimitLayer};

use crate::demo::{self, CHEAP, Demo, api_key, call};

/// Serves `app` with `axum::serve` (HTTP/1.1 and HTTP/2) on a loopback
/// port: a gRPC channel to it, and its base URL.
async fn serve(app: Router) -> (Channel, String) {
    let (listener, addr) = demo::listener().await;
    tokio::spawn(async move { axum::serve(listener, app).await });
    (demo::connect(addr).await, format!("http://{addr}"))
}

fn app() -> Router {
    Router::new()
        .route("/api", get(|| async { "hi" }))
        .route("/upload", post(|body: Bytes| async move { body }))
        .merge(Routes::new(Demo).into_axum_router())
}

fn free(quota: Quota) -> RateTier {
    RateTier::builder().tier("free", quota).build()
}

/// One HTTP/1.1 request: status, headers and body.
async fn http(request: Request<Full<Bytes>>) -> (StatusCode, http::HeaderMap, Bytes) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client.request(request).await.expect("the server answers");
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

#[tokio::test]
async fn grpc_and_http_callers_share_a_quota_each_refused_in_its_protocol() {
    let limiter = TierLimitLayer::new(free(Quota::per_minute(2))).identifier_fn(api_key);
    let (channel, base) = serve(app().layer(limiter)).await;
    let get_api = || {
        let request = Request::get(format!("{base}/api")).header("x-api-key", "ada");
        http(request.body(Full::default()).unwrap())
    };

    call(&channel, CHEAP, "ada", "free").await.unwrap();
    let (status, headers, _) = get_api().await;
    assert_eq!(
        (status, &headers["x-ratelimit-remaining"]),
        (StatusCode::OK, &"0".parse().unwrap())
    );

    let refused = call(&channel, CHEAP, "ada", "free").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    let (status, headers, body) = get_api().await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["tier"], "free");
    assert_eq!(headers["retry-after"], "30");
}

#[tokio::test]
async fn grpc_web_gets_a_trailers_only_answer_over_http1() {
    let limiter = TierLimitLayer::new(free(Quota::per_minute(1))).identifier_fn(api_key);
    let (channel, base) = serve(app().layer(limiter)).await;
    call(&channel, CHEAP, "ada", "free").await.unwrap();

    let request = Request::post(format!("{base}{CHEAP}"))
        .header("content-type", "application/grpc-web+proto")
        .header("x-api-key", "ada")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let (status, headers, body) = http(request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/grpc-web");
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(headers["retry-after"], "60");
    assert!(headers.contains_key("grpc-status-details-bin"));
    assert!(body.is_empty());
}

#[tokio::test]
async fn a_buffering_limiter_lets_grpc_streams_through_unbuffered() {
    // bodies are buffered up to 8 bytes for identification; a gRPC call's
    // frame alone is larger, and it is identified by its metadata instead
    let limiter = TierLimitLayer::new(free(Quota::per_minute(1)))
        .identifier_fn(api_key)
        .buffer_body(true)
        .max_body_size(8);
    let (channel, base) = serve(app().layer(limiter)).await;

    let upload = Request::post(format!("{base}/upload"))
        .header("x-api-key", "bob")
        .body(Full::new(Bytes::from_static(&[b'x'; 64])))
        .unwrap();
    assert_eq!(http(upload).await.0, StatusCode::PAYLOAD_TOO_LARGE);

    assert_eq!(
        call(&channel, CHEAP, "ada", "free").await.unwrap(),
        "hello from ada"
    );
    let refused = call(&channel, CHEAP, "ada", "free").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
}

/// The account is the body's `{"api_key": ..}`; a header `x-api-key` also
/// identifies (as gRPC metadata would).
#[derive(Clone, Default)]
struct KeyInBodyOrHeader;

#[tower_rate_tier::async_trait]
impl tower_rate_tier::TierIdentifier for KeyInBodyOrHeader {
    async fn identify(&self, headers: &http::HeaderMap) -> Option<tower_rate_tier::TierIdentity> {
        api_key(headers)
    }

    async fn identify_with_body(
        &self,
        headers: &http::HeaderMap,
        body: &Bytes,
    ) -> Option<tower_rate_tier::TierIdentity> {
        if let Some(identity) = api_key(headers) {
            return Some(identity);
        }
        let json: serde_json::Value = serde_json::from_slice(body).ok()?;
        let key = json.get("api_key")?.as_str()?;
        Some(tower_rate_tier::TierIdentity::new(key, "free"))
    }
}

/// 60 requests with the account's key in the body, every other one sent as
/// `application/grpc`: how many reached the handler.
async fn body_keyed_requests(limiter: tower_rate_tier::BufferedTierLimitLayer) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;
    let reached = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = reached.clone();
    let app = Router::new()
        .route(
            "/query",
            post(move |body: Bytes| async move {
                seen.fetch_add(1, Ordering::SeqCst);
                body
            }),
        )
        .layer(limiter);
    for i in 0..60 {
        let content_type = if i % 2 == 0 {
            "application/json"
        } else {
            "application/grpc"
        };
        let request = Request::post("/query")
            .header("content-type", content_type)
            .extension(axum::extract::ConnectInfo(std::net::SocketAddr::from((
                [10, 0, 0, i as u8],
                4000,
            ))))
            .body(axum::body::Body::from(r#"{"api_key": "acct-1"}"#))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        if response.status() != StatusCode::OK || response.headers().contains_key("grpc-status") {
            assert_eq!(
                response
                    .headers()
                    .get("cache-control")
                    .map(|v| v.to_str().unwrap()),
                Some("no-store"),
                "every refusal is marked no-store: {response:?}"
            );
        }
    }
    reached.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_grpc_content_type_does_not_switch_body_identification_off() {
    use tower_rate_tier::OnMissing;
    // `Allow`: an unidentified request would pass uncounted
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .on_missing(OnMissing::Allow)
        .build();
    let limiter = TierLimitLayer::new(tiers)
        .identifier(KeyInBodyOrHeader)
        .buffer_body(true);
    assert_eq!(body_keyed_requests(limiter).await, 5);
    // `UseDefault`: an unidentified request would get anonymous quota per
    // address (one new address per request here)
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .tier("anonymous", Quota::per_minute(100))
        .default_tier("anonymous")
        .build();
    let limiter = TierLimitLayer::new(tiers)
        .identifier(KeyInBodyOrHeader)
        .buffer_body(true);
    assert_eq!(body_keyed_requests(limiter).await, 5);
}

#[tokio::test]
async fn grpc_calls_identified_by_metadata_stream_and_body_refusals_answer_in_grpc() {
    // bodies are buffered up to 8 bytes: a gRPC call's frame alone is larger
    let limiter = TierLimitLayer::new(free(Quota::per_minute(1)))
        .identifier(KeyInBodyOrHeader)
        .buffer_body(true)
        .max_body_size(8);
    let (channel, base) = serve(app().layer(limiter)).await;
    // identified by its metadata: not buffered, so not too large
    assert_eq!(
        call(&channel, CHEAP, "ada", "free").await.unwrap(),
        "hello from ada"
    );
    let refused = call(&channel, CHEAP, "ada", "free").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    // unidentified by its headers: buffered, and too large, refused as gRPC
    // refuses (HTTP 200, grpc-status 8), never cached
    let upload = Request::post(format!("{base}/upload"))
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(&[b'x'; 64])))
        .unwrap();
    let (status, headers, body) = http(upload).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers.get("grpc-status").unwrap(), "8");
    assert_eq!(headers.get("cache-control").unwrap(), "no-store");
    assert!(body.is_empty());
    // the same as plain HTTP: a 413 problem, never cached
    let upload = Request::post(format!("{base}/upload"))
        .body(Full::new(Bytes::from_static(&[b'x'; 64])))
        .unwrap();
    let (status, headers, _) = http(upload).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(headers.get("cache-control").unwrap(), "no-store");
}
