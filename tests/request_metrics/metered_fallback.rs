//! A `MeteredStorage` around a fallback, for a tier with a concurrency
//! limit: a slot given back moves neither the fallback's gauge nor the
//! storage's error count while the fallback answers locally.

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::metrics::MeteredStorage;
use tower_rate_tier::storage::Fallback;
use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
use tower_rate_tier_tests::flaky::Flaky;
use tower_rate_tier_tests::reply::{header_identity, send};

fn active(snapshotter: &Snapshotter) -> Option<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| match (key.key().name(), value) {
            ("tower_rate_tier_fallback_active", DebugValue::Gauge(g)) => Some(g.into_inner()),
            _ => None,
        })
}

/// A tier with a concurrency limit over a `MeteredStorage` around a
/// fallback (its handles registered with the recorder in force): the
/// primary's switch, the fallback, and the app.
fn metered_fallback() -> (Arc<AtomicBool>, Fallback<Flaky>, Router) {
    let flaky = Flaky::default();
    let down = flaky.down.clone();
    let fallback = Fallback::builder(flaky)
        .instances(2)
        .failures_to_switch(1)
        .build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 4)
        .clock(FakeClock::new())
        .storage(MeteredStorage::new(fallback.clone(), "fallback"))
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    (down, fallback, app)
}

fn get_as(user: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

#[test]
fn a_release_does_not_clear_fallback_active_while_decisions_are_local() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        let (down, fallback, app) = metered_fallback();
        rt.block_on(async {
            // the primary goes down: answered locally from now on
            down.store(true, Ordering::SeqCst);
            assert_eq!(send(&app, get_as("ada")).await.status, StatusCode::OK);
            assert!(fallback.is_local());
            assert_eq!(active(&snapshotter), Some(1.0), "local after the outage began");
            // the primary is back, but no probe is due yet (the fake clock
            // stands still): every decision is still answered locally
            down.store(false, Ordering::SeqCst);
            for _ in 0..3 {
                assert_eq!(send(&app, get_as("ada")).await.status, StatusCode::OK);
                assert!(fallback.is_local(), "still answering locally");
                assert_eq!(
                    active(&snapshotter),
                    Some(1.0),
                    "fallback_active after a request answered locally"
                );
            }
        });
    });
}

fn unavailable_errors(snapshotter: &Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| {
            key.key().name() == "tower_rate_tier_storage_errors_total"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "kind" && l.value() == "unavailable")
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

/// During an outage every decision of a tier with a concurrency limit is
/// answered locally, and so is each release: the dead primary's error for
/// its release is not the release's, and counts no storage error.
#[test]
fn an_outage_answered_by_the_fallback_counts_no_storage_errors() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        let (down, fallback, app) = metered_fallback();
        rt.block_on(async {
            down.store(true, Ordering::SeqCst);
            for _ in 0..5 {
                assert_eq!(send(&app, get_as("ada")).await.status, StatusCode::OK);
            }
            assert!(fallback.is_local());
            assert_eq!(
                unavailable_errors(&snapshotter),
                0,
                "every decision was answered locally"
            );
        });
    });
}
