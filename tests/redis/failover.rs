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

/// The connections the nodes of `cluster` but `skip` accepted so far.
fn connections(cluster: &tower_rate_tier_tests::redis::RedisCluster, skip: usize) -> u64 {
    cluster
        .nodes()
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != skip)
        .filter_map(|(_, node)| {
            let info = node.cli(&["INFO", "stats"]);
            let line = info
                .lines()
                .find_map(|l| l.strip_prefix("total_connections_received:"))?;
            line.trim().parse::<u64>().ok()
        })
        .sum()
}

/// A primary that hangs (stopped, as a stalled machine is): once its
/// replica is promoted, its users are decided again within a few seconds
/// (the storage connects again after calls that got no answer), and the
/// storage does not flood the cluster with connections meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_follow_a_hung_primary_to_its_promoted_replica() {
    follow_a_lost_primary("STOP").await;
}

/// A primary that dies (`kill -9`): the same, while its replica answers
/// `READONLY` until its promotion (each answer a reason to connect again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_follow_a_dead_primary_to_its_promoted_replica() {
    follow_a_lost_primary("KILL").await;
}

/// A primary lost to `kill -<signal>` under traffic.
async fn follow_a_lost_primary(signal: &str) {
    let Some(cluster) = own_replicated_cluster() else {
        return;
    };
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-hung")
        .timeout(Duration::from_millis(500))
        .deny_cache(false)
        .connect()
        .await
        .expect("connect to the test cluster");
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(100).with_burst(100_000))
        .storage(storage)
        .build();
    let users: Vec<String> = (0..24).map(|i| format!("hung-{i}")).collect();
    for user in &users {
        assert!(tiers.check(user, "free", 1).await.expect("decided").is_ok());
    }
    let nodes = cluster.nodes();
    let primary = nodes
        .iter()
        .position(|node| node.cli(&["INFO", "replication"]).contains("role:master"))
        .expect("a primary");
    let port = nodes[primary].port().to_string();
    let replica = nodes
        .iter()
        .position(|node| {
            let info = node.cli(&["INFO", "replication"]);
            info.contains("role:slave") && info.contains(&format!("master_port:{port}"))
        })
        .expect("its replica");
    let before = connections(&cluster, primary);
    let pid = nodes[primary].pid().expect("the primary runs").to_string();
    let sent = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -{signal} {pid}");
    let started = Instant::now();
    // decisions go on meanwhile (those of the hung node time out)
    while !nodes[replica]
        .cli(&["INFO", "replication"])
        .contains("role:master")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the replica was never promoted"
        );
        for user in &users {
            let _ = tiers.check(user, "free", 1).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let mut failed = 0;
        for user in &users {
            failed += usize::from(tiers.check(user, "free", 1).await.is_err());
        }
        if failed == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{failed} of {} users still fail 8 s after the promotion",
            users.len()
        );
    }
    let made = connections(&cluster, primary) - before;
    // The cluster connection is made again at most once a second (each
    // time to every node, with the attempts that fail meanwhile): some 25
    // connections a second here, where one made again on every `READONLY`
    // made over 300 a second.
    let bound = 50 * (started.elapsed().as_secs() + 2);
    assert!(
        made <= bound,
        "{made} connections in {:?} (at most {bound})",
        started.elapsed()
    );
    let _ = std::process::Command::new("kill").args(["-CONT", &pid]).status();
}

/// The number of keys each node of `cluster` holds.
fn key_counts(cluster: &tower_rate_tier_tests::redis::RedisCluster) -> Vec<u64> {
    cluster
        .nodes()
        .iter()
        .map(|node| node.cli(&["DBSIZE"]).trim().parse::<u64>().unwrap_or(0))
        .collect()
}

/// A primary that hangs, before any failover: its decisions time out, and
/// the other primaries' users are decided all along, whether the storage
/// was given every node or only the hung one (a connection made anew after
/// the timeouts, which waits for that node, never holds them up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_never_holds_up_the_other_primaries() {
    let Some(cluster) = tower_rate_tier_tests::redis::own_cluster() else {
        return;
    };
    let urls = cluster.urls();
    let hung = 0;
    let mut limiters = Vec::new();
    for seeds in [urls.clone(), vec![urls[hung].clone()]] {
        let storage = RedisStorage::cluster(seeds)
            .prefix("trt-held-up")
            .deny_cache(false)
            .connect()
            .await
            .expect("connect to the test cluster");
        let tiers = RateTier::builder()
            .tier("free", Quota::per_day(100).with_burst(1_000_000))
            .storage(storage)
            .build();
        limiters.push(tiers);
    }
    // users of the hung node, and of the others, by where their key lands
    let (mut on_hung, mut elsewhere) = (Vec::new(), Vec::new());
    for i in 0..40 {
        let user = format!("held-up-{i}");
        let before = key_counts(&cluster);
        assert!(
            limiters[0]
                .check(&user, "free", 1)
                .await
                .expect("decided")
                .is_ok()
        );
        let after = key_counts(&cluster);
        match (0..3).find(|&n| after[n] > before[n]) {
            Some(node) if node == hung => on_hung.push(user),
            Some(_) => elsewhere.push(user),
            None => panic!("no node took {user}'s key"),
        }
    }
    assert!(!on_hung.is_empty() && !elsewhere.is_empty());
    let pid = cluster.nodes()[hung].pid().expect("the primary runs").to_string();
    let sent = std::process::Command::new("kill").args(["-STOP", &pid]).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -STOP {pid}");
    let mut failed = Vec::new();
    // well within the cluster's node timeout (5 s): no failover
    for tiers in &limiters {
        let until = Instant::now() + Duration::from_millis(1_500);
        while Instant::now() < until {
            for user in on_hung.iter().take(2) {
                let _ = tiers.check(user, "free", 1).await;
            }
            for user in &elsewhere {
                if let Err(error) = tiers.check(user, "free", 1).await {
                    failed.push(format!("{user}: {error}"));
                }
            }
        }
    }
    let _ = std::process::Command::new("kill").args(["-CONT", &pid]).status();
    assert!(
        failed.is_empty(),
        "{} decisions of healthy primaries failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
}

/// A primary dead with its replica (its slots served by no one, under
/// `cluster-require-full-coverage no`), then another primary failed over:
/// the users of live primaries are decided by the new primary soon after
/// (a connection made anew while a primary is out of reach is put in place
/// when its map moved slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_follow_a_failover_while_another_primary_is_dead() {
    let Some(mut cluster) = own_replicated_cluster() else {
        return;
    };
    for node in cluster.nodes() {
        node.cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
    }
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-dead-and-moved")
        .timeout(Duration::from_millis(500))
        .deny_cache(false)
        .connect()
        .await
        .expect("connect");
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(100).with_burst(100_000))
        .storage(storage)
        .build();
    let users: Vec<String> = (0..24).map(|i| format!("dm-{i}")).collect();
    for user in &users {
        assert!(tiers.check(user, "free", 1).await.expect("decided").is_ok());
    }
    let role =
        |i: usize, c: &tower_rate_tier_tests::redis::RedisCluster| c.nodes()[i].cli(&["INFO", "replication"]);
    let masters: Vec<usize> = (0..6)
        .filter(|&i| role(i, &cluster).contains("role:master"))
        .collect();
    let replica_of = |m: usize, c: &tower_rate_tier_tests::redis::RedisCluster| {
        let port = c.nodes()[m].port();
        (0..6)
            .find(|&i| {
                let r = role(i, c);
                r.contains("role:slave") && r.contains(&format!("master_port:{port}"))
            })
            .unwrap()
    };
    let (a, b) = (masters[0], masters[1]);
    let (a2, b2) = (replica_of(a, &cluster), replica_of(b, &cluster));
    {
        cluster.nodes_mut()[a2].kill();
        cluster.nodes_mut()[a].kill();
        // until the others mark A failed (node timeout 5 s)
        let until = Instant::now() + Duration::from_secs(20);
        while !cluster.nodes()[b].cli(&["CLUSTER", "NODES"]).lines().any(|l| {
            l.contains(&format!(":{}@", cluster.nodes()[a].port()))
                && l.contains("fail")
                && !l.contains("fail?")
        }) {
            assert!(Instant::now() < until, "A never marked failed");
            for user in &users {
                let _ = tiers.check(user, "free", 1).await;
            }
        }
    }
    // the users a live primary serves (on the connection in use)
    let mut healthy = Vec::new();
    for user in &users {
        if tiers.check(user, "free", 1).await.is_ok() {
            healthy.push(user.clone());
        }
    }
    assert!(!healthy.is_empty(), "no user of a live primary");
    cluster.nodes()[b2].cli(&["CLUSTER", "FAILOVER", "TAKEOVER"]);
    let until = Instant::now() + Duration::from_secs(20);
    while !(role(b2, &cluster).contains("role:master") && role(b, &cluster).contains("role:slave")) {
        assert!(Instant::now() < until, "no takeover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let promoted = Instant::now();
    let mut last = String::new();
    let mut failed = 0;
    while promoted.elapsed() < Duration::from_secs(10) {
        failed = 0;
        for user in &healthy {
            if let Err(e) = tiers.check(user, "free", 1).await {
                failed += 1;
                last = e.to_string();
            }
        }
        if failed == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        failed,
        0,
        "{failed} of {} users of live primaries still fail 10 s after the takeover: {last}",
        healthy.len()
    );
}
