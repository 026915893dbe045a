//! The storage under the HTTP layer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request};
use tower::ServiceExt;
use tower_rate_tier::storage::RedisStorage;
use tower_rate_tier::{OnStorageError, Quota, RateTier, TierIdentity, TierLimitLayer, tier_cost};
use tower_rate_tier_tests::redis::RedisServer;
use tower_rate_tier_tests::storage_ops::Tally;

use super::storage;

fn identity(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    Some(TierIdentity::new(user, "free"))
}

#[tier_cost(5)]
async fn search() -> &'static str {
    "hits"
}

fn app(storage: RedisStorage, policy: OnStorageError, calls: &Arc<AtomicU32>) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(1_000))
        .storage(storage)
        .build();
    let counted = {
        let calls = calls.clone();
        move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            "ok"
        }
    };
    Router::new()
        .route("/plain", get(counted))
        .route("/export", get(|| async { "csv" }).layer(tier_cost(20)))
        .route("/search", get(search))
        .layer(
            TierLimitLayer::new(tiers)
                .identifier_fn(identity)
                .on_storage_error(policy),
        )
}

/// (status, X-RateLimit-Remaining) of `GET path` as `user`.
async fn get_as(app: &Router, path: &str, user: &str) -> (u16, Option<u32>) {
    let req = Request::builder()
        .uri(path)
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let remaining = res
        .headers()
        .get("x-ratelimit-remaining")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (res.status().as_u16(), remaining)
}

#[tokio::test]
async fn layer_one_script_call_per_request_including_costed_routes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let calls = Arc::new(AtomicU32::new(0));
    let app = app(storage(&server.url()).await, OnStorageError::Deny, &calls);
    // the first request of a costed route teaches the edge its cost
    assert_eq!(get_as(&app, "/export", "ada").await, (200, Some(980)));
    assert_eq!(get_as(&app, "/search", "ada").await, (200, Some(975)));
    server.cli(&["CONFIG", "RESETSTAT"]);
    let mut requests = 0;
    let mut expected = 975;
    for _ in 0..10 {
        for (path, cost) in [("/plain", 1), ("/export", 20), ("/search", 5)] {
            expected -= cost;
            assert_eq!(get_as(&app, path, "ada").await, (200, Some(expected)), "{path}");
            requests += 1;
        }
    }
    let calls_seen = server.command_calls("evalsha") + server.command_calls("eval");
    assert_eq!(calls_seen, requests, "script calls for {requests} requests");
    assert_eq!(calls.load(Ordering::SeqCst), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_fails_open_or_closed_while_redis_is_down() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let timeout = Duration::from_millis(250);
    let connect = || async {
        RedisStorage::builder(server.url())
            .timeout(timeout)
            .connect()
            .await
            .unwrap()
    };
    let calls = Arc::new(AtomicU32::new(0));
    let open = app(connect().await, OnStorageError::Allow, &calls);
    let closed = app(connect().await, OnStorageError::Deny, &calls);
    assert_eq!(get_as(&open, "/plain", "ada").await, (200, Some(999)));
    assert_eq!(get_as(&closed, "/plain", "ada").await, (200, Some(998)));
    server.kill();
    for _ in 0..5 {
        let started = Instant::now();
        // fail open: served, without rate-limit fields
        assert_eq!(get_as(&open, "/plain", "ada").await, (200, None));
        // fail closed: 503, the handler is not called
        assert_eq!(get_as(&closed, "/plain", "ada").await, (503, None));
        assert!(started.elapsed() < 2 * (timeout + Duration::from_millis(250)));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2 + 5);
    server.restart();
    // each app's connection recovers by itself: limited again within 2 s
    // (the restarted server is empty, so remaining starts afresh)
    let deadline = Instant::now() + Duration::from_secs(2);
    for (app, user) in [(&closed, "bob"), (&open, "eve")] {
        loop {
            match get_as(app, "/plain", user).await {
                (200, Some(remaining)) => {
                    assert_eq!(remaining, 999);
                    break;
                }
                other => assert!(Instant::now() < deadline, "{other:?} 2 s after the restart"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Storages wrap storages: two counting wrappers around Redis, under the
/// layer. Every decision passes through both, and the limit holds.
#[tokio::test]
async fn wrappers_around_redis_compose_under_the_layer() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let outer = Tally::new(Tally::new(storage(&server.url()).await));
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(3))
        .storage(outer.clone())
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/search", get(search))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identity));
    let statuses = [
        get_as(&app, "/", "wrapped").await,
        get_as(&app, "/", "wrapped").await,
        get_as(&app, "/", "wrapped").await,
        get_as(&app, "/", "wrapped").await,
    ];
    assert_eq!(
        statuses,
        [(200, Some(2)), (200, Some(1)), (200, Some(0)), (429, Some(0))]
    );
    // four charges went through both wrappers to Redis
    let inner = outer.inner_ref();
    assert_eq!(outer.counts(), (4, 0));
    assert_eq!(inner.counts(), (4, 0));
}

/// A request answered 500 and given back (`refund_on`) through Redis, whose
/// intervals are whole microseconds (`per_minute(7)`'s is not a whole
/// number of nanoseconds either): the response says what Redis holds after
/// the refund, 7, not one less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refunded_response_says_what_redis_holds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url()).connect().await.unwrap();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(7))
        .storage(redis)
        .build();
    let app = Router::new()
        .route("/fail", get(|| async { http::StatusCode::INTERNAL_SERVER_ERROR }))
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(identity)
                .refund_on(|status| status.is_server_error()),
        );
    let request = Request::get("/fail")
        .header("x-user", "ada")
        .body(Body::empty())
        .unwrap();
    let failed = app.oneshot(request).await.unwrap();
    assert_eq!(failed.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.headers()["x-ratelimit-remaining"], "7");
    // the refund is given back in a task of its own
    for _ in 0..100 {
        if tiers.check("ada", "free", 0).await.unwrap().unwrap().remaining == 7 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("Redis never got the refund");
}
