//! Usage recorded by handlers behind the layer: `TierUsage` reservations and
//! records, refusals by a unit, and `content-bytes` counted from response
//! bodies (memory storage, a fake clock).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateLimitEvent, RateTier, TierLimitLayer, TierRefusal, TierUsage};
use tower_rate_tier_tests::bodies::Repeated;
use tower_rate_tier_tests::reply::{header_identity, send};

#[path = "usage/at_the_cap.rs"]
mod at_the_cap;

fn tiers(clock: &FakeClock) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .tier_unit("free", "content-bytes", Quota::per_minute(100))
        .clock(clock.clone())
        .build()
}

/// The units of `unit` left to `user` now (0 while in debt).
async fn left(tiers: &RateTier, user: &str, unit: &str) -> u32 {
    let state = tiers.check(user, "free", 0).await.unwrap();
    let bands: Vec<_> = match &state {
        Ok(info) => info.bands().collect(),
        Err(limited) => limited.bands().collect(),
    };
    bands
        .iter()
        .find(|(q, _)| q.unit().as_str() == unit)
        .map(|(_, s)| s.remaining)
        .expect("the tier has the unit")
}

/// `/complete?reserve=R&use=U`: reserves R tokens, records U (none when
/// absent); `/fail?reserve=R` reserves and fails without recording.
fn routes() -> Router {
    async fn complete(usage: TierUsage, uri: http::Uri) -> Result<String, TierRefusal> {
        let query = uri.query().unwrap_or("");
        let arg = |name: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .map(|v| v.parse::<u32>().unwrap())
        };
        if let Some(n) = arg("reserve") {
            usage.reserve("tokens", n).await?;
        }
        if let Some(n) = arg("use") {
            usage.record("tokens", n);
        }
        Ok("done".into())
    }
    async fn fail(usage: TierUsage) -> Result<StatusCode, TierRefusal> {
        usage.reserve("tokens", 400).await?;
        Ok(StatusCode::INTERNAL_SERVER_ERROR)
    }
    Router::new()
        .route("/complete", get(complete))
        .route("/fail", get(fail))
        .route("/bytes", get(|| async { Body::from(vec![b'x'; 30]) }))
        .route("/empty", get(|| async { StatusCode::NO_CONTENT }))
        .route(
            "/typo",
            get(|usage: TierUsage| async move { usage.reserve("tokenz", 1).await.map(|()| "ok") }),
        )
}

fn app(tiers: &RateTier) -> Router {
    routes().layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity))
}

fn get_as(user: &str, uri: &str) -> Request<Body> {
    Request::get(uri)
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn a_reservation_gives_back_what_was_not_used() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = app(&tiers);
    let reply = send(&app, get_as("ada", "/complete?reserve=800&use=300")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(left(&tiers, "ada", "tokens").await, 700);
    // the response's fields name the unit's item
    let policy = reply.header("ratelimit-policy").unwrap();
    assert!(policy.contains(r#""free.tokens";q=1000;w=60"#), "{policy}");
    assert!(
        policy.contains(r#""free.content-bytes";q=100;w=60;qu="content-bytes""#),
        "{policy}"
    );
}

#[tokio::test]
async fn a_refused_reservation_is_a_429_that_consumes_nothing() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = app(&tiers);
    send(&app, get_as("ada", "/complete?reserve=900")).await;
    let requests_before = tiers.check("ada", "free", 0).await.unwrap().unwrap().remaining;
    let refused = send(&app, get_as("ada", "/complete?reserve=200")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // 100 tokens short, 60 ms each
    assert_eq!(refused.header("retry-after"), Some("6"));
    let body = refused.json();
    assert_eq!(body["violated-policies"], serde_json::json!(["free.tokens"]));
    let ratelimit = refused.header("ratelimit").unwrap();
    assert!(ratelimit.contains(r#""free.tokens";r=100;t=6"#), "{ratelimit}");
    // the request band as it stands with this request's charge given back
    assert!(
        ratelimit.starts_with(&format!(r#""free";r={requests_before}"#)),
        "{ratelimit}"
    );
    // the request's own charge came back, and no token was taken
    let requests_after = tiers.check("ada", "free", 0).await.unwrap().unwrap().remaining;
    assert_eq!(requests_after, requests_before);
    assert_eq!(left(&tiers, "ada", "tokens").await, 100);
}

#[tokio::test]
async fn usage_beyond_what_is_left_is_a_debt_that_refuses_the_next_requests() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = app(&tiers);
    // 100 reserved, 1,500 used: 500 of debt
    assert_eq!(
        send(&app, get_as("ada", "/complete?reserve=100&use=1500"))
            .await
            .status,
        StatusCode::OK
    );
    let refused = send(&app, get_as("ada", "/complete")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // 500 tokens of debt and one token, 60 ms each: 30.06 s
    assert_eq!(refused.header("retry-after"), Some("31"));
    clock.advance(Duration::from_millis(30_059));
    assert_eq!(
        send(&app, get_as("ada", "/complete")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        send(&app, get_as("ada", "/complete")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn usage_beyond_the_debt_bound_is_forgiven_and_reported() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let app = routes().layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(header_identity)
            .on_event(move |event| {
                if let RateLimitEvent::UsageForgiven { unit, units, .. } = event {
                    seen.lock().unwrap().push((unit.to_string(), *units));
                }
            }),
    );
    send(&app, get_as("ada", "/complete?use=5000")).await;
    // 1,000 left and 1,000 of debt taken: 3,000 forgiven
    assert_eq!(*events.lock().unwrap(), [("tokens".to_owned(), 3_000)]);
}

/// `content-bytes` of a body above 4 GiB: a plan of 4 GiB a day (and as
/// much of debt) streams 9 GiB. What is left and the debt bound take
/// 8 GiB less 2 bytes, and the rest is forgiven and reported, never
/// dropped unseen: the next download waits for the debt.
#[tokio::test]
async fn content_bytes_above_4_gib_are_charged_and_the_excess_reported() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(1_000))
        .tier_unit("free", "content-bytes", Quota::per_day(u32::MAX))
        .clock(clock.clone())
        .build();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let chunk = Bytes::from(vec![0u8; 64 << 20]);
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let chunk = chunk.clone();
                async move {
                    Body::new(Repeated {
                        chunk,
                        frames: 9 * 16,
                    })
                }
            }),
        )
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(header_identity)
                .on_event(move |event| {
                    if let RateLimitEvent::UsageForgiven { units, .. } = event {
                        seen.lock().unwrap().push(*units);
                    }
                }),
        );
    let response = app.clone().oneshot(get_as("ada", "/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut read = 0u64;
    while let Some(frame) = body.frame().await {
        read += frame.unwrap().into_data().map_or(0, |data| data.len() as u64);
    }
    drop(body);
    assert_eq!(read, 9 << 30);
    let absorbed = 2 * u64::from(u32::MAX);
    let forgiven: u64 = events.lock().unwrap().iter().map(|&units| u64::from(units)).sum();
    assert_eq!(forgiven, read - absorbed);
    // a full day of debt to repay
    let next = send(&app, get_as("ada", "/")).await;
    assert_eq!(next.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = next.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry > 86_000, "Retry-After {retry}");
}

#[tokio::test]
async fn a_reservation_never_recorded_stays_charged() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = app(&tiers);
    let reply = send(&app, get_as("ada", "/fail")).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(left(&tiers, "ada", "tokens").await, 600);
}

#[tokio::test]
async fn an_unknown_unit_or_a_missing_limiter_is_a_500_that_says_so() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let typo = send(&app(&tiers), get_as("ada", "/typo")).await;
    assert_eq!(typo.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(typo.json()["unit"], "tokenz");
    let bare = send(&routes(), get_as("ada", "/complete?reserve=1")).await;
    assert_eq!(bare.status, StatusCode::INTERNAL_SERVER_ERROR);
}

/// Plans differ in what they limit: a tier without a unit another tier
/// counts (an enterprise plan with no token limit), or a tier whose unit
/// was removed at run time, takes nothing and serves the handler; a unit
/// no tier counts or counted is still the 500 of a typo.
#[tokio::test]
async fn a_tier_without_a_unit_another_tier_counts_serves_its_handlers() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .tier("enterprise", Quota::per_minute(100))
        .clock(clock.clone())
        .build();
    let app = app(&tiers);
    let as_enterprise = |uri: &str| {
        let mut req = get_as("bob", uri);
        req.headers_mut().insert("x-tier", "enterprise".parse().unwrap());
        req
    };
    let reply = send(&app, as_enterprise("/complete?reserve=5000&use=3000")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    assert_eq!(
        send(&app, as_enterprise("/typo")).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    // the free plan stops limiting tokens at run time
    assert_eq!(
        send(&app, get_as("ada", "/complete?reserve=800&use=300"))
            .await
            .status,
        StatusCode::OK
    );
    tiers.set_tier_unit("free", "tokens", None).unwrap();
    let reply = send(&app, get_as("ada", "/complete?reserve=5000&use=3000")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let typo = send(&app, get_as("ada", "/typo")).await;
    assert_eq!(typo.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(typo.json()["unit"], "tokenz");
}

/// A route priced 0 up front (`cost_fn`) still waits while a unit is in
/// debt: it may use the unit, and a route that records what it used would
/// else use it without bound (its usage beyond the debt forgiven).
#[tokio::test]
async fn a_route_priced_0_that_uses_a_unit_is_held_to_it() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = routes().layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(header_identity)
            .cost_fn(|_| Some(0)),
    );
    let mut admitted = 0;
    for _ in 0..20 {
        if send(&app, get_as("ada", "/complete?use=800")).await.status == StatusCode::OK {
            admitted += 1;
        }
    }
    // 800 used of 1,000, then 800 more into a debt of 600: refused since
    assert_eq!(admitted, 2);
}

/// `routes()` behind a limiter of `tiers` whose user `acme` has a contract
/// counting 1,000 tokens a minute; the others are on the tier `pro`.
fn with_a_token_contract(tiers: &RateTier) -> Router {
    routes().layer(
        TierLimitLayer::new(tiers.clone()).identifier_fn(|headers: &http::HeaderMap| {
            let user = headers.get("x-user")?.to_str().ok()?;
            let identity = tower_rate_tier::TierIdentity::new(user, "pro");
            Some(match user {
                "acme" => identity.with_unit_quotas("tokens", Quota::per_minute(1_000)),
                _ => identity,
            })
        }),
    )
}

/// A unit that only a customer's own quotas count (a tier without it):
/// once such a customer was seen, the tier's other users' reservations of
/// it take nothing; a typo is still a 500.
#[tokio::test]
async fn a_unit_only_a_contract_counts_is_no_typo_for_the_tiers_other_users() {
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_minute(100))
        .default_tier("pro")
        .clock(FakeClock::new())
        .build();
    let app = with_a_token_contract(&tiers);
    let acme = send(&app, get_as("acme", "/complete?reserve=800&use=300")).await;
    assert_eq!(acme.status, StatusCode::OK);
    let bob = send(&app, get_as("bob", "/complete?reserve=5000&use=3000")).await;
    assert_eq!(bob.status, StatusCode::OK, "{:?}", bob.json());
    assert_eq!(
        send(&app, get_as("bob", "/typo")).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    // acme's own tokens were counted: 700 left, 800 do not fit
    let again = send(&app, get_as("acme", "/complete?reserve=800")).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
}

/// The same unit named by the builder (`contract_unit`): known before any
/// such customer is seen.
#[tokio::test]
async fn a_contract_unit_named_in_the_builder_is_known_before_any_customer_counts_it() {
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_minute(100))
        .contract_unit("tokens")
        .default_tier("pro")
        .clock(FakeClock::new())
        .build();
    let app = with_a_token_contract(&tiers);
    // bob comes first (a restart, say): his plan counts no tokens
    let bob = send(&app, get_as("bob", "/complete?reserve=5000&use=3000")).await;
    assert_eq!(bob.status, StatusCode::OK, "{:?}", bob.json());
    assert_eq!(
        send(&app, get_as("bob", "/typo")).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    // acme's contract counts them
    let acme = send(&app, get_as("acme", "/complete?reserve=800&use=300")).await;
    assert_eq!(acme.status, StatusCode::OK);
    let again = send(&app, get_as("acme", "/complete?reserve=800")).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    // and it stays known through a change at run time
    tiers.set_tier("pro", Quota::per_minute(200)).unwrap();
    let bob = send(&app, get_as("bob", "/complete?reserve=5000&use=3000")).await;
    assert_eq!(bob.status, StatusCode::OK, "{:?}", bob.json());
}

#[tokio::test]
async fn content_bytes_are_counted_from_the_body_read() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = app(&tiers);
    send(&app, get_as("ada", "/bytes")).await;
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 70);
    // a body with no content, and one never read, count nothing
    send(&app, get_as("ada", "/empty")).await;
    let unread = app.clone().oneshot(get_as("ada", "/bytes")).await.unwrap();
    drop(unread);
    let head = Request::head("/bytes")
        .header("x-user", "ada")
        .body(Body::empty())
        .unwrap();
    let head = app.clone().oneshot(head).await.unwrap();
    drop(head);
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 70);
}

#[tokio::test]
async fn a_streamed_body_is_counted_as_read_and_charged_when_dropped_half_way() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = Router::new()
        .route("/stream", get(|| async { Body::new(Chunks(4)) }))
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    // read whole: 40 bytes
    send(&app, get_as("ada", "/stream")).await;
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 60);
    // two frames read, then dropped: 20 bytes
    let response = app.clone().oneshot(get_as("ada", "/stream")).await.unwrap();
    let mut body = response.into_body();
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(
        left(&tiers, "ada", "content-bytes").await,
        60,
        "charged when it ends, not before"
    );
    drop(body);
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 40);
}

/// A body of `n` frames of 10 bytes, one per poll.
struct Chunks(u32);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        self.0 -= 1;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            b"0123456789",
        )))))
    }
}

#[tokio::test]
async fn a_customer_may_have_bands_of_its_own_for_a_unit() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = routes().layer(TierLimitLayer::new(tiers.clone()).identifier_fn(
        |headers: &http::HeaderMap| {
            let identity = header_identity(headers)?;
            Some(match identity.user_id.as_str() {
                "acme" => identity.with_unit_quotas("tokens", Quota::per_minute(10_000)),
                _ => identity,
            })
        },
    ));
    // the contract's 10,000 tokens, where the tier has 1,000
    assert_eq!(
        send(&app, get_as("acme", "/complete?reserve=5000&use=5000"))
            .await
            .status,
        StatusCode::OK
    );
    let reply = send(&app, get_as("acme", "/complete?reserve=5000")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply
            .header("ratelimit-policy")
            .unwrap()
            .contains(r#""free.tokens";q=10000;w=60"#)
    );
    assert_eq!(
        send(&app, get_as("acme", "/complete?reserve=1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // another user of the tier has the tier's
    assert_eq!(
        send(&app, get_as("bob", "/complete?reserve=5000")).await.status,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn a_tonic_service_reads_a_refusal_as_resource_exhausted() {
    use tonic_types::StatusExt;
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let status = Arc::new(Mutex::new(None));
    let seen = status.clone();
    let app = Router::new()
        .route(
            "/",
            get(move |request: Request<Body>| async move {
                // what a tonic service does with `request.extensions()`
                let usage = TierUsage::from_extensions(request.extensions()).unwrap();
                let refused = usage
                    .reserve("tokens", 1_000)
                    .await
                    .and(usage.reserve("tokens", 1).await);
                *seen.lock().unwrap() = refused.err().map(tonic::Status::from);
                "ok"
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    send(&app, get_as("ada", "/")).await;
    let status = status
        .lock()
        .unwrap()
        .take()
        .expect("the second reservation was refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
    let failure = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(failure.violations[0].subject, "tier:free.tokens");
    assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
}

#[tokio::test]
async fn shadow_mode_reports_a_units_refusal_and_lets_it_through() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .shadow_tier("free")
        .clock(clock.clone())
        .build();
    let shadowed = Arc::new(Mutex::new(0));
    let seen = shadowed.clone();
    let app = routes().layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(header_identity)
            .on_event(move |event| {
                if let RateLimitEvent::ShadowLimited { .. } = event {
                    *seen.lock().unwrap() += 1;
                }
            }),
    );
    assert_eq!(
        send(&app, get_as("ada", "/complete?reserve=900")).await.status,
        StatusCode::OK
    );
    // 100 left: refused in shadow, let through, nothing taken
    assert_eq!(
        send(&app, get_as("ada", "/complete?reserve=500")).await.status,
        StatusCode::OK
    );
    assert_eq!(*shadowed.lock().unwrap(), 1);
    assert_eq!(left(&tiers, "ada", "tokens").await, 100);
}

#[tokio::test]
async fn stacked_limiters_each_count_the_units_their_tiers_have() {
    let clock = FakeClock::new();
    let outer = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_unit("free", "tokens", Quota::per_minute(10_000))
        .clock(clock.clone())
        .build();
    let inner = tiers(&clock);
    let requests_only = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .clock(clock.clone())
        .build();
    let app = routes()
        .layer(TierLimitLayer::new(inner.clone()).identifier_fn(header_identity))
        .layer(TierLimitLayer::new(requests_only).identifier_fn(header_identity))
        .layer(TierLimitLayer::new(outer.clone()).identifier_fn(header_identity));
    assert_eq!(
        send(&app, get_as("ada", "/complete?reserve=500&use=700"))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(left(&inner, "ada", "tokens").await, 300);
    assert_eq!(left(&outer, "ada", "tokens").await, 9_300);
    // the inner one refuses: the outer one's reservation is given back
    let refused = send(&app, get_as("ada", "/complete?reserve=400")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(left(&outer, "ada", "tokens").await, 9_300);
}

#[tokio::test]
async fn units_recorded_and_forgiven_are_counted_per_tier_and_unit() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let (app, snapshotter) = metered(&tiers);
    send(&app, get_as("ada", "/complete?reserve=100&use=300")).await;
    // 1,000 left and 1,000 of debt: 2,000 recorded, 3,000 forgiven
    send(&app, get_as("bob", "/complete?use=5000")).await;
    send(&app, get_as("ada", "/bytes")).await;
    let counts = units_counted(&snapshotter);
    let count = |unit: &str, outcome: &str| counts[&("free".to_owned(), unit.to_owned(), outcome.to_owned())];
    assert_eq!(count("tokens", "recorded"), 2_300);
    assert_eq!(count("tokens", "forgiven"), 3_000);
    assert_eq!(count("tokens", "lost"), 0);
    // two answers of 4 bytes ("done") and one of 30
    assert_eq!(count("content-bytes", "recorded"), 38);
}

#[tokio::test]
async fn a_request_let_through_uncounted_may_use_units_and_a_unit_is_recorded_each_time() {
    use tower_rate_tier::OnMissing;
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .on_missing(OnMissing::Allow)
        .clock(clock.clone())
        .build();
    let app = app(&tiers);
    // not identified, let through uncounted: its reservation is not refused
    let anonymous = Request::get("/complete?reserve=10&use=10")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, anonymous).await.status, StatusCode::OK);
    // recorded twice: each record is usage
    send(&app, get_as("ada", "/complete?use=100")).await;
    send(&app, get_as("ada", "/complete?use=100")).await;
    assert_eq!(left(&tiers, "ada", "tokens").await, 800);
}

/// The memory storage, failing every decision of usage with an amount that
/// `fails` picks (a forced charge, say): Redis down with no fallback.
#[derive(Debug)]
struct FailsUsage {
    memory: tower_rate_tier::storage::MemoryStorage,
    fails: fn(tower_rate_tier::storage::Amount) -> bool,
}

impl FailsUsage {
    fn new(fails: fn(tower_rate_tier::storage::Amount) -> bool) -> Self {
        FailsUsage {
            memory: tower_rate_tier::storage::MemoryStorage::new(),
            fails,
        }
    }
}

impl tower_rate_tier::storage::Storage for FailsUsage {
    fn decide(
        &self,
        key: tower_rate_tier::storage::StorageKey<'_>,
        bands: &[Quota],
        op: tower_rate_tier::storage::Op,
        clock: &Arc<dyn tower_rate_tier::clock::Clock>,
    ) -> tower_rate_tier::storage::Decide {
        use tower_rate_tier::storage::{Decide, Op, StorageError, StorageErrorKind};
        if let Op::Each(amounts) = op
            && amounts.iter().any(|(amount, _)| (self.fails)(amount))
        {
            return Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")));
        }
        self.memory.decide(key, bands, op, clock)
    }
}

#[tokio::test]
async fn usage_that_a_failed_write_could_not_record_is_reported_as_lost() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .storage(FailsUsage::new(|amount| {
            matches!(amount, tower_rate_tier::storage::Amount::Force(_))
        }))
        .clock(clock.clone())
        .build();
    let lost = Arc::new(Mutex::new(Vec::new()));
    let seen = lost.clone();
    let app = routes().layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(header_identity)
            .on_event(move |event| {
                if let RateLimitEvent::UsageLost {
                    unit, units, error, ..
                } = event
                {
                    seen.lock()
                        .unwrap()
                        .push((unit.to_string(), *units, error.to_string()));
                }
            }),
    );
    // the response is served; the usage it could not record is reported
    assert_eq!(
        send(&app, get_as("ada", "/complete?use=300")).await.status,
        StatusCode::OK
    );
    let lost = lost.lock().unwrap().clone();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!((lost[0].0.as_str(), lost[0].1), ("tokens", 300));
    assert!(lost[0].2.contains("down"), "{lost:?}");
    // the program's form says so too
    assert!(matches!(
        tiers.record("ada", "free", "tokens", 5).await,
        Err(tower_rate_tier::CheckError::Storage(_))
    ));
}

/// A settlement that fails loses only what it was to charge beyond the
/// reservation: the reserved part was charged, and is recorded. A failed
/// refund of a reservation's unused part loses no usage (it stays charged).
#[tokio::test]
async fn a_failed_settlement_loses_only_what_the_reservation_did_not_charge() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .storage(FailsUsage::new(|amount| {
            // a forced charge beyond a reservation, or a refund of its
            // unused part
            use tower_rate_tier::storage::Amount;
            matches!(amount, Amount::Force(1..) | Amount::Refund(1..))
        }))
        .clock(FakeClock::new())
        .build();
    let lost = Arc::new(Mutex::new(Vec::new()));
    let seen = lost.clone();
    let app = routes().layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(header_identity)
            .on_event(move |event| {
                if let RateLimitEvent::UsageLost { units, .. } = event {
                    seen.lock().unwrap().push(*units);
                }
            }),
    );
    let over = send(&app, get_as("ada", "/complete?reserve=100&use=300")).await;
    assert_eq!(over.status, StatusCode::OK);
    assert_eq!(*lost.lock().unwrap(), [200], "100 of the 300 were reserved");
    assert_eq!(left(&tiers, "ada", "tokens").await, 900);
    let under = send(&app, get_as("bea", "/complete?reserve=100&use=30")).await;
    assert_eq!(under.status, StatusCode::OK);
    assert_eq!(*lost.lock().unwrap(), [200], "the 30 used were charged");
    assert_eq!(left(&tiers, "bea", "tokens").await, 900);
}

#[tokio::test]
async fn a_program_record_with_the_tiers_bands_keeps_a_contracts_own_unit_state() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    async fn reserve_all(usage: TierUsage) -> Result<&'static str, TierRefusal> {
        usage.reserve("tokens", 10_000).await?;
        Ok("ok")
    }
    let app =
        Router::new()
            .route("/", get(reserve_all))
            .layer(
                TierLimitLayer::new(tiers.clone()).identifier_fn(|h: &http::HeaderMap| {
                    Some(header_identity(h)?.with_unit_quotas("tokens", Quota::per_hour(10_000)))
                }),
            );
    assert_eq!(send(&app, get_as("acme", "/")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, get_as("acme", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // a decision of the same user with the tier's token band (another
    // window) leaves the contract's band as it was
    tiers.record("acme", "free", "tokens", 1).await.unwrap();
    assert_eq!(
        send(&app, get_as("acme", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_reservation_that_could_never_fit_keeps_the_request_counted() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .clock(clock.clone())
        .build();
    let app = app(&tiers);
    // above the burst: 403, and the request counts, so a client asking for
    // too much reaches the handler no more often than the request bands allow
    for _ in 0..2 {
        assert_eq!(
            send(&app, get_as("mallory", "/complete?reserve=1001"))
                .await
                .status,
            StatusCode::FORBIDDEN
        );
    }
    assert_eq!(
        send(&app, get_as("mallory", "/complete?reserve=1001"))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_content_bytes_reservation_is_settled_when_the_body_is_never_read() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = Router::new()
        .route(
            "/file",
            get(|usage: TierUsage| async move {
                usage.reserve("content-bytes", 30).await?;
                Ok::<_, TierRefusal>(vec![b'x'; 30])
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    send(&app, get_as("ada", "/file")).await;
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 70);
    let head = Request::head("/file")
        .header("x-user", "ada")
        .body(Body::empty())
        .unwrap();
    drop(app.clone().oneshot(head).await.unwrap());
    assert_eq!(
        left(&tiers, "ada", "content-bytes").await,
        70,
        "nothing read, nothing kept"
    );
}

#[tokio::test]
async fn a_contracts_invalid_unit_bands_leave_the_rest_of_the_contract() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .clock(clock.clone())
        .build();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers.clone()).identifier_fn(|h: &http::HeaderMap| {
            Some(
                header_identity(h)?
                    .with_quotas(Quota::per_minute(100))
                    .with_unit_quotas("Tokens", Quota::per_minute(5)),
            )
        }),
    );
    let mut ok = 0;
    for _ in 0..10 {
        ok += u32::from(send(&app, get_as("acme", "/")).await.status == StatusCode::OK);
    }
    assert_eq!(ok, 10, "the contract's own request band admits 100 a minute");
}

#[tokio::test]
async fn a_reservation_of_nothing_reports_the_unit() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    tiers
        .reserve("ada", "free", "tokens", 300)
        .await
        .unwrap()
        .unwrap();
    let info = tiers.reserve("ada", "free", "tokens", 0).await.unwrap().unwrap();
    assert_eq!((info.limit, info.remaining), (10, 10));
    let tokens = info
        .bands()
        .find(|(q, _)| q.unit().as_str() == "tokens")
        .unwrap()
        .1;
    assert_eq!(tokens.remaining, 700);
}

/// A storage that is down.
#[derive(Debug)]
struct Down;

impl tower_rate_tier::storage::Storage for Down {
    fn decide(
        &self,
        _: tower_rate_tier::storage::StorageKey<'_>,
        _: &[Quota],
        _: tower_rate_tier::storage::Op,
        _: &Arc<dyn tower_rate_tier::clock::Clock>,
    ) -> tower_rate_tier::storage::Decide {
        use tower_rate_tier::storage::{Decide, StorageError, StorageErrorKind};
        Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")))
    }
}

#[tokio::test]
async fn while_the_storage_is_down_a_reservation_above_the_local_share_waits_for_the_whole_share() {
    use tower_rate_tier::storage::Fallback;
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .storage(Fallback::builder(Down).instances(4).failures_to_switch(1).build())
        .clock(clock.clone())
        .build();
    let app = app(&tiers);
    // the local share is 250 tokens (one every 240 ms): 400 take all of it
    assert_eq!(
        send(&app, get_as("ada", "/complete?reserve=400")).await.status,
        StatusCode::OK
    );
    // half of it back: the request is admitted, its reservation waits for
    // the rest of the share, a wait that comes true (125 x 240 ms)
    clock.advance(Duration::from_secs(30));
    let refused = send(&app, get_as("ada", "/complete?reserve=400")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.json()["violated-policies"],
        serde_json::json!(["free.tokens"])
    );
    assert_eq!(refused.header("retry-after"), Some("30"));
    clock.advance(Duration::from_secs(30));
    assert_eq!(
        send(&app, get_as("ada", "/complete?reserve=400")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn usage_equal_to_its_reservation_is_counted_as_recorded() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let (app, snapshotter) = metered(&tiers);
    // exactly what was reserved: nothing to settle in the storage, and
    // still usage recorded
    send(&app, get_as("ada", "/complete?reserve=200&use=200")).await;
    assert_eq!(left(&tiers, "ada", "tokens").await, 800);
    let counts = units_counted(&snapshotter);
    let recorded = counts.get(&("free".to_owned(), "tokens".to_owned(), "recorded".to_owned()));
    assert_eq!(recorded, Some(&200));
}

/// The routes under a limiter of `tiers` counting into a recorder of its
/// own, and what reads that recorder.
fn metered(tiers: &RateTier) -> (Router, metrics_util::debugging::Snapshotter) {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let app = metrics::with_local_recorder(&recorder, || {
        routes().layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(header_identity)
                .metrics(true),
        )
    });
    (app, snapshotter)
}

/// The units counter of `snapshotter`, by tier, unit and outcome.
fn units_counted(
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> std::collections::BTreeMap<(String, String, String), u64> {
    let mut counts = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != tower_rate_tier::metrics::UNITS_TOTAL {
            continue;
        }
        let label = |k: &str| key.labels().find(|l| l.key() == k).unwrap().value().to_owned();
        let metrics_util::debugging::DebugValue::Counter(n) = value else {
            panic!("a counter")
        };
        counts.insert((label("tier"), label("unit"), label("outcome")), n);
    }
    counts
}

#[tokio::test]
async fn a_reservation_above_the_burst_names_the_tier_and_the_unit() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let refused = send(&app(&tiers), get_as("ada", "/complete?reserve=1001")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(refused.header("retry-after"), None);
    let body = refused.json();
    assert_eq!(body["status"], 403);
    assert_eq!(
        (&body["tier"], &body["unit"]),
        (&serde_json::json!("free"), &serde_json::json!("tokens"))
    );
    assert_eq!(
        (&body["cost"], &body["limit"]),
        (&serde_json::json!(1_001), &serde_json::json!(1_000))
    );
}

/// At the key cap, a tier whose only bands are a unit's (no request band)
/// refuses the identities without a key of their own once their shared
/// bucket is in debt: each request only requires a byte to be left, which
/// must be asked of that bucket, not of a fresh state.
#[tokio::test]
async fn at_the_key_cap_a_unit_only_tier_refuses_overflow_identities_in_debt() {
    let storage = tower_rate_tier::storage::MemoryStorage::builder()
        .max_keys(1)
        .build();
    let tiers = RateTier::builder()
        .tier("free", Quota::unlimited())
        .tier_unit("free", "content-bytes", Quota::per_minute(100))
        .storage(storage.clone())
        .clock(FakeClock::new())
        .build();
    let app = Router::new()
        .route("/big", get(|| async { vec![b'x'; 100] }))
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    // the storage is full
    tiers.record("filler", "free", "content-bytes", 1).await.unwrap();
    assert_eq!(storage.len(), 1);
    let mut statuses = Vec::new();
    for i in 0..10 {
        let user = if i % 2 == 0 {
            "mallory".to_owned()
        } else {
            format!("m{i}")
        };
        statuses.push(send(&app, get_as(&user, "/big")).await.status);
    }
    // the first 100 bytes fit the shared minute; every later request meets
    // its debt
    assert_eq!(statuses[0], StatusCode::OK);
    assert!(
        statuses[1..].iter().all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    assert_eq!(storage.len(), 1, "an overflow identity got a key of its own");
}

/// A handler that reserves `content-bytes` and is then refused (another
/// unit's reservation does not fit) answers with the limiter's 429, whose
/// content counts nothing: the bytes it reserved come back, as the
/// request's own charge does.
#[tokio::test]
async fn a_refused_requests_content_bytes_reservation_comes_back() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = Router::new()
        .route(
            "/file",
            get(|usage: TierUsage| async move {
                usage.reserve("content-bytes", 30).await?;
                usage.reserve("tokens", 800).await?;
                Ok::<_, TierRefusal>(vec![b'x'; 30])
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    assert_eq!(send(&app, get_as("ada", "/file")).await.status, StatusCode::OK);
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 70);
    assert_eq!(left(&tiers, "ada", "tokens").await, 200);
    // 800 tokens do not fit now
    let refused = send(&app, get_as("ada", "/file")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 70);
    assert_eq!(left(&tiers, "ada", "tokens").await, 200);
}

/// The other way round: tokens reserved, then `content-bytes` refused. A
/// refused request consumes nothing, whichever unit refused it: the tokens
/// come back too (and the request's own charge).
#[tokio::test]
async fn a_refused_requests_reservation_of_another_unit_comes_back() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = Router::new()
        .route(
            "/file",
            get(|usage: TierUsage| async move {
                usage.reserve("tokens", 300).await?;
                usage.reserve("content-bytes", 60).await?;
                usage.record("tokens", 300);
                Ok::<_, TierRefusal>(vec![b'x'; 60])
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    assert_eq!(send(&app, get_as("ada", "/file")).await.status, StatusCode::OK);
    assert_eq!(left(&tiers, "ada", "tokens").await, 700);
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 40);
    let requests = tiers.check("ada", "free", 0).await.unwrap().unwrap().remaining;
    // 60 bytes do not fit now
    let refused = send(&app, get_as("ada", "/file")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(left(&tiers, "ada", "tokens").await, 700, "the tokens come back");
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 40);
    let after = tiers.check("ada", "free", 0).await.unwrap().unwrap().remaining;
    assert_eq!(after, requests, "the request's own charge comes back");
}

/// A handler that reserved tokens, did its work, then met a unit the tier
/// does not count (its `TierRefusal` is a 500, not a refusal for want of
/// quota): its reservation stays charged, as any failed handler's does.
#[tokio::test]
async fn a_failed_handlers_reservation_stays_charged_even_through_a_tier_refusal() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = Router::new()
        .route(
            "/",
            get(|usage: TierUsage| async move {
                usage.reserve("tokens", 300).await?;
                // ... the work the tokens stood for is done here ...
                usage.reserve("imgaes", 1).await?; // a typo: the 500 that names it
                Ok::<_, TierRefusal>("ok")
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    let reply = send(&app, get_as("ada", "/")).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        left(&tiers, "ada", "tokens").await,
        700,
        "a reservation of a handler that failed (not a 429) stays charged"
    );
}

/// A reservation above a unit's burst is answered 403 by the limiter (its
/// request stays counted, so that asking for too much is never free); the
/// 403's body is the limiter's content and counts nothing as
/// `content-bytes`, and the bytes the handler reserved come back.
#[tokio::test]
async fn the_limiters_403_for_a_reservation_above_the_burst_counts_no_content_bytes() {
    let clock = FakeClock::new();
    let tiers = tiers(&clock);
    let app = Router::new()
        .route(
            "/complete",
            get(|usage: TierUsage| async move {
                usage.reserve("content-bytes", 30).await?;
                // above the burst of 1,000
                usage.reserve("tokens", 1_001).await?;
                Ok::<_, TierRefusal>("never")
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(header_identity));
    let refused = send(&app, get_as("ada", "/complete")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(!refused.body.is_empty(), "a problem body");
    assert_eq!(left(&tiers, "ada", "content-bytes").await, 100);
    // the request itself was counted
    let requests = tiers.check("ada", "free", 0).await.unwrap().unwrap();
    assert_eq!(requests.remaining, 9);
}
