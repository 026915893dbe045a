//! Where a Redis slot's release goes when a response is dropped away from
//! the runtime that waited for the slot: on a plain thread, under a runtime
//! without a timer, by a blocking task of a runtime that shut down, in a
//! thread-local destructor, and through a `Fallback` answering locally
//! meanwhile. Each drop is free of panics, and the slot comes back at once.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing;
use http::{HeaderMap, Request, StatusCode};
use tower::ServiceExt;
use tower_rate_tier::storage::{Fallback, RedisStorage, Storage};
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_tests::redis::RedisServer;

use super::storage;

fn identity(headers: &HeaderMap) -> Option<TierIdentity> {
    Some(TierIdentity::new(headers.get("x-user")?.to_str().ok()?, "free"))
}

async fn get(app: &Router, user: &str) -> http::Response<Body> {
    let req = Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An app with one slot per user and a lease of a minute on `storage`.
fn one_slot_app(storage: impl Storage) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1_000))
        .tier_concurrency("free", 1)
        .concurrency_lease(Duration::from_secs(60))
        .storage(storage)
        .build();
    Router::new()
        .route("/", routing::get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identity))
}

/// Takes `ada`'s one slot in Redis on an instance's own runtime, has
/// `drop_it` drop the response away from that runtime (`true` when the
/// drop went without a panic), and checks that it did and that `ada` is
/// admitted again within a second: the release was started on the runtime
/// that waited for the slot, its answer not awaited.
fn dropped_away(drop_it: fn(http::Response<Body>) -> bool) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let runtime = multi_thread();
    let app = runtime.block_on(async { one_slot_app(storage(&server.url()).await) });
    let held = runtime.block_on(get(&app, "ada"));
    assert_eq!(held.status(), StatusCode::OK);
    assert!(drop_it(held), "dropping the response panicked");
    let admitted = runtime.block_on(async {
        for _ in 0..100 {
            if get(&app, "ada").await.status() == StatusCode::OK {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    });
    assert!(admitted, "the slot was not given back");
}

/// Under another runtime, one without a timer (a helper runtime built
/// without `enable_time`), where the storage's timeout would panic.
#[test]
fn a_response_dropped_under_a_runtime_without_timers_gives_its_slot_back() {
    dropped_away(|held| {
        let plain = tokio::runtime::Builder::new_current_thread().build().unwrap();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            plain.block_on(async move { drop(held) });
        }))
        .is_ok()
    });
}

/// By a blocking task of another runtime after that runtime shut down
/// (the instance's runtime runs on).
#[test]
fn a_response_dropped_after_another_runtime_shut_down_gives_its_slot_back() {
    dropped_away(|held| {
        let other = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        other.spawn_blocking(move || {
            // outlives the runtime's shutdown below
            std::thread::sleep(Duration::from_millis(300));
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(held)));
            let _ = tx.send(dropped.is_ok());
        });
        drop(other);
        rx.recv_timeout(Duration::from_secs(5)) == Ok(true)
    });
}

/// Where no tokio runtime runs (a body handed to a thread of its own).
#[test]
fn a_response_dropped_outside_a_runtime_gives_its_slot_back() {
    dropped_away(|held| std::thread::spawn(move || drop(held)).join().is_ok());
}

thread_local! {
    static HELD: RefCell<Option<http::Response<Body>>> = const { RefCell::new(None) };
}

/// By a thread-local's destructor when a plain thread exits, after
/// tokio's own thread-local context is gone (no runtime can be entered).
#[test]
fn a_response_dropped_in_a_thread_local_destructor_gives_its_slot_back() {
    dropped_away(|held| {
        std::thread::spawn(move || {
            HELD.with(|h| *h.borrow_mut() = Some(held));
            // tokio's context thread-local, made after ours: destroyed first
            let _ = tokio::runtime::Handle::try_current();
        })
        .join()
        .is_ok()
    });
}

/// `Fallback<RedisStorage>`: a slot taken in Redis, its response dropped
/// away from the runtime that waited for it (`drop`) while the fallback
/// answers locally: the slot goes back to Redis, so once the fallback is
/// back on Redis the user is admitted.
fn through_a_fallback(drop_it: fn(http::Response<Body>)) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let runtime = multi_thread();
    let app = runtime.block_on(async {
        let redis = RedisStorage::builder(server.url())
            .timeout(Duration::from_millis(100))
            .connect()
            .await
            .unwrap();
        let fallback = Fallback::builder(redis)
            .instances(1)
            .failures_to_switch(1)
            .probe_interval(Duration::from_millis(500))
            .build();
        one_slot_app(fallback)
    });
    let held = runtime.block_on(get(&app, "ada"));
    assert_eq!(held.status(), StatusCode::OK);
    // Redis hangs: another user's requests switch the fallback to local
    server.pause(true);
    runtime.block_on(async {
        for _ in 0..3 {
            let _ = get(&app, "bob").await;
        }
    });
    server.pause(false);
    drop_it(held);
    // the probe hands the domain back to Redis within a few intervals
    let admitted = runtime.block_on(async {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let status = get(&app, "ada").await.status();
            if Instant::now() > until {
                return status == StatusCode::OK;
            }
        }
    });
    assert!(admitted, "the slot taken in Redis was not given back to it");
}

#[test]
fn through_a_fallback_a_response_dropped_on_a_plain_thread_gives_its_slot_back() {
    through_a_fallback(|held| std::thread::spawn(move || drop(held)).join().unwrap());
}

#[test]
fn through_a_fallback_a_response_dropped_under_a_runtime_without_timers_gives_its_slot_back() {
    through_a_fallback(|held| {
        let plain = tokio::runtime::Builder::new_current_thread().build().unwrap();
        plain.block_on(async move { drop(held) });
    });
}
