//! Slots through a `Fallback` whose primary is down: each is given back
//! where it was taken, from the primary's first failure on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::{Decide, Fallback, Op, Storage, StorageError, StorageErrorKind, StorageKey};
use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
use tower_rate_tier_tests::bodies::Endless;
use tower_rate_tier_tests::reply::{header_identity, send};

/// A primary that is down (Redis refusing connections answers the same:
/// `StorageErrorKind::Unavailable`, at once).
#[derive(Debug, Default)]
struct Down {
    calls: AtomicU32,
}

impl Storage for Down {
    fn decide(&self, _: StorageKey<'_>, _: &[Quota], _: Op, _: &Arc<dyn Clock>) -> Decide {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")))
    }
}

fn get_as(user: &str, path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

fn app(tiers: RateTier) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/stream", get(|| async { Body::new(Endless::default()) }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity))
}

/// A request answered by the fallback's local limiter before the switch
/// (the primary's first failures, `failures_to_switch` 3 by default) takes
/// a local slot, and its end gives it back there: once the fallback has
/// switched, a user with nothing in flight is admitted.
#[tokio::test]
async fn slots_taken_locally_before_the_switch_are_given_back_there() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 2)
        .clock(clock.clone())
        .storage(Fallback::builder(Down::default()).build()) // defaults: share 1, 3 failures to switch
        .build();
    let app = app(tiers);
    // two requests, one after the other, each over before the next starts
    for i in 0..2 {
        let reply = send(&app, get_as("ada", "/")).await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
    }
    // nothing in flight: the next requests must be admitted
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(send(&app, get_as("ada", "/")).await.status);
    }
    // ...and still after most of the lease (2 min by default)
    clock.advance(Duration::from_secs(110));
    statuses.push(send(&app, get_as("ada", "/")).await.status);
    clock.advance(Duration::from_secs(11));
    let after_lease = send(&app, get_as("ada", "/")).await.status;
    assert_eq!(after_lease, StatusCode::OK);
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "a user with no request in flight was refused: {statuses:?}"
    );
}

/// The same with the slots held by streams that end while answered
/// locally before the switch, and with `instances(2)` (one slot each):
/// one short request is enough to lock the user out.
#[tokio::test]
async fn one_request_before_the_switch_leaves_a_share_of_one_free() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 2)
        .clock(clock.clone())
        .storage(Fallback::builder(Down::default()).instances(2).build())
        .build();
    let app = app(tiers);
    let first = send(&app, get_as("ada", "/")).await.status;
    let mut later = Vec::new();
    for _ in 0..4 {
        later.push(send(&app, get_as("ada", "/")).await.status);
        clock.advance(Duration::from_secs(20));
    }
    assert_eq!(first, StatusCode::OK);
    assert!(
        later.iter().all(|s| *s == StatusCode::OK),
        "locked out with nothing in flight: {later:?}"
    );
}
