//! A tier's request bands and its units' bands of the same refill window
//! are different bands: a change of the tier (`set_tier`) or of a
//! customer's contract never reads one's state as the other's, in the
//! memory storage, which keeps a tier's one request band apart.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request, StatusCode};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, TierRefusal, TierUsage};
use tower_rate_tier_tests::reply::send;

/// A tier that loses its request rate for a token quota (two run-time
/// changes): a user who spent the request band finds its *tokens* spent,
/// though it never used one. The memory storage's one-band map holds the
/// request band's time, and the tier's one remaining band (the tokens',
/// same 60 s window) reads it as its own.
#[tokio::test]
async fn request_state_is_read_as_a_units_state_after_set_tier() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(20))
        .clock(clock.clone())
        .build();
    for _ in 0..20 {
        assert!(tiers.check("ada", "free", 1).await.unwrap().is_ok());
    }
    // the plan changes: no request limit any more, 1,000 tokens a minute
    tiers
        .set_tier_unit("free", "tokens", Some(vec![Quota::per_minute(1_000)]))
        .unwrap();
    tiers.set_tier("free", Quota::unlimited()).unwrap();
    // bob never called: he may reserve
    assert!(tiers.reserve("bob", "free", "tokens", 500).await.unwrap().is_ok());
    // ada never used a token either
    let ada = tiers.reserve("ada", "free", "tokens", 500).await.unwrap();
    assert!(
        ada.is_ok(),
        "ada never used a token, yet her reservation is refused: {ada:?}"
    );
}

/// The other way: an unlimited tier counting tokens gets a request rate
/// (`set_tier`, which "keeps a tier's units and their users' state"). A
/// user whose tokens are spent and in debt gets a fresh burst of tokens.
#[tokio::test]
async fn a_units_debt_is_forgiven_when_set_tier_gives_an_unlimited_tier_a_rate() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("team", Quota::unlimited())
        .tier_unit("team", "tokens", Quota::per_minute(1_000))
        .clock(clock.clone())
        .build();
    // 2,000 tokens used: 1,000 spent and 1,000 in debt (the bound)
    tiers.record("ada", "team", "tokens", 2_000).await.unwrap();
    let before = tiers.reserve("ada", "team", "tokens", 1).await.unwrap();
    assert!(before.is_err(), "in debt: {before:?}");
    // the plan gets a request rate; units and their state are said to stay
    tiers.set_tier("team", Quota::per_minute(600)).unwrap();
    clock.advance(Duration::from_secs(1));
    // still ~59 s of debt: not even one token should be available
    let after = tiers.reserve("ada", "team", "tokens", 1_000).await.unwrap();
    assert!(
        after.is_err(),
        "a user 1,000 tokens in debt reserved a full burst of 1,000 after set_tier: {after:?}"
    );
}

/// The same through a contract change (no `set_tier`): acme's contract goes
/// from "unlimited requests" to "600 requests a minute", the tier's token
/// unit unchanged. Its tokens, 1,000 in debt, come back as a full burst.
#[tokio::test]
async fn a_contract_change_forgives_a_units_debt_in_memory() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_minute(100))
        .tier_unit("pro", "tokens", Quota::per_minute(1_000))
        .clock(clock.clone())
        .build();
    // the contract as the database holds it now (the header stands for it)
    let identify = |headers: &HeaderMap| {
        let identity = TierIdentity::new("acme", "pro");
        Some(match headers.get("x-contract").and_then(|v| v.to_str().ok()) {
            Some("v2") => identity.with_quotas(Quota::per_minute(600)),
            _ => identity.with_quotas(Quota::unlimited()),
        })
    };
    async fn complete(usage: TierUsage) -> Result<&'static str, TierRefusal> {
        usage.reserve("tokens", 1_000).await?;
        usage.record("tokens", 2_000); // 1,000 spent, 1,000 in debt
        Ok("done")
    }
    let app = Router::new()
        .route("/", get(complete))
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(identify));
    let req = |contract: &str| {
        Request::get("/")
            .header("x-contract", contract)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, req("v1")).await.status, StatusCode::OK);
    // in debt: refused under the old contract
    assert_eq!(send(&app, req("v1")).await.status, StatusCode::TOO_MANY_REQUESTS);
    // 61 s later the debt is repaid but for ~59 s worth: about 16 tokens
    clock.advance(Duration::from_secs(61));
    // the contract gains a request rate: the tokens' state should stay
    let after = send(&app, req("v2")).await;
    assert_eq!(
        after.status,
        StatusCode::TOO_MANY_REQUESTS,
        "~16 tokens left, yet 1,000 reserved after a contract change: {:?}",
        after.headers.get("ratelimit")
    );
}
