//! A request's charge and its reservations decided partly by a fallback's
//! local limiter and partly by its primary: each part is given back where it
//! was charged, never the local part to the primary (which never charged
//! it). The primary is the memory storage, failing while a flag is set.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::middleware::Next;
use axum::routing::get;
use http::{Request, StatusCode};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::{DecisionSource, Fallback};
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, TierRefusal, TierUsage, tier_cost};
use tower_rate_tier_tests::flaky::Flaky;
use tower_rate_tier_tests::reply::send;

#[path = "fallback_charges/local_state.rs"]
mod local_state;
#[path = "fallback_charges/wrappers.rs"]
mod wrappers;

/// The primary's switch, the limiter's clock and the fallback.
#[derive(Clone)]
struct World {
    down: Arc<AtomicBool>,
    clock: FakeClock,
    storage: Fallback<Flaky>,
}

fn world() -> World {
    let flaky = Flaky::default();
    let down = flaky.down.clone();
    let storage = Fallback::builder(flaky)
        .instances(1)
        .failures_to_switch(1)
        .probe_interval(Duration::from_millis(1))
        .build();
    World {
        down,
        clock: FakeClock::new(),
        storage,
    }
}

/// Brings the fallback back to its primary: the primary up, a probe due,
/// decisions of another user until one comes from the primary.
async fn back_on_primary(world: &World, tiers: &RateTier, tier: &str) {
    world.down.store(false, Ordering::SeqCst);
    world.clock.advance(Duration::from_millis(5));
    for _ in 0..100 {
        let source = match tiers.check("someone-else", tier, 1).await.unwrap() {
            Ok(info) => info.source(),
            Err(limited) => limited.source(),
        };
        if source == DecisionSource::Storage && !world.storage.is_local() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never back on the primary");
}

/// Admitted (1 unit) by the local limiter while the primary is down; the
/// primary is back before the route's price (5) is settled, so it charges
/// the top-up of 4; the handler answers 500 and `refund_on` gives the
/// charge back: the primary gets back its 4, never the local 1.
#[tokio::test]
async fn a_topped_up_charge_gives_the_primary_back_only_what_it_charged() {
    let world = world();
    let tiers = free(&world);
    let (w, t) = (world.clone(), tiers.clone());
    let app = Router::new()
        .route(
            "/priced",
            get(|| async { StatusCode::INTERNAL_SERVER_ERROR })
                .layer(tier_cost(5))
                .layer(axum::middleware::from_fn(
                    move |req: Request<Body>, next: Next| {
                        let (w, t) = (w.clone(), t.clone());
                        async move {
                            assert!(w.storage.is_local(), "admitted while the primary is down");
                            back_on_primary(&w, &t, "free").await;
                            next.run(req).await
                        }
                    },
                )),
        )
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(|_| Some(TierIdentity::new("ada", "free")))
                .refund_on(|status| status.is_server_error()),
        );
    // ada spends 5 of her 10 in the primary
    let spent = tiers.check("ada", "free", 5).await.unwrap().unwrap();
    assert_eq!(spent.source(), DecisionSource::Storage);

    world.down.store(true, Ordering::SeqCst);
    let reply = send(&app, Request::get("/priced").body(Body::empty()).unwrap()).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!world.storage.is_local());
    // the primary charged 5 + 4 and gave the 4 back: 5 left, not 6
    assert_eq!(tiers.check("ada", "free", 0).await.unwrap().unwrap().remaining, 5);
}

/// Two reservations of one request, the first by the local limiter, the
/// second by the primary once it is back; the handler records what it
/// used: what goes back is taken from the local reservation first, and the
/// primary keeps what it charged.
#[tokio::test]
async fn mixed_reservations_give_the_primary_back_only_its_part() {
    let world = world();
    let tiers = llm(&world);
    let (w, t) = (world.clone(), tiers.clone());
    let app = Router::new()
        .route(
            "/",
            get(move |usage: TierUsage| {
                let (w, t) = (w.clone(), t.clone());
                async move {
                    usage.reserve("tokens", 400).await?;
                    back_on_primary(&w, &t, "llm").await;
                    usage.reserve("tokens", 500).await?;
                    usage.record("tokens", 500);
                    Ok::<_, TierRefusal>("ok")
                }
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(|_| Some(TierIdentity::new("ada", "llm"))));

    world.down.store(true, Ordering::SeqCst);
    let reply = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(!world.storage.is_local());
    // the primary charged 500 tokens, all used: 500 left, no more
    assert_eq!(tokens_left(&tiers, "ada").await, 500);
}

/// A tier `free` of 10 requests a minute in the world's fallback.
fn free(world: &World) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .clock(world.clock.clone())
        .storage(world.storage.clone())
        .build()
}

/// A tier `llm` of 100 requests and 1,000 tokens a minute in the world's
/// fallback.
fn llm(world: &World) -> RateTier {
    RateTier::builder()
        .tier("llm", Quota::per_minute(100))
        .tier_unit("llm", "tokens", Quota::per_minute(1_000))
        .clock(world.clock.clone())
        .storage(world.storage.clone())
        .build()
}

/// The tokens `user` of the tier `llm` has left now.
async fn tokens_left(tiers: &RateTier, user: &str) -> u32 {
    let state = tiers.reserve(user, "llm", "tokens", 0).await.unwrap().unwrap();
    let tokens = state.bands().find(|(q, _)| q.unit().as_str() == "tokens");
    tokens.expect("the tier counts tokens").1.remaining
}

/// A program's check charged by the local limiter while the primary was
/// down, refunded once the primary is back: `refund_decided` with the
/// check's source gives the primary nothing (it never charged it), where
/// `refund`, which knows no decision, gives back where the fallback decides
/// now.
#[tokio::test]
async fn a_programs_refund_of_a_local_charge_gives_the_primary_nothing() {
    let world = world();
    let tiers = free(&world);
    // ada spends 3 of her 10 in the primary
    let spent = tiers.check("ada", "free", 3).await.unwrap().unwrap();
    assert_eq!(spent.source(), DecisionSource::Storage);
    world.down.store(true, Ordering::SeqCst);
    let local = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!(local.source(), DecisionSource::Fallback);
    back_on_primary(&world, &tiers, "free").await;
    let left = || async { tiers.check("ada", "free", 0).await.unwrap().unwrap() };
    assert_eq!(left().await.remaining, 7);
    tiers
        .refund_decided("ada", "free", 1, local.source())
        .await
        .unwrap();
    assert_eq!(left().await.remaining, 7, "the primary never charged it");
    tiers.refund("ada", "free", 1).await.unwrap();
    assert_eq!(left().await.remaining, 8, "no decision known: to the primary");
}

/// The same for a reservation settled by a program: `settle_decided` gives
/// the unused part of a local reservation to nobody once the primary is
/// back.
#[tokio::test]
async fn a_programs_settlement_of_a_local_reservation_gives_the_primary_nothing() {
    let world = world();
    let tiers = llm(&world);
    let tokens_left = || tokens_left(&tiers, "ada");
    tiers.record("ada", "llm", "tokens", 600).await.unwrap();
    world.down.store(true, Ordering::SeqCst);
    let reserved = tiers.reserve("ada", "llm", "tokens", 300).await.unwrap().unwrap();
    assert_eq!(reserved.source(), DecisionSource::Fallback);
    back_on_primary(&world, &tiers, "llm").await;
    assert_eq!(tokens_left().await, 400);
    tiers
        .settle_decided("ada", "llm", "tokens", 300, 0, reserved.source())
        .await
        .unwrap();
    assert_eq!(tokens_left().await, 400, "the primary never charged it");
}

/// While the primary is down each of 4 instances has a quarter of the
/// tokens (250 a minute, 500 an hour). A handler reserves 1,000 (the
/// client's `max_tokens`): the local limiter takes its whole minute band,
/// 250, in both bands, and the handler records 700 used. The 450 beyond
/// what was taken are charged (into the local debt), never given back as
/// if 1,000 had been taken: the next request waits for the debt.
#[tokio::test]
async fn a_reservation_above_the_local_share_charges_what_was_used() {
    let storage = a_quarter_while_down();
    let tiers = RateTier::builder()
        .tier("llm", Quota::per_minute(100))
        .tier_unit(
            "llm",
            "tokens",
            [Quota::per_minute(1_000), Quota::per_hour(2_000)],
        )
        .clock(FakeClock::new())
        .storage(storage.clone())
        .build();
    let app = Router::new()
        .route(
            "/",
            get(|usage: TierUsage| async move {
                usage.reserve("tokens", 1_000).await?;
                usage.record("tokens", 700);
                Ok::<_, TierRefusal>("ok")
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(|_| Some(TierIdentity::new("ada", "llm"))));
    let first = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(storage.is_local());
    let next = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(
        next.status,
        StatusCode::TOO_MANY_REQUESTS,
        "700 used of a 250-token share"
    );
    let peek = tiers.reserve("ada", "llm", "tokens", 0).await.unwrap();
    let bands: Vec<_> = match &peek {
        Ok(info) => info.bands().collect(),
        Err(limited) => limited.bands().collect(),
    };
    let tokens: Vec<_> = bands
        .iter()
        .filter(|(q, _)| q.unit().as_str() == "tokens")
        .collect();
    // the minute band: 250 taken and 250 of debt (the rest forgiven); the
    // hour band: 700 of its 500, 200 in debt
    assert!(
        tokens.iter().all(|(_, s)| s.remaining == 0 && s.debt_ns > 0),
        "{tokens:?}"
    );
}

/// While the primary is down each of 4 instances has 25 of 100 requests a
/// minute. A request answered 500 is given back (`refund_on`), and its
/// response says what the local limiter holds then: its share whole, 25,
/// as the next response (24 left) confirms; not 97, counted from the
/// tier's quota of 100.
#[tokio::test]
async fn a_refunded_response_counts_from_the_local_share() {
    let storage = a_quarter_while_down();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .clock(FakeClock::new())
        .storage(storage.clone())
        .build();
    let app = Router::new()
        .route("/fail", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .route("/ok", get(|| async { "ok" }))
        .layer(
            TierLimitLayer::new(tiers.clone())
                .identifier_fn(|_| Some(TierIdentity::new("ada", "free")))
                .refund_on(|status| status.is_server_error()),
        );
    let failed = send(&app, Request::get("/fail").body(Body::empty()).unwrap()).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(storage.is_local());
    assert_eq!(failed.remaining(), Some(25));
    assert!(failed.header("ratelimit").unwrap().starts_with("\"free\";r=25"));
    let ok = send(&app, Request::get("/ok").body(Body::empty()).unwrap()).await;
    assert_eq!(ok.remaining(), Some(24));
}

/// A unit's refusal while the primary is down (the request bands' share:
/// 25 of 100): the 429 says the request bands as they stand once its own
/// charge is given back, from the local share: 25 left, not 99.
#[tokio::test]
async fn a_units_refusal_counts_the_request_bands_from_the_local_share() {
    let storage = a_quarter_while_down();
    let tiers = RateTier::builder()
        .tier("llm", Quota::per_minute(100))
        .tier_unit("llm", "tokens", Quota::per_minute(1_000))
        .clock(FakeClock::new())
        .storage(storage.clone())
        .build();
    let app = Router::new()
        .route(
            "/",
            get(|usage: TierUsage| async move {
                usage.reserve("tokens", 200).await?;
                Ok::<_, TierRefusal>("ok")
            }),
        )
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(|_| Some(TierIdentity::new("ada", "llm"))));
    // the local share of tokens is 250: the first 200 fit, the next do not
    assert_eq!(
        send(&app, Request::get("/").body(Body::empty()).unwrap())
            .await
            .status,
        StatusCode::OK
    );
    let refused = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let field = refused.header("ratelimit").unwrap();
    assert!(field.starts_with("\"llm\";r=24"), "{field}");
}

/// A fallback of 4 instances (a quarter of each quota locally) whose
/// primary is down.
fn a_quarter_while_down() -> Fallback<Flaky> {
    let flaky = Flaky::default();
    flaky.down.store(true, Ordering::SeqCst);
    Fallback::builder(flaky)
        .instances(4)
        .failures_to_switch(1)
        .build()
}

/// While the primary is down each of 4 instances has a quarter of
/// `per_second(8)`: a burst of 2. A request costing 3 (within the tier's
/// burst) is admitted once the local band is full, taking it whole; the
/// next is refused, and its `Retry-After` comes true (it is not refused for
/// as long as the outage lasts). On a plain tier, one with a concurrency
/// limit and one with a unit (the three ways a request is charged).
#[tokio::test]
async fn a_request_above_the_local_share_waits_what_its_refusal_says() {
    let plain = |builder: tower_rate_tier::RateTierBuilder| builder;
    let slots = |builder: tower_rate_tier::RateTierBuilder| builder.tier_concurrency("free", 4);
    let unit = |builder: tower_rate_tier::RateTierBuilder| {
        builder.tier_unit("free", "tokens", Quota::per_minute(1_000))
    };
    for (shape, configure) in [
        ("plain", &plain as &dyn Fn(_) -> _),
        ("slots", &slots),
        ("unit", &unit),
    ] {
        let clock = FakeClock::new();
        let storage = a_quarter_while_down();
        let builder = RateTier::builder()
            .tier("free", Quota::per_second(8))
            .clock(clock.clone())
            .storage(storage.clone());
        let app = Router::new().route("/", get(|| async { "ok" })).layer(
            TierLimitLayer::new(configure(builder).build())
                .identifier_fn(|_| Some(TierIdentity::new("ada", "free")))
                .cost_fn(|_| Some(3)),
        );
        let first = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
        assert_eq!(first.status, StatusCode::OK, "{shape}");
        assert!(storage.is_local(), "{shape}");
        let refused = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{shape}");
        let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
        clock.advance(Duration::from_secs(wait));
        let after = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
        assert_eq!(after.status, StatusCode::OK, "{shape}: waited {wait} s as told");
    }
}

/// Requests of cost 3 for a minute, every 250 ms, on `[per_second(8),
/// per_minute(100)]`: how many are admitted, on the whole quota or on one
/// instance's quarter of it while the primary is down.
async fn admitted_in_a_minute(storage: Option<Fallback<Flaky>>) -> u32 {
    let clock = FakeClock::new();
    let mut builder = RateTier::builder()
        .tier("two", [Quota::per_second(8), Quota::per_minute(100)])
        .clock(clock.clone());
    if let Some(storage) = storage {
        builder = builder.storage(storage);
    }
    let tiers = builder.build();
    let mut admitted = 0;
    for _ in 0..240 {
        if tiers.check("ada", "two", 3).await.unwrap().is_ok() {
            admitted += 1;
        }
        clock.advance(Duration::from_millis(250));
    }
    admitted
}

/// A cost above the share of the second band (2) but within the share of
/// the minute band (25) is charged whole there: one instance admits about
/// a quarter of what the whole quota does, not more.
#[tokio::test]
async fn a_longer_bands_share_is_charged_the_whole_cost() {
    let whole = admitted_in_a_minute(None).await;
    let local = admitted_in_a_minute(Some(a_quarter_while_down())).await;
    assert!(local > 0);
    assert!(
        local <= whole.div_ceil(4) + 1,
        "one instance admitted {local} of cost 3 in a minute; a quarter of {whole} is {}",
        whole.div_ceil(4)
    );
}

/// A charge clamped to a share and given back (a failed request) leaves
/// each band where it was: the minute band after a charge and refund of 3
/// is where a charge and refund of 2 leaves it.
#[tokio::test]
async fn a_refund_of_a_charge_fitted_to_the_share_gives_back_what_was_taken() {
    async fn minute_band_after(cost: u32) -> (bool, u32) {
        let clock = FakeClock::new();
        let tiers = RateTier::builder()
            .tier("two", [Quota::per_second(8), Quota::per_minute(100)])
            .clock(clock.clone())
            .storage(a_quarter_while_down())
            .build();
        tiers.check("ada", "two", 1).await.unwrap().unwrap();
        clock.advance(Duration::from_secs(1));
        let charged = tiers.check("ada", "two", cost).await.unwrap();
        let allowed = charged.is_ok();
        let source = charged.unwrap().source();
        tiers.refund_decided("ada", "two", cost, source).await.unwrap();
        let after = tiers.check("ada", "two", 1).await.unwrap().unwrap();
        (allowed, after.bands().nth(1).unwrap().1.remaining)
    }
    assert_eq!(minute_band_after(3).await, minute_band_after(2).await);
}

/// A request's cost fitted to a share is no reservation: its bands forgive
/// nothing (`BandState::forgiven` is for forced charges and reservations).
#[tokio::test]
async fn a_cost_fitted_to_a_share_forgives_nothing() {
    let tiers = RateTier::builder()
        .tier("two", [Quota::per_second(8), Quota::per_minute(100)])
        .clock(FakeClock::new())
        .storage(a_quarter_while_down())
        .build();
    let info = tiers.check("ada", "two", 3).await.unwrap().unwrap();
    assert_eq!(info.source(), DecisionSource::Fallback);
    let forgiven: Vec<u32> = info.bands().map(|(_, state)| state.forgiven).collect();
    assert_eq!(forgiven, [0, 0]);
}
