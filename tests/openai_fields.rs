//! OpenAI-style rate-limit fields (`RateLimitHeaders::OPENAI`), as clients
//! written against OpenAI's API read them: `x-ratelimit-limit-requests`,
//! `-remaining-requests`, `-reset-requests` and the same per unit
//! (`-tokens`), the reset a duration in OpenAI's format (`1s`, `6m0s`),
//! exact for a `FakeClock` state; a refusal by a unit.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateLimitHeaders, RateTier, TierLimitLayer};
use tower_rate_tier_tests::reply::{Reply, header_identity, send};

/// A chat tier with requests and tokens per minute and per day, a tier
/// whose daily request band is the closer one, an unlimited tier limited
/// by tokens alone.
fn llm(clock: &FakeClock) -> RateTier {
    RateTier::builder()
        .tier("free", [Quota::per_minute(60), Quota::per_day(1_000)])
        .tier_unit(
            "free",
            "tokens",
            [Quota::per_minute(40_000), Quota::per_day(1_000_000)],
        )
        .tier("daily", [Quota::per_second(10), Quota::per_day(3)])
        .tier("team", Quota::unlimited())
        .tier_unit("team", "tokens", Quota::per_minute(100))
        .clock(clock.clone())
        .build()
}

fn app(tiers: &RateTier, which: RateLimitHeaders) -> Router {
    Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(header_identity)
            .headers(which),
    )
}

async fn hit(app: &Router, user: &str, tier: &str) -> Reply {
    let req = Request::get("/")
        .header("x-user", user)
        .header("x-tier", tier)
        .body(Body::empty())
        .unwrap();
    send(app, req).await
}

/// The three fields of `unit` (`requests`, `tokens`), `None` when absent.
fn openai(r: &Reply, unit: &str) -> Option<[String; 3]> {
    let field = |name: &str| r.header(&format!("x-ratelimit-{name}-{unit}")).map(str::to_owned);
    match (field("limit"), field("remaining"), field("reset")) {
        (Some(limit), Some(remaining), Some(reset)) => Some([limit, remaining, reset]),
        (None, None, None) => None,
        partial => panic!("{unit}: some fields only: {partial:?}"),
    }
}

fn fields(limit: &str, remaining: &str, reset: &str) -> Option<[String; 3]> {
    Some([limit.to_owned(), remaining.to_owned(), reset.to_owned()])
}

#[tokio::test]
async fn fields_describe_the_band_closest_to_denying_of_each_unit() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    let app = app(&tiers, RateLimitHeaders::ALL.union(RateLimitHeaders::OPENAI));
    let r = hit(&app, "ada", "free").await;
    assert_eq!(r.status, StatusCode::OK);
    // 59 of 60 a minute left (999 of 1,000 a day): the minute band; one
    // request is given back in 1 s
    assert_eq!(openai(&r, "requests"), fields("60", "59", "1s"));
    // tokens untouched: both bands full, the smaller one reported
    assert_eq!(openai(&r, "tokens"), fields("40000", "40000", "0s"));
    // the other fields are still there
    assert_eq!(r.header("x-ratelimit-limit"), Some("60"));
    assert!(r.header("ratelimit").is_some());

    // 10,000 tokens used: 1.5 ms each in the minute band (15 s to full),
    // 86.4 us each in the daily band (864 s to full, 990,000 left)
    tiers.record("ada", "free", "tokens", 10_000).await.unwrap();
    clock.advance(Duration::from_millis(500));
    let r = hit(&app, "ada", "free").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(openai(&r, "requests"), fields("60", "58", "1.5s"));
    assert_eq!(openai(&r, "tokens"), fields("40000", "30333", "14.5s"));

    // the daily band is the closer one: three a day, 8 h each
    let r = hit(&app, "ada", "daily").await;
    assert_eq!(openai(&r, "requests"), fields("3", "2", "8h0m0s"));
    assert_eq!(openai(&r, "tokens"), None, "a tier without units");
    clock.advance(Duration::from_secs(6 * 60));
    let r = hit(&app, "ada", "daily").await;
    assert_eq!(openai(&r, "requests"), fields("3", "1", "15h54m0s"));

    // an unlimited tier with tokens: tokens only
    let r = hit(&app, "ada", "team").await;
    assert_eq!(openai(&r, "requests"), None);
    assert_eq!(openai(&r, "tokens"), fields("100", "100", "0s"));
}

#[tokio::test]
async fn a_refusal_by_a_unit_shows_the_state_that_refused() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    let app = app(&tiers, RateLimitHeaders::OPENAI);
    // 50,000 tokens: the minute band's 40,000 and 10,000 of debt (75 s to
    // full); the daily band has 950,000 left
    tiers.record("bob", "free", "tokens", 50_000).await.unwrap();
    let r = hit(&app, "bob", "free").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(openai(&r, "tokens"), fields("40000", "0", "1m15s"));
    // the refusal charged no request
    assert_eq!(openai(&r, "requests"), fields("60", "60", "0s"));
    // 10,001 tokens of 1.5 ms: 15.0015 s
    assert_eq!(r.header("retry-after"), Some("16"));
    assert_eq!(
        r.json()["violated-policies"],
        serde_json::json!(["free.tokens.0"])
    );
    // OPENAI alone: no other rate-limit field
    for other in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "ratelimit",
        "ratelimit-policy",
    ] {
        assert_eq!(r.header(other), None, "{other}");
    }

    // waiting Retry-After is enough; the debt is repaid, the band not full
    clock.advance(Duration::from_secs(16));
    let r = hit(&app, "bob", "free").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(openai(&r, "tokens"), fields("40000", "666", "59s"));
    assert_eq!(openai(&r, "requests"), fields("60", "59", "1s"));
}

#[tokio::test]
async fn the_default_fields_have_no_openai_fields() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    for which in [
        RateLimitHeaders::ALL,
        RateLimitHeaders::IETF,
        RateLimitHeaders::LEGACY,
    ] {
        let r = hit(&app(&tiers, which), "cy", "free").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(openai(&r, "requests"), None, "{which:?}");
        assert_eq!(openai(&r, "tokens"), None, "{which:?}");
    }
    assert_eq!(RateLimitHeaders::default(), RateLimitHeaders::ALL);
    let all = RateLimitHeaders::ALL.union(RateLimitHeaders::OPENAI);
    assert!(all.legacy() && all.ietf() && all.openai());
    assert_eq!(
        RateLimitHeaders::NONE.union(RateLimitHeaders::OPENAI),
        RateLimitHeaders::OPENAI
    );
}

/// An `on_limited` response that writes its own OpenAI-style fields keeps
/// them: the layer adds its fields only where the closure set none.
#[tokio::test]
async fn a_custom_refusal_keeps_its_own_openai_fields() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .clock(clock.clone())
        .build();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(header_identity)
            .headers(RateLimitHeaders::OPENAI)
            .on_limited(|_| {
                http::Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("x-ratelimit-remaining-requests", "0")
                    .header("x-ratelimit-reset-requests", "ask again tomorrow")
                    .body(bytes::Bytes::from_static(b"slow down"))
                    .unwrap()
            }),
    );
    let request = || {
        Request::get("/")
            .header("x-user", "ada")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, request()).await.status, StatusCode::OK);
    let refused = send(&app, request()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.headers["x-ratelimit-reset-requests"],
        "ask again tomorrow"
    );
    assert!(refused.headers.get("x-ratelimit-limit-requests").is_none());
    assert_eq!(refused.headers["retry-after"], "60");
}
