//! The plain builder and a closure identifier, under one router-wide layer.
//!
//! ```sh
//! cargo run --example axum_basic            # a self-test run, then exits
//! cargo run --example axum_basic -- --serve # keeps serving, for curl
//! ```
//!
//! The service sits behind an API gateway that authenticates every caller
//! and sets `x-account` and `x-plan` from its own records; the limiter reads
//! them with a closure. **That is safe only behind such a gateway**: it must
//! overwrite (or strip) both headers on every request, and the service must
//! be unreachable except through it, or any client could send `x-plan:
//! enterprise`. Without a gateway, look the plan up yourself (the
//! `quickstart`, `axum_api_key_redis` and `axum_jwt` examples).
//!
//! Shown: a two-band tier, an unlimited tier, a route cost as a layer, a
//! health check exempted up front with `cost_fn`, the unknown-tier and
//! storage policies, and `on_event` for metrics. The self-test run checks
//! every row it prints and exits with status 1 if one differs.

use std::process::ExitCode;
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
use tower_rate_tier_examples::{Client, SelfTest, serve_axum, serve_forever, serve_mode, want};

/// The gateway's headers name the account and its plan. They come from the
/// gateway's records, never from the client (see the module docs); a
/// request without them is unidentified.
fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let account = headers.get("x-account")?.to_str().ok()?;
    let plan = headers.get("x-plan")?.to_str().ok()?;
    Some(TierIdentity::new(account, plan))
}

fn app(limited: Arc<AtomicUsize>) -> Router {
    let tiers = RateTier::builder()
        // two bands, both must admit a request: 3 a minute, 1,000 a day
        .tier("free", [Quota::per_minute(3), Quota::per_day(1_000)])
        // 3,000 an hour on average, at most 50 at once
        .tier("pro", Quota::per_hour(3_000).with_burst(50))
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
async fn main() -> ExitCode {
    let limited = Arc::new(AtomicUsize::new(0));
    let (addr, server) = serve_axum(app(limited.clone())).await;
    println!("serving on http://{addr}\n");

    if serve_mode() {
        println!("try (as the gateway would send them):");
        println!("  curl -i -H 'x-account: ana' -H 'x-plan: free' http://{addr}/   # 3/min, 1,000/day");
        println!("  curl -i -H 'x-account: pat' -H 'x-plan: pro' http://{addr}/search");
        println!("  curl -i -X POST -H 'x-account: pat' -H 'x-plan: pro' http://{addr}/export");
        println!("  curl -i http://{addr}/health                                    # never limited");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return ExitCode::SUCCESS;
    }

    let client = Client::new(addr);
    let ana = [("x-account", "ana"), ("x-plan", "free")];
    let pat = [("x-account", "pat"), ("x-plan", "pro")];
    let eve = [("x-account", "eve"), ("x-plan", "enterprise")];
    let gil = [("x-account", "gil"), ("x-plan", "gold")];

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

    let mut test = SelfTest::new();
    // the X- fields describe the band closest to denying (3 a minute); the
    // IETF fields list both bands: a unit comes back every 20 s and 86.4 s
    test.equal("x-ratelimit-limit", first.header("x-ratelimit-limit"), "3");
    test.equal(
        "ratelimit-policy",
        first.header("ratelimit-policy"),
        "\"free.0\";q=3;w=60, \"free.1\";q=1000;w=86400",
    );
    test.equal(
        "ratelimit",
        first.header("ratelimit"),
        "\"free.0\";r=2;t=20, \"free.1\";r=999;t=87",
    );
    test.row("GET /", "ana (free)", &first, want(200, "2", "-"));
    for remaining in ["1", "0"] {
        test.row(
            "GET /",
            "ana (free)",
            &client.get("/", &ana).await,
            want(200, remaining, "-"),
        );
    }
    // the 3-a-minute band refuses the 4th: one unit comes back in 20 s
    test.row(
        "GET /",
        "ana (free)",
        &client.get("/", &ana).await,
        want(429, "0", "20"),
    );
    // cost 0 (cost_fn): passes even now, and consumes nothing
    let health = client.get("/health", &ana).await;
    test.row("GET /health", "ana (free)", &health, want(200, "0", "-"));
    for remaining in ["47", "44"] {
        let reply = client.get("/search", &pat).await;
        test.row("GET /search", "pat (pro)", &reply, want(200, remaining, "-"));
    }
    let export = client
        .send(Method::POST, "/export", &pat, Default::default())
        .await;
    test.row("POST /export", "pat (pro)", &export, want(200, "24", "-"));
    // 20 is more than the free burst of 3: it can never pass (403, no Retry-After)
    let export = client
        .send(Method::POST, "/export", &ana, Default::default())
        .await;
    test.row("POST /export", "ana (free)", &export, want(403, "-", "-"));
    // unlimited: no rate-limit fields
    test.row(
        "GET /",
        "eve (enterprise)",
        &client.get("/", &eve).await,
        want(200, "-", "-"),
    );
    // a plan the service does not know: the free quota, in gil's own bucket
    let reply = client.get("/", &gil).await;
    test.row("GET /", "gil (unknown plan)", &reply, want(200, "2", "-"));
    // no identity: the free tier, keyed by the client's address
    let reply = client.get("/health", &[]).await;
    test.row("GET /health", "no identity", &reply, want(200, "3", "-"));
    test.equal(
        "limited events seen by on_event",
        limited.load(Ordering::Relaxed),
        1,
    );

    println!(
        "\nana's 4th request in a minute is refused (429): the 3/min band. /health costs 0 (cost_fn),\n\
         so it passes even then. /export costs 20: pat pays it from a burst of 50; ana's free tier can never\n\
         afford it (403). Enterprise is unlimited (no headers); an unknown plan gets the free quota.\n\
         limited events seen by on_event: {}",
        limited.load(Ordering::Relaxed)
    );
    server.abort();
    test.finish()
}
