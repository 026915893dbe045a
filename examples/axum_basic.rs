//! The plain builder and a closure identifier, under one router-wide layer.
//!
//! ```sh
//! cargo run --example axum_basic            # a self-test run, then exits
//! cargo run --example axum_basic -- --serve # keeps serving, for curl
//! ```
//!
//! The service sits behind a gateway that authenticates callers and sets
//! `x-user-id` and `x-plan`; the limiter reads them with a closure. Shown:
//! a two-band tier, an unlimited tier, a route cost as a layer, a health
//! check exempted up front with `cost_fn`, the unknown-tier and storage
//! policies, and `on_event` for metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::MatchedPath;
use axum::routing::{get, post};
use http::{HeaderMap, Method};
use tower_rate_tier::{
    OnMissing, OnStorageError, OnUnknownTier, Quota, RateLimitEvent, RateTier, TierIdentity, TierLimitLayer,
    tier_cost,
};
use tower_rate_tier_examples::{Client, header, row, serve_axum, serve_forever, serve_mode};

/// The gateway's headers name the user and their plan.
fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user-id")?.to_str().ok()?;
    let plan = headers
        .get("x-plan")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("free");
    Some(TierIdentity::new(user, plan))
}

fn app(limited: Arc<AtomicUsize>) -> Router {
    let tiers = RateTier::builder()
        // two bands, both must admit a request: 2 per second, 100 per hour
        .tier("free", [Quota::per_second(2), Quota::per_hour(100)])
        // 600 a minute on average, at most 50 at once
        .tier("pro", Quota::per_minute(600).with_burst(50))
        .tier("enterprise", Quota::unlimited())
        .default_tier("free")
        .on_missing(OnMissing::UseDefault) // unidentified: free tier, keyed by address
        .build();

    let limiter = TierLimitLayer::new(tiers)
        .identifier_fn(identify)
        .on_unknown_tier(OnUnknownTier::UseDefault) // a plan we do not know: free, own bucket
        .on_storage_error(OnStorageError::Allow) // fail open (the default)
        .cost_fn(|parts| {
            // known before the route runs: health checks are never limited
            let path = parts.extensions.get::<MatchedPath>()?;
            (path.as_str() == "/health").then_some(0)
        })
        .on_event(move |event| {
            if let RateLimitEvent::Limited { .. } = event {
                limited.fetch_add(1, Ordering::Relaxed);
            }
        });

    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }).layer(tier_cost(3)))
        .route("/export", post(|| async { "exported\n" }).layer(tier_cost(20)))
        .route("/health", get(|| async { "ok\n" }))
        .layer(limiter)
}

#[tokio::main]
async fn main() {
    let limited = Arc::new(AtomicUsize::new(0));
    let (addr, server) = serve_axum(app(limited.clone())).await;
    println!("serving on http://{addr}\n");

    if serve_mode() {
        println!("try:");
        println!("  curl -i -H 'x-user-id: ana' http://{addr}/                     # free: 2/s, 100/h");
        println!("  curl -i -H 'x-user-id: pat' -H 'x-plan: pro' http://{addr}/search");
        println!("  curl -i -X POST -H 'x-user-id: pat' -H 'x-plan: pro' http://{addr}/export");
        println!("  curl -i http://{addr}/health                                   # never limited");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return;
    }

    let client = Client::new(addr);
    let ana = [("x-user-id", "ana")];
    let pat = [("x-user-id", "pat"), ("x-plan", "pro")];
    let eve = [("x-user-id", "eve"), ("x-plan", "enterprise")];
    let gil = [("x-user-id", "gil"), ("x-plan", "gold")];

    let first = client.get("/", &ana).await;
    println!("the headers of ana's first request (free: two bands):");
    for name in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-policy",
        "ratelimit",
    ] {
        println!("  {name}: {}", first.header(name));
    }
    println!();

    header();
    row("GET /", "ana (free)", &first);
    for _ in 0..2 {
        row("GET /", "ana (free)", &client.get("/", &ana).await);
    }
    row("GET /health", "ana (free)", &client.get("/health", &ana).await);
    for _ in 0..2 {
        row("GET /search", "pat (pro)", &client.get("/search", &pat).await);
    }
    let export = client
        .send(Method::POST, "/export", &pat, Default::default())
        .await;
    row("POST /export", "pat (pro)", &export);
    row(
        "POST /export",
        "ana (free)",
        &client
            .send(Method::POST, "/export", &ana, Default::default())
            .await,
    );
    row("GET /", "eve (enterprise)", &client.get("/", &eve).await);
    row("GET /", "gil (unknown plan)", &client.get("/", &gil).await);
    row("GET /health", "no identity", &client.get("/health", &[]).await);

    println!(
        "\nana's third request in a second is refused (429): the 2/s band. /health costs 0 (cost_fn),\n\
         so it passes even then. /export costs 20: pat pays it from a burst of 50; ana's free tier can never\n\
         afford it (403). Enterprise is unlimited (no headers); an unknown plan gets the free quota.\n\
         limited events seen by on_event: {}",
        limited.load(Ordering::Relaxed)
    );
    server.abort();
}
