//! A storage call its caller stopped waiting for (an outer timeout while
//! the storage hangs): timed until then, so that a stalled storage shows in
//! the durations.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::ServiceExt;
use tower_rate_tier::metrics::{MeteredStorage, STORAGE_DURATION_SECONDS};
use tower_rate_tier::storage::{Decide, Op, Storage, StorageKey};

use super::*;

/// A storage that never answers.
#[derive(Debug)]
struct Stalled;

impl Storage for Stalled {
    fn decide(
        &self,
        _: StorageKey<'_>,
        _: &[Quota],
        _: Op,
        _: &std::sync::Arc<dyn tower_rate_tier::clock::Clock>,
    ) -> Decide {
        Decide::pending(std::future::pending())
    }
}

#[tokio::test]
async fn a_storage_call_cut_by_an_outer_timeout_is_timed_until_then() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let app = metrics::with_local_recorder(&recorder, || {
        let tiers = RateTier::builder()
            .tier("free", Quota::per_minute(2))
            .storage(MeteredStorage::new(Stalled, "stalled"))
            .build();
        app(TierLimitLayer::new(tiers)
            .identifier_fn(header_identity)
            .metrics(true))
    });
    for _ in 0..3 {
        let request = Request::get("/")
            .header("x-user", "ada")
            .header("x-tier", "free")
            .body(Body::empty())
            .unwrap();
        let cut = tokio::time::timeout(Duration::from_millis(30), app.clone().oneshot(request)).await;
        assert!(cut.is_err(), "the storage never answers");
    }
    let metrics = collect(&snapshotter);
    let durations = metrics
        .iter()
        .find(|((name, labels), _)| {
            name == STORAGE_DURATION_SECONDS && labels.contains(&("storage".into(), "stalled".into()))
        })
        .map(|(_, value)| value);
    let Some(DebugValue::Histogram(samples)) = durations else {
        panic!("no duration of the stalled storage: {durations:?}")
    };
    assert_eq!(samples.len(), 3, "{samples:?}");
    assert!(samples.iter().all(|s| s.into_inner() >= 0.029), "{samples:?}");
}
