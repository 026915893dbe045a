//! The Redis storage against real `redis-server` processes (see
//! `support/redis.rs`; without Redis these tests skip loudly outside CI and
//! fail in CI). One module per concern, under `redis/`.

use tower_rate_tier::storage::{RedisStorage, StorageKey};
use tower_rate_tier::{Quota, RateTier};

#[path = "redis/batching.rs"]
mod batching;
#[path = "redis/cluster.rs"]
mod cluster;
#[path = "redis/cluster_batching.rs"]
mod cluster_batching;
#[path = "redis/cluster_down.rs"]
mod cluster_down;
#[path = "redis/concurrency.rs"]
mod concurrency;
#[path = "redis/deny_cache.rs"]
mod deny_cache;
#[path = "redis/each.rs"]
mod each;
#[path = "redis/exactness.rs"]
mod exactness;
#[path = "redis/failover.rs"]
mod failover;
#[path = "redis/failures.rs"]
mod failures;
#[path = "redis/fallback.rs"]
mod fallback;
#[path = "redis/fallback_primary.rs"]
mod fallback_primary;
#[path = "redis/fallback_refunds.rs"]
mod fallback_refunds;
#[path = "redis/half_moved.rs"]
mod half_moved;
#[path = "redis/keys.rs"]
mod keys;
#[path = "redis/layer.rs"]
mod layer;
#[path = "redis/outages.rs"]
mod outages;
#[path = "redis/own_connection.rs"]
mod own_connection;
#[path = "redis/script.rs"]
mod script;
#[path = "redis/slot_release.rs"]
mod slot_release;
#[path = "redis/units.rs"]
mod units;
#[path = "redis/units_batching.rs"]
mod units_batching;
#[path = "redis/units_exactness.rs"]
mod units_exactness;
#[path = "redis/units_slots.rs"]
mod units_slots;

pub(crate) fn key<'a>(tier: &'a str, user: &'a str) -> StorageKey<'a> {
    StorageKey {
        namespace: "",
        tier,
        user,
    }
}

pub(crate) async fn storage(url: &str) -> RedisStorage {
    RedisStorage::connect(url)
        .await
        .expect("connect to the test Redis")
}

/// A storage whose every decision is a script call of its own: no batch,
/// no deny cache (for tests of the script itself).
pub(crate) async fn script_only(url: &str) -> RedisStorage {
    RedisStorage::builder(url)
        .batching(false)
        .deny_cache(false)
        .connect()
        .await
        .expect("connect to the test Redis")
}

pub(crate) fn tiers(storage: RedisStorage) -> RateTier {
    RateTier::builder()
        .tier("one", Quota::per_day(37))
        .tier("bands", [Quota::per_hour(23), Quota::per_day(1_000)])
        .storage(storage)
        .build()
}
