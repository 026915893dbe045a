//! A tier with units and a concurrency limit, through the layer, in memory
//! and in Redis: a request takes a slot only when its units are not
//! exhausted; a refusal by a unit (in debt, or at zero) takes none, and
//! says so in its `RateLimit` field.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::{MemoryStorage, RedisStorage, Storage};
use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
use tower_rate_tier_tests::bodies::Endless;
use tower_rate_tier_tests::redis::RedisServer;
use tower_rate_tier_tests::reply::{Reply, header_identity, send};

use super::key;

/// `free`: 100 requests a day, 1,000 tokens a day, two requests in flight.
fn tiers(storage: impl Storage) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_day(100))
        .tier_unit("free", "tokens", Quota::per_day(1_000))
        .tier_concurrency("free", 2)
        .clock(FakeClock::new())
        .storage(storage)
        .build()
}

fn app(tiers: RateTier) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/stream", get(|| async { Body::new(Endless::default()) }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity))
}

fn get_as(user: &str, path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

/// Opens a stream: the response with its body unread (holding its slot).
async fn open(app: &Router, user: &str) -> Response<Body> {
    app.clone().oneshot(get_as(user, "/stream")).await.unwrap()
}

/// The free slots the `RateLimit` field reports, when it has the
/// concurrency item.
fn free_slots(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get("ratelimit")?.to_str().ok()?;
    let list: sfv::List = sfv::Parser::new(value).parse().ok()?;
    list.into_iter().find_map(|entry| {
        let sfv::ListEntry::Item(item) = entry else {
            return None;
        };
        (item.bare_item.as_string()?.as_str() == "free.concurrency").then(|| {
            let r = item.params.get("r").and_then(|r| r.as_integer());
            r.map(|r| i64::from(r).to_string()).unwrap_or_default()
        })
    })
}

/// A request refused by the tokens, with one slot of two free: its field
/// (when it carries the concurrency item: a refusal the Redis storage's
/// deny cache answers knows no slots) says one is still free.
fn assert_refused_by_tokens(reply: &Reply, what: &str) {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{what}");
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["free.tokens"]),
        "{what}"
    );
    if let Some(free) = free_slots(&reply.headers) {
        assert_eq!(free, "1", "{what}: the refusal took a slot");
    }
}

/// The scenario, on the tiers of `app`; `slots_taken(user)` reads how many
/// slots the storage holds for `user`, where it can tell.
async fn refusals_by_units_take_no_slot(tiers: RateTier, slots_taken: impl Fn(&str) -> Option<u64>) {
    let app = app(tiers.clone());
    // ada holds one slot of two, then her usage puts the tokens in debt
    let held = open(&app, "ada").await;
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(free_slots(held.headers()).as_deref(), Some("1"));
    tiers.record("ada", "free", "tokens", 1_500).await.unwrap();
    for i in 0..4 {
        let refused = send(&app, get_as("ada", "/stream")).await;
        assert_refused_by_tokens(&refused, &format!("ada #{i}"));
    }
    assert_eq!(slots_taken("ada").unwrap_or(1), 1, "a refusal took a slot");
    drop(held);

    // bob holds one slot, and reserves every token: at zero, the tokens
    // refuse his next requests, which take no slot either
    let first = open(&app, "bob").await;
    assert_eq!(first.status(), StatusCode::OK);
    tiers
        .reserve("bob", "free", "tokens", 1_000)
        .await
        .unwrap()
        .unwrap();
    for i in 0..4 {
        let refused = send(&app, get_as("bob", "/")).await;
        assert_refused_by_tokens(&refused, &format!("bob #{i}"));
    }
    assert_eq!(slots_taken("bob").unwrap_or(1), 1, "a refusal took a slot");
    // the reservation given back unused: the next request is admitted and
    // takes the second slot...
    tiers.settle("bob", "free", "tokens", 1_000, 0).await.unwrap();
    let second = open(&app, "bob").await;
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(free_slots(second.headers()).as_deref(), Some("0"));
    // ...and the one after is refused by the concurrency limit: the four
    // refusals by the tokens held none
    let third = send(&app, get_as("bob", "/")).await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        third.json()["violated-policies"],
        serde_json::json!(["free.concurrency"])
    );
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_a_refusal_by_units_takes_no_slot() {
    refusals_by_units_take_no_slot(tiers(MemoryStorage::new()), |_| None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_redis_a_refusal_by_units_takes_no_slot() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (prefix, cached) in [("slots-default", true), ("slots-plain", false)] {
        let storage = RedisStorage::builder(server.url())
            .prefix(prefix)
            .deny_cache(cached)
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap();
        // the slot set of a user, read from the server
        let slots_key = |user: &str| {
            let band = storage.band_key(key("free", user), &Quota::per_day(100));
            format!("{}slots", &band[..=band.rfind(':').unwrap()])
        };
        let taken = |user: &str| {
            let count = server.cli(&["ZCARD", &slots_key(user)]);
            Some(count.parse().expect("a count"))
        };
        refusals_by_units_take_no_slot(tiers(storage.clone()), taken).await;
    }
}
