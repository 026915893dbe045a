//! An app built only from a `#[rate_tiers]` enum and `#[tier_cost]`
//! handlers, and the same app built with the plain builder and
//! `tier_cost(n)` route layers, answer a fixed request sequence with the same
//! statuses and `X-RateLimit-Remaining` values, written out below.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::{get, post};
use http::{HeaderMap, Request};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, rate_tiers, tier_cost};

/// Handler calls, to check that refused requests never reach a handler.
type Calls = Arc<AtomicUsize>;

// ------------------------------------------------------------ macro app

#[rate_tiers]
enum Plan {
    #[tier(per_minute = 10, default)]
    Free,
    #[tier(per_minute = 60, burst = 20)]
    Pro,
    #[tier(unlimited)]
    Enterprise,
}

/// `x-user` is the user; `x-tier` names a plan (unknown or absent: free).
fn plan_identity(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    let plan = headers
        .get("x-tier")
        .and_then(|tier| tier.to_str().ok()?.parse::<Plan>().ok())
        .unwrap_or(Plan::Free);
    Some(TierIdentity::new(user, plan))
}

async fn plain(State(calls): State<Calls>) -> &'static str {
    calls.fetch_add(1, Ordering::SeqCst);
    "plain"
}

#[tier_cost(5)]
async fn search(State(calls): State<Calls>) -> &'static str {
    calls.fetch_add(1, Ordering::SeqCst);
    "hits"
}

/// A body extractor after the state, checked by `debug_handler` (which
/// needs the state named: it sits inside the tuple `#[tier_cost]` makes).
#[tier_cost(3)]
#[axum::debug_handler(state = Calls)]
async fn upload(State(calls): State<Calls>, body: String) -> String {
    calls.fetch_add(1, Ordering::SeqCst);
    body.to_uppercase()
}

/// No arguments at all.
#[tier_cost(0)]
async fn health() -> &'static str {
    "up"
}

/// More than a free user's burst of 10.
#[tier_cost(20)]
async fn export(State(calls): State<Calls>) -> &'static str {
    calls.fetch_add(1, Ordering::SeqCst);
    "csv"
}

fn macro_app(clock: &FakeClock, calls: &Calls) -> Router {
    let tiers = RateTier::builder().tiers::<Plan>().clock(clock.clone()).build();
    Router::new()
        .route("/plain", get(plain))
        .route("/search", get(search))
        .route("/upload", post(upload))
        .route("/health", get(health))
        .route("/export", get(export))
        .layer(TierLimitLayer::new(tiers).identifier_fn(plan_identity))
        .with_state(calls.clone())
}

// ------------------------------------------------------------ plain app

fn name_identity(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    let tier = headers
        .get("x-tier")
        .and_then(|tier| tier.to_str().ok())
        .filter(|tier| ["free", "pro", "enterprise"].contains(tier))
        .unwrap_or("free");
    Some(TierIdentity::new(user, tier))
}

async fn plain_search(State(calls): State<Calls>) -> &'static str {
    calls.fetch_add(1, Ordering::SeqCst);
    "hits"
}

async fn plain_upload(State(calls): State<Calls>, body: String) -> String {
    calls.fetch_add(1, Ordering::SeqCst);
    body.to_uppercase()
}

async fn plain_export(State(calls): State<Calls>) -> &'static str {
    calls.fetch_add(1, Ordering::SeqCst);
    "csv"
}

fn builder_app(clock: &FakeClock, calls: &Calls) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(60).with_burst(20))
        .tier("enterprise", Quota::unlimited())
        .default_tier("free")
        .clock(clock.clone())
        .build();
    Router::new()
        .route("/plain", get(plain))
        .route("/search", get(plain_search).layer(tier_cost(5)))
        .route("/upload", post(plain_upload).layer(tier_cost(3)))
        .route("/health", get(|| async { "up" }).layer(tier_cost(0)))
        .route("/export", get(plain_export).layer(tier_cost(20)))
        .layer(TierLimitLayer::new(tiers).identifier_fn(name_identity))
        .with_state(calls.clone())
}

// ------------------------------------------------------------ the sequence

/// One step: what is sent, and what must come back.
struct Step {
    method: &'static str,
    path: &'static str,
    user: &'static str,
    tier: Option<&'static str>,
    /// Seconds the clock moves before the request.
    advance: u64,
    status: u16,
    remaining: Option<u32>,
    body: Option<&'static str>,
}

const fn step(
    method: &'static str,
    path: &'static str,
    user: &'static str,
    status: u16,
    remaining: Option<u32>,
) -> Step {
    Step {
        method,
        path,
        user,
        tier: None,
        advance: 0,
        status,
        remaining,
        body: None,
    }
}

#[rustfmt::skip]
const SEQUENCE: &[Step] = &[
    // ada, free: a burst of 10, one more every 6 s. Cost 20 can never pass
    // a burst of 10: 403 without `Retry-After`, nothing charged.
    step("GET", "/export", "ada", 403, None),
    step("GET", "/plain", "ada", 200, Some(9)),
    step("GET", "/search", "ada", 200, Some(4)),
    Step { body: Some("HELLO"), ..step("POST", "/upload", "ada", 200, Some(1)) },
    // Does not fit: refused, nothing charged, the handler not called.
    step("GET", "/search", "ada", 429, Some(1)),
    // Cost 0: spends nothing.
    step("GET", "/health", "ada", 200, Some(1)),
    step("GET", "/plain", "ada", 200, Some(0)),
    step("GET", "/plain", "ada", 429, Some(0)),
    // bob, pro: a burst of 20 fits the export exactly.
    Step { tier: Some("pro"), ..step("GET", "/export", "bob", 200, Some(0)) },
    Step { tier: Some("pro"), ..step("GET", "/plain", "bob", 429, Some(0)) },
    // The limiter has learned the export's cost from bob's request: a spent
    // free user gets 403 (it can never pass), not 429.
    step("GET", "/export", "ada", 403, None),
    // 6 s later one unit is back.
    Step { advance: 6, ..step("GET", "/plain", "ada", 200, Some(0)) },
    // boss, enterprise: never limited, no rate-limit fields.
    Step { tier: Some("enterprise"), ..step("GET", "/export", "boss", 200, None) },
    Step { tier: Some("enterprise"), ..step("GET", "/export", "boss", 200, None) },
    // An unknown plan name is the default tier (in the user's own bucket).
    Step { tier: Some("gold"), ..step("GET", "/search", "cy", 200, Some(5)) },
];

/// Handler calls the sequence makes: the admitted requests other than
/// `/health` (which counts nothing).
const HANDLER_CALLS: usize = 9;

async fn run(app: Router, clock: &FakeClock) -> Vec<(u16, Option<u32>)> {
    let mut seen = Vec::new();
    for (i, step) in SEQUENCE.iter().enumerate() {
        clock.advance(Duration::from_secs(step.advance));
        let mut request = Request::builder()
            .method(step.method)
            .uri(step.path)
            .header("x-user", step.user);
        if let Some(tier) = step.tier {
            request = request.header("x-tier", tier);
        }
        let body = if step.method == "POST" { "hello" } else { "" };
        let response = app
            .clone()
            .oneshot(request.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let remaining = response
            .headers()
            .get("x-ratelimit-remaining")
            .map(|value| value.to_str().unwrap().parse::<u32>().unwrap());
        if status == 403 {
            assert!(response.headers().get("retry-after").is_none(), "step {i}");
        }
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            (status, remaining),
            (step.status, step.remaining),
            "step {i}: {} {}",
            step.method,
            step.path
        );
        if let Some(expected) = step.body {
            assert_eq!(bytes, expected, "step {i}");
        }
        seen.push((status, remaining));
    }
    seen
}

#[tokio::test]
async fn an_app_from_the_macros_gives_the_expected_sequence() {
    let (clock, calls) = (FakeClock::new(), Calls::default());
    run(macro_app(&clock, &calls), &clock).await;
    assert_eq!(calls.load(Ordering::SeqCst), HANDLER_CALLS);
}

#[tokio::test]
async fn the_same_app_from_the_builder_and_route_layers_gives_the_same_sequence() {
    let (clock, calls) = (FakeClock::new(), Calls::default());
    let from_builder = run(builder_app(&clock, &calls), &clock).await;
    assert_eq!(calls.load(Ordering::SeqCst), HANDLER_CALLS);

    let (clock, calls) = (FakeClock::new(), Calls::default());
    let from_macros = run(macro_app(&clock, &calls), &clock).await;
    assert_eq!(from_macros, from_builder);
}

// ------------------------------------------------ a cost above the burst

/// Ten units, more than the `small` tier's burst of 5.
#[tier_cost(10)]
async fn ten() -> &'static str {
    "ten"
}

/// A route costing 10 (by attribute and by route layer), under tiers with
/// bursts of 5 (`small`) and 20 (`big`).
fn costly_app(clock: &FakeClock) -> Router {
    let tiers = RateTier::builder()
        .tier("small", Quota::per_minute(5))
        .tier("big", Quota::per_minute(20))
        .clock(clock.clone())
        .build();
    Router::new()
        .route("/plain", get(|| async { "plain" }))
        .route("/attribute", get(ten))
        .route("/layer", get(|| async { "ten" }).layer(tier_cost(10)))
        .layer(TierLimitLayer::new(tiers).identifier_fn(|headers: &HeaderMap| {
            let user = headers.get("x-user")?.to_str().ok()?;
            let tier = headers.get("x-tier")?.to_str().ok()?;
            Some(TierIdentity::new(user, tier))
        }))
}

async fn status_of(app: &Router, path: &str, user: &str, tier: &str) -> (u16, bool) {
    let request = Request::get(path)
        .header("x-user", user)
        .header("x-tier", tier)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    (
        response.status().as_u16(),
        response.headers().contains_key("retry-after"),
    )
}

#[tokio::test]
async fn a_cost_once_refused_above_the_burst_is_403_for_every_user_from_then_on() {
    for path in ["/attribute", "/layer"] {
        let clock = FakeClock::new();
        let app = costly_app(&clock);
        // ada spends her quota before anyone has reached the route
        for _ in 0..5 {
            assert_eq!(status_of(&app, "/plain", "ada", "small").await.0, 200);
        }
        // the one corner no route-level mechanism reaches: the limiter has
        // never seen the route, pre-charges 1 and her quota is spent
        assert_eq!(status_of(&app, path, "ada", "small").await, (429, true), "{path}");
        // a user with quota left reaches the declaration, which refuses:
        // 403, and the limiter learns the route's price from it
        assert_eq!(
            status_of(&app, path, "bob", "small").await,
            (403, false),
            "{path}"
        );
        // from then on ada, spent, is told 403 (no Retry-After) every time,
        // across refills, as is every other user of the tier
        for wait in [0, 12, 60] {
            clock.advance(Duration::from_secs(wait));
            assert_eq!(
                status_of(&app, path, "ada", "small").await,
                (403, false),
                "{path} after {wait} s"
            );
        }
        assert_eq!(status_of(&app, path, "cy", "small").await, (403, false), "{path}");
        // nothing was charged by the refusals: bob still has his five
        for _ in 0..5 {
            assert_eq!(status_of(&app, "/plain", "bob", "small").await.0, 200);
        }
        // a tier whose burst admits the cost passes, charged exactly once
        assert_eq!(status_of(&app, path, "dee", "big").await, (200, false), "{path}");
        assert_eq!(status_of(&app, path, "dee", "big").await, (200, false), "{path}");
        assert_eq!(status_of(&app, path, "dee", "big").await, (429, true), "{path}");
    }
}
