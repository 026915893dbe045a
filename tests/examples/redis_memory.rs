//! Memory a flood of distinct identities costs Redis: `N` users (default
//! 100,000) each charged once in a one-band tier and in a two-band tier,
//! `INFO memory` read before and after; prints bytes per key and per
//! identity, and checks that every key carries an expiry. See RELIABILITY.md.
//!
//! `cargo run --release -p tower-rate-tier-tests --example redis_memory [N]`

use tower_rate_tier::storage::RedisStorage;
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::redis::RedisServer;

fn used_memory(server: &RedisServer) -> u64 {
    let info = server.cli(&["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory in INFO: {info}"))
}

fn count(server: &RedisServer, command: &[&str]) -> u64 {
    server
        .cli(command)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{command:?} is not a number"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let Some(server) = RedisServer::start() else {
        eprintln!("redis-server is not installed");
        std::process::exit(1);
    };
    let storage = RedisStorage::builder(server.url())
        .hash_secret("memory")
        .connect()
        .await
        .expect("connect");
    let tiers = RateTier::builder()
        .tier("free", Quota::per_hour(100))
        .tier("pro", [Quota::per_second(5), Quota::per_day(10_000)])
        .storage(storage)
        .build();
    let before = used_memory(&server);
    for (tier, keys_per_user) in [("free", 1u64), ("pro", 2)] {
        let start = used_memory(&server);
        let mut tasks = Vec::new();
        for part in 0..16 {
            let tiers = tiers.clone();
            tasks.push(tokio::spawn(async move {
                for i in (part..n).step_by(16) {
                    let user = format!("user-{i:09}");
                    let admitted = tiers.check(&user, tier, 1).await.expect("redis answers");
                    assert!(admitted.is_ok(), "a first request is admitted");
                }
            }));
        }
        for task in tasks {
            task.await.expect("no panic");
        }
        let grown = used_memory(&server) - start;
        let keys = n as u64 * keys_per_user;
        println!(
            "{tier}: {n} identities, {keys} keys, used_memory +{grown} B = {:.1} B per key, {:.1} B per identity",
            grown as f64 / keys as f64,
            grown as f64 / n as f64
        );
    }
    let keys = count(&server, &["DBSIZE"]);
    // every band of every identity is one key; the `pro` second band's keys
    // expire 201 ms after their charge, so some are gone already
    let n = n as u64;
    assert!((2 * n..=3 * n).contains(&keys), "{keys} keys for {n} identities");
    let info = server.cli(&["INFO", "keyspace"]);
    let expires: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("db0:"))
        .and_then(|v| v.split(',').find_map(|p| p.strip_prefix("expires=")))
        .and_then(|v| v.parse().ok())
        .expect("keyspace info");
    assert_eq!(expires, keys, "every key carries an expiry");
    println!(
        "total: {keys} keys, all with an expiry, used_memory +{} B",
        used_memory(&server) - before
    );
}
