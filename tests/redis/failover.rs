//! A Redis Cluster failover: a replica takes over its primary's slots
//! (`CLUSTER FAILOVER`, the manual kind that loses no write), and the
//! storage follows it. redis-rs puts its cluster connections in `READONLY`
//! mode, in which the demoted primary runs the rate-limit script itself and
//! fails its write (`READONLY`) instead of redirecting it: the storage must
//! make its connection again to learn the new primary, or every decision of
//! those slots fails for good.

use std::time::{Duration, Instant};

use tower_rate_tier::storage::RedisStorage;
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::redis::own_replicated_cluster;

/// Users of every node are decided again within a few seconds of a
/// failover, batched or not, and each admitted check stays counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_follow_a_failover_to_the_new_primary() {
    let Some(cluster) = own_replicated_cluster() else {
        return;
    };
    let users: Vec<String> = (0..48).map(|i| format!("failover-{i}")).collect();
    let mut limiters = Vec::new();
    for batching in [true, false] {
        let storage = RedisStorage::cluster(cluster.urls())
            .prefix(if batching {
                "trt-failover-b"
            } else {
                "trt-failover-a"
            })
            .timeout(Duration::from_secs(1))
            .batching(batching)
            .deny_cache(false)
            .connect()
            .await
            .expect("connect to the test cluster");
        let tiers = RateTier::builder()
            .tier("free", Quota::per_day(100).with_burst(10_000))
            .storage(storage)
            .build();
        for user in &users {
            assert!(tiers.check(user, "free", 1).await.expect("decided").is_ok());
        }
        limiters.push(tiers);
    }
    let replica = cluster
        .nodes()
        .iter()
        .find(|node| node.cli(&["INFO", "replication"]).contains("role:slave"))
        .expect("a replica");
    let asked = replica.cli(&["CLUSTER", "FAILOVER"]);
    assert!(asked.contains("OK"), "CLUSTER FAILOVER: {asked}");
    let started = Instant::now();
    while !replica.cli(&["INFO", "replication"]).contains("role:master") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the replica was never promoted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for tiers in &limiters {
        // every user decided again, within a few seconds
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut admitted = vec![1u32; users.len()];
        loop {
            let mut failed = Vec::new();
            for (i, user) in users.iter().enumerate() {
                match tiers.check(user, "free", 1).await {
                    Ok(Ok(_)) => admitted[i] += 1,
                    Ok(Err(limited)) => panic!("{user} refused: {limited:?}"),
                    Err(error) => failed.push(format!("{user}: {error}")),
                }
            }
            if failed.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} users still fail 10 s after the failover: {:?}",
                failed.len(),
                users.len(),
                &failed[..failed.len().min(3)]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // every admitted check is counted (a failed one may have been too)
        for (user, admitted) in users.iter().zip(&admitted) {
            let left = tiers
                .check(user, "free", 0)
                .await
                .expect("decided")
                .expect("a peek");
            assert!(
                10_000 - left.remaining >= *admitted,
                "{user}: {left:?}, {admitted} admitted"
            );
        }
    }
}
