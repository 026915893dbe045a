//! Live policy through a real axum `Router`: tiers changed while requests
//! are served, per-customer quotas, shadow mode, the choice of header
//! fields, long periods.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request, StatusCode};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    OnUnknownTier, Quota, QuotaError, RateLimitEvent, RateLimitHeaders, RateTier, TierIdentity,
    TierLimitLayer, tier_cost,
};
use tower_rate_tier_tests::reply::{Reply, header_identity, send};

#[path = "live_policy/unit_changes_racing_new_users.rs"]
mod unit_changes_racing_new_users;
#[path = "live_policy/units_and_requests.rs"]
mod units_and_requests;

fn get_as(user: &str, tier: &str, path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-user", user)
        .header("x-tier", tier)
        .body(Body::empty())
        .unwrap()
}

async fn hit(app: &Router, user: &str, tier: &str) -> Reply {
    send(app, get_as(user, tier, "/")).await
}

fn app(tiers: RateTier) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_raised_and_lowered_under_load_decides_each_request_on_one_version() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .clock(clock.clone())
        .build();
    let app = app(tiers.clone());
    let versions = [
        (r#""pro";q=100;w=60"#, "100"),
        (r#""pro";q=300;w=60"#, "300"),
        (r#""pro";q=50;w=60"#, "50"),
    ];
    let seen = Arc::new(Mutex::new(BTreeMap::<(String, String), usize>::new()));
    let mut tasks = Vec::new();
    for t in 0..64 {
        let (app, seen) = (app.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..12 {
                let r = hit(&app, &format!("user-{t}-{}", i % 3), "pro").await;
                assert!(r.status == StatusCode::OK || r.status == StatusCode::TOO_MANY_REQUESTS);
                let policy = r.header("ratelimit-policy").unwrap_or_default().to_owned();
                let limit = r.header("x-ratelimit-limit").unwrap_or_default().to_owned();
                *seen.lock().unwrap().entry((policy, limit)).or_default() += 1;
                tokio::task::yield_now().await;
            }
        }));
    }
    // raise, then lower, while the tasks run
    tokio::time::sleep(Duration::from_millis(2)).await;
    tiers.set_tier("pro", Quota::per_minute(300)).unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    tiers.set_tier("pro", [Quota::per_minute(50)]).unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    // every response's fields come from one version: its policy and its
    // X-RateLimit-Limit agree
    for ((policy, limit), n) in seen.iter() {
        assert!(
            versions.iter().any(|(p, l)| p == policy && l == limit),
            "{n} responses mixed versions: {policy} / {limit}"
        );
    }
    assert_eq!(seen.values().sum::<usize>(), 64 * 12);
    // after the change, a new user gets the last version's burst exactly
    let app2 = app.clone();
    let mut admitted = 0;
    for _ in 0..60 {
        admitted += usize::from(hit(&app2, "late", "pro").await.status == StatusCode::OK);
    }
    assert_eq!(admitted, 50);
}

#[tokio::test]
async fn a_raise_keeps_the_time_debt_and_refills_at_the_new_rate() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_hour(100))
        .clock(clock.clone())
        .build();
    for _ in 0..100 {
        tiers.check("ada", "pro", 1).await.unwrap().unwrap();
    }
    assert!(tiers.check("ada", "pro", 1).await.unwrap().is_err());
    // raised, same period: the spent hour is still owed, and units come back
    // every 18 s instead of every 36 s
    tiers.set_tier("pro", Quota::per_hour(200)).unwrap();
    let denied = tiers.check("ada", "pro", 1).await.unwrap().unwrap_err();
    assert_eq!(denied.retry_after, Duration::from_secs(18));
    clock.advance(Duration::from_secs(18));
    assert_eq!(tiers.check("ada", "pro", 1).await.unwrap().unwrap().remaining, 0);
    // a raise of the burst over the same rate gives its extra room at once
    tiers
        .set_tier("pro", Quota::per_hour(200).with_burst(210))
        .unwrap();
    // (a new window: a new band, a full burst)
    assert_eq!(
        tiers.check("ada", "pro", 0).await.unwrap().unwrap().remaining,
        210
    );
    // lowered: nobody waits longer than one refill of the new quota
    tiers.set_tier("pro", Quota::per_hour(2)).unwrap();
    for _ in 0..2 {
        tiers.check("bob", "pro", 1).await.unwrap().unwrap();
    }
    let denied = tiers.check("bob", "pro", 1).await.unwrap().unwrap_err();
    assert!(denied.retry_after <= Duration::from_secs(3_600));
}

#[tokio::test]
async fn a_removed_tier_follows_the_unknown_tier_policy_and_the_default_stays() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("legacy", Quota::per_minute(10))
        .default_tier("free")
        .clock(FakeClock::new())
        .build();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(header_identity)
            .on_unknown_tier(OnUnknownTier::Deny(StatusCode::FORBIDDEN)),
    );
    assert_eq!(hit(&app, "ada", "legacy").await.status, StatusCode::OK);
    assert!(tiers.remove_tier("legacy"));
    assert!(!tiers.remove_tier("legacy"), "already gone");
    assert!(!tiers.remove_tier("free"), "the default tier stays");
    assert_eq!(hit(&app, "ada", "legacy").await.status, StatusCode::FORBIDDEN);
    assert_eq!(hit(&app, "ada", "free").await.status, StatusCode::OK);
    assert_eq!(tiers.tier_names(), ["free"]);
}

#[tokio::test]
async fn a_customer_quota_counts_in_its_own_bucket_under_the_tier_name() {
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_minute(2))
        .clock(FakeClock::new())
        .build();
    let identify = |headers: &HeaderMap| {
        let user = headers.get("x-user")?.to_str().ok()?;
        let identity = TierIdentity::new(user, "pro");
        // the contract is looked up server-side; here: one customer has one
        Some(if user == "acme" {
            identity.with_quotas([Quota::per_minute(5)])
        } else {
            identity
        })
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identify));
    let mut acme = Vec::new();
    for _ in 0..6 {
        acme.push(hit(&app, "acme", "pro").await);
    }
    assert_eq!(acme.iter().filter(|r| r.status == StatusCode::OK).count(), 5);
    assert_eq!(acme[0].header("ratelimit-policy"), Some(r#""pro";q=5;w=60"#));
    assert_eq!(acme[0].remaining(), Some(4));
    // the tier's users keep the tier's quota, apart from the customer's
    let bob: Vec<u16> = [
        hit(&app, "bob", "pro").await,
        hit(&app, "bob", "pro").await,
        hit(&app, "bob", "pro").await,
    ]
    .iter()
    .map(|r| r.status.as_u16())
    .collect();
    assert_eq!(bob, [200, 200, 429]);
    assert_eq!(
        hit(&app, "acme-2", "pro").await.header("ratelimit-policy"),
        Some(r#""pro";q=2;w=60"#)
    );
}

#[tokio::test]
async fn shadow_mode_decides_and_reports_but_refuses_nothing_and_consumes_nothing() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(6))
        .clock(FakeClock::new())
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let shadowed = Arc::new(AtomicUsize::new(0));
    let inner = {
        let calls = calls.clone();
        move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            "ok"
        }
    };
    let events = shadowed.clone();
    let app = Router::new()
        .route("/", get(inner.clone()))
        .route("/export", get(inner).layer(tier_cost(5)))
        .layer(
            TierLimitLayer::new(tiers)
                .identifier_fn(header_identity)
                .shadow(true)
                .on_event(move |e| {
                    if matches!(e, RateLimitEvent::ShadowLimited { .. }) {
                        events.fetch_add(1, Ordering::SeqCst);
                    }
                }),
        );
    let export = |app: Router| async move { send(&app, get_as("ada", "free", "/export")).await };
    let first = export(app.clone()).await;
    assert_eq!((first.status, first.remaining()), (StatusCode::OK, Some(1)));
    // would be refused: let through, with the state's fields, no Retry-After
    let second = export(app.clone()).await;
    assert_eq!((second.status, second.remaining()), (StatusCode::OK, Some(1)));
    assert!(second.header("retry-after").is_none());
    // ... and it consumed nothing: the one unit left is still there
    assert_eq!(hit(&app, "ada", "free").await.remaining(), Some(0));
    let over = hit(&app, "ada", "free").await;
    assert_eq!(over.status, StatusCode::OK);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the inner service ran for every request"
    );
    assert_eq!(shadowed.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_shadowed_tier_next_to_an_enforced_one() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .tier("beta", Quota::per_minute(1))
        .shadow_tier("beta")
        .clock(FakeClock::new())
        .build();
    let app = app(tiers);
    let statuses = |replies: [Reply; 2]| replies.map(|r| r.status.as_u16());
    assert_eq!(
        statuses([hit(&app, "ada", "free").await, hit(&app, "ada", "free").await]),
        [200, 429]
    );
    assert_eq!(
        statuses([hit(&app, "ada", "beta").await, hit(&app, "ada", "beta").await]),
        [200, 200]
    );
    assert!(
        RateTier::builder()
            .tier("free", Quota::per_minute(1))
            .shadow_tier("nope")
            .try_build()
            .is_err()
    );
}

#[tokio::test]
async fn each_choice_of_header_fields() {
    let names = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-policy",
        "ratelimit",
    ];
    for (which, expected) in [
        (RateLimitHeaders::ALL, [true, true, true, true, true]),
        (RateLimitHeaders::IETF, [false, false, false, true, true]),
        (RateLimitHeaders::LEGACY, [true, true, true, false, false]),
        (RateLimitHeaders::NONE, [false; 5]),
    ] {
        let tiers = RateTier::builder()
            .tier("free", Quota::per_minute(1))
            .clock(FakeClock::new())
            .build();
        let app = Router::new().route("/", get(|| async { "ok" })).layer(
            TierLimitLayer::new(tiers)
                .identifier_fn(header_identity)
                .headers(which),
        );
        let ok = hit(&app, "ada", "free").await;
        let present = names.map(|n| ok.header(n).is_some());
        assert_eq!(present, expected, "{which:?}");
        // a 429 always has Retry-After and its body
        let refused = hit(&app, "ada", "free").await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.header("retry-after"), Some("60"));
        assert_eq!(refused.json()["retry_after"], 60);
        assert_eq!(
            names.map(|n| refused.header(n).is_some()),
            expected,
            "{which:?} on a 429"
        );
    }
}

#[tokio::test]
async fn a_thirty_day_quota_has_right_header_values() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("monthly", Quota::per_period(30, Duration::from_secs(30 * 86_400)))
        .clock(clock.clone())
        .build();
    let app = app(tiers);
    let r = hit(&app, "ada", "monthly").await;
    assert_eq!(r.header("ratelimit-policy"), Some(r#""monthly";q=30;w=2592000"#));
    // one unit refills in a day: it is full again in 86,400 s
    assert_eq!(r.header("ratelimit"), Some(r#""monthly";r=29;t=86400"#));
    let reset = FakeClock::START_UNIX_SECS + 86_400;
    assert_eq!(r.header("x-ratelimit-reset"), Some(reset.to_string().as_str()));
    clock.advance(Duration::from_secs(43_200));
    let r = hit(&app, "ada", "monthly").await;
    // 1.5 days used: half a day until the next unit (not the 1.5 days until full)
    assert_eq!(r.header("ratelimit"), Some(r#""monthly";r=28;t=43200"#));
}

#[test]
fn quotas_from_configuration_fail_without_panicking() {
    assert_eq!(
        Quota::try_per_period(0, Duration::from_secs(60)),
        Err(QuotaError::ZeroCount)
    );
    assert!(Quota::try_per_period(10, Duration::ZERO).is_err());
    assert!(Quota::try_per_period(10, Duration::from_secs(60)).is_ok());
}

/// The same change on Redis: a band keeps its state under its window, on
/// the server's clock.
#[tokio::test]
async fn a_change_on_redis_keeps_the_state_of_bands_whose_window_stays() {
    use tower_rate_tier::storage::RedisStorage;
    use tower_rate_tier_tests::redis::RedisServer;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let storage = RedisStorage::builder(server.url())
        .hash_secret("live")
        .connect()
        .await
        .unwrap();
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_hour(100))
        .storage(storage)
        .build();
    for _ in 0..100 {
        tiers.check("ada", "pro", 1).await.unwrap().unwrap();
    }
    tiers.set_tier("pro", Quota::per_hour(200)).unwrap();
    let denied = tiers.check("ada", "pro", 1).await.unwrap().unwrap_err();
    assert!(
        denied.retry_after > Duration::from_secs(17) && denied.retry_after <= Duration::from_secs(18),
        "{:?}",
        denied.retry_after
    );
    // another window: a band of its own, a full burst
    tiers.set_tier("pro", [Quota::per_minute(5)]).unwrap();
    assert_eq!(tiers.check("ada", "pro", 0).await.unwrap().unwrap().remaining, 5);
    // back to the hourly window: its state is still there
    tiers.set_tier("pro", Quota::per_hour(100)).unwrap();
    assert!(tiers.check("ada", "pro", 1).await.unwrap().is_err());
}

/// From a dark launch to enforcement at run time, and shadow events name
/// users by their pseudonym, never by their id.
#[tokio::test]
async fn a_shadowed_tier_is_enforced_at_run_time_and_its_events_carry_no_user_id() {
    let tiers = RateTier::builder()
        .tier("beta", Quota::per_minute(1))
        .shadow_tier("beta")
        .clock(FakeClock::new())
        .build();
    let users = Arc::new(Mutex::new(Vec::new()));
    let seen = users.clone();
    let layer = TierLimitLayer::new(tiers.clone())
        .identifier_fn(header_identity)
        .on_event(move |e| {
            if let RateLimitEvent::ShadowLimited { user, .. } = e {
                seen.lock().unwrap().push(user.to_string());
            }
        });
    let pseudonym = layer.user_pseudonym("ada-secret-id");
    let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
    assert_eq!(hit(&app, "ada-secret-id", "beta").await.status, StatusCode::OK);
    assert_eq!(hit(&app, "ada-secret-id", "beta").await.status, StatusCode::OK);
    assert_eq!(*users.lock().unwrap(), [pseudonym]);
    // enforced from now on, the state kept: the spent minute is still spent
    assert!(tiers.set_shadow("beta", false));
    assert_eq!(
        hit(&app, "ada-secret-id", "beta").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(!tiers.set_shadow("gamma", true));
}

/// A custom 429 that sets its own `Retry-After` still gets the rate-limit
/// fields.
#[tokio::test]
async fn a_custom_refusal_keeps_the_fields_it_did_not_set() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .clock(FakeClock::new())
        .build();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers)
            .identifier_fn(header_identity)
            .on_limited(|l| {
                http::Response::builder()
                    .status(429)
                    .header("retry-after", (l.retry_after_secs() + 1).to_string())
                    .body(bytes::Bytes::from_static(b"slow down"))
                    .unwrap()
            }),
    );
    hit(&app, "ada", "free").await;
    let refused = hit(&app, "ada", "free").await;
    assert_eq!(refused.header("retry-after"), Some("61"), "the closure's own");
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(refused.header("ratelimit-policy"), Some(r#""free";q=1;w=60"#));
}
