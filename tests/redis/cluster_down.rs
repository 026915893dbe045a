//! A Redis Cluster whose state is `fail`: batched decisions are
//! unavailable as decisions sent on their own are, so a `Fallback` answers
//! them.

use std::time::Duration;

use tower_rate_tier::Quota;
use tower_rate_tier::storage::{Decide, RedisStorage};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::own_cluster;

use super::key;

/// The kinds of the errors of `n` concurrent checks of users of node 0.
async fn kinds_of_concurrent_checks(storage: &RedisStorage, users: &[String]) -> Vec<String> {
    let quota = [Quota::per_day(1000)];
    let pending: Vec<Decide> = users
        .iter()
        .map(|u| storage.check(key("t", u), &quota, 1))
        .collect();
    let mut out = Vec::new();
    for d in pending {
        out.push(match d.await {
            Ok(_) => "ok".to_owned(),
            Err(e) => format!("{:?}: {e}", e.kind()),
        });
    }
    out
}

/// A primary whose cluster state is `fail` (it no longer sees every slot
/// served; `cluster-require-full-coverage yes`, the default) answers
/// `CLUSTERDOWN`: the storage must report it as `Unavailable`, as it does
/// for a decision sent on its own, so that a `Fallback` answers (Trap 7).
/// A batched decision (the batch script sends no declared key, so the node
/// runs it and each key access fails inside) must not come out as `Other`,
/// which a Fallback passes through to `OnStorageError` (fail open by
/// default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_cluster_is_unavailable_for_batched_decisions_too() {
    let _heavy = super::cluster_batching::HEAVY.lock().await;
    let Some(cluster) = own_cluster() else { return };
    let batched = RedisStorage::cluster(cluster.urls())
        .prefix("trt-down")
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    let single = RedisStorage::cluster(cluster.urls())
        .prefix("trt-down")
        .deny_cache(false)
        .batching(false)
        .connect()
        .await
        .unwrap();
    let quota = Quota::per_day(1000);
    // 40 users of node 0
    let slot_of = |user: &str| {
        let name = batched.band_key(key("t", user), &quota);
        cluster
            .cli(&["CLUSTER", "KEYSLOT", &name])
            .parse::<u16>()
            .unwrap()
    };
    let users: Vec<String> = (0..)
        .map(|i| format!("d{i}"))
        .filter(|u| slot_of(u) <= 5460 && slot_of(u) != 5000)
        .take(40)
        .collect();
    // warm up: the slot map is read, the scripts loaded
    for _ in 0..3 {
        assert!(
            kinds_of_concurrent_checks(&batched, &users)
                .await
                .iter()
                .all(|k| k == "ok")
        );
    }
    // node 0 no longer sees slot 5000 served: its cluster state is `fail`
    assert_eq!(cluster.nodes()[0].cli(&["CLUSTER", "DELSLOTS", "5000"]), "OK");
    for _ in 0..100 {
        if cluster.nodes()[0]
            .cli(&["CLUSTER", "INFO"])
            .contains("cluster_state:fail")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let alone = kinds_of_concurrent_checks(&single, &users).await;
    let together = kinds_of_concurrent_checks(&batched, &users).await;
    assert!(alone.iter().all(|k| k.starts_with("Unavailable")), "{alone:?}");
    let other: Vec<_> = together
        .iter()
        .filter(|k| !k.starts_with("Unavailable"))
        .collect();
    // what a user sees: behind a Fallback (with the storage's failure
    // domains, as the README says), the decisions of the down node must be
    // answered locally; batched ones come out as storage errors, which the
    // layer turns into `OnStorageError` (Allow by default: no limit at all)
    let domains = batched.clone();
    let fallback = tower_rate_tier::storage::Fallback::builder(batched.clone())
        .instances(2)
        .failures_to_switch(1)
        .domains(move |key| domains.failure_domain(key))
        .build();
    let mut errors = Vec::new();
    for _ in 0..5 {
        let pending: Vec<Decide> = users
            .iter()
            .map(|u| fallback.check(key("t", u), &[quota], 1))
            .collect();
        for d in pending {
            if let Err(e) = d.await {
                errors.push(format!("{:?}: {e}", e.kind()));
            }
        }
    }
    assert!(
        other.is_empty(),
        "{} of {} batched decisions: {:?}",
        other.len(),
        together.len(),
        other.first()
    );
    assert!(
        errors.is_empty(),
        "{} decisions failed behind a Fallback",
        errors.len()
    );
}
