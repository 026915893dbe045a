//! Quick start: two plans, API keys, one router-wide limiter, in memory.
//!
//! ```sh
//! cargo run --example quickstart            # serves, sends requests, prints a table, exits
//! cargo run --example quickstart -- --serve # keeps serving; prints curl commands
//! ```
//!
//! The free plan admits 5 requests a minute, the pro plan 1,000 an hour;
//! `/report` costs 10. The plan comes from the server's record of the API
//! key, never from anything the client sends; clients without a known key
//! are limited on the free plan by their address. The self-test run checks
//! every row it prints and exits with status 1 if one differs.

use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::HeaderMap;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, tier_cost};
use tower_rate_tier_examples::{Client, SelfTest, serve_axum, serve_forever, serve_mode, want};

/// Who holds which API key, on which plan (a database in a real service).
const API_KEYS: &[(&str, &str, &str)] = &[("key-alice", "alice", "free"), ("key-bob", "bob", "pro")];

fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let key = headers.get("x-api-key")?.to_str().ok()?;
    let (_, user, plan) = API_KEYS.iter().find(|(k, _, _)| *k == key)?;
    Some(TierIdentity::new(*user, *plan))
}

fn app() -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .tier("pro", Quota::per_hour(1_000))
        .default_tier("free") // clients without a key
        .build();

    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route(
            "/report",
            get(|| async { "a costly report\n" }).layer(tier_cost(10)),
        )
        .layer(TierLimitLayer::new(tiers).identifier_fn(identify))
}

#[tokio::main]
async fn main() -> ExitCode {
    let (addr, server) = serve_axum(app()).await;
    println!("serving on http://{addr} (free: 5 requests/minute, pro: 1,000/hour; /report costs 10)\n");

    if serve_mode() {
        println!("try:");
        println!(
            "  curl -i -H 'x-api-key: key-alice' http://{addr}/        # free; the 6th in a minute gets 429"
        );
        println!("  curl -i -H 'x-api-key: key-bob' http://{addr}/report   # pro; costs 10");
        println!("  curl -i http://{addr}/                                  # no key: free plan, by address");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return ExitCode::SUCCESS;
    }

    let client = Client::new(addr);
    let mut test = SelfTest::new();
    for remaining in ["4", "3", "2", "1", "0"] {
        let reply = client.get("/", &[("x-api-key", "key-alice")]).await;
        test.row("GET /", "alice (free)", &reply, want(200, remaining, "-"));
    }
    // 5 a minute is one every 12 s: the 6th waits 12 s, and costs nothing
    let reply = client.get("/", &[("x-api-key", "key-alice")]).await;
    test.row("GET /", "alice (free)", &reply, want(429, "0", "12"));
    for (path, remaining) in [("/", "999"), ("/report", "989"), ("/report", "979")] {
        let reply = client.get(path, &[("x-api-key", "key-bob")]).await;
        test.row(
            &format!("GET {path}"),
            "bob (pro)",
            &reply,
            want(200, remaining, "-"),
        );
    }
    let reply = client.get("/", &[]).await;
    test.row("GET /", "no key (by address)", &reply, want(200, "4", "-"));
    // a key the server does not know names no plan: the same address's bucket
    let reply = client.get("/", &[("x-api-key", "key-made-up")]).await;
    test.row("GET /", "unknown key", &reply, want(200, "3", "-"));

    println!(
        "\nalice's 6th request in a minute is refused: 429 with Retry-After, and it costs nothing.\n\
         bob's plan pays 10 per /report. Run with `-- --serve` to try it with curl."
    );
    server.abort();
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    test.finish()
}
