//! Per-customer quotas: an enterprise contract looked up by API key, with a
//! small TTL cache in front of the customer database.
//!
//! ```sh
//! cargo run --example axum_customer_quotas            # a self-test run, then exits
//! cargo run --example axum_customer_quotas -- --serve # keeps serving, for curl
//! ```
//!
//! An async [`TierIdentifier`] reads `x-api-key`, finds the customer in a
//! slow "database" (an async fn that counts its lookups) through a
//! `moka::future::Cache` with a time-to-live and a maximum capacity, and
//! returns `TierIdentity::new(customer, plan)`, with
//! `.with_quotas(contract)` for a customer who signed a contract of their
//! own. That customer is limited by the contract, in a bucket of their own,
//! and their headers show it under the plan's name; the plan's other
//! customers keep the plan's quota. Unknown keys are cached too (as `None`),
//! so a client retrying a bad key does not reach the database each time; a
//! request without a known key is answered 401 (`OnMissing::Deny`).
//!
//! A changed contract applies once the cached entry expires: at most the
//! TTL later. The self-test run waits for that, checks every row it prints
//! and exits with status 1 if one differs.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::{HeaderMap, StatusCode};
use moka::future::Cache;
use tokio::sync::RwLock;
use tower_rate_tier::{OnMissing, Quota, RateTier, TierIdentifier, TierIdentity, TierLimitLayer};
use tower_rate_tier_examples::{Client, SelfTest, serve_axum, serve_forever, serve_mode, want};

/// How long a lookup is trusted. Short so that the self-test can wait it
/// out; a service would keep entries for seconds to a minute, the longest a
/// changed contract may take to apply.
const CACHE_TTL: Duration = Duration::from_millis(1_500);

/// A customer's record: their plan and, for some, a contract of their own.
#[derive(Debug, Clone)]
struct Customer {
    id: &'static str,
    plan: &'static str,
    contract: Option<Vec<Quota>>,
}

/// The customer table, keyed by API key; a database in a real service.
#[derive(Debug)]
struct Database {
    by_key: RwLock<HashMap<&'static str, Customer>>,
    lookups: AtomicUsize,
}

impl Database {
    fn demo() -> Self {
        let customer = |id, plan, contract| Customer { id, plan, contract };
        let by_key = HashMap::from([
            // an enterprise contract: 6 a minute where the plan gives 4
            (
                "sk_acme",
                customer("acct_acme", "enterprise", Some(vec![Quota::per_minute(6)])),
            ),
            ("sk_bolt", customer("acct_bolt", "enterprise", None)),
            ("sk_cleo", customer("acct_cleo", "free", None)),
        ]);
        Database {
            by_key: RwLock::new(by_key),
            lookups: AtomicUsize::new(0),
        }
    }

    /// Stands in for a query: slow, and counted.
    async fn customer(&self, api_key: &str) -> Option<Customer> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.by_key.read().await.get(api_key).cloned()
    }

    /// What the sales team's tool would do.
    async fn set_contract(&self, api_key: &str, contract: Vec<Quota>) {
        if let Some(customer) = self.by_key.write().await.get_mut(api_key) {
            customer.contract = Some(contract);
        }
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::Relaxed)
    }
}

/// The identifier: API key -> customer, through the cache.
#[derive(Debug, Clone)]
struct Customers {
    db: Arc<Database>,
    cache: Cache<String, Option<TierIdentity>>,
}

impl Customers {
    fn new(db: Arc<Database>) -> Self {
        let cache = Cache::builder()
            .max_capacity(10_000) // bounds the memory a flood of made-up keys can take
            .time_to_live(CACHE_TTL)
            .build();
        Customers { db, cache }
    }
}

#[tower_rate_tier::async_trait]
impl TierIdentifier for Customers {
    async fn identify(&self, headers: &HeaderMap) -> Option<TierIdentity> {
        let key = headers.get("x-api-key")?.to_str().ok()?;
        if key.len() > 64 {
            return None; // not one of our keys; not worth a lookup or a cache entry
        }
        // One lookup per key per TTL, also when requests for a key arrive
        // together (they wait for the first one's lookup).
        self.cache
            .get_with_by_ref(key, async {
                let customer = self.db.customer(key).await?;
                let identity = TierIdentity::new(customer.id, customer.plan);
                Some(match customer.contract {
                    Some(contract) => identity.with_quotas(contract), // own bands, own bucket
                    None => identity,
                })
            })
            .await
    }
}

fn app(db: Arc<Database>) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .tier("enterprise", Quota::per_minute(4))
        .default_tier("free")
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED)) // no key, or an unknown one
        .build();
    let limiter = TierLimitLayer::new(tiers).identifier(Customers::new(db));
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limiter)
}

#[tokio::main]
async fn main() -> ExitCode {
    let db = Arc::new(Database::demo());
    let (addr, server) = serve_axum(app(db.clone())).await;
    println!("serving on http://{addr} (free: 2/minute, enterprise: 4/minute, acme's contract: 6/minute)\n");

    if serve_mode() {
        println!("try:");
        println!("  curl -i -H 'x-api-key: sk_acme' http://{addr}/   # enterprise, contract: 6/minute");
        println!("  curl -i -H 'x-api-key: sk_bolt' http://{addr}/   # enterprise: 4/minute");
        println!("  curl -i -H 'x-api-key: sk_cleo' http://{addr}/   # free: 2/minute");
        println!("  curl -i -H 'x-api-key: sk_nope' http://{addr}/   # 401");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return ExitCode::SUCCESS;
    }

    let client = Client::new(addr);
    let acme = [("x-api-key", "sk_acme")];
    let bolt = [("x-api-key", "sk_bolt")];
    let cleo = [("x-api-key", "sk_cleo")];
    let nope = [("x-api-key", "sk_nope")];
    // every cache entry below is made after this instant
    let started = Instant::now();

    let acme_first = client.get("/", &acme).await;
    let bolt_first = client.get("/", &bolt).await;
    println!("the plan's name, acme's contract, bolt's plan quota:");
    for (who, reply) in [("acme", &acme_first), ("bolt", &bolt_first)] {
        for name in ["x-ratelimit-limit", "ratelimit-policy", "ratelimit"] {
            println!("  {who} {name}: {}", reply.header(name));
        }
    }
    println!();

    let mut test = SelfTest::new();
    test.equal(
        "acme's x-ratelimit-limit",
        acme_first.header("x-ratelimit-limit"),
        "6",
    );
    test.equal(
        "acme's ratelimit-policy",
        acme_first.header("ratelimit-policy"),
        "\"enterprise\";q=6;w=60",
    );
    test.equal(
        "bolt's x-ratelimit-limit",
        bolt_first.header("x-ratelimit-limit"),
        "4",
    );
    test.equal(
        "bolt's ratelimit-policy",
        bolt_first.header("ratelimit-policy"),
        "\"enterprise\";q=4;w=60",
    );

    // acme: the contract's 6, then refused (a unit comes back every 10 s)
    test.row("GET /", "acme (contract)", &acme_first, want(200, "5", "-"));
    for remaining in ["4", "3", "2", "1", "0"] {
        let reply = client.get("/", &acme).await;
        test.row("GET /", "acme (contract)", &reply, want(200, remaining, "-"));
    }
    let reply = client.get("/", &acme).await;
    test.row("GET /", "acme (contract)", &reply, want(429, "0", "10"));
    // bolt, same plan, no contract: the plan's 4 (a unit every 15 s), in
    // a bucket apart from acme's
    test.row("GET /", "bolt (enterprise)", &bolt_first, want(200, "3", "-"));
    for remaining in ["2", "1", "0"] {
        let reply = client.get("/", &bolt).await;
        test.row("GET /", "bolt (enterprise)", &reply, want(200, remaining, "-"));
    }
    let reply = client.get("/", &bolt).await;
    test.row("GET /", "bolt (enterprise)", &reply, want(429, "0", "15"));
    let reply = client.get("/", &cleo).await;
    test.row("GET /", "cleo (free)", &reply, want(200, "1", "-"));
    // an unknown key (asked twice) and no key: 401, nothing counted
    for _ in 0..2 {
        let reply = client.get("/", &nope).await;
        test.row("GET /", "unknown key", &reply, want(401, "-", "-"));
    }
    let reply = client.get("/", &[]).await;
    test.row("GET /", "no key", &reply, want(401, "-", "-"));

    // bolt signs a contract of 12 a minute; the cache still holds the plan
    // until its entry expires
    db.set_contract("sk_bolt", vec![Quota::per_minute(12)]).await;
    let stale = client.get("/", &bolt).await;
    let lookups = db.lookups();
    if started.elapsed() < CACHE_TTL {
        test.row("GET /", "bolt (cached plan)", &stale, want(429, "0", "15"));
        test.equal(
            "bolt's ratelimit-policy within the TTL",
            stale.header("ratelimit-policy"),
            "\"enterprise\";q=4;w=60",
        );
        // one lookup per key: acme, bolt, cleo, the unknown key
        test.equal("database lookups within the TTL", lookups, 4);
    } else {
        // The requests above took longer than the TTL (a very loaded
        // machine): bolt's entry may have expired, so he saw either the
        // cached plan or his new contract, and the database was asked at
        // least once per key.
        println!("  (the requests above took longer than the TTL: checking what holds either way)");
        let policy = stale.header("ratelimit-policy");
        let either = ["\"enterprise\";q=4;w=60", "\"enterprise\";q=12;w=60"].contains(&policy);
        test.equal(
            "bolt's ratelimit-policy: the plan's or the contract's",
            either,
            true,
        );
        test.equal("database lookups, at least one per key", lookups >= 4, true);
    }

    // more than the TTL after every entry was made: all have expired
    tokio::time::sleep(CACHE_TTL + Duration::from_millis(20)).await;
    let before = db.lookups();
    // the contract is a bucket of its own: bolt starts it with a full burst
    // (less the one unit of the request above, if that one already met the
    // contract on a machine too slow to stay within the TTL)
    let contract_met_early = stale.header("ratelimit-policy") == "\"enterprise\";q=12;w=60";
    let remaining = if contract_met_early { "10" } else { "11" };
    let fresh = client.get("/", &bolt).await;
    test.row("GET /", "bolt (contract)", &fresh, want(200, remaining, "-"));
    test.equal(
        "database lookups for bolt after the TTL",
        db.lookups() - before,
        1,
    );
    test.equal(
        "bolt's ratelimit-policy after the TTL",
        fresh.header("ratelimit-policy"),
        "\"enterprise\";q=12;w=60",
    );

    println!(
        "\nacme's contract (6/minute) is a bucket of its own, shown under the plan's name; bolt, on the\n\
         same plan, gets the plan's 4. Each key reached the database once within the TTL, unknown keys\n\
         included; bolt's new contract (12/minute) applied once the cached entry expired."
    );
    server.abort();
    test.finish()
}
