//! Metrics with a real recorder (`metrics-util`'s debugging recorder, one
//! per test, registered through `metrics::with_local_recorder`): exact
//! counts by tier and outcome after a scripted sequence, storage timings
//! and errors, and no label that a client chose.

use std::collections::BTreeMap;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::{Request, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::metrics::{
    MeteredStorage, REQUESTS_TOTAL, STORAGE_DURATION_SECONDS, STORAGE_ERRORS_TOTAL,
};
use tower_rate_tier::storage::{
    Decide, MemoryStorage, Op, Storage, StorageError, StorageErrorKind, StorageKey,
};
use tower_rate_tier::{OnMissing, OnStorageError, OnUnknownTier, Quota, RateTier, TierLimitLayer};
use tower_rate_tier_tests::reply::{header_identity, send};

#[path = "request_metrics/cancelled.rs"]
mod cancelled;
#[path = "request_metrics/metered_fallback.rs"]
mod metered_fallback;

/// Every metric of a snapshot: (name, sorted labels) -> value.
type Metrics = BTreeMap<(String, Vec<(String, String)>), DebugValue>;

fn collect(snapshotter: &Snapshotter) -> Metrics {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            ((key.name().to_owned(), labels), value)
        })
        .collect()
}

/// `tower_rate_tier_requests_total` by (tier, outcome), zeros included.
fn requests(metrics: &Metrics) -> BTreeMap<(String, String), u64> {
    metrics
        .iter()
        .filter(|((name, _), _)| name == REQUESTS_TOTAL)
        .map(|((_, labels), value)| {
            let label = |k: &str| labels.iter().find(|(key, _)| key == k).unwrap().1.clone();
            let DebugValue::Counter(n) = value else {
                panic!("a counter")
            };
            ((label("tier"), label("outcome")), *n)
        })
        .collect()
}

/// The non-zero request counts.
fn counted(metrics: &Metrics) -> BTreeMap<(String, String), u64> {
    requests(metrics).into_iter().filter(|(_, n)| *n > 0).collect()
}

fn pairs(expected: &[(&str, &str, u64)]) -> BTreeMap<(String, String), u64> {
    expected
        .iter()
        .map(|(tier, outcome, n)| ((tier.to_string(), outcome.to_string()), *n))
        .collect()
}

fn app(limiter: TierLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/big", get(|| async { "big" }))
        .layer(limiter)
}

async fn get_as(app: &Router, path: &str, user: Option<&str>, tier: &str) -> StatusCode {
    let mut request = Request::get(path).header("x-tier", tier);
    if let Some(user) = user {
        request = request.header("x-user", user);
    }
    send(app, request.body(Body::empty()).unwrap()).await.status
}

#[tokio::test]
async fn counts_every_request_once_by_configured_tier_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let app = metrics::with_local_recorder(&recorder, || {
        let tiers = RateTier::builder()
            .tier("free", Quota::per_minute(2))
            .tier("pro", Quota::per_minute(3))
            .tier("enterprise", Quota::unlimited())
            .default_tier("free")
            .clock(FakeClock::new())
            .storage(MeteredStorage::new(MemoryStorage::new(), "memory"))
            .build();
        let limiter = TierLimitLayer::new(tiers)
            .identifier_fn(header_identity)
            .cost_fn(|parts| (parts.uri.path() == "/big").then_some(5))
            .metrics(true);
        app(limiter)
    });

    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get_as(&app, "/", Some("ada-4711"), "free").await);
    }
    for _ in 0..4 {
        statuses.push(get_as(&app, "/", Some("bob-4712"), "pro").await);
    }
    for _ in 0..5 {
        statuses.push(get_as(&app, "/", Some("eve-4713"), "enterprise").await);
    }
    // an unknown plan is limited with the default tier, and counted there
    statuses.push(get_as(&app, "/", Some("carl-4714"), "platinum-9000").await);
    // cost 5 above free's burst of 2
    statuses.push(get_as(&app, "/big", Some("dan-4715"), "free").await);
    // unidentified: the default tier, keyed by address
    statuses.push(get_as(&app, "/", None, "free").await);
    let ok = StatusCode::OK;
    let limited = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(
        statuses,
        [
            [ok, ok, limited].as_slice(),
            &[ok, ok, ok, limited],
            &[ok; 5],
            &[ok, StatusCode::FORBIDDEN, ok]
        ]
        .concat()
    );

    let metrics = collect(&snapshotter);
    assert_eq!(
        counted(&metrics),
        pairs(&[
            ("enterprise", "allowed", 5),
            ("free", "allowed", 4),
            ("free", "cost_exceeds_limit", 1),
            ("free", "limited", 1),
            ("pro", "allowed", 3),
            ("pro", "limited", 1),
        ])
    );
    // every pair a user can meet is there from the start, at 0
    let registered = requests(&metrics);
    assert_eq!(registered.len(), 3 * 8 + 5, "{registered:?}");
    assert!(registered.contains_key(&("free".into(), "concurrency_limited".into())));
    assert!(registered.contains_key(&("free".into(), "shadow_limited".into())));
    assert!(registered.contains_key(&("pro".into(), "storage_error_denied".into())));
    assert!(registered.contains_key(&("unknown".into(), "unidentified_denied".into())));
    assert!(!registered.contains_key(&("unknown".into(), "shadow_limited".into())));

    // labels come from the configuration: no user id, no client-sent tier
    for (_, labels) in metrics.keys() {
        for (key, value) in labels {
            assert!(
                !value.contains("47") && !value.contains("platinum"),
                "{key}={value}"
            );
            if key == "tier" {
                assert!(
                    ["free", "pro", "enterprise", "unknown"].contains(&value.as_str()),
                    "{value}"
                );
            }
        }
    }

    // the storage: ada 3, bob 4, carl 1, the unidentified client 1; the
    // unlimited tier and the cost above the burst never reach it
    let duration = &metrics[&(
        STORAGE_DURATION_SECONDS.to_owned(),
        vec![("storage".into(), "memory".into())],
    )];
    assert!(
        matches!(duration, DebugValue::Histogram(samples) if samples.len() == 9),
        "{duration:?}"
    );
    let errors: u64 = metrics
        .iter()
        .filter(|((name, _), _)| name == STORAGE_ERRORS_TOTAL)
        .map(|(_, value)| match value {
            DebugValue::Counter(n) => *n,
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(errors, 0);
}

#[tokio::test]
async fn policy_answers_count_under_unknown() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (deny, allow) = metrics::with_local_recorder(&recorder, || {
        let layer = |on_missing, on_unknown| {
            let tiers = RateTier::builder()
                .tier("free", Quota::per_minute(2))
                .on_missing(on_missing)
                .build();
            TierLimitLayer::new(tiers)
                .identifier_fn(header_identity)
                .on_unknown_tier(on_unknown)
                .metrics(true)
        };
        (
            app(layer(
                OnMissing::Deny(StatusCode::UNAUTHORIZED),
                OnUnknownTier::Deny(StatusCode::FORBIDDEN),
            )),
            app(layer(OnMissing::Allow, OnUnknownTier::Allow)),
        )
    });

    assert_eq!(get_as(&deny, "/", None, "free").await, StatusCode::UNAUTHORIZED);
    assert_eq!(get_as(&deny, "/", None, "free").await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        get_as(&deny, "/", Some("zed"), "gold").await,
        StatusCode::FORBIDDEN
    );
    for _ in 0..3 {
        assert_eq!(get_as(&allow, "/", None, "free").await, StatusCode::OK);
    }
    assert_eq!(get_as(&allow, "/", Some("zed"), "gold").await, StatusCode::OK);
    assert_eq!(get_as(&allow, "/", Some("zed"), "free").await, StatusCode::OK);

    // both layers register the same pairs: one recorder, one series each
    assert_eq!(
        counted(&collect(&snapshotter)),
        pairs(&[
            ("free", "allowed", 1),
            ("unknown", "unidentified_allowed", 3),
            ("unknown", "unidentified_denied", 2),
            ("unknown", "unknown_tier_allowed", 1),
            ("unknown", "unknown_tier_denied", 1),
        ])
    );
}

/// A storage that is down.
#[derive(Debug)]
struct Down;

impl Storage for Down {
    fn decide(
        &self,
        _: StorageKey<'_>,
        _: &[Quota],
        _: Op,
        _: &std::sync::Arc<dyn tower_rate_tier::clock::Clock>,
    ) -> Decide {
        Decide::ready(Err(StorageError::new(
            StorageErrorKind::Timeout,
            "no answer in 50 ms",
        )))
    }
}

#[tokio::test]
async fn storage_failures_count_by_policy_and_kind() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (open, closed) = metrics::with_local_recorder(&recorder, || {
        let layer = |name: &'static str, policy| {
            let storage = MeteredStorage::new(Down, name);
            let tiers = RateTier::builder()
                .tier("free", Quota::per_minute(2))
                .storage(storage)
                .build();
            TierLimitLayer::new(tiers)
                .identifier_fn(header_identity)
                .on_storage_error(policy)
                .metrics(true)
        };
        (
            app(layer("primary", OnStorageError::Allow)),
            app(layer("secondary", OnStorageError::Deny)),
        )
    });

    for _ in 0..3 {
        assert_eq!(get_as(&open, "/", Some("ada"), "free").await, StatusCode::OK);
    }
    for _ in 0..2 {
        assert_eq!(
            get_as(&closed, "/", Some("ada"), "free").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    let metrics = collect(&snapshotter);
    assert_eq!(
        counted(&metrics),
        pairs(&[
            ("free", "storage_error_allowed", 3),
            ("free", "storage_error_denied", 2)
        ])
    );
    let errors = |storage: &str, kind: &str| {
        let labels = vec![
            ("kind".to_owned(), kind.to_owned()),
            ("storage".to_owned(), storage.to_owned()),
        ];
        &metrics[&(STORAGE_ERRORS_TOTAL.to_owned(), labels)]
    };
    assert_eq!(errors("primary", "timeout"), &DebugValue::Counter(3));
    assert_eq!(errors("secondary", "timeout"), &DebugValue::Counter(2));
    assert_eq!(errors("primary", "unavailable"), &DebugValue::Counter(0));
}

#[tokio::test]
async fn bodies_refused_before_identification_count_as_body_rejected() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let app = metrics::with_local_recorder(&recorder, || {
        let tiers = RateTier::builder().tier("free", Quota::per_minute(5)).build();
        let limiter = TierLimitLayer::new(tiers)
            .identifier_fn(header_identity)
            .metrics(true)
            .buffer_body(true)
            .max_body_size(4);
        Router::new().route("/", post(|| async { "ok" })).layer(limiter)
    });
    let post_body = |body: &'static str| {
        let request = Request::post("/").header("x-user", "ada").body(Body::from(body));
        send(&app, request.unwrap())
    };

    assert_eq!(post_body("tiny").await.status, StatusCode::OK);
    assert_eq!(
        post_body("far too large").await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(
        counted(&collect(&snapshotter)),
        pairs(&[("free", "allowed", 1), ("unknown", "body_rejected", 1)])
    );
}

/// A would-be refusal in shadow mode counts as `shadow_limited`, not
/// `limited`.
#[test]
fn shadowed_refusals_count_as_shadow_limited() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let tiers = tower_rate_tier::RateTier::builder()
            .tier("free", tower_rate_tier::Quota::per_minute(1))
            .clock(tower_rate_tier::clock::FakeClock::new())
            .build();
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(
                tower_rate_tier::TierLimitLayer::new(tiers)
                    .identifier_fn(tower_rate_tier_tests::reply::header_identity)
                    .shadow(true)
                    .metrics(true),
            );
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for _ in 0..3 {
            let req = http::Request::get("/")
                .header("x-user", "ada")
                .body(axum::body::Body::empty())
                .unwrap();
            let reply = rt.block_on(tower_rate_tier_tests::reply::send(&app, req));
            assert_eq!(reply.status, http::StatusCode::OK);
        }
    });
    let counts: std::collections::BTreeMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let outcome = key
                .key()
                .labels()
                .find(|l| l.key() == "outcome")?
                .value()
                .to_owned();
            match value {
                metrics_util::debugging::DebugValue::Counter(n) if n > 0 => Some((outcome, n)),
                _ => None,
            }
        })
        .collect();
    assert_eq!(
        counts,
        [("allowed".to_owned(), 1), ("shadow_limited".to_owned(), 2)].into()
    );
}

/// Around a deny cache, denials it answers itself are counted; around a
/// fallback, the gauge says whether it answers locally.
#[test]
fn deny_cache_hits_and_the_fallback_gauge_are_reported() {
    use std::sync::Arc;
    use tower_rate_tier::clock::{Clock, FakeClock};
    use tower_rate_tier::metrics::MeteredStorage;
    use tower_rate_tier::storage::{
        Decide, DenyCache, Fallback, MemoryStorage, Op, Storage, StorageError, StorageErrorKind, StorageKey,
    };
    use tower_rate_tier::{Quota, RateTier};

    #[derive(Debug)]
    struct Down;
    impl Storage for Down {
        fn decide(&self, _: StorageKey<'_>, _: &[Quota], _: Op, _: &Arc<dyn Clock>) -> Decide {
            Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")))
        }
    }

    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        let cached = RateTier::builder()
            .tier("free", Quota::per_minute(1))
            .clock(FakeClock::new())
            .storage(MeteredStorage::new(
                DenyCache::new(MemoryStorage::new()),
                "cached",
            ))
            .build();
        let fallback = Fallback::builder(Down).instances(2).failures_to_switch(1).build();
        let local = RateTier::builder()
            .tier("free", Quota::per_minute(4))
            .clock(FakeClock::new())
            .storage(MeteredStorage::new(fallback, "fallback"))
            .build();
        rt.block_on(async {
            assert!(cached.check("ada", "free", 1).await.unwrap().is_ok());
            for _ in 0..3 {
                assert!(cached.check("ada", "free", 1).await.unwrap().is_err());
            }
            // answered by the fallback's local share (2 of 4)
            assert!(local.check("bob", "free", 1).await.unwrap().is_ok());
        });
    });
    let mut hits = None;
    let mut active = None;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let storage = key
            .key()
            .labels()
            .find(|l| l.key() == "storage")
            .map(|l| l.value().to_owned());
        match (key.key().name(), storage.as_deref(), value) {
            (
                "tower_rate_tier_deny_cache_hits_total",
                Some("cached"),
                metrics_util::debugging::DebugValue::Counter(n),
            ) => hits = Some(n),
            (
                "tower_rate_tier_fallback_active",
                Some("fallback"),
                metrics_util::debugging::DebugValue::Gauge(g),
            ) => active = Some(g.into_inner()),
            _ => {}
        }
    }
    // the first denial asked the storage; the two after it were the cache's
    assert_eq!(hits, Some(2));
    assert_eq!(active, Some(1.0));
}

#[test]
fn a_tier_added_at_run_time_is_counted_under_its_name() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    // the recorder in force for the layer's build and for the requests, as
    // a global one is
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let tiers = RateTier::builder()
                .tier("free", Quota::per_minute(2))
                .clock(FakeClock::new())
                .build();
            let app = app(TierLimitLayer::new(tiers.clone())
                .identifier_fn(header_identity)
                .metrics(true));
            tiers.set_tier("gold", Quota::per_minute(3)).unwrap();
            for _ in 0..4 {
                get_as(&app, "/", Some("ada-4711"), "gold").await;
            }
            // replaced: the same row
            tiers.set_tier("gold", Quota::per_minute(4)).unwrap();
            for _ in 0..4 {
                get_as(&app, "/", Some("bob-4712"), "gold").await;
            }
            // a name no configuration ever had stays `unknown`
            get_as(&app, "/", Some("eve-4713"), "platinum").await;
        })
    });
    assert_eq!(
        counted(&collect(&snapshotter)),
        pairs(&[
            ("gold", "allowed", 7),
            ("gold", "limited", 1),
            ("unknown", "unknown_tier_denied", 1),
        ])
    );
}
