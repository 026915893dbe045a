//! What Redis charged or granted, given back through a fallback while it
//! answers locally: to Redis (or, when Redis cannot take it, nowhere),
//! never to the local limiter, which never charged it.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_rate_tier::storage::{DecisionSource, Fallback, RedisStorage};
use tower_rate_tier::{
    OnStorageError, Quota, RateTier, TierIdentity, TierLimitLayer, TierRefusal, TierUsage,
};
use tower_rate_tier_tests::redis::RedisServer;

/// A fallback that answers locally from the first failure and probes
/// every `probe`.
async fn fallback(server: &RedisServer, timeout: Duration, probe: Duration) -> Fallback<RedisStorage> {
    let redis = RedisStorage::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    Fallback::builder(redis)
        .failures_to_switch(1)
        .probe_interval(probe)
        .build()
}

/// Where a handler says it has started, then waits until the test opens.
#[derive(Clone)]
struct Gate {
    entered: Arc<Semaphore>,
    open: Arc<Semaphore>,
}

impl Gate {
    fn new() -> Self {
        Gate {
            entered: Arc::new(Semaphore::new(0)),
            open: Arc::new(Semaphore::new(0)),
        }
    }

    /// The handler's side: started, and waiting.
    async fn pass(&self) {
        self.entered.add_permits(1);
        self.open.acquire().await.unwrap().forget();
    }

    /// The test's side: until a handler has started.
    async fn entered(&self) {
        self.entered.acquire().await.unwrap().forget();
    }

    /// The test's side: lets one handler go on.
    fn open(&self) {
        self.open.add_permits(1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_a_redis_charge_during_an_outage_gives_the_local_limiter_nothing() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let never = Duration::from_secs(3_600);
    let storage = fallback(&server, Duration::from_millis(500), never).await;
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(2))
        .storage(storage.clone())
        .build();
    let info = tiers.check("ada", "free", 2).await.unwrap().unwrap();
    assert_eq!(info.source(), DecisionSource::Storage);
    server.kill();
    // the outage: the local limiter gives ada her share (2), no more
    let local = tiers.check("ada", "free", 2).await.unwrap().unwrap();
    assert_eq!(local.source(), DecisionSource::Fallback);
    assert!(
        tiers.check("ada", "free", 1).await.unwrap().is_err(),
        "local share spent"
    );
    // the work Redis admitted failed: given back where it was charged
    let _ = tiers.refund_decided("ada", "free", 2, info.source()).await;
    let again = tiers.check("ada", "free", 2).await.unwrap();
    assert!(again.is_err(), "the local limiter got Redis's refund: {again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_redis_admitted_refunded_during_an_outage_gives_the_local_limiter_nothing() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let never = Duration::from_secs(3_600);
    let storage = fallback(&server, Duration::from_millis(500), never).await;
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(1))
        .storage(storage.clone())
        .build();
    let gate = Gate::new();
    let handler = gate.clone();
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let gate = handler.clone();
                async move {
                    gate.pass().await;
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(|_| Some(TierIdentity::new("ada", "free")))
                .refund_on(|status| status.is_server_error())
                .on_storage_error(OnStorageError::Deny),
        );
    let get = |path: &'static str| {
        app.clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
    };
    // admitted by Redis, still running
    let slow = tokio::spawn(get("/slow"));
    gate.entered().await;
    server.kill();
    // the outage: ada's local share is 1 request a day
    assert_eq!(get("/").await.unwrap().status(), 200);
    assert!(storage.is_local());
    assert_eq!(get("/").await.unwrap().status(), 429);
    // the request Redis admitted fails: its refund is due (in a task)
    gate.open();
    assert_eq!(slow.await.unwrap().unwrap().status(), 500);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        get("/").await.unwrap().status(),
        429,
        "the local limiter got the refund of the request Redis had admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_redis_made_settled_during_an_outage_gives_the_local_limiter_nothing() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let never = Duration::from_secs(3_600);
    let storage = fallback(&server, Duration::from_millis(500), never).await;
    let tiers = RateTier::builder()
        .tier("llm", Quota::per_day(1_000))
        .tier_unit("llm", "tokens", Quota::per_day(1_000))
        .storage(storage.clone())
        .build();
    let gate = Gate::new();
    let handler = gate.clone();
    let app = Router::new()
        .route(
            "/",
            get(move |usage: TierUsage| {
                let gate = handler.clone();
                async move {
                    usage.reserve("tokens", 1_000).await?;
                    gate.pass().await;
                    usage.record("tokens", 0);
                    Ok::<_, TierRefusal>("ok")
                }
            }),
        )
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(|_| Some(TierIdentity::new("ada", "llm")))
                .on_storage_error(OnStorageError::Deny),
        );
    // reserved in Redis, the model still running
    let request = tokio::spawn(
        app.clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap()),
    );
    gate.entered().await;
    server.kill();
    // the outage: ada spends her local share
    let spent = tiers
        .reserve("ada", "llm", "tokens", 1_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(spent.source(), DecisionSource::Fallback);
    assert!(
        tiers.reserve("ada", "llm", "tokens", 1).await.unwrap().is_err(),
        "local share spent"
    );
    gate.open();
    assert_eq!(request.await.unwrap().unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = tiers.reserve("ada", "llm", "tokens", 1_000).await.unwrap();
    assert!(
        again.is_err(),
        "the local limiter got Redis's reservation back: {again:?}"
    );
}

/// A slot Redis granted, released while the fallback still answers locally
/// (Redis is up again, no probe made yet), is given back in Redis: the
/// user, with nothing in flight, is admitted once decisions are back on
/// Redis (its slot stayed taken there for the whole lease before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_redis_granted_released_during_an_outage_comes_back_in_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let storage = fallback(&server, Duration::from_millis(300), Duration::from_millis(100)).await;
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(1_000))
        .tier_concurrency("free", 1)
        .storage(storage.clone())
        .build();
    let gate = Gate::new();
    let handler = gate.clone();
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let gate = handler.clone();
                async move {
                    gate.pass().await;
                    "done"
                }
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(tower_rate_tier_tests::reply::header_identity)
                .on_storage_error(OnStorageError::Deny),
        );
    let send = |path: &'static str, user: &'static str| {
        let request = Request::get(path).header("x-user", user).body(Body::empty());
        app.clone().oneshot(request.unwrap())
    };
    // ada's request holds her one slot in Redis
    let slow = tokio::spawn(send("/slow", "ada"));
    gate.entered().await;
    // Redis sleeps: another user's request times out and switches to local
    server.pause(true);
    let other = send("/", "bob").await.unwrap();
    assert_eq!(other.status(), 200);
    drop(other);
    assert!(storage.is_local());
    server.pause(false);
    // ada's request ends while decisions are still answered locally
    gate.open();
    drop(slow.await.unwrap().unwrap());
    // back on Redis (someone else's decisions bring it back)
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let source = match tiers.check("someone-else", "free", 0).await.unwrap() {
            Ok(info) => info.source(),
            Err(limited) => limited.source(),
        };
        if source == DecisionSource::Storage {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never back on Redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        send("/", "ada").await.unwrap().status(),
        StatusCode::OK,
        "Redis still counts the slot of ada's finished request"
    );
}
