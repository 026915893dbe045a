//! Concurrency limits in Redis: instances share the count of requests in
//! flight, a dead instance's slots come back after the lease, the deny cache
//! never repeats a concurrency refusal, and the fallback gives each instance
//! its share of the slots while Redis is down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing;
use http::{HeaderMap, Request, StatusCode};
use tower::ServiceExt;
use tower_rate_tier::clock::{Clock, SystemClock};
use tower_rate_tier::storage::{Decision, Fallback, Op, RedisStorage, Slots, Storage};
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_tests::redis::RedisServer;

use super::{key, storage};

fn identity(headers: &HeaderMap) -> Option<TierIdentity> {
    Some(TierIdentity::new(headers.get("x-user")?.to_str().ok()?, "free"))
}

/// One instance of the application on `storage`: `/` answers a body that
/// holds its slot until it is dropped (unread).
fn instance(storage: impl Storage, rate: Quota, slots: u32) -> Router {
    let tiers = RateTier::builder()
        .tier("free", rate)
        .tier_concurrency("free", slots)
        .storage(storage)
        .build();
    Router::new()
        .route("/", routing::get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identity))
}

async fn get(app: &Router, user: &str) -> http::Response<axum::body::Body> {
    let req = Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap()
}

async fn acquire(storage: &impl Storage, user: &str, limit: u32, lease: Duration) -> Decision {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let op = Op::Acquire {
        cost: 1,
        slots: Slots { limit, lease },
    };
    storage
        .decide(key("free", user), &[Quota::per_hour(1_000)], op, &clock)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_count() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let one = instance(storage(&server.url()).await, Quota::per_minute(100), 2);
    let two = instance(storage(&server.url()).await, Quota::per_minute(100), 2);
    let a = get(&one, "ada").await;
    let b = get(&two, "ada").await;
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(get(&one, "ada").await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get(&two, "ada").await.status(), StatusCode::TOO_MANY_REQUESTS);
    // another user has slots of their own
    assert_eq!(get(&one, "bob").await.status(), StatusCode::OK);
    // a response over on one instance frees a slot for the other; the
    // release is sent in a task of its own, so wait for it to land
    drop(a);
    let mut admitted = None;
    for _ in 0..200 {
        let response = get(&two, "ada").await;
        if response.status() == StatusCode::OK {
            admitted = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        admitted.is_some(),
        "the slot given back on one instance never reached the other"
    );
    drop((b, admitted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_slots_come_back_after_the_lease() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let lease = Duration::from_secs(2);
    let dead = storage(&server.url()).await;
    let started = Instant::now();
    assert!(acquire(&dead, "ada", 1, lease).await.allowed);
    // the instance dies holding its slot: no release is ever sent
    drop(dead);
    let alive = storage(&server.url()).await;
    let refused = acquire(&alive, "ada", 1, lease).await;
    if started.elapsed() < lease {
        assert!(!refused.allowed && refused.slots.unwrap().refused);
    }
    // the lease passes: the slot is free again
    let mut waited = 0;
    while !acquire(&alive, "ada", 1, lease).await.allowed {
        waited += 1;
        assert!(waited < 200, "the dead instance's slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= lease, "admitted before the lease ended");
    // and the set holds one lease, the live one (it expires with it)
    let key = server.cli(&["--scan", "--pattern", "*slots"]);
    assert_eq!(server.cli(&["ZCARD", key.trim()]).trim(), "1");
    let ttl: i64 = server.cli(&["PTTL", key.trim()]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 2_001, "{ttl}");
}

/// Waits until no slot is taken in the server (the releases of ended
/// responses are sent in tasks of their own).
async fn settle(server: &RedisServer) {
    for _ in 0..400 {
        let keys = server.cli(&["--scan", "--pattern", "*slots"]);
        let taken = keys
            .split_whitespace()
            .any(|key| server.cli(&["ZCARD", key]).trim() != "0");
        if !taken {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a slot is still taken after every response ended");
}

async fn body(response: http::Response<Body>) -> String {
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_one_limit_consumes_nothing_of_the_other() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let app = instance(storage(&server.url()).await, Quota::per_hour(3), 1);
    let held = get(&app, "ada").await;
    for _ in 0..4 {
        assert_eq!(get(&app, "ada").await.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    drop(held);
    settle(&server).await;
    // two more fit the rate: the concurrency refusals charged nothing
    for _ in 0..2 {
        let response = get(&app, "ada").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body(response).await, "ok");
        settle(&server).await;
    }
    // refused by rate: it names the rate band, and holds no slot
    let refused = get(&app, "ada").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let refused = body(refused).await;
    assert!(refused.contains(r#""violated-policies":["free"]"#), "{refused}");
    settle(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_never_repeats_a_concurrency_refusal() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // the deny cache is on by default
    let storage: RedisStorage = storage(&server.url()).await;
    let lease = Duration::from_secs(60);
    let first = acquire(&storage, "ada", 1, lease).await;
    let refused = acquire(&storage, "ada", 1, lease).await;
    assert!(refused.slots.unwrap().refused);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let release = Op::Release(first.slots.unwrap().lease.unwrap());
    storage
        .decide(key("free", "ada"), &[Quota::per_hour(1_000)], release, &clock)
        .await
        .unwrap();
    let again = acquire(&storage, "ada", 1, lease).await;
    assert!(again.allowed, "{again:?}");
    assert_eq!(again.source, tower_rate_tier::storage::DecisionSource::Storage);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_each_instance_has_its_share_of_the_slots() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let fallback = Fallback::builder(redis)
        .instances(2)
        .failures_to_switch(1)
        .build();
    server.kill();
    let lease = Duration::from_secs(60);
    // 3 slots between 2 instances: 2 each (rounded up)
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let op = Op::Acquire {
        cost: 1,
        slots: Slots { limit: 3, lease },
    };
    let mut taken = Vec::new();
    for _ in 0..10 {
        // the failure that switches may be an error of its own
        let Ok(decision) = fallback
            .decide(key("free", "ada"), &[Quota::per_hour(1_000)], op, &clock)
            .await
        else {
            continue;
        };
        if decision.source == tower_rate_tier::storage::DecisionSource::Fallback {
            taken.push(decision);
        }
        if taken.len() == 3 {
            break;
        }
    }
    assert!(fallback.is_local());
    let allowed: Vec<bool> = taken.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, true, false], "{taken:?}");
    assert_eq!(taken[2].slots.unwrap().limit, 2);
}
