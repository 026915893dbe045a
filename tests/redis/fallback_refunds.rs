//! Refunds through a fallback: what the local limiter charged while Redis
//! was away is given back there, or nowhere once Redis answers again, never
//! to Redis, which never charged it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_rate_tier::storage::{DecisionSource, Fallback, RedisStorage};
use tower_rate_tier::{OnStorageError, Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_tests::redis::RedisServer;

/// A fallback around `server` that answers locally from the first failure
/// (a call taking over 150 ms) and probes every 100 ms.
async fn fallback(server: &RedisServer) -> Fallback<RedisStorage> {
    let redis = RedisStorage::builder(server.url())
        .timeout(Duration::from_millis(150))
        .connect()
        .await
        .unwrap();
    Fallback::builder(redis)
        .failures_to_switch(1)
        .probe_interval(Duration::from_millis(100))
        .build()
}

/// Sends a request to `app` while `server` sleeps, waits until its handler
/// says it was `entered` (admitted by the local limiter), and wakes the
/// server. The request, still running.
async fn admitted_during_a_pause(
    server: &RedisServer,
    storage: &Fallback<RedisStorage>,
    app: &Router,
    entered: &Semaphore,
) -> tokio::task::JoinHandle<Result<http::Response<Body>, std::convert::Infallible>> {
    server.pause(true);
    let request = tokio::spawn(
        app.clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap()),
    );
    let admitted = tokio::time::timeout(Duration::from_secs(10), entered.acquire()).await;
    assert!(admitted.is_ok(), "the request was not admitted while Redis slept");
    assert!(storage.is_local());
    server.pause(false);
    request
}

/// Decisions of `tiers` (a user of its own, in `tier`) until one comes
/// from Redis again, for at most 5 s.
async fn until_back_on_redis(tiers: &RateTier, tier: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let source = match tiers.check("someone-else", tier, 1).await.unwrap() {
            Ok(info) => info.source(),
            Err(limited) => limited.source(),
        };
        if source == DecisionSource::Storage {
            return;
        }
        assert!(Instant::now() < deadline, "never back on Redis");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Through the layer: a request admitted and its tokens reserved by the
/// local fallback while Redis was paused; its handler records its usage
/// once Redis answers again. Redis must not get the unused part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_recording_usage_after_redis_is_back_gives_redis_nothing() {
    use tower_rate_tier::{TierRefusal, TierUsage};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let storage = fallback(&server).await;
    let tiers = RateTier::builder()
        .tier("llm", Quota::per_day(1_000))
        .tier_unit("llm", "tokens", Quota::per_day(1_000))
        .storage(storage.clone())
        .build();
    let (entered, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let handler = (entered.clone(), gate.clone());
    let app = Router::new()
        .route(
            "/",
            get(move |usage: TierUsage| {
                let (entered, gate) = handler.clone();
                async move {
                    usage.reserve("tokens", 1_000).await?;
                    entered.add_permits(1);
                    // the model runs until the test lets it finish
                    gate.acquire().await.unwrap().forget();
                    usage.record("tokens", 10);
                    Ok::<_, TierRefusal>("ok")
                }
            }),
        )
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(|_| Some(TierIdentity::new("ada", "llm")))
                .on_storage_error(OnStorageError::Deny),
        );
    // ada spends her day's tokens in Redis
    tiers.record("ada", "llm", "tokens", 1_000).await.unwrap();

    // the request is admitted and reserves while Redis sleeps: locally
    let request = admitted_during_a_pause(&server, &storage, &app, &entered).await;
    until_back_on_redis(&tiers, "llm").await;
    assert!(
        tiers.reserve("ada", "llm", "tokens", 1).await.unwrap().is_err(),
        "still spent in Redis"
    );

    gate.add_permits(1);
    let response = request.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    // the record is settled in a task of its own
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = tiers.reserve("ada", "llm", "tokens", 500).await.unwrap();
    assert!(
        again.is_err(),
        "Redis admitted 500 tokens of ada's spent day: the record of a request the local \
         fallback had admitted refunded 990 tokens Redis never charged: {again:?}"
    );
}

/// Through the layer: a request admitted by the local fallback while Redis
/// was paused, whose answer (a 500, with `refund_on` server errors) comes
/// once Redis answers again. Its charge is not given to Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refunded_after_redis_is_back_gives_redis_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let storage = fallback(&server).await;
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(10))
        .storage(storage.clone())
        .build();
    let (entered, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let handler = (entered.clone(), gate.clone());
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let (entered, gate) = handler.clone();
                async move {
                    entered.add_permits(1);
                    gate.acquire().await.unwrap().forget();
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            }),
        )
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(|_| Some(TierIdentity::new("ada", "free")))
                .on_storage_error(OnStorageError::Deny)
                .refund_on(|status| status.is_server_error()),
        );
    // ada spends her day in Redis
    assert_eq!(
        tiers.check("ada", "free", 10).await.unwrap().unwrap().source(),
        DecisionSource::Storage
    );

    // the request is admitted while Redis sleeps: locally
    let request = admitted_during_a_pause(&server, &storage, &app, &entered).await;
    until_back_on_redis(&tiers, "free").await;
    assert!(
        tiers.check("ada", "free", 1).await.unwrap().is_err(),
        "still spent in Redis"
    );

    gate.add_permits(1);
    let response = request.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    drop(response);
    let refunded = tiers.check("ada", "free", 1).await.unwrap();
    assert!(
        refunded.is_err(),
        "Redis admitted ada's spent day: the refund of a request the local fallback \
         had admitted reached Redis: {refunded:?}"
    );
}
