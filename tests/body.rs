//! Identification from a buffered body (feature `buffered-body`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier, TierIdentifier, TierIdentity, TierLimitLayer};

/// Reads `{"api_key": ".."}`; keys starting with `pro_` are pro.
#[derive(Clone, Default)]
struct BodyKeys {
    calls: Arc<AtomicUsize>,
}

#[tower_rate_tier::async_trait]
impl TierIdentifier for BodyKeys {
    async fn identify(&self, _headers: &HeaderMap) -> Option<TierIdentity> {
        None
    }

    async fn identify_with_body(&self, _headers: &HeaderMap, body: &Bytes) -> Option<TierIdentity> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let json: serde_json::Value = serde_json::from_slice(body).ok()?;
        let key = json.get("api_key")?.as_str()?;
        Some(TierIdentity::new(
            key,
            if key.starts_with("pro_") { "pro" } else { "free" },
        ))
    }
}

fn app(ids: BodyKeys, inner_calls: Arc<AtomicUsize>) -> Router {
    app_with_limit(ids, inner_calls, 1024)
}

fn app_with_limit(ids: BodyKeys, inner_calls: Arc<AtomicUsize>, max_body_size: usize) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .tier("pro", Quota::per_minute(100))
        .clock(FakeClock::new())
        .build();
    Router::new()
        .route(
            "/echo",
            post(move |body: Bytes| {
                inner_calls.fetch_add(1, Ordering::SeqCst);
                async move { body }
            }),
        )
        .layer(
            TierLimitLayer::new(tiers)
                .identifier(ids)
                .buffer_body(true)
                .max_body_size(max_body_size)
                .body_timeout(Duration::from_millis(200)),
        )
}

async fn send(app: &Router, body: Body) -> (StatusCode, Option<String>, Bytes) {
    let req = Request::post("/echo").body(body).unwrap();
    let response = app.clone().oneshot(req).await.unwrap();
    let remaining = response
        .headers()
        .get("x-ratelimit-remaining")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = response.status();
    (
        status,
        remaining,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// A body that yields its chunks, then fails or stalls.
struct Scripted {
    chunks: Vec<Bytes>,
    end: End,
}

#[derive(Clone, Copy)]
enum End {
    Fail,
    Stall,
}

impl http_body::Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if !self.chunks.is_empty() {
            let chunk = self.chunks.remove(0);
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        match self.end {
            End::Fail => Poll::Ready(Some(Err(std::io::Error::other("connection reset")))),
            End::Stall => Poll::Pending,
        }
    }
}

#[tokio::test]
async fn the_body_identifies_and_reaches_the_handler_intact() {
    let (ids, inner) = (BodyKeys::default(), Arc::new(AtomicUsize::new(0)));
    let app = app(ids.clone(), inner.clone());
    let payload = r#"{"api_key":"free_ada","data":"hello"}"#;
    assert_eq!(
        send(&app, Body::from(payload)).await,
        (StatusCode::OK, Some("1".into()), Bytes::from(payload))
    );
    assert_eq!(send(&app, Body::from(payload)).await.1.as_deref(), Some("0"));
    assert_eq!(
        send(&app, Body::from(payload)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let pro = r#"{"api_key":"pro_bob"}"#;
    assert_eq!(send(&app, Body::from(pro)).await.1.as_deref(), Some("99"));
    assert_eq!(ids.calls.load(Ordering::SeqCst), 4);
    assert_eq!(inner.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_without_identifier_or_handler() {
    let (ids, inner) = (BodyKeys::default(), Arc::new(AtomicUsize::new(0)));
    let app = app(ids.clone(), inner.clone());
    // declared by Content-Length
    let big = format!(r#"{{"api_key":"free_ada","pad":"{}"}}"#, "x".repeat(2048));
    assert_eq!(send(&app, Body::from(big)).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    // streamed without a length
    let chunks = vec![Bytes::from(vec![b'x'; 700]), Bytes::from(vec![b'x'; 700])];
    let streamed = Body::new(Scripted {
        chunks,
        end: End::Fail,
    });
    assert_eq!(send(&app, streamed).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(ids.calls.load(Ordering::SeqCst), 0);
    assert_eq!(inner.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_body_that_fails_or_stalls_gets_a_clear_4xx_not_a_hang() {
    let (ids, inner) = (BodyKeys::default(), Arc::new(AtomicUsize::new(0)));
    let app = app(ids.clone(), inner.clone());
    let failing = Body::new(Scripted {
        chunks: vec![Bytes::from_static(b"{\"api")],
        end: End::Fail,
    });
    assert_eq!(send(&app, failing).await.0, StatusCode::BAD_REQUEST);
    let started = Instant::now();
    let stalling = Body::new(Scripted {
        chunks: vec![Bytes::from_static(b"{\"api")],
        end: End::Stall,
    });
    assert_eq!(send(&app, stalling).await.0, StatusCode::REQUEST_TIMEOUT);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(ids.calls.load(Ordering::SeqCst), 0);
    assert_eq!(inner.load(Ordering::SeqCst), 0);
}

/// An outer limiter in front of a buffered one: the inner one's answers to
/// bodies too large (413) or too slow (408) count in the outer limit, so
/// that it throttles a client sending them (they are no refusals for want
/// of quota, which would consume nothing further out).
#[tokio::test]
async fn an_outer_limit_counts_the_bodies_an_inner_buffered_limiter_cannot_read() {
    let outer = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .clock(FakeClock::new())
        .build();
    let inner = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .clock(FakeClock::new())
        .build();
    let app = Router::new()
        .route("/", post(|body: Bytes| async move { body }))
        .layer(
            TierLimitLayer::new(inner)
                .identifier_fn(tower_rate_tier_tests::reply::header_identity)
                .buffer_body(true)
                .max_body_size(8)
                // the body stalls for good: a 408 whatever the machine's speed
                .body_timeout(Duration::from_millis(20)),
        )
        .layer(TierLimitLayer::new(outer).identifier_fn(tower_rate_tier_tests::reply::header_identity));
    let post = |chunk: &'static [u8]| {
        let body = Scripted {
            chunks: vec![Bytes::from_static(chunk)],
            end: End::Stall,
        };
        let request = Request::post("/").header("x-user", "ada").body(Body::new(body));
        request.unwrap()
    };
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let answer = app.clone().oneshot(post(&[b'x'; 100])).await.unwrap();
        statuses.push(answer.status().as_u16());
        let answer = app.clone().oneshot(post(b"x")).await.unwrap();
        statuses.push(answer.status().as_u16());
    }
    assert_eq!(statuses, [413, 408, 429, 429, 429, 429]);
}

/// A body always ready with empty data frames, never ending: the read
/// yields between frames, so its deadline answers 408 (it spun on the task
/// for good before).
#[tokio::test]
async fn a_body_of_endless_empty_frames_meets_its_deadline() {
    struct EmptyFrames;
    impl http_body::Body for EmptyFrames {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Ready(Some(Ok(Frame::data(Bytes::new()))))
        }
    }
    let (ids, inner) = (BodyKeys::default(), Arc::new(AtomicUsize::new(0)));
    let app = app(ids, inner.clone());
    let (status, _, _) = send(&app, Body::new(EmptyFrames)).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    assert_eq!(inner.load(Ordering::SeqCst), 0);
}

/// A client's declared length is no allocation: a body that says it holds
/// a petabyte (an exact size hint, as hyper gives from `Content-Length`)
/// and sends a few bytes, under a limit meant as "no limit", is read as
/// what it sends (the process aborted on the allocation before).
#[tokio::test]
async fn a_declared_length_far_above_what_is_sent_reserves_nothing_of_it() {
    struct Declared(Option<Bytes>);
    impl http_body::Body for Declared {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Ready(self.0.take().map(|chunk| Ok(Frame::data(chunk))))
        }
        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(1 << 50)
        }
    }
    let (ids, inner) = (BodyKeys::default(), Arc::new(AtomicUsize::new(0)));
    let app = app_with_limit(ids, inner.clone(), usize::MAX);
    let payload = r#"{"api_key":"free_ada"}"#;
    let (status, _, echoed) = send(&app, Body::new(Declared(Some(Bytes::from(payload))))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echoed, Bytes::from(payload));
    assert_eq!(inner.load(Ordering::SeqCst), 1);
}
