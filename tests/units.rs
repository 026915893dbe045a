//! Usage-based quotas through `RateTier`: units besides requests, admission
//! refused by a unit in debt, reservations settled, usage recorded after
//! the fact (memory storage; `tests/redis/units.rs` holds Redis to the
//! same).

use std::time::Duration;

use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::quota::UnitError;
use tower_rate_tier::{BuildError, CheckError, Quota, RateTier};

fn llm(clock: &FakeClock) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit(
            "free",
            "tokens",
            [Quota::per_minute(1_000), Quota::per_day(5_000)],
        )
        .tier("team", Quota::unlimited())
        .tier_unit("team", "tokens", Quota::per_minute(100))
        .clock(clock.clone())
        .build()
}

#[tokio::test]
async fn a_unit_in_debt_refuses_requests_while_request_bands_have_room() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    // admission charges requests only: the token bands are untouched
    let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!((info.limit, info.remaining), (10, 9));
    let tokens: Vec<u32> = info
        .bands()
        .filter(|(q, _)| q.unit().as_str() == "tokens")
        .map(|(_, s)| s.remaining)
        .collect();
    assert_eq!(tokens, [1_000, 5_000]);
    // 1,500 tokens used: 500 of debt in the minute band (bound: 1,000)
    tiers.record("ada", "free", "tokens", 1_500).await.unwrap();
    let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    // the minute band refused: 500 tokens of debt and one token, 60 ms each
    assert_eq!(refused.retry_after, Duration::from_millis(30_060));
    assert_eq!(refused.limit, 1_000);
    assert_eq!(refused.violated_policies().collect::<Vec<_>>(), ["free.tokens.0"]);
    // nothing was charged to requests by the refusal
    clock.advance(Duration::from_millis(30_059));
    assert!(tiers.check("ada", "free", 1).await.unwrap().is_err());
    clock.advance(Duration::from_millis(1));
    let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!(info.remaining, 9, "the bucket refilled in 30 s, one charged");
    // another user is not affected
    assert!(tiers.check("bob", "free", 1).await.unwrap().is_ok());
}

#[tokio::test]
async fn the_debt_is_bounded_by_one_burst_of_the_smallest_band() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    tiers.record("ada", "free", "tokens", u32::MAX).await.unwrap();
    let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    // the minute band: a full burst used and 1,000 of debt; the day band
    // (smallest burst of the unit: 1,000) 1,000 of debt beyond its 5,000
    let day_interval = Duration::from_secs(86_400) / 5_000;
    assert_eq!(refused.retry_after, day_interval * 1_001);
    // a record of 0 changes nothing
    tiers.record("bob", "free", "tokens", 0).await.unwrap();
    assert!(tiers.check("bob", "free", 10).await.unwrap().is_ok());
}

#[tokio::test]
async fn reservations_take_up_front_and_settle_what_was_used() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    let reserved = tiers
        .reserve("ada", "free", "tokens", 800)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reserved.remaining, 10, "a reservation charges no request");
    // 800 of 1,000 taken: 300 more do not fit, and take nothing
    let refused = tiers
        .reserve("ada", "free", "tokens", 300)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.violated_policies().collect::<Vec<_>>(), ["free.tokens.0"]);
    assert_eq!(refused.retry_after, Duration::from_millis(100 * 60));
    // 500 used of 800: 300 come back, so 500 are left
    tiers.settle("ada", "free", "tokens", 800, 500).await.unwrap();
    tiers
        .reserve("ada", "free", "tokens", 500)
        .await
        .unwrap()
        .unwrap();
    assert!(tiers.reserve("ada", "free", "tokens", 1).await.unwrap().is_err());
    // a settlement above the reservation charges the rest, into debt
    tiers.settle("ada", "free", "tokens", 500, 700).await.unwrap();
    let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.retry_after, Duration::from_millis(201 * 60));
}

#[tokio::test]
async fn an_unlimited_tier_is_limited_by_its_units_alone() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    for _ in 0..1_000 {
        assert!(tiers.check("ada", "team", 1).await.unwrap().is_ok());
    }
    tiers.record("ada", "team", "tokens", 150).await.unwrap();
    let refused = tiers.check("ada", "team", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.limit, 100);
    assert_eq!(refused.retry_after, Duration::from_millis(51 * 600));
    assert_eq!(refused.violated_policies().collect::<Vec<_>>(), ["team.tokens"]);
}

#[tokio::test]
async fn bad_usage_gets_a_clear_error_and_changes_nothing() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    let unknown = tiers.record("ada", "free", "tokenz", 5).await.unwrap_err();
    assert!(matches!(unknown, CheckError::UnknownUnit { .. }));
    assert_eq!(unknown.to_string(), "tier `free` has no unit `tokenz`");
    assert!(matches!(
        tiers.reserve("ada", "gold", "tokens", 5).await,
        Err(CheckError::UnknownTier(_))
    ));
    assert!(matches!(
        tiers.record("", "free", "tokens", 5).await,
        Err(CheckError::InvalidUserId)
    ));
    // above the smallest burst a reservation could never fit: not a 429
    let never = tiers.reserve("ada", "free", "tokens", 1_001).await.unwrap_err();
    assert!(matches!(
        never,
        CheckError::CostExceedsLimit {
            cost: 1_001,
            limit: 1_000,
            ..
        }
    ));
    tiers
        .reserve("ada", "free", "tokens", 1_000)
        .await
        .unwrap()
        .unwrap();
    assert!(tiers.check("ada", "free", 1).await.unwrap().is_err());
}

#[test]
fn unit_configuration_is_checked() {
    let base = || RateTier::builder().tier("free", Quota::per_minute(10));
    assert_eq!(
        base()
            .tier_unit("pro", "tokens", Quota::per_minute(1))
            .try_build()
            .unwrap_err(),
        BuildError::UnknownUnitTier("pro".into())
    );
    for reserved in ["requests", "concurrent-requests"] {
        assert_eq!(
            base()
                .tier_unit("free", reserved, Quota::per_minute(1))
                .try_build()
                .unwrap_err(),
            BuildError::InvalidUnit {
                tier: "free".into(),
                error: UnitError::Reserved(reserved.into())
            }
        );
    }
    let invalid = base()
        .tier_unit("free", "to\"kens", Quota::per_minute(1))
        .try_build()
        .unwrap_err();
    assert_eq!(
        invalid.to_string(),
        "tier `free`: `to\"kens` is not a valid unit name (1 to 24 bytes of a-z, 0-9, `-` and `_`, starting with a letter)"
    );
    assert_eq!(
        base()
            .tier_unit("free", "tokens", Quota::unlimited())
            .try_build()
            .unwrap_err(),
        BuildError::InvalidUnitBands("free".into(), "tokens".into())
    );
    assert_eq!(
        base()
            .tier_unit("free", "tokens", Vec::<Quota>::new())
            .try_build()
            .unwrap_err(),
        BuildError::InvalidUnitBands("free".into(), "tokens".into())
    );
    let many = base()
        .tier_unit("free", "tokens", [Quota::per_second(1); 4])
        .tier_unit("free", "bytes", [Quota::per_second(1); 4])
        .try_build()
        .unwrap_err();
    assert_eq!(many, BuildError::TooManyUnitBands("free".into(), "bytes".into()));
    // a unit named again replaces its bands
    let tiers = base()
        .tier_unit("free", "tokens", Quota::per_minute(1))
        .tier_unit("free", "tokens", Quota::per_minute(2))
        .build();
    assert_eq!(
        tiers.unit_quotas("free", "tokens"),
        Some(vec![Quota::per_minute(2)])
    );
    assert_eq!(tiers.units("free"), ["tokens"]);
}

#[tokio::test]
async fn set_tier_keeps_units_and_their_state_until_set_tier_unit_changes_them() {
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    tiers.record("ada", "free", "tokens", 1_500).await.unwrap();
    // new request bands: the unit and its debt stay
    tiers.set_tier("free", Quota::per_minute(100)).unwrap();
    assert_eq!(tiers.units("free"), ["tokens"]);
    assert!(tiers.check("ada", "free", 1).await.unwrap().is_err());
    // the unit's bands raised in the same windows: its state stays, which
    // is a time (the minute band full again in 90 s: 30 s of debt, repaid
    // at the new rate of one token per 30 ms)
    tiers
        .set_tier_unit(
            "free",
            "tokens",
            Some(vec![Quota::per_minute(2_000), Quota::per_day(5_000)]),
        )
        .unwrap();
    let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.retry_after, Duration::from_millis(30_030));
    assert_eq!(refused.limit, 2_000);
    // removed: requests only
    tiers.set_tier_unit("free", "tokens", None).unwrap();
    assert!(tiers.units("free").is_empty());
    assert!(matches!(
        tiers.record("ada", "free", "tokens", 1).await,
        Err(CheckError::UnknownUnit { .. })
    ));
    assert_eq!(
        tiers.set_tier_unit("gold", "tokens", None).unwrap_err(),
        BuildError::UnknownUnitTier("gold".into())
    );
    assert!(
        tiers
            .set_tier_unit("free", "requests", Some(vec![Quota::per_minute(1)]))
            .is_err()
    );
}

#[tower_rate_tier::rate_tiers]
enum Plan {
    #[tier(per_minute = 20, concurrent = 2, default)]
    #[tier(unit = "tokens", per_minute = 40_000, per_day = 1_000_000)]
    Free,
    #[tier(unlimited)]
    #[tier(unit = "content-bytes", per_hour = 1_048_576)]
    Team,
}

#[test]
fn a_tier_table_brings_its_units() {
    let tiers = RateTier::builder().tiers::<Plan>().build();
    assert_eq!(tiers.units("free"), ["tokens"]);
    assert_eq!(
        tiers.unit_quotas("free", "tokens"),
        Some(vec![Quota::per_minute(40_000), Quota::per_day(1_000_000)])
    );
    assert_eq!(tiers.concurrency("free"), Some(2));
    assert_eq!(tiers.units("team"), ["content-bytes"]);
    assert_eq!(tiers.quotas("team"), Some(vec![Quota::unlimited()]));
}

#[tokio::test]
async fn adding_a_unit_at_run_time_keeps_the_users_request_state_in_memory() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_hour(2))
        .clock(clock.clone())
        .build();
    for _ in 0..2 {
        assert!(tiers.check("ada", "free", 1).await.unwrap().is_ok());
    }
    assert!(tiers.check("ada", "free", 1).await.unwrap().is_err());
    tiers
        .set_tier_unit("free", "tokens", Some(vec![Quota::per_minute(1_000)]))
        .unwrap();
    // the request band's state moved with the key: still spent
    let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.retry_after, Duration::from_secs(1_800));
    // and removed again: still there
    tiers.set_tier_unit("free", "tokens", None).unwrap();
    assert!(tiers.check("ada", "free", 1).await.unwrap().is_err());
}

#[tokio::test]
async fn an_overflow_identity_settles_its_reservation_in_the_shared_bucket() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .storage(
            tower_rate_tier::storage::MemoryStorage::builder()
                .max_keys(1)
                .build(),
        )
        .clock(FakeClock::new())
        .build();
    tiers.check("first", "free", 1).await.unwrap().unwrap();
    // the storage is full: "bob" and "carol" share the overflow bucket
    tiers
        .reserve("bob", "free", "tokens", 900)
        .await
        .unwrap()
        .unwrap();
    tiers.settle("bob", "free", "tokens", 900, 0).await.unwrap();
    tiers
        .reserve("carol", "free", "tokens", 500)
        .await
        .unwrap()
        .expect("bob's unused 900 came back to the shared bucket");
}

/// A quota of a unit given as a request band (`Quota::in_unit` is public)
/// would count requests under the unit's name: the builder and `set_tier`
/// refuse it, and a contract's bands with one are ignored (the tier's
/// bands stand in for them, under the tier's name).
#[tokio::test]
async fn a_quota_of_a_unit_is_no_request_band() {
    let tokens = tower_rate_tier::quota::Unit::new("tokens").unwrap();
    let of_tokens = Quota::per_minute(2).in_unit(tokens);
    let error = RateTier::builder()
        .tier("free", of_tokens)
        .try_build()
        .unwrap_err();
    assert_eq!(
        error,
        BuildError::UnitInRequestBands("free".into(), "tokens".into())
    );
    assert!(error.to_string().contains("tier_unit"), "{error}");
    let clock = FakeClock::new();
    let tiers = llm(&clock);
    let refused = tiers.set_tier("free", [Quota::per_minute(10), of_tokens]);
    assert_eq!(
        refused.unwrap_err(),
        BuildError::UnitInRequestBands("free".into(), "tokens".into())
    );
    assert_eq!(tiers.quotas("free"), Some(vec![Quota::per_minute(10)]));
    // a contract of such bands: ignored, the tier's bands count
    let contract = tower_rate_tier::TierIdentity::new("acme", "free").with_quotas([of_tokens]);
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(tower_rate_tier::TierLimitLayer::new(tiers).identifier_fn(move |_| Some(contract.clone())));
    let request = http::Request::get("/").body(axum::body::Body::empty()).unwrap();
    let reply = tower_rate_tier_tests::reply::send(&app, request).await;
    let policy = reply.header("ratelimit-policy").unwrap();
    assert!(
        policy.starts_with(r#""free";q=10;w=60, "free.tokens.0""#),
        "{policy}"
    );
}

/// A unit never used stays whole when the clock goes back (a `FakeClock`
/// rewound, a clock stepped back): the request band, spent, waits its one
/// refill, and the unit refuses nothing (it read as a whole band charged,
/// and its debt bound: a wait of twice the refill, the unit named).
#[tokio::test]
async fn a_unit_never_used_stays_whole_when_the_clock_goes_back() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .clock(clock.clone())
        .build();
    for _ in 0..2 {
        tiers.check("ada", "free", 1).await.unwrap().unwrap();
    }
    clock.rewind(Duration::from_secs(365 * 24 * 3_600));
    let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.retry_after, Duration::from_secs(30));
    let tokens = refused
        .bands()
        .find(|(q, _)| q.unit().as_str() == "tokens")
        .map(|(_, state)| state.remaining);
    assert!(matches!(tokens, None | Some(1_000)), "{tokens:?}");
    // once the refill has passed, the user is admitted with every token
    clock.advance(Duration::from_secs(30));
    let admitted = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    let tokens = admitted.bands().find(|(q, _)| q.unit().as_str() == "tokens");
    assert_eq!(tokens.map(|(_, s)| s.remaining), Some(1_000));
}
