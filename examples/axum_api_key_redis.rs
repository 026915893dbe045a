//! API keys looked up per request, state in Redis, and two instances of the
//! service sharing one quota.
//!
//! ```sh
//! redis-server --port 6379 &   # or any Redis / Valkey; REDIS_URL=redis://host:port to point elsewhere
//! cargo run --example axum_api_key_redis --features redis            # a self-test run, then exits
//! cargo run --example axum_api_key_redis --features redis -- --serve # keeps both instances serving
//! ```
//!
//! Each instance builds its own `RateTier` on its own Redis connection, as
//! two processes behind a load balancer would. Requests alternate between
//! them and still spend one quota, because every decision is one atomic
//! script in Redis on Redis's clock. The API key's plan comes from an async
//! [`TierIdentifier`] (a database lookup in a real service), never from what
//! the client sends. The self-test run checks every row it prints and exits
//! with status 1 if one differs (2 when Redis cannot be reached).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::HeaderMap;
use tower_rate_tier::storage::RedisStorage;
use tower_rate_tier::{
    OnStorageError, Quota, RateTier, TierIdentifier, TierIdentity, TierLimitLayer, tier_cost,
};
use tower_rate_tier_examples::{Client, SelfTest, serve_axum, serve_mode, want};

/// An account behind an API key.
#[derive(Debug, Clone)]
struct Account {
    id: String,
    plan: String,
}

/// The API-key table; a database in a real service.
#[derive(Debug, Clone)]
struct ApiKeys {
    accounts: Arc<HashMap<String, Account>>,
}

impl ApiKeys {
    fn demo() -> Self {
        let account = |id: &str, plan: &str| Account {
            id: id.to_owned(),
            plan: plan.to_owned(),
        };
        let accounts = HashMap::from([
            ("sk_live_alice".to_owned(), account("acct_alice", "free")),
            ("sk_live_bob".to_owned(), account("acct_bob", "pro")),
            // two keys of one account share its quota: the user id is the account
            ("sk_live_bob_ci".to_owned(), account("acct_bob", "pro")),
        ]);
        ApiKeys {
            accounts: Arc::new(accounts),
        }
    }

    /// Stands in for a database query.
    async fn lookup(&self, key: &str) -> Option<Account> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.accounts.get(key).cloned()
    }
}

#[tower_rate_tier::async_trait]
impl TierIdentifier for ApiKeys {
    async fn identify(&self, headers: &HeaderMap) -> Option<TierIdentity> {
        let key = headers.get("x-api-key")?.to_str().ok()?;
        let account = self.lookup(key).await?; // unknown key: unidentified
        Some(TierIdentity::new(account.id, account.plan))
    }
}

/// One instance of the service: its own Redis connection, its own `RateTier`.
async fn instance(redis_url: &str, prefix: &str) -> Result<Router, tower_rate_tier::storage::StorageError> {
    let storage = RedisStorage::builder(redis_url).prefix(prefix).connect().await?;
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .tier("pro", Quota::per_hour(1_000))
        .default_tier("free")
        .storage(storage)
        .build();
    let limiter = TierLimitLayer::new(tiers)
        .identifier(ApiKeys::demo())
        .on_storage_error(OnStorageError::Deny); // Redis down: 503 rather than unlimited
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/report", get(|| async { "report\n" }).layer(tier_cost(10)))
        .layer(limiter))
}

#[tokio::main]
async fn main() -> ExitCode {
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    // A fresh prefix per self-test run, so a rerun within the minute starts
    // with full quotas; `--serve` uses a fixed one.
    let prefix = match serve_mode() {
        true => "trt-example".to_owned(),
        false => format!("trt-example-{}", std::process::id()),
    };

    let mut addrs: Vec<SocketAddr> = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..2 {
        let app = match instance(&redis_url, &prefix).await {
            Ok(app) => app,
            Err(error) => {
                eprintln!(
                    "cannot reach Redis at {redis_url}: {error}\n\n\
                     This example needs a running Redis (or Valkey). Start one with\n    \
                     redis-server --port 6379\n\
                     or point REDIS_URL at yours, e.g. REDIS_URL=redis://127.0.0.1:6380."
                );
                return ExitCode::from(2);
            }
        };
        let (addr, server) = serve_axum(app).await;
        addrs.push(addr);
        servers.push(server);
    }
    let (a, b) = (addrs[0], addrs[1]);
    println!("two instances on one Redis ({redis_url}): A = http://{a}, B = http://{b}");
    println!("free: 5 requests/minute, pro: 1,000/hour; /report costs 10\n");

    if serve_mode() {
        println!("try (the two instances share each account's quota):");
        println!("  curl -i -H 'x-api-key: sk_live_alice' http://{a}/");
        println!("  curl -i -H 'x-api-key: sk_live_alice' http://{b}/");
        println!("  curl -i -H 'x-api-key: sk_live_bob' http://{b}/report");
        println!("\nCtrl-C to stop.");
        for server in servers {
            let _ = server.await;
        }
        return ExitCode::SUCCESS;
    }

    let clients = [("A", Client::new(a)), ("B", Client::new(b))];
    let mut test = SelfTest::new();
    let alice = [("x-api-key", "sk_live_alice")];
    for (i, remaining) in ["4", "3", "2", "1", "0"].into_iter().enumerate() {
        let (name, client) = &clients[i % 2];
        let reply = client.get("/", &alice).await;
        test.row(
            &format!("GET / via {name}"),
            "alice (free)",
            &reply,
            want(200, remaining, "-"),
        );
    }
    // the 6th, on B, meets the quota both instances spent: a unit comes back in 12 s
    let reply = clients[1].1.get("/", &alice).await;
    test.row("GET / via B", "alice (free)", &reply, want(429, "0", "12"));
    for (i, (key, remaining)) in [
        ("sk_live_bob", "990"),
        ("sk_live_bob_ci", "980"),
        ("sk_live_bob", "970"),
    ]
    .into_iter()
    .enumerate()
    {
        let (name, client) = &clients[i % 2];
        let reply = client.get("/report", &[("x-api-key", key)]).await;
        test.row(
            &format!("GET /report via {name}"),
            key,
            &reply,
            want(200, remaining, "-"),
        );
    }
    println!(
        "\nalice's requests alternate between A and B and count against one quota: the 6th is refused.\n\
         bob's two keys are one account, so they share one quota too."
    );
    for server in servers {
        server.abort();
    }
    test.finish()
}
