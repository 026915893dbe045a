//! Every metric as a Prometheus exporter renders it: each one described
//! once, with its help text and type, so a scrape carries `# HELP` and
//! `# TYPE` lines (metrics-exporter-prometheus's own rendering, through a
//! recorder local to the test).

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use metrics_exporter_prometheus::PrometheusBuilder;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::metrics::{
    DENY_CACHE_HITS_TOTAL, FALLBACK_ACTIVE, MeteredStorage, REQUESTS_TOTAL, STORAGE_DURATION_SECONDS,
    STORAGE_ERRORS_TOTAL,
};
use tower_rate_tier::storage::{DenyCache, MemoryStorage};
use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
use tower_rate_tier_tests::reply::{header_identity, send};

#[tokio::test]
async fn every_metric_has_help_and_type_lines() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let app = metrics::with_local_recorder(&recorder, || {
        let tiers = RateTier::builder()
            .tier("free", Quota::per_minute(1))
            .clock(FakeClock::new())
            .storage(MeteredStorage::new(
                DenyCache::new(MemoryStorage::new()),
                "memory",
            ))
            .build();
        Router::new().route("/", get(|| async { "ok" })).layer(
            TierLimitLayer::new(tiers)
                .identifier_fn(header_identity)
                .metrics(true),
        )
    });
    for _ in 0..3 {
        let req = Request::get("/")
            .header("x-user", "ada")
            .body(Body::empty())
            .unwrap();
        send(&app, req).await;
    }
    let text = handle.render();
    for (name, kind) in [
        (REQUESTS_TOTAL, "counter"),
        (STORAGE_DURATION_SECONDS, "summary"),
        (STORAGE_ERRORS_TOTAL, "counter"),
        (DENY_CACHE_HITS_TOTAL, "counter"),
        (FALLBACK_ACTIVE, "gauge"),
    ] {
        let help: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("# HELP {name} ")))
            .collect();
        assert_eq!(help.len(), 1, "one # HELP line for {name}:\n{text}");
        assert!(
            help[0].len() > format!("# HELP {name} ").len() + 10,
            "a help text for {name}: {}",
            help[0]
        );
        assert!(
            text.lines().any(|l| l == format!("# TYPE {name} {kind}")),
            "# TYPE {name} {kind}:\n{text}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l == r#"tower_rate_tier_requests_total{tier="free",outcome="limited"} 2"#),
        "{text}"
    );
}
