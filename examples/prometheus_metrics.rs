//! Prometheus metrics of a limited API (feature `metrics`): the app serves
//! `/metrics` itself with `metrics-exporter-prometheus` (no listener of the
//! exporter's own).
//!
//! ```sh
//! cargo run --example prometheus_metrics            # a self-test run, then exits
//! cargo run --example prometheus_metrics -- --serve # keeps serving, for curl
//! ```
//!
//! The recorder is installed first, then the storage and the layer are
//! built: their handles register with the recorder in force. The storage
//! latency histogram gets buckets (without them the exporter renders a
//! summary). `/metrics` is merged after the limiter's `Router::layer`, so
//! scrapes are never limited nor counted. The example checks the scrape and
//! exits non-zero on a mismatch.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::HeaderMap;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower_rate_tier::metrics::{MeteredStorage, STORAGE_DURATION_SECONDS};
use tower_rate_tier::storage::MemoryStorage;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_examples::{Client, SelfTest, serve_axum, serve_forever, serve_mode, want};

/// The API keys the server knows, and each one's plan (a database in a real
/// service): the plan comes from the server's records, never from the
/// client.
fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let key = headers.get("x-api-key")?.to_str().ok()?;
    let plan = match key {
        "free-1" | "free-2" => "free",
        "pro-1" => "pro",
        _ => return None,
    };
    Some(TierIdentity::new(key, plan))
}

/// The Prometheus recorder, installed for the process, with buckets for the
/// storage latency.
fn install_recorder() -> PrometheusHandle {
    let buckets = [0.000_01, 0.000_1, 0.001, 0.01, 0.1];
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(STORAGE_DURATION_SECONDS.to_owned()), &buckets)
        .expect("non-empty buckets")
        .install_recorder()
        .expect("no other recorder is installed")
}

fn app(scrape: PrometheusHandle) -> Router {
    let storage = MeteredStorage::new(MemoryStorage::new(), "memory");
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .storage(storage)
        .build();
    let limiter = TierLimitLayer::new(tiers)
        .identifier_fn(identify)
        .cost_fn(|parts| (parts.uri.path() == "/report").then_some(5))
        .metrics(true);
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/report", get(|| async { "report\n" }))
        .layer(limiter)
        .route("/metrics", get(move || std::future::ready(scrape.render())))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let handle = install_recorder();
    // Histogram samples wait in a buffer until a scrape or an upkeep folds
    // them into their buckets: run upkeep now and then, so that the buffer
    // stays small between scrapes.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let (addr, server) = serve_axum(app(handle)).await;
    println!("serving on http://{addr} (free: 3 requests/minute, pro: 100; /report costs 5)\n");

    if serve_mode() {
        println!("try:");
        println!("  curl -i -H 'x-api-key: free-1' http://{addr}/");
        println!("  curl -i -H 'x-api-key: pro-1' http://{addr}/report");
        println!("  curl http://{addr}/metrics");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return std::process::ExitCode::SUCCESS;
    }

    let client = Client::new(addr);
    let mut test = SelfTest::new();
    for expected in [
        want(200, "2", "-"),
        want(200, "1", "-"),
        want(200, "0", "-"),
        want(429, "0", "20"),
    ] {
        let reply = client.get("/", &[("x-api-key", "free-1")]).await;
        test.row("GET /", "free-1", &reply, expected);
    }
    for expected in [want(200, "95", "-"), want(200, "90", "-")] {
        let reply = client.get("/report", &[("x-api-key", "pro-1")]).await;
        test.row("GET /report", "pro-1", &reply, expected);
    }
    // a cost of 5 above the free burst of 3: 403, never a 429
    let reply = client.get("/report", &[("x-api-key", "free-2")]).await;
    test.row("GET /report", "free-2", &reply, want(403, "-", "-"));

    let scrape = client.get("/metrics", &[]).await;
    let text = String::from_utf8_lossy(&scrape.body);
    println!("\nGET /metrics (the rate limiter's lines):");
    for line in text
        .lines()
        .filter(|l| l.starts_with("tower_rate_tier") || l.starts_with("# HELP tower_rate_tier"))
    {
        println!("  {line}");
    }

    let has = |line: &str| text.lines().any(|l| l == line);
    for expected in [
        r#"tower_rate_tier_requests_total{tier="free",outcome="allowed"} 3"#,
        r#"tower_rate_tier_requests_total{tier="free",outcome="limited"} 1"#,
        r#"tower_rate_tier_requests_total{tier="free",outcome="cost_exceeds_limit"} 1"#,
        r#"tower_rate_tier_requests_total{tier="pro",outcome="allowed"} 2"#,
        r#"tower_rate_tier_requests_total{tier="pro",outcome="limited"} 0"#,
        // free-1 four times, pro-1 twice; the cost above the burst never
        // reaches the storage
        r#"tower_rate_tier_storage_duration_seconds_count{storage="memory"} 6"#,
        r#"tower_rate_tier_storage_errors_total{storage="memory",kind="timeout"} 0"#,
    ] {
        test.equal(&format!("the scrape has `{expected}`"), has(expected), true);
    }
    test.equal(
        "the storage latency has the configured buckets",
        text.contains(r#"tower_rate_tier_storage_duration_seconds_bucket{storage="memory",le="0.1"} 6"#),
        true,
    );
    for name in [
        "tower_rate_tier_requests_total",
        "tower_rate_tier_storage_duration_seconds",
    ] {
        test.equal(
            &format!("the scrape describes `{name}` (# HELP)"),
            text.lines().any(|l| l.starts_with(&format!("# HELP {name} "))),
            true,
        );
    }
    test.equal(
        "no API key appears in the scrape",
        !text.contains("free-1") && !text.contains("pro-1"),
        true,
    );
    test.finish()
}
