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
#[derive(Debug, Default, Clone)]
struct Down {
    calls: Arc<AtomicU32>,
    releases: Arc<AtomicU32>,
}

impl Storage for Down {
    fn decide(&self, _: StorageKey<'_>, _: &[Quota], op: Op, _: &Arc<dyn Clock>) -> Decide {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Op::Release(_) = op {
            self.releases.fetch_add(1, Ordering::Relaxed);
        }
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

/// A fallback whose primary and local limiter are both in memory: a slot
/// the primary granted, released while the fallback answers locally, frees
/// nothing of the local limiter's (their lease ids are not each other's):
/// a user with one slot and one local stream in flight is refused a second.
#[tokio::test]
async fn a_primarys_lease_never_frees_a_local_slot() {
    let flaky = tower_rate_tier_tests::flaky::Flaky::default();
    let down = flaky.down.clone();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 1)
        .clock(FakeClock::new())
        .storage(Fallback::builder(flaky).failures_to_switch(1).build())
        .build();
    let app = app(tiers);
    let open = |app: &Router| {
        let app = app.clone();
        async move {
            tower::ServiceExt::oneshot(app, get_as("ada", "/stream"))
                .await
                .unwrap()
        }
    };
    // a stream in flight, its slot granted by the primary
    let in_primary = open(&app).await;
    assert_eq!(in_primary.status(), StatusCode::OK);
    // the primary fails: a second stream is answered locally (the local
    // state starts empty)
    down.store(true, Ordering::SeqCst);
    let in_local = open(&app).await;
    assert_eq!(in_local.status(), StatusCode::OK);
    // the first stream ends: its slot goes back, to both limiters
    drop(in_primary);
    // the local stream still holds the local limiter's only slot
    let third = send(&app, get_as("ada", "/")).await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    drop(in_local);
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
}

/// A tier of one slot per user over a fallback of `primary` (share 1).
fn one_slot_over(primary: tower_rate_tier_tests::flaky::Flaky) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 1)
        .clock(FakeClock::new())
        .storage(Fallback::builder(primary).build())
        .build()
}

/// A stream of `user`, held open until its response is dropped.
async fn open_stream(app: &Router, user: &str) -> http::Response<Body> {
    tower::ServiceExt::oneshot(app.clone(), get_as(user, "/stream"))
        .await
        .unwrap()
}

/// A short request the primary admits after a blip gives its lease back to
/// the local limiter too (the domain has local state): it frees nothing
/// there, where a stream answered in the blip still holds the only slot,
/// and the next blip (the same spell, within `continue_within`) refuses a
/// second stream.
#[tokio::test]
async fn a_primarys_release_frees_no_local_slot_someone_holds() {
    let primary = tower_rate_tier_tests::flaky::Flaky::default();
    let down = primary.down.clone();
    let app = app(one_slot_over(primary));

    // a blip: one failure (no switch), answered locally: local lease 1
    down.store(true, Ordering::SeqCst);
    let a = open_stream(&app, "ada").await;
    assert_eq!(a.status(), StatusCode::OK);

    // back: the primary (which never saw A) admits a short request under
    // its own lease 1, and it ends
    down.store(false, Ordering::SeqCst);
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);

    // another blip within continue_within: the same spell's local state,
    // where A still holds the only slot
    down.store(true, Ordering::SeqCst);
    let c = open_stream(&app, "ada").await;
    assert_eq!(
        c.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "A's local stream is still open (limit 1), yet a second stream was admitted locally"
    );
    drop(a);
}

/// A stream that took its slot locally ends after the primary is back: its
/// release, given to the primary too, frees nothing there, where another
/// stream of the user holds the only slot.
#[tokio::test]
async fn a_local_release_frees_no_primary_slot_someone_holds() {
    let primary = tower_rate_tier_tests::flaky::Flaky::default();
    let down = primary.down.clone();
    let app = app(one_slot_over(primary));

    down.store(true, Ordering::SeqCst);
    let a = open_stream(&app, "ada").await; // local lease 1
    assert_eq!(a.status(), StatusCode::OK);
    down.store(false, Ordering::SeqCst);
    let b = open_stream(&app, "ada").await; // primary lease 1
    assert_eq!(b.status(), StatusCode::OK);
    drop(a); // releases lease 1 locally and in the primary: B's slot
    tokio::task::yield_now().await;
    let c = open_stream(&app, "ada").await;
    assert_eq!(
        c.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "B's stream is still open on the primary (limit 1), yet C was admitted"
    );
    drop(b);
}

/// While the fallback answers locally, a slot the local limiter gave goes
/// back there alone: the primary, which never gave it, is not asked (each
/// release was a call to a primary that is down: against a hung Redis, a
/// task waiting out the timeout per request, and a burst of releases when
/// it recovers).
#[tokio::test]
async fn a_slot_given_locally_is_not_given_back_to_the_primary() {
    let primary = Down::default();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 2)
        .clock(FakeClock::new())
        .storage(Fallback::builder(primary.clone()).failures_to_switch(1).build())
        .build();
    let app = app(tiers);
    for _ in 0..10 {
        assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
    }
    assert_eq!(primary.releases.load(Ordering::Relaxed), 0);
}

/// A refusal for want of a slot answered locally (2 instances: a share of
/// 2 of the limit of 4) names the configured limit in its body as in its
/// fields.
#[tokio::test]
async fn a_local_slot_refusal_names_the_configured_limit() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 4)
        .clock(FakeClock::new())
        .storage(
            Fallback::builder(Down::default())
                .instances(2)
                .failures_to_switch(1)
                .build(),
        )
        .build();
    let app = app(tiers);
    let held = [open_stream(&app, "ada").await, open_stream(&app, "ada").await];
    assert!(held.iter().all(|r| r.status() == StatusCode::OK));
    let refused = send(&app, get_as("ada", "/")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("x-ratelimit-limit"), Some("4"));
    assert_eq!(refused.json()["limit"], 4);
}
