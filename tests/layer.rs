//! The tower layer under a real axum `Router`: identification, policies,
//! exact per-route costs, responses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath};
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::{
    Decide, MemoryStorage, Op, Storage, StorageError, StorageErrorKind, StorageKey,
};
use tower_rate_tier::{
    OnMissing, OnStorageError, OnUnknownTier, PeerAddr, Quota, RateLimitEvent, RateTier, TierCost,
    TierIdentifier, TierIdentity, TierLimitLayer, tier_cost,
};
use tower_rate_tier_tests::reply::{header_identity, send};

// ---------------------------------------------------------------- helpers

fn tiers(clock: &FakeClock) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .tier("multi", [Quota::per_second(2), Quota::per_hour(5)])
        .tier("enterprise", Quota::unlimited())
        .default_tier("free")
        .clock(clock.clone())
        .build()
}

fn layer(clock: &FakeClock) -> TierLimitLayer {
    TierLimitLayer::new(tiers(clock)).identifier_fn(header_identity)
}

fn req(method: &str, path: &str, user: Option<&str>, tier: Option<&str>) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(user) = user {
        b = b.header("x-user", user);
    }
    if let Some(tier) = tier {
        b = b.header("x-tier", tier);
    }
    b.body(Body::empty()).unwrap()
}

/// Sends `GET path` as `user` (free tier) and returns (status, remaining).
async fn hit(app: &Router, method: &str, path: &str, user: &str) -> (u16, Option<u32>) {
    let r = send(app, req(method, path, Some(user), None)).await;
    (r.status.as_u16(), r.remaining())
}

/// Counts storage operations (and forwards to memory).
#[derive(Debug, Clone, Default)]
struct Counting {
    inner: MemoryStorage,
    checks: Arc<AtomicUsize>,
    refunds: Arc<AtomicUsize>,
}

impl Storage for Counting {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let counter = match op {
            Op::Refund(_) => &self.refunds,
            Op::Release(_) => return self.inner.decide(key, bands, op, clock),
            _ => &self.checks,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        self.inner.decide(key, bands, op, clock)
    }
}

/// A storage that is down.
#[derive(Debug, Clone)]
struct Down;

impl Storage for Down {
    fn decide(&self, _: StorageKey<'_>, _: &[Quota], _: Op, _: &Arc<dyn Clock>) -> Decide {
        Decide::ready(Err(StorageError::new(
            StorageErrorKind::Unavailable,
            "connection refused",
        )))
    }
}

/// An async identifier (the slow path: nothing decided inline).
struct AsyncIds;

#[tower_rate_tier::async_trait]
impl TierIdentifier for AsyncIds {
    async fn identify(&self, headers: &HeaderMap) -> Option<TierIdentity> {
        tokio::task::yield_now().await;
        header_identity(headers)
    }
}

fn counted_handler(
    calls: &Arc<AtomicUsize>,
) -> impl Fn() -> std::future::Ready<&'static str> + Clone + use<> {
    let calls = calls.clone();
    move || {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready("ok")
    }
}

// ---------------------------------------------------------------- headers

#[tokio::test]
async fn admitted_and_denied_headers_are_exact() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(&clock));

    let r = send(&app, req("GET", "/", Some("ada"), None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("9"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("1704067206"));
    assert_eq!(r.header("ratelimit-policy"), Some(r#""free";q=10;w=60"#));
    assert_eq!(r.header("ratelimit"), Some(r#""free";r=9;t=6"#));
    assert_eq!(r.header("retry-after"), None);

    for _ in 0..9 {
        assert_eq!(
            send(&app, req("GET", "/", Some("ada"), None)).await.status,
            StatusCode::OK
        );
    }
    clock.advance(Duration::from_millis(1_500));
    let r = send(&app, req("GET", "/", Some("ada"), None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // 4.5 s until one unit is back: rounded up, never 0
    assert_eq!(r.header("retry-after"), Some("5"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    // full again 58.5 s from now (t = 1704067201.5): 1704067259.999.. -> 1704067260
    assert_eq!(r.header("x-ratelimit-reset"), Some("1704067260"));
    // `t` of the band that denied: until the request fits, as Retry-After
    assert_eq!(r.header("ratelimit"), Some(r#""free";r=0;t=5"#));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    let body = r.json();
    assert_eq!(body["tier"], "free");
    assert_eq!(body["retry_after"], 5);
    assert_eq!(body["status"], 429);
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["violated-policies"], serde_json::json!(["free"]));
}

#[tokio::test]
async fn multi_band_tiers_list_every_band() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(&clock));
    let r = send(&app, req("GET", "/", Some("ada"), Some("multi"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""multi.0";q=2;w=1, "multi.1";q=5;w=3600"#)
    );
    assert_eq!(
        r.header("ratelimit"),
        Some(r#""multi.0";r=1;t=1, "multi.1";r=4;t=720"#)
    );
    // the X- fields describe the band closest to denying
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    // the second band is the tighter one after three requests a second apart
    for _ in 0..2 {
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            send(&app, req("GET", "/", Some("ada"), Some("multi")))
                .await
                .status,
            StatusCode::OK
        );
    }
    clock.advance(Duration::from_secs(1));
    let r = send(&app, req("GET", "/", Some("ada"), Some("multi"))).await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        send(&app, req("GET", "/", Some("ada"), Some("multi")))
            .await
            .status,
        StatusCode::OK
    );
    clock.advance(Duration::from_secs(1));
    let r = send(&app, req("GET", "/", Some("ada"), Some("multi"))).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
}

#[tokio::test]
async fn unlimited_tiers_get_no_rate_limit_fields() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(&clock));
    for _ in 0..50 {
        let r = send(&app, req("GET", "/", Some("boss"), Some("enterprise"))).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(
            r.headers.keys().all(|k| !k.as_str().contains("ratelimit")),
            "{:?}",
            r.headers
        );
    }
}

// ---------------------------------------------------------------- costs

/// The sequence of the issue: limit 10; three plain requests, one cost-5
/// leaving 2, a denied cost-5, then exactly two plain requests pass.
async fn assert_cost_sequence(app: &Router, costly: (&str, &str)) {
    let (method, path) = costly;
    assert_eq!(hit(app, "GET", "/plain", "ada").await, (200, Some(9)));
    assert_eq!(hit(app, "GET", "/plain", "ada").await, (200, Some(8)));
    assert_eq!(hit(app, "GET", "/plain", "ada").await, (200, Some(7)));
    assert_eq!(hit(app, method, path, "ada").await, (200, Some(2)));
    assert_eq!(hit(app, method, path, "ada").await, (429, Some(2)));
    assert_eq!(hit(app, "GET", "/plain", "ada").await, (200, Some(1)));
    assert_eq!(hit(app, "GET", "/plain", "ada").await, (200, Some(0)));
    assert_eq!(hit(app, "GET", "/plain", "ada").await, (429, Some(0)));
    // a second user: now the cost is learned, the same sequence holds
    assert_eq!(hit(app, method, path, "bob").await, (200, Some(5)));
    assert_eq!(hit(app, method, path, "bob").await, (200, Some(0)));
    assert_eq!(hit(app, method, path, "bob").await, (429, Some(0)));
}

#[tokio::test]
async fn route_layer_cost_is_charged_exactly() {
    let clock = FakeClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/search", get(counted_handler(&calls)).layer(tier_cost(5)))
        .layer(layer(&clock));
    assert_cost_sequence(&app, ("GET", "/search")).await;
    // the handler ran only for the admitted cost-5 requests
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// What `#[tier_cost(5)]` expands to, written by hand.
async fn hand_expanded(
    (_cost, _path): (tower_rate_tier::__private::TierCostGuard<5>, MatchedPath),
) -> &'static str {
    "ok"
}

#[axum::debug_handler]
async fn hand_expanded_debug(
    (_cost, body): (tower_rate_tier::__private::TierCostGuard<5>, String),
) -> String {
    body
}

#[tokio::test]
async fn handler_guard_cost_is_charged_exactly() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/search", get(hand_expanded))
        .layer(layer(&clock));
    assert_cost_sequence(&app, ("GET", "/search")).await;
}

#[tokio::test]
async fn handler_guard_under_debug_handler_with_a_body() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/echo", post(hand_expanded_debug))
        .layer(layer(&clock));
    assert_cost_sequence(&app, ("POST", "/echo")).await;
    let mut r = req("POST", "/echo", Some("cy"), None);
    *r.body_mut() = Body::from("hello");
    let r = send(&app, r).await;
    assert_eq!(r.body, "hello");
    assert_eq!(r.remaining(), Some(5));
}

#[tokio::test]
async fn extension_before_the_layer_sets_the_cost() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/batch", post(|| async { "ok" }))
        .layer(layer(&clock))
        .layer(axum::middleware::map_request(
            |mut req: Request<Body>| async move {
                if req.uri().path() == "/batch" {
                    req.extensions_mut().insert(TierCost(5));
                }
                req
            },
        ));
    assert_cost_sequence(&app, ("POST", "/batch")).await;
}

#[tokio::test]
async fn cost_fn_prices_and_exempts_up_front() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/report", get(|| async { "ok" }))
        .route("/health", get(|| async { "ok" }))
        .layer(
            layer(&clock).cost_fn(|parts| match parts.extensions.get::<MatchedPath>()?.as_str() {
                "/report" => Some(5),
                "/health" => Some(0),
                _ => None,
            }),
        );
    assert_cost_sequence(&app, ("GET", "/report")).await;
    // ada's quota is spent; the health check is free and never limited
    for _ in 0..3 {
        assert_eq!(hit(&app, "GET", "/health", "ada").await, (200, Some(0)));
    }
}

#[tokio::test]
async fn cost_zero_route_consumes_nothing() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/free", get(|| async { "ok" }).layer(tier_cost(0)))
        .layer(layer(&clock));
    for _ in 0..5 {
        assert_eq!(hit(&app, "GET", "/free", "ada").await, (200, Some(10)));
    }
    assert_eq!(hit(&app, "GET", "/plain", "ada").await, (200, Some(9)));
    assert_eq!(hit(&app, "GET", "/free", "ada").await, (200, Some(9)));
}

#[tokio::test]
async fn cost_zero_route_first_seen_by_an_exhausted_user_is_refused_once_learned_it_is_free() {
    // The documented corner: the limiter pre-charges 1 on a route it has
    // never seen. Once learned, the route is free even for a spent quota.
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/free", get(|| async { "ok" }).layer(tier_cost(0)))
        .layer(layer(&clock));
    for _ in 0..10 {
        hit(&app, "GET", "/plain", "ada").await;
    }
    assert_eq!(hit(&app, "GET", "/free", "ada").await.0, 429);
    assert_eq!(hit(&app, "GET", "/free", "bob").await, (200, Some(10)));
    assert_eq!(hit(&app, "GET", "/free", "ada").await, (200, Some(0)));
}

#[tokio::test]
async fn precedence_extension_then_cost_fn_then_handler_then_route_layer() {
    let clock = FakeClock::new();
    let app = Router::new()
        // handler says 5, route layer says 3: the handler wins
        .route("/both", get(hand_expanded).layer(tier_cost(3)))
        // cost_fn says 2, route layer says 3: the cost function wins
        .route("/fn", get(|| async { "ok" }).layer(tier_cost(3)))
        // the extension says 4, route layer says 3: the extension wins
        .route("/ext", get(|| async { "ok" }).layer(tier_cost(3)))
        .layer(
            layer(&clock)
                .cost_fn(|parts| (parts.extensions.get::<MatchedPath>()?.as_str() == "/fn").then_some(2)),
        )
        .layer(axum::middleware::map_request(
            |mut req: Request<Body>| async move {
                if req.uri().path() == "/ext" {
                    req.extensions_mut().insert(TierCost(4));
                }
                req
            },
        ));
    // twice: before and after the limiter has learned the routes' costs
    for round in 0..2 {
        let (a, b, c) = (format!("a{round}"), format!("b{round}"), format!("c{round}"));
        assert_eq!(
            hit(&app, "GET", "/both", &a).await,
            (200, Some(5)),
            "round {round}"
        );
        assert_eq!(hit(&app, "GET", "/fn", &b).await, (200, Some(8)), "round {round}");
        assert_eq!(
            hit(&app, "GET", "/ext", &c).await,
            (200, Some(6)),
            "round {round}"
        );
    }
}

#[tokio::test]
async fn learned_costs_take_one_storage_operation() {
    let clock = FakeClock::new();
    let storage = Counting::default();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    let app = Router::new()
        .route("/layer", get(|| async { "ok" }).layer(tier_cost(5)))
        .route("/guard", get(hand_expanded))
        .route("/plain", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    let ops = || storage.checks.load(Ordering::SeqCst) + storage.refunds.load(Ordering::SeqCst);
    // first request of each costed route: pre-charge 1 and top-up 4
    assert_eq!(hit(&app, "GET", "/layer", "ada").await, (200, Some(95)));
    assert_eq!(ops(), 2);
    assert_eq!(hit(&app, "GET", "/guard", "ada").await, (200, Some(90)));
    assert_eq!(ops(), 4);
    // from then on: one operation per request
    for i in 0..5u32 {
        let before = ops();
        assert_eq!(hit(&app, "GET", "/layer", "ada").await, (200, Some(85 - 10 * i)));
        assert_eq!(hit(&app, "GET", "/guard", "ada").await, (200, Some(80 - 10 * i)));
        assert_eq!(hit(&app, "GET", "/plain", "bob").await.0, 200);
        assert_eq!(ops() - before, 3);
    }
}

#[tokio::test]
async fn a_cost_above_the_burst_is_403_without_retry_after() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/export", get(|| async { "ok" }).layer(tier_cost(20)))
        .layer(layer(&clock));
    for _ in 0..2 {
        let r = send(&app, req("GET", "/export", Some("ada"), None)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert_eq!(r.header("retry-after"), None);
        let body = r.json();
        assert_eq!(body["cost"], 20);
        assert_eq!(body["limit"], 10);
        assert_eq!(body["tier"], "free");
    }
    // nothing was consumed
    assert_eq!(hit(&app, "GET", "/plain", "ada").await, (200, Some(9)));
    // pro users have room for it
    let r = send(&app, req("GET", "/export", Some("ada"), Some("pro"))).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(80)));
}

#[tokio::test]
async fn a_costed_route_without_the_limiter_fails_closed() {
    let clock = FakeClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .layer(layer(&clock))
        // added after the limiter: the limiter does not wrap it
        .route("/late", get(counted_handler(&calls)).layer(tier_cost(2)))
        .route("/late-guard", get(hand_expanded));
    for path in ["/late", "/late-guard"] {
        let r = send(&app, req("GET", path, Some("ada"), None)).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
        assert!(String::from_utf8_lossy(&r.body).contains("no rate limiter runs before it"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn stacked_limiters_each_count_in_their_own_namespace() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::new();
    let strict = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .tier("pro", Quota::per_minute(2))
        .namespace("login")
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    let general = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .clock(clock.clone())
        .storage(storage)
        .build();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route(
            "/login",
            post(|| async { "ok" }).layer(TierLimitLayer::new(strict).identifier_fn(header_identity)),
        )
        .layer(TierLimitLayer::new(general).identifier_fn(header_identity));
    assert_eq!(hit(&app, "POST", "/login", "ada").await.0, 200);
    assert_eq!(hit(&app, "POST", "/login", "ada").await.0, 200);
    let r = send(&app, req("POST", "/login", Some("ada"), None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // the refusal carries the strict limiter's own fields
    assert_eq!(r.header("ratelimit-policy"), Some(r#""free";q=2;w=60"#));
    // the general limiter counted the two admitted logins only: the refused
    // third consumed nothing there either (10 - 2 logins - this request)
    assert_eq!(hit(&app, "GET", "/plain", "ada").await, (200, Some(7)));
}

/// An outer per-address limit in front of a limiter that answers clients
/// it cannot identify 401: the 401s count in the outer limit (so that it
/// throttles key guessing), whether the inner identifier answers inline or
/// waits; only a refusal for want of quota consumes nothing further out.
#[tokio::test]
async fn an_outer_limit_counts_the_requests_an_inner_limiter_denies() {
    for waits in [false, true] {
        let per_address = RateTier::builder()
            .tier("ip", Quota::per_minute(3))
            .default_tier("ip")
            .namespace("ip")
            .clock(FakeClock::new())
            .build();
        let keys = RateTier::builder()
            .tier("free", Quota::per_minute(1_000))
            .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
            .clock(FakeClock::new())
            .build();
        let inner = TierLimitLayer::new(keys);
        let inner = if waits {
            inner.identifier(AsyncIds)
        } else {
            inner.identifier_fn(header_identity)
        };
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(inner)
            .layer(TierLimitLayer::new(per_address));
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let mut guess = req("GET", "/", None, None);
            guess
                .extensions_mut()
                .insert(PeerAddr("10.0.0.1:4000".parse().unwrap()));
            statuses.push(send(&app, guess).await.status.as_u16());
        }
        assert_eq!(
            statuses,
            [401, 401, 401, 429, 429],
            "the identifier waits: {waits}"
        );
    }
}

#[tokio::test]
async fn refund_on_gives_back_the_charge_of_chosen_statuses_only() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route("/boom", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .route("/busy", get(|| async { StatusCode::TOO_MANY_REQUESTS }))
        .layer(
            TierLimitLayer::new(tiers(&clock))
                .identifier_fn(header_identity)
                .refund_on(|status| status.is_server_error()),
        );
    assert_eq!(hit(&app, "GET", "/ok", "ada").await, (200, Some(9)));
    // a 500 is given back, and its headers say so
    assert_eq!(hit(&app, "GET", "/boom", "ada").await, (500, Some(9)));
    assert_eq!(hit(&app, "GET", "/boom", "ada").await, (500, Some(9)));
    // the inner service's own 429 is its answer: charged
    assert_eq!(hit(&app, "GET", "/busy", "ada").await, (429, Some(8)));
    assert_eq!(hit(&app, "GET", "/ok", "ada").await, (200, Some(7)));
}

// ---------------------------------------------------------------- policies

#[tokio::test]
async fn on_missing_use_default_keys_anonymous_clients_by_peer_address() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .default_tier("free")
        .clock(clock.clone())
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    let from = |ip: &str, xff: Option<&str>| {
        let mut r = req("GET", "/", None, None);
        let addr: SocketAddr = format!("{ip}:4000").parse().unwrap();
        r.extensions_mut().insert(ConnectInfo(addr));
        if let Some(xff) = xff {
            r.headers_mut().insert("x-forwarded-for", xff.parse().unwrap());
        }
        r
    };
    assert_eq!(send(&app, from("10.0.0.1", None)).await.remaining(), Some(1));
    // X-Forwarded-For is not trusted by default: same client
    assert_eq!(
        send(&app, from("10.0.0.1", Some("1.1.1.1"))).await.remaining(),
        Some(0)
    );
    assert_eq!(
        send(&app, from("10.0.0.1", Some("2.2.2.2"))).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // another peer has its own quota
    assert_eq!(send(&app, from("10.0.0.2", None)).await.remaining(), Some(1));
    // without any address, anonymous clients share one bucket
    assert_eq!(send(&app, req("GET", "/", None, None)).await.remaining(), Some(1));
    assert_eq!(send(&app, req("GET", "/", None, None)).await.remaining(), Some(0));
    assert_eq!(
        send(&app, req("GET", "/", None, None)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn trusted_proxies_let_forwarded_for_pick_the_client() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .default_tier("free")
        .clock(clock.clone())
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).trusted_proxies(["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]));
    let from_proxy = |client: &str| {
        let mut r = req("GET", "/", None, None);
        r.extensions_mut()
            .insert(ConnectInfo("10.0.0.1:4000".parse::<SocketAddr>().unwrap()));
        r.headers_mut().insert("x-forwarded-for", client.parse().unwrap());
        r
    };
    assert_eq!(send(&app, from_proxy("1.1.1.1")).await.status, StatusCode::OK);
    assert_eq!(send(&app, from_proxy("2.2.2.2")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, from_proxy("1.1.1.1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn on_missing_allow_and_deny_and_no_default() {
    let clock = FakeClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let build = |policy: OnMissing, default: bool| {
        let mut b = RateTier::builder()
            .tier("free", Quota::per_minute(1))
            .on_missing(policy)
            .clock(clock.clone());
        if default {
            b = b.default_tier("free");
        }
        Router::new()
            .route("/", get(counted_handler(&calls)))
            .route("/costly", get(|| async { "ok" }).layer(tier_cost(3)))
            .layer(TierLimitLayer::new(b.build()).identifier_fn(header_identity))
    };
    let allow = build(OnMissing::Allow, true);
    for _ in 0..3 {
        let r = send(&allow, req("GET", "/", None, None)).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.remaining(), None);
    }
    // a costed route is not refused as "no limiter" when the policy lets it through
    assert_eq!(
        send(&allow, req("GET", "/costly", None, None)).await.status,
        StatusCode::OK
    );
    let deny = build(OnMissing::Deny(StatusCode::UNAUTHORIZED), true);
    let r = send(&deny, req("GET", "/", None, None)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json()["status"], 401);
    let no_default = build(OnMissing::UseDefault, false);
    assert_eq!(
        send(&no_default, req("GET", "/", None, None)).await.status,
        StatusCode::FORBIDDEN
    );
    // identified users are still limited under every policy
    assert_eq!(
        send(&deny, req("GET", "/", Some("ada"), None)).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&deny, req("GET", "/", Some("ada"), None)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn on_unknown_tier_policies() {
    let clock = FakeClock::new();
    let app = |policy| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer(&clock).on_unknown_tier(policy))
    };
    // UseDefault: the default tier's quota, in the user's own bucket
    let use_default = app(OnUnknownTier::UseDefault);
    let r = send(&use_default, req("GET", "/", Some("ada"), Some("platinum"))).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(9)));
    assert_eq!(r.header("ratelimit-policy"), Some(r#""free";q=10;w=60"#));
    let r = send(&use_default, req("GET", "/", Some("bob"), Some("platinum"))).await;
    assert_eq!(r.remaining(), Some(9));
    let deny = app(OnUnknownTier::Deny(StatusCode::FORBIDDEN));
    assert_eq!(
        send(&deny, req("GET", "/", Some("ada"), Some("platinum")))
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    let allow = app(OnUnknownTier::Allow);
    for _ in 0..20 {
        let r = send(&allow, req("GET", "/", Some("ada"), Some("platinum"))).await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, None));
    }
    // without a default tier, UseDefault answers 403
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .clock(clock.clone())
        .build();
    let no_default = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    assert_eq!(
        send(&no_default, req("GET", "/", Some("ada"), Some("gold")))
            .await
            .status,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn storage_errors_fail_open_or_closed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = |policy| {
        let tiers = RateTier::builder()
            .tier("free", Quota::per_minute(1))
            .storage(Down)
            .build();
        Router::new()
            .route("/", get(counted_handler(&calls)))
            .route("/costly", get(|| async { "ok" }).layer(tier_cost(3)))
            .layer(
                TierLimitLayer::new(tiers)
                    .identifier_fn(header_identity)
                    .on_storage_error(policy),
            )
    };
    let open = app(OnStorageError::Allow);
    for _ in 0..3 {
        let r = send(&open, req("GET", "/", Some("ada"), None)).await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, None));
    }
    assert_eq!(
        send(&open, req("GET", "/costly", Some("ada"), None)).await.status,
        StatusCode::OK
    );
    let closed = app(OnStorageError::Deny);
    let r = send(&closed, req("GET", "/", Some("ada"), None)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn events_and_custom_429() {
    let clock = FakeClock::new();
    let limited = Arc::new(AtomicUsize::new(0));
    let seen = limited.clone();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        layer(&clock)
            .on_event(move |event| {
                if let RateLimitEvent::Limited { user, .. } = event {
                    // a pseudonym, never the id
                    assert!(user.len() == 8 && *user != "ada", "{user}");
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            })
            .on_limited(|limited| {
                http::Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .body(Bytes::from(format!("slow down, {} plan", limited.tier())))
                    .unwrap()
            }),
    );
    for _ in 0..10 {
        send(&app, req("GET", "/", Some("ada"), None)).await;
    }
    let r = send(&app, req("GET", "/", Some("ada"), None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body, "slow down, free plan");
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(limited.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn error_bodies_do_not_reflect_raw_input() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("fr\"ee<script>", Quota::per_minute(1))
        .clock(clock.clone())
        .build();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers)
            .identifier_fn(|_: &HeaderMap| Some(TierIdentity::new("x", "fr\"ee<script>"))),
    );
    send(&app, req("GET", "/", None, None)).await;
    let r = send(&app, req("GET", "/", None, None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["tier"], "fr\"ee<script>");
    assert_eq!(r.header("ratelimit-policy"), Some(r#""fr\"ee<script>";q=1;w=60"#));
}

// ---------------------------------------------------------------- service

#[tokio::test]
async fn the_inner_service_is_never_called_for_a_denied_request() {
    let clock = FakeClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    for slow in [false, true] {
        calls.store(0, Ordering::SeqCst);
        let layer = if slow {
            layer(&clock).identifier(AsyncIds)
        } else {
            layer(&clock)
        };
        let app = Router::new()
            .route("/", get(counted_handler(&calls)))
            .layer(layer);
        let mut statuses = Vec::new();
        for _ in 0..15 {
            statuses.push(
                send(&app, req("GET", "/", Some(if slow { "s" } else { "f" }), None))
                    .await
                    .status
                    .as_u16(),
            );
        }
        assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10);
        assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 5);
        assert_eq!(calls.load(Ordering::SeqCst), 10, "slow path: {slow}");
    }
}

#[tokio::test]
async fn poll_ready_is_respected_with_a_concurrency_limited_inner_service() {
    let clock = FakeClock::new();
    let release = Arc::new(tokio::sync::Notify::new());
    let gate = release.clone();
    let inner = tower::service_fn(move |_req: Request<Body>| {
        let gate = gate.clone();
        async move {
            gate.notified().await;
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("done")))
        }
    });
    for slow in [false, true] {
        let limited = tower::limit::ConcurrencyLimitLayer::new(1).layer(inner.clone());
        let layer = if slow {
            layer(&clock).identifier(AsyncIds)
        } else {
            layer(&clock)
        };
        let mut svc = layer.layer(limited);
        let user = if slow { "slow" } else { "fast" };
        svc.ready().await.unwrap();
        let first = tokio::spawn(svc.call(req("GET", "/", Some(user), None)));
        // the only permit is held by the first request
        let blocked = tokio::time::timeout(Duration::from_millis(50), svc.ready()).await;
        assert!(blocked.is_err(), "second request must wait for the permit");
        release.notify_one();
        let response = first.await.unwrap().unwrap();
        assert_eq!(response.headers()["x-ratelimit-remaining"], "9");
        svc.ready().await.unwrap();
        let second = tokio::spawn(svc.call(req("GET", "/", Some(user), None)));
        release.notify_one();
        assert_eq!(
            second.await.unwrap().unwrap().headers()["x-ratelimit-remaining"],
            "8"
        );
    }
}

#[tokio::test]
async fn a_plain_tower_service_with_a_bytes_body_works() {
    let clock = FakeClock::new();
    let svc = tower::service_fn(|_req: Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(Bytes::from("hi"))))
    });
    let svc = layer(&clock).layer(svc);
    let mut r = Request::new(());
    r.headers_mut().insert("x-user", "ada".parse().unwrap());
    let response = svc.oneshot(r).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-ratelimit-remaining"], "9");
}

// ---------------------------------------------------------------- over TCP

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_real_socket_with_a_real_client() {
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;

    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/costly", get(hand_expanded))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });

    let client_from = |local: &str| {
        let mut connector = HttpConnector::new();
        connector.set_local_address(Some(local.parse().unwrap()));
        Client::builder(TokioExecutor::new()).build::<_, http_body_util::Empty<Bytes>>(connector)
    };
    let get =
        |client: &Client<HttpConnector, http_body_util::Empty<Bytes>>, path: &str, user: Option<&str>| {
            let mut b = Request::get(format!("http://{addr}{path}"));
            if let Some(user) = user {
                b = b.header("x-user", user).header("x-tier", "pro");
            }
            client.request(b.body(http_body_util::Empty::new()).unwrap())
        };
    let a = client_from("127.0.0.1");
    let b = client_from("127.0.0.2");
    let mut anon_a = Vec::new();
    for _ in 0..4 {
        anon_a.push(get(&a, "/", None).await.unwrap().status().as_u16());
    }
    assert_eq!(anon_a, [200, 200, 200, 429]);
    // another peer address: its own quota
    assert_eq!(get(&b, "/", None).await.unwrap().status(), 200);
    // an identified pro user, with a costed handler
    let r = get(&a, "/costly", Some("ada")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-remaining"], "95");
    let r = get(&a, "/costly", Some("ada")).await.unwrap();
    assert_eq!(r.headers()["x-ratelimit-remaining"], "90");
    server.abort();
}

/// A route of cost 5 behind a cache-like layer that answers requests with
/// `x-cached` itself (so the declaration does not run for them).
fn maybe_cached_route() -> axum::routing::MethodRouter {
    get(|| async { "computed" })
        .layer(tier_cost(5))
        .layer(axum::middleware::from_fn(
            |req: Request<Body>, next: axum::middleware::Next| async move {
                if req.headers().contains_key("x-cached") {
                    return http::Response::new(Body::from("cached"));
                }
                next.run(req).await
            },
        ))
}

#[tokio::test]
async fn a_declaration_behind_a_conditional_layer_is_still_charged_exactly() {
    // A cache-like layer answers some requests before the route's cost layer
    // runs: the limiter learns "declares nothing" from those, and must still
    // charge the declared cost when the declaration does run.
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/maybe", maybe_cached_route())
        .layer(layer(&clock));
    let cached = |user: &str| {
        let mut r = req("GET", "/maybe", Some(user), None);
        r.headers_mut().insert("x-cached", "1".parse().unwrap());
        r
    };
    for _ in 0..3 {
        let r = send(&app, cached("ada")).await;
        assert_eq!(r.body, "cached");
    }
    assert_eq!(hit(&app, "GET", "/plain", "ada").await, (200, Some(6)));
    let r = send(&app, req("GET", "/maybe", Some("ada"), None)).await;
    assert_eq!(
        (r.status, r.remaining(), &r.body[..]),
        (StatusCode::OK, Some(1), &b"computed"[..])
    );
    let r = send(&app, req("GET", "/maybe", Some("ada"), None)).await;
    assert_eq!(
        (r.status, r.remaining()),
        (StatusCode::TOO_MANY_REQUESTS, Some(1))
    );
    assert_eq!(hit(&app, "GET", "/plain", "ada").await, (200, Some(0)));
}

#[tokio::test]
async fn requests_that_skip_a_conditional_declaration_keep_costing_one() {
    // Once the limiter has priced a route, a declaration that runs only on
    // some of its requests is settled on those, and does not re-price the
    // requests that skip it.
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/maybe", maybe_cached_route())
        .layer(layer(&clock));
    let maybe = |cached: bool| {
        let mut r = req("GET", "/maybe", Some("ada"), None);
        if cached {
            r.headers_mut().insert("x-cached", "1".parse().unwrap());
        }
        r
    };
    let mut seen = Vec::new();
    for cached in [true, true, false, true, true, false] {
        let r = send(&app, maybe(cached)).await;
        seen.push((r.status.as_u16(), r.remaining()));
    }
    // 10 units: 1, 1, 5, 1, 1, then 5 does not fit in the 1 left
    assert_eq!(
        seen,
        [
            (200, Some(9)),
            (200, Some(8)),
            (200, Some(3)),
            (200, Some(2)),
            (200, Some(1)),
            (429, Some(1))
        ]
    );
}

#[tokio::test]
async fn identities_cannot_claim_an_anonymous_bucket() {
    // An identifier that passes a client-chosen id through must not let the
    // client spend (or dodge into) an anonymous address's bucket.
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .default_tier("free")
        .clock(clock.clone())
        .build();
    let app =
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(TierLimitLayer::new(tiers).identifier_fn(|h: &HeaderMap| {
                let id = std::str::from_utf8(h.get("x-user")?.as_bytes()).ok()?;
                Some(TierIdentity::new(id.replace("NUL", "\0"), "free"))
            }));
    let from = |user: Option<&str>| {
        let mut r = req("GET", "/", user, None);
        r.extensions_mut()
            .insert(ConnectInfo("10.0.0.9:1".parse::<SocketAddr>().unwrap()));
        r
    };
    assert_eq!(send(&app, from(None)).await.status, StatusCode::OK);
    // "\0ip:10.0.0.9" and "ip:10.0.0.9" are not the anonymous bucket
    assert_eq!(send(&app, from(Some("ip:10.0.0.9"))).await.status, StatusCode::OK);
    // an id with the reserved prefix counts as unidentified: the peer's bucket, spent
    assert_eq!(
        send(&app, from(Some("NULip:10.0.0.9"))).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, from(None)).await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_price_learned_from_a_refused_request_is_corrected_by_the_next_admitted_one() {
    // handler #[tier_cost(5)] wins over the route layer's 8 (precedence).
    // The first request is refused by the route layer (8 does not fit), so the
    // limiter learns (8, RouteLayer). A later admitted request declares 5 (Handler).
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/both", get(hand_expanded).layer(tier_cost(8)))
        .layer(layer(&clock));
    for _ in 0..5 {
        hit(&app, "GET", "/plain", "ada").await;
    }
    // ada has 5 left: the route layer's 8 does not fit -> 429
    assert_eq!(hit(&app, "GET", "/both", "ada").await.0, 429);
    // bob, fresh: admitted, charged exactly 5 (handler wins)
    assert_eq!(hit(&app, "GET", "/both", "bob").await, (200, Some(5)));
    // carol has 6 left: the route costs 5, so it must pass
    for _ in 0..4 {
        hit(&app, "GET", "/plain", "carol").await;
    }
    assert_eq!(hit(&app, "GET", "/both", "carol").await, (200, Some(1)));
}

#[tokio::test]
async fn tiers_sharing_one_memory_storage_keep_namespaces_cap_and_own_clocks() {
    let storage = MemoryStorage::builder().max_keys(2).build();
    let clock = FakeClock::new();
    let later = FakeClock::new();
    // a and b: one storage, other namespaces, each limiter on its own clock
    let a = RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    let b = RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .namespace("b")
        .clock(later.clone())
        .storage(storage.clone())
        .build();
    assert_eq!(a.check("u", "free", 2).await.unwrap().unwrap().remaining, 1);
    assert_eq!(b.check("u", "free", 1).await.unwrap().unwrap().remaining, 2);
    a.refund("u", "free", 1).await.unwrap();
    assert_eq!(a.check("u", "free", 0).await.unwrap().unwrap().remaining, 2);
    assert_eq!(b.check("u", "free", 0).await.unwrap().unwrap().remaining, 2);
    // key cap: 2 keys in use; a new one shares the overflow bucket of its
    // namespace and tier
    let shared = a.check("v", "free", 1).await.unwrap().unwrap();
    assert_eq!(
        shared.source(),
        tower_rate_tier::storage::DecisionSource::Overflow
    );
    assert_eq!(shared.remaining, 2);
    assert_eq!(b.check("v", "free", 3).await.unwrap().unwrap().remaining, 0);
    // cost 0 peek does not take a key
    assert_eq!(a.check("w", "free", 0).await.unwrap().unwrap().remaining, 3);
    assert_eq!(storage.len(), 2);
    // each limiter's decisions run on its own clock: time passes for b only
    later.advance(Duration::from_secs(20));
    assert_eq!(b.check("u", "free", 0).await.unwrap().unwrap().remaining, 3);
    assert_eq!(a.check("u", "free", 0).await.unwrap().unwrap().remaining, 2);
}

async fn policy_script(mode: usize, deny_on_error: bool) -> Vec<(u16, Vec<(String, String)>, Bytes)> {
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder().max_keys(12).build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("multi", [Quota::per_second(2), Quota::per_hour(5)])
        .tier("enterprise", Quota::unlimited())
        .default_tier("free")
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    let inner_tiers = RateTier::builder()
        .tier("free", Quota::per_minute(7))
        .default_tier("free")
        .namespace("inner")
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    let policy = if deny_on_error {
        OnStorageError::Deny
    } else {
        OnStorageError::Allow
    };
    let base = |t: RateTier| {
        let l = TierLimitLayer::new(t)
            .trusted_proxies(["10.0.0.1".parse::<std::net::IpAddr>().unwrap()])
            .on_storage_error(policy);
        match mode {
            0 => l.identifier_fn(header_identity),
            1 => l.identifier_parts_fn(|p| header_identity(&p.headers)),
            2 => l.identifier_fn(header_identity).cost_fn(|_| None),
            _ => l.identifier(AsyncIds),
        }
    };
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .route("/layer", get(|| async { "ok" }).layer(tier_cost(3)))
        .route("/guard", get(hand_expanded))
        .route("/both", get(hand_expanded).layer(tier_cost(8)))
        .route("/big", get(|| async { "ok" }).layer(tier_cost(50)))
        .route("/zero", get(|| async { "ok" }).layer(tier_cost(0)))
        .layer(base(inner_tiers))
        .layer(base(tiers))
        .layer(axum::middleware::map_request(
            |mut req: Request<Body>| async move {
                if req.headers().contains_key("x-cost") {
                    let c = req.headers()["x-cost"].to_str().unwrap().parse().unwrap();
                    req.extensions_mut().insert(TierCost(c));
                }
                req
            },
        ));
    let mut out = Vec::new();
    let users = ["ada", "bob", "", &"x".repeat(300), "\u{0}evil"];
    let paths = ["/plain", "/layer", "/guard", "/both", "/big", "/zero"];
    let tiers_h = [None, Some("multi"), Some("enterprise"), Some("nope")];
    let mut n = 0u32;
    for round in 0..3 {
        for (pi, path) in paths.iter().enumerate() {
            for (ui, user) in users.iter().enumerate() {
                for (ti, tier) in tiers_h.iter().enumerate() {
                    n += 1;
                    let mut r = req("GET", path, None, *tier);
                    // the last user (a NUL id, not a valid header value)
                    // stays unidentified in the first round, then sends "z"
                    if ui < 4 || round > 0 {
                        r.headers_mut()
                            .insert("x-user", user.parse().unwrap_or_else(|_| "z".parse().unwrap()));
                    }
                    if (pi + ui + ti + round) % 3 == 0 {
                        let ip = format!("10.0.0.{}:1", 1 + (n % 3));
                        r.extensions_mut()
                            .insert(ConnectInfo(ip.parse::<SocketAddr>().unwrap()));
                        r.headers_mut().insert(
                            "x-forwarded-for",
                            format!("9.9.9.{}, 10.0.0.1", n % 5).parse().unwrap(),
                        );
                        r.headers_mut().remove("x-user");
                    }
                    if matches!(n % 7, 0) {
                        r.headers_mut()
                            .insert("x-cost", format!("{}", n % 4).parse().unwrap());
                    }
                    let resp = send(&app, r).await;
                    let mut hs: Vec<(String, String)> = resp
                        .headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string()))
                        .collect();
                    hs.sort();
                    out.push((resp.status.as_u16(), hs, resp.body));
                }
            }
            clock.advance(Duration::from_millis(700));
        }
    }
    out
}

#[tokio::test]
async fn header_parts_cost_fn_and_async_identifier_paths_answer_alike() {
    for deny in [false, true] {
        let a = policy_script(0, deny).await;
        for mode in 1..4 {
            let b = policy_script(mode, deny).await;
            assert_eq!(a.len(), b.len());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(x, y, "mode {mode} deny {deny} request {i}");
            }
        }
        // The script reaches every kind of answer: admitted, limited and 403
        // (unknown tier without a fitting default, cost above the burst).
        // Once the storage is full, new users share their tier's overflow
        // bucket: never an error, so no 503 even under `Deny`.
        let statuses: std::collections::BTreeSet<u16> = a.iter().map(|r| r.0).collect();
        assert_eq!(statuses.into_iter().collect::<Vec<_>>(), [200, 403, 429]);
    }
}

/// Answers every decision with a future (that is ready at once): the layer
/// serves its requests on the path for storages that wait.
#[derive(Debug, Clone, Default)]
struct AsyncOnlyNow(MemoryStorage);

impl Storage for AsyncOnlyNow {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        Decide::pending(self.0.decide(key, bands, op, clock))
    }
}

#[tokio::test]
async fn a_storage_deciding_at_once_through_its_async_check_is_served() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .clock(clock.clone())
        .storage(AsyncOnlyNow::default())
        .build();
    let app = Router::new()
        .route("/plain", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    assert_eq!(hit(&app, "GET", "/plain", "ada").await, (200, Some(9)));
}

/// A response future polled again after it completed panics with a clear
/// message, as futures conventionally do, instead of staying pending.
#[test]
fn a_response_future_polled_after_completion_panics_clearly() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .clock(FakeClock::new())
        .build();
    // no identifier and no default tier: every request is refused with 403
    let mut service = TierLimitLayer::new(tiers).layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    }));
    let mut future = Box::pin(service.call(Request::new(Body::empty())));
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(response)) = future.as_mut().poll(&mut cx) else {
        panic!("a refusal is ready at once");
    };
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
    let message = again.expect_err("polling again panics");
    let message = message.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(message.contains("polled after completion"), "{message}");
}

/// A fallback's switches reach `on_event`, once each way.
#[tokio::test]
async fn fallback_switches_are_reported_through_on_event_once_each_way() {
    use tower_rate_tier::storage::Fallback;
    use tower_rate_tier_tests::flaky::Flaky;

    let flaky = Flaky::default();
    let down = flaky.down.clone();
    let storage = Fallback::builder(flaky)
        .instances(2)
        .failures_to_switch(1)
        .probe_interval(Duration::from_millis(1))
        .build();
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .clock(clock.clone())
        .storage(storage)
        .build();
    let switches = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = switches.clone();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers)
            .identifier_fn(header_identity)
            .on_event(move |e| {
                if let RateLimitEvent::Fallback { active } = e {
                    seen.lock().unwrap().push(*active);
                }
            }),
    );
    assert_eq!(hit(&app, "GET", "/", "ada").await.0, 200);
    down.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        assert_eq!(hit(&app, "GET", "/", "ada").await.0, 200);
    }
    down.store(false, Ordering::SeqCst);
    // the next probe is due (on the limiter's clock); it runs in a task of
    // its own, which this single-threaded test lets run between requests
    clock.advance(Duration::from_millis(5));
    for _ in 0..3 {
        assert_eq!(hit(&app, "GET", "/", "ada").await.0, 200);
        tokio::task::yield_now().await;
    }
    assert_eq!(*switches.lock().unwrap(), [true, false]);
}
