//! The rate-limit fields and the 429 body as clients read them: `RateLimit`
//! and `RateLimit-Policy` parsed with `sfv` (an RFC 9651 Structured Fields
//! parser), the draft's `t` ("seconds until additional quota is made
//! available") and its rule that `Retry-After` is never earlier than a
//! denying policy's `t`, and the `quota-exceeded` problem.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
use tower_rate_tier_tests::fields;
use tower_rate_tier_tests::reply::{Reply, header_identity, send};

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A field's items as `sfv` decodes them: name and integer parameters.
/// Panics when the field is not the draft's shape (a List of Strings with
/// non-negative Integer parameters).
fn items(value: &str) -> Vec<(String, HashMap<String, i64>)> {
    fields::items(value)
        .into_iter()
        .map(|(name, params)| {
            let params = params
                .iter()
                .map(|(k, v)| {
                    let n = i64::from(v.as_integer().expect("an Integer parameter"));
                    assert!(n >= 0, "{value:?}");
                    (k.as_str().to_owned(), n)
                })
                .collect();
            (name, params)
        })
        .collect()
}

fn app(clock: &FakeClock) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .tier("multi", [Quota::per_second(2), Quota::per_day(1_000)])
        .tier("day", [Quota::per_second(10), Quota::per_day(3)])
        .clock(clock.clone())
        .build();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity))
}

async fn hit(app: &Router, user: &str, tier: &str) -> Reply {
    let req = Request::get("/")
        .header("x-user", user)
        .header("x-tier", tier)
        .body(Body::empty())
        .unwrap();
    send(app, req).await
}

/// Every item's `t` (`None` when absent), checked against the policy's names.
fn ts(r: &Reply) -> Vec<(String, Option<i64>)> {
    let policy = items(r.header("ratelimit-policy").expect("RateLimit-Policy"));
    let state = items(r.header("ratelimit").expect("RateLimit"));
    let names: Vec<&String> = policy.iter().map(|(n, _)| n).collect();
    assert_eq!(state.iter().map(|(n, _)| n).collect::<Vec<_>>(), names);
    for (_, params) in &policy {
        assert!(params.contains_key("q"), "{policy:?}");
    }
    state
        .into_iter()
        .map(|(name, params)| {
            assert!(params.contains_key("r"));
            if let Some(t) = params.get("t") {
                assert!(*t >= 1, "t is at least 1: {t}");
            }
            (name, params.get("t").copied())
        })
        .collect()
}

fn retry_after(r: &Reply) -> u64 {
    r.header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds")
}

#[tokio::test]
async fn t_is_the_time_until_one_more_unit() {
    let clock = FakeClock::new();
    let app = app(&clock);
    // per_minute(5): one unit every 12 s; after each of the first requests
    // the next unit is 12 s away, not the time until the bucket is full
    for i in 0..5 {
        let r = hit(&app, "ada", "free").await;
        assert_eq!(r.status, StatusCode::OK);
        let t = ts(&r)[0].1.expect("a band that is not full has a t");
        assert!(t <= 12, "request {i}: t={t}");
        assert_eq!(t, 12, "request {i}");
    }
    // 5 s on: 7 s to go
    clock.advance(Duration::from_secs(5));
    let r = hit(&app, "ada", "free").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(ts(&r), [("free".to_owned(), Some(7))]);
    assert_eq!(retry_after(&r), 7);
    // full again, then one request: one unit, 12 s
    clock.advance(Duration::from_secs(120));
    let r = hit(&app, "ada", "free").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(ts(&r)[0].1, Some(12));
}

#[tokio::test]
async fn retry_after_is_never_earlier_than_a_denying_t_and_waiting_it_is_enough() {
    let clock = FakeClock::new();
    let app = app(&clock);
    for tier in ["free", "multi", "day"] {
        for round in 0..3 {
            // spend what is left, at one instant
            let mut admitted = 0;
            let r = loop {
                let r = hit(&app, "ada", tier).await;
                if r.status != StatusCode::OK {
                    break r;
                }
                admitted += 1;
                assert!(admitted <= 5, "{tier}: never refused");
            };
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{tier} round {round}");
            let retry = retry_after(&r);
            let items = ts(&r);
            let denying: Vec<&(String, Option<i64>)> = items.iter().filter(|(_, t)| t.is_some()).collect();
            assert!(!denying.is_empty(), "{tier}: {items:?}");
            for (name, t) in &denying {
                assert!(
                    retry >= t.unwrap() as u64,
                    "{tier}: {name} t={t:?} > Retry-After {retry}"
                );
            }
            // the body names exactly the items that carry a t (the ones that
            // refused), as the field's parser decodes them
            let body = r.json();
            assert_eq!(body["type"], QUOTA_EXCEEDED);
            assert_eq!(body["status"], 429);
            assert_eq!(body["tier"], tier);
            assert_eq!(body["retry_after"], retry);
            let named: Vec<&str> = denying.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(body["violated-policies"], serde_json::json!(named), "{tier}");
            // a client that waits Retry-After is admitted
            clock.advance(Duration::from_secs(retry));
            let r = hit(&app, "ada", tier).await;
            assert_eq!(r.status, StatusCode::OK, "{tier} round {round} after {retry} s");
        }
    }
}

#[tokio::test]
async fn only_the_band_that_refused_is_violated() {
    let clock = FakeClock::new();
    let app = app(&clock);
    // multi: the per-second band refuses, the daily one has room
    for _ in 0..2 {
        hit(&app, "ada", "multi").await;
    }
    let r = hit(&app, "ada", "multi").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["violated-policies"], serde_json::json!(["multi.0"]));
    // the daily band's next unit is far away: no t for it on the 429
    assert_eq!(
        ts(&r),
        [("multi.0".to_owned(), Some(1)), ("multi.1".to_owned(), None)]
    );
    assert_eq!(retry_after(&r), 1);
    // day: three a day; the daily band refuses, the per-second one has room
    clock.advance(Duration::from_secs(1));
    for _ in 0..3 {
        assert_eq!(hit(&app, "bob", "day").await.status, StatusCode::OK);
    }
    let r = hit(&app, "bob", "day").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["violated-policies"], serde_json::json!(["day.1"]));
    assert_eq!(ts(&r)[0], ("day.0".to_owned(), None));
    assert_eq!(ts(&r)[1], ("day.1".to_owned(), Some(28_800)));
    assert_eq!(retry_after(&r), 28_800);
}

#[tokio::test]
async fn outcomes_expose_the_same_numbers() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .tier("multi", [Quota::per_second(2), Quota::per_day(1_000)])
        .clock(clock.clone())
        .build();
    let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!(info.more_quota_after(), Some(Duration::from_secs(12)));
    assert_eq!(info.reset_after, Duration::from_secs(12));
    let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!(info.more_quota_after(), Some(Duration::from_secs(12)));
    assert_eq!(info.reset_after, Duration::from_secs(24));
    assert_eq!(info.ratelimit_t_secs().collect::<Vec<_>>(), [Some(12)]);
    let peek = tiers.check("bob", "free", 0).await.unwrap().unwrap();
    assert_eq!(peek.more_quota_after(), None, "a full band");
    tiers.check("ada", "multi", 2).await.unwrap().unwrap();
    let limited = tiers.check("ada", "multi", 1).await.unwrap().unwrap_err();
    assert_eq!(limited.ratelimit_t_secs().collect::<Vec<_>>(), [Some(1), None]);
    assert_eq!(limited.violated_policies().collect::<Vec<_>>(), ["multi.0"]);
    assert_eq!(limited.retry_after_secs(), 1);
}

/// A fallback decides with its share of each band: `t` counts from the
/// share's interval, the quota that decided.
#[tokio::test]
async fn t_comes_from_the_quota_that_decided() {
    use std::sync::Arc;
    use tower_rate_tier::clock::Clock;
    use tower_rate_tier::storage::{
        Decide, Fallback, Op, Storage, StorageError, StorageErrorKind, StorageKey,
    };

    #[derive(Debug)]
    struct Down;
    impl Storage for Down {
        fn decide(&self, _: StorageKey<'_>, _: &[Quota], _: Op, _: &Arc<dyn Clock>) -> Decide {
            Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")))
        }
    }
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .storage(Fallback::builder(Down).instances(2).build())
        .clock(clock.clone())
        .build();
    // half the quota locally: 5 a minute, one every 12 s (not 6)
    let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!(info.ratelimit_t_secs().collect::<Vec<_>>(), [Some(12)]);
    for _ in 0..4 {
        tiers.check("ada", "free", 1).await.unwrap().unwrap();
    }
    let limited = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(limited.ratelimit_t_secs().collect::<Vec<_>>(), [Some(12)]);
    assert_eq!(limited.retry_after_secs(), 12);
}

// ------------------------------------------------------------- units

/// The quota units draft-ietf-httpapi-ratelimit-headers registers (its
/// text names `requests`, its registry table `request`).
const REGISTERED_UNITS: [&str; 4] = ["request", "requests", "content-bytes", "concurrent-requests"];

fn param<'a>(params: &'a sfv::Parameters, key: &str) -> Option<&'a sfv::BareItem> {
    params.iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v)
}

/// Requests, tokens in two bands, content bytes and a concurrency limit.
fn metered(clock: &FakeClock) -> (RateTier, Router) {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .tier_unit(
            "free",
            "tokens",
            [Quota::per_minute(1_000), Quota::per_day(10_000)],
        )
        .tier_unit("free", "content-bytes", Quota::per_hour(1_000_000))
        .tier_concurrency("free", 2)
        .clock(clock.clone())
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    (tiers, app)
}

/// Checks both IETF fields of `r` against the draft, and returns the
/// `RateLimit` items' names with their `t`.
fn unit_fields(r: &Reply) -> Vec<(String, Option<i64>)> {
    let policy = fields::items(r.header("ratelimit-policy").expect("RateLimit-Policy"));
    let names: Vec<&str> = policy.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "free",
            "free.tokens.0",
            "free.tokens.1",
            "free.content-bytes",
            "free.concurrency"
        ]
    );
    for (name, params) in &policy {
        let q = param(params, "q").and_then(sfv::BareItem::as_integer);
        assert!(q.is_some_and(|q| i64::from(q) >= 0), "{name}: q {params:?}");
        if let Some(w) = param(params, "w") {
            assert!(
                w.as_integer().is_some_and(|w| i64::from(w) > 0),
                "{name}: w {params:?}"
            );
        }
        // `qu` only for a unit the draft registers, and only where it
        // applies; every other unit is told by the item's name alone
        let qu = param(params, "qu").map(|v| v.as_string().expect("qu is a String").as_str());
        if let Some(qu) = qu {
            assert!(REGISTERED_UNITS.contains(&qu), "{name}: unregistered qu {qu:?}");
        }
        let expected = match name.as_str() {
            "free.content-bytes" => Some("content-bytes"),
            "free.concurrency" => Some("concurrent-requests"),
            _ => None,
        };
        assert_eq!(qu, expected, "{name}");
        for key in params.iter().map(|(k, _)| k.as_str()) {
            assert!(["q", "qu", "w"].contains(&key), "{name}: parameter {key}");
        }
    }
    let state = fields::items(r.header("ratelimit").expect("RateLimit"));
    assert_eq!(state.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), names);
    state
        .into_iter()
        .map(|(name, params)| {
            for key in params.iter().map(|(k, _)| k.as_str()) {
                assert!(["r", "t"].contains(&key), "{name}: parameter {key} in RateLimit");
            }
            let r = param(&params, "r").and_then(sfv::BareItem::as_integer);
            assert!(r.is_some_and(|r| i64::from(r) >= 0), "{name}: r {params:?}");
            let t = param(&params, "t").map(|t| i64::from(t.as_integer().expect("an Integer t")));
            (name, t)
        })
        .collect()
}

#[tokio::test]
async fn unit_items_parse_are_unique_and_carry_only_registered_units() {
    let clock = FakeClock::new();
    let (_, app) = metered(&clock);
    let r = hit(&app, "ada", "free").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(concat!(
            r#""free";q=5;w=60, "free.tokens.0";q=1000;w=60, "free.tokens.1";q=10000;w=86400, "#,
            r#""free.content-bytes";q=1000000;w=3600;qu="content-bytes", "#,
            r#""free.concurrency";q=2;qu="concurrent-requests""#
        ))
    );
    // the units' bands are full: no t
    let t: Vec<Option<i64>> = unit_fields(&r).into_iter().map(|(_, t)| t).collect();
    assert_eq!(t, [Some(12), None, None, None, None]);
}

#[tokio::test]
async fn a_refusal_by_a_unit_names_its_item() {
    let clock = FakeClock::new();
    let (tiers, app) = metered(&clock);
    // 1,500 tokens: 500 of debt in the minute band, room in the daily one
    tiers.record("ada", "free", "tokens", 1_500).await.unwrap();
    let r = hit(&app, "ada", "free").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // 501 tokens of 60 ms each: 30.06 s
    assert_eq!(retry_after(&r), 31);
    assert_eq!(
        unit_fields(&r),
        [
            ("free".to_owned(), None),
            ("free.tokens.0".to_owned(), Some(31)),
            ("free.tokens.1".to_owned(), None),
            ("free.content-bytes".to_owned(), None),
            ("free.concurrency".to_owned(), None),
        ]
    );
    assert!(
        r.header("ratelimit")
            .unwrap()
            .contains(r#""free.tokens.0";r=0;t=31"#)
    );
    let body = r.json();
    assert_eq!(body["type"], QUOTA_EXCEEDED);
    assert_eq!(body["violated-policies"], serde_json::json!(["free.tokens.0"]));
    assert_eq!(body["unit"], "tokens");
    assert_eq!(
        (body["limit"].as_u64(), body["remaining"].as_u64()),
        (Some(1_000), Some(0))
    );
    assert_eq!(r.header("x-ratelimit-limit"), Some("1000"));
    assert_eq!(r.remaining(), Some(0));

    // both token bands in debt: both named
    tiers.record("bob", "free", "tokens", u32::MAX).await.unwrap();
    let r = hit(&app, "bob", "free").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.json()["violated-policies"],
        serde_json::json!(["free.tokens.0", "free.tokens.1"])
    );
    let t = unit_fields(&r);
    assert!(t[1].1.is_some() && t[2].1.is_some(), "{t:?}");
    assert_eq!(
        retry_after(&r),
        t[2].1.unwrap() as u64,
        "the daily band refuses longest"
    );

    // content bytes: the registered unit's item
    tiers
        .record("cy", "free", "content-bytes", 2 << 20)
        .await
        .unwrap();
    let r = hit(&app, "cy", "free").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.json()["violated-policies"],
        serde_json::json!(["free.content-bytes"])
    );
    assert_eq!(r.json()["unit"], "content-bytes");
    unit_fields(&r);

    // a request band's refusal says so
    for _ in 0..5 {
        assert_eq!(hit(&app, "dee", "free").await.status, StatusCode::OK);
    }
    let r = hit(&app, "dee", "free").await;
    assert_eq!(r.json()["violated-policies"], serde_json::json!(["free"]));
    assert_eq!(r.json()["unit"], "requests");
}

/// A window longer than a Structured Field's Integer can hold (15 digits:
/// a yearly quota with a burst in the billions) is written as the largest
/// one, so that the field still parses.
#[tokio::test]
async fn a_window_too_long_for_a_structured_field_is_written_as_the_largest_integer() {
    let year = Duration::from_secs(365 * 86_400);
    let tiers = RateTier::builder()
        .tier("eon", Quota::per_period(1, year).with_burst(u32::MAX))
        .clock(FakeClock::new())
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    let reply = hit(&app, "ada", "eon").await;
    assert_eq!(reply.status, StatusCode::OK);
    let policy = items(reply.header("ratelimit-policy").expect("RateLimit-Policy"));
    assert_eq!(policy[0].1["w"], 999_999_999_999_999);
    assert_eq!(policy[0].1["q"], i64::from(u32::MAX));
    items(reply.header("ratelimit").expect("RateLimit"));
}

/// `w` is the configured window, so that a client pacing itself at `q`
/// per `w` runs at the quota's rate: `per_second(3)` is 3 per second, not
/// 3 per 2 seconds (each emission interval is rounded up by a fraction of
/// a nanosecond, which must not add a whole second to `w`).
#[tokio::test]
async fn w_is_the_window_the_quota_was_written_with() {
    let cases = [
        (Quota::per_second(3), 1),
        (Quota::per_second(7), 1),
        (Quota::per_minute(7), 60),
        (Quota::per_hour(7), 3_600),
        (Quota::per_day(7), 86_400),
        (Quota::per_day(7).with_burst(1), 12_343),
        (Quota::per_period(7, Duration::from_secs(30 * 86_400)), 2_592_000),
    ];
    for (quota, w) in cases {
        let clock = FakeClock::new();
        let tiers = RateTier::builder()
            .tier("free", quota)
            .clock(clock.clone())
            .build();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
        let reply = hit(&app, "ada", "free").await;
        let policy = items(reply.header("ratelimit-policy").expect("RateLimit-Policy"));
        assert_eq!(policy[0].1["w"], w, "{quota:?}");
        // A client pacing itself at q per w is admitted every time.
        let pace = Duration::from_nanos(w as u64 * 1_000_000_000 / policy[0].1["q"] as u64);
        for _ in 0..3 * policy[0].1["q"] {
            clock.advance(pace);
            assert_eq!(hit(&app, "bea", "free").await.status, StatusCode::OK, "{quota:?}");
        }
    }
}
