//! Batching on a Redis Cluster: decisions queue per primary and go to it
//! as one call; exact through resharding and a lost primary.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tower_rate_tier::clock::{Clock, SystemClock};
use tower_rate_tier::storage::{
    Decide, DecisionSource, Fallback, Op, RedisStorage, Storage, StorageErrorKind,
};
use tower_rate_tier::{CheckError, Quota, RateTier};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::{RedisCluster, cluster, own_cluster};

use super::batching::batched_equal_one_call_each;
use super::key;

/// Held by the heavy tests of this module and of `half_moved`, so that they
/// run one at a time next to the rest of the suite (which has timing bounds
/// of its own on a 2-core machine).
pub(crate) static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long each checking task of the load tests pauses between checks:
/// enough load to meet every move and the kill, without taking the
/// machine from the tests running beside them.
pub(crate) const PACE: Duration = Duration::from_millis(1);

/// Concurrent decisions on keys of every node are batched per node, and
/// each is decided as a call of its own would decide it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_batches_the_decisions_of_each_node() {
    let Some(cluster) = cluster() else { return };
    let redis = RedisStorage::cluster(cluster.urls())
        .prefix("trt-cluster-batch")
        .connect()
        .await
        .unwrap();
    assert!(redis.is_batching());
    assert_eq!(redis.max_batch(), Some(128));
    for round in 0..3u32 {
        let pending: Vec<Decide> = (0..60)
            .map(|i| redis.check(key("t", &format!("c{i}")), &[Quota::per_minute(5)], 1))
            .collect();
        for d in pending {
            assert_eq!(d.await.unwrap().bands[0].remaining, 4 - round);
        }
    }
    let off = RedisStorage::cluster(cluster.urls())
        .prefix("trt-cluster-batch")
        .batching(false)
        .connect()
        .await
        .unwrap();
    assert!(!off.is_batching());
    let d = off
        .check(key("t", "c7"), &[Quota::per_minute(5)], 1)
        .await
        .unwrap();
    assert_eq!(d.bands[0].remaining, 1);
}

/// The property test of batching (random groups of concurrent decisions,
/// refunds and peeks among them, one to three bands), on a 3-master
/// cluster: every batching storage decides exactly as one call per
/// decision, and in fewer calls.
#[test]
fn batched_decisions_equal_one_call_each_on_a_cluster() {
    let _heavy = HEAVY.blocking_lock();
    let Some(cluster) = own_cluster() else { return };
    let urls = cluster.urls();
    let calls = batched_equal_one_call_each(
        // a generous timeout: a decision that timed out on a loaded machine
        // would fail the comparison, and timeouts are not what it is about
        |prefix| {
            RedisStorage::cluster(urls.clone())
                .prefix(prefix)
                .timeout(Duration::from_secs(2))
        },
        || {
            for node in cluster.nodes() {
                node.cli(&["CONFIG", "RESETSTAT"]);
            }
        },
        || cluster.command_calls("evalsha") + cluster.command_calls("eval"),
    );
    // each group's keys spread over three nodes: fewer decisions per call
    // than on one server, still fewer calls than decisions
    assert!(calls.subject < 3 * calls.asked * 9 / 10, "{calls:?}");
}

/// 64 tasks with real (server) time on a cluster: per key, never more than
/// `B + span / I`, and never short of it by more than the stated margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_with_real_time_keep_the_bound_on_a_cluster() {
    use tower_rate_tier_tests::exactness::{self, Hammer};
    let _heavy = HEAVY.lock().await;
    let Some(cluster) = cluster() else { return };
    let shared = Quota::per_second(1_000).with_burst(500);
    let own = Quota::per_second(20).with_burst(5);
    // no deny cache: its denials report an estimate of Redis's time (see
    // the single-server test)
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-cluster-real-time")
        .deny_cache(false)
        .connect()
        .await
        .expect("connect to the test cluster");
    assert!(storage.is_batching());
    let tiers = exactness::tiers(RateTier::builder().storage(storage), shared, own);
    let hammer = Hammer {
        tasks: 64,
        run_for: Duration::from_millis(600),
        min_attempts: 60,
    };
    let report = exactness::run(&tiers, hammer).await;
    let rows = exactness::real_time_rows(&report, &shared, &own);
    println!(
        "cluster, real time: {} checks in {:?}; shared key admitted {} + {} left, bound {} over {:?}",
        report.total_attempts(),
        report.elapsed,
        rows[0].admitted,
        rows[0].left,
        rows[0].bound,
        report.shared.span()
    );
    assert_eq!(report.shared.errors, 0);
    for key in &report.own {
        assert_eq!(key.errors, 0, "{key:?}");
    }
    for row in &rows {
        assert!(row.admitted + row.left <= row.bound + 1, "{row:?}");
        assert!(row.shortfall <= exactness::margin(row.bound), "{row:?}");
    }
}

/// Which node of a test cluster serves `slot` as `redis-cli --cluster
/// create` shares the slots out (0 to 5460, 5461 to 10922, the rest).
pub(crate) fn first_slots(slot: u16) -> usize {
    match slot {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    }
}

/// The cluster id of `node`.
pub(crate) fn node_id(node: &tower_rate_tier_tests::redis::RedisServer) -> String {
    node.cli(&["CLUSTER", "MYID"])
}

/// Moves `slots` from node `from` to node `to` of `cluster` the way
/// `redis-cli --cluster reshard` does: `IMPORTING`/`MIGRATING`, the keys
/// with `MIGRATE`, then `SETSLOT .. NODE` on every node.
fn move_slots(cluster: &RedisCluster, slots: &[u16], from: usize, to: usize) {
    let nodes = cluster.nodes();
    let (from_id, to_id) = (node_id(&nodes[from]), node_id(&nodes[to]));
    let to_port = nodes[to].port().to_string();
    for slot in slots {
        let slot = slot.to_string();
        nodes[to].cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        nodes[from].cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
        loop {
            let keys = nodes[from].cli(&["CLUSTER", "GETKEYSINSLOT", &slot, "10"]);
            let keys: Vec<&str> = keys.lines().map(str::trim).filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            // one key at a time, so that decisions meet the slot half moved
            for k in keys {
                nodes[from].cli(&["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS", k]);
            }
        }
        for node in [to, from] {
            nodes[node].cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        }
        for (i, node) in nodes.iter().enumerate() {
            if i != to && i != from {
                node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
            }
        }
    }
}

/// Slots moved back and forth between two nodes while 16 tasks check keys
/// in them (batched, no deny cache): no decision fails other than by the
/// timeout, every call returns within it, and for every key the requests
/// admitted are exactly what the key's state on the cluster counted (none
/// lost in a move, none admitted twice), never more than the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_moved_under_load_lose_nothing_and_admit_nothing_extra() {
    let _heavy = HEAVY.lock().await;
    let Some(cluster) = own_cluster() else { return };
    let cluster = Arc::new(cluster);
    let timeout = Duration::from_millis(250);
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-reshard")
        .timeout(timeout)
        .deny_cache(false)
        .connect()
        .await
        .expect("connect to the test cluster");
    let quota = Quota::per_day(1_500);
    let tiers = RateTier::builder()
        .tier("q", quota)
        .storage(storage.clone())
        .build();
    // 16 users on node 0, each in its own slot
    let slot_of = |user: &str| {
        let name = storage.band_key(key("q", user), &quota);
        cluster
            .cli(&["CLUSTER", "KEYSLOT", &name])
            .parse::<u16>()
            .unwrap()
    };
    let mut users = Vec::new();
    let mut slots = Vec::new();
    for i in 0.. {
        let user = format!("moving-{i}");
        let slot = slot_of(&user);
        if first_slots(slot) == 0 && !slots.contains(&slot) {
            users.push(user);
            slots.push(slot);
        }
        if users.len() == 16 {
            break;
        }
    }
    // every key exists before the moves (a move carries state)
    for user in &users {
        assert_eq!(tiers.check(user, "q", 1).await.unwrap().unwrap().remaining, 1_499);
    }
    let users = Arc::new(users);
    let stop = Arc::new(AtomicBool::new(false));
    let during = Arc::new(AtomicU64::new(0));
    let moving = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let (tiers, users, stop, during, moving) = (
            tiers.clone(),
            users.clone(),
            stop.clone(),
            during.clone(),
            moving.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut admitted = vec![0u64; users.len()];
            let (mut timeouts, mut slowest) = (0u64, Duration::ZERO);
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let u = i % users.len();
                i += 1;
                let started = Instant::now();
                match tiers.check(&users[u], "q", 1).await {
                    Ok(Ok(_)) => admitted[u] += 1,
                    Ok(Err(_)) => {}
                    Err(CheckError::Storage(e)) if e.kind() == StorageErrorKind::Timeout => timeouts += 1,
                    Err(e) => panic!("{}: {e:?}", users[u]),
                }
                slowest = slowest.max(started.elapsed());
                if moving.load(Ordering::Relaxed) {
                    during.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(PACE).await;
            }
            (admitted, timeouts, slowest)
        }));
    }
    let mover = {
        let (cluster, moving) = (cluster.clone(), moving.clone());
        let slots = slots.clone();
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(100));
            moving.store(true, Ordering::Relaxed);
            move_slots(&cluster, &slots, 0, 1);
            move_slots(&cluster, &slots, 1, 0);
            move_slots(&cluster, &slots, 0, 1);
            moving.store(false, Ordering::Relaxed);
        })
    };
    mover.await.expect("the slots were moved");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut admitted = vec![1u64; users.len()];
    let (mut timeouts, mut slowest) = (0, Duration::ZERO);
    for task in tasks {
        let (seen, t, s) = task.await.expect("a checking task panicked");
        for (total, n) in admitted.iter_mut().zip(seen) {
            *total += n;
        }
        timeouts += t;
        slowest = slowest.max(s);
    }
    let checked_while_moving = during.load(Ordering::Relaxed);
    println!(
        "{checked_while_moving} checks while slots moved; admitted {admitted:?}; {timeouts} timeouts; slowest {slowest:?}"
    );
    assert!(checked_while_moving > 100, "{checked_while_moving}");
    assert!(slowest < timeout + Duration::from_millis(500), "{slowest:?}");
    // the keys now live on node 1
    for (user, admitted) in users.iter().zip(&admitted) {
        let name = storage.band_key(key("q", user), &quota);
        assert_eq!(cluster.nodes()[1].cli(&["EXISTS", &name]), "1", "{user}");
        let peek = tiers.check(user, "q", 0).await.unwrap().unwrap();
        let counted = u64::from(1_500 - peek.remaining);
        assert!(*admitted <= 1_500, "{user}: {admitted}");
        // a check that timed out may or may not have been counted
        assert!(
            counted >= *admitted && counted <= admitted + timeouts,
            "{user}: {counted} counted, {admitted} admitted, {timeouts} timeouts"
        );
    }
}

/// A primary killed while 16 tasks check keys of every node through a
/// fallback with per-slot failure domains: the killed node's keys are
/// answered by the fallback, the other nodes' keys keep being decided by
/// Redis (never by the fallback), and no call fails or hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_under_load_sends_only_its_keys_to_the_fallback() {
    let _heavy = HEAVY.lock().await;
    let Some(mut cluster) = own_cluster() else { return };
    // long enough that a loaded machine does not time out the other nodes'
    // decisions (which would send their slots to the fallback too); the
    // killed node's decisions fail fast (its port refuses connections)
    let timeout = Duration::from_secs(1);
    let redis = RedisStorage::cluster(cluster.urls())
        .prefix("trt-kill")
        .timeout(timeout)
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    assert!(redis.is_batching());
    let domains = redis.clone();
    let storage = Arc::new(
        Fallback::builder(redis.clone())
            .instances(3)
            .failures_to_switch(2)
            .probe_interval(Duration::from_secs(10))
            .domains(move |key| domains.failure_domain(key))
            .build(),
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let bands = [Quota::per_day(100_000)];
    let users: Arc<Vec<String>> = Arc::new((0..48).map(|i| format!("kill-user-{i}")).collect());
    for user in users.iter() {
        let d = storage
            .decide(key("t", user), &bands, Op::Charge(1), &clock)
            .await
            .unwrap();
        assert_eq!(d.source, DecisionSource::Storage);
    }
    let owners: Arc<Vec<usize>> = Arc::new(
        users
            .iter()
            .map(|user| {
                let name = redis.band_key(key("t", user), &bands[0]);
                first_slots(cluster.cli(&["CLUSTER", "KEYSLOT", &name]).parse().unwrap())
            })
            .collect(),
    );
    assert!((0..3).all(|n| owners.contains(&n)), "{owners:?}");
    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let (storage, users, owners, clock) = (storage.clone(), users.clone(), owners.clone(), clock.clone());
        let (killed, stop) = (killed.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            // per node: decisions by Redis, by the fallback, after the kill
            let mut seen = [[0u64; 2]; 3];
            let mut slowest = Duration::ZERO;
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let u = i % users.len();
                i += 1;
                let after = killed.load(Ordering::Relaxed);
                let started = Instant::now();
                let d = storage
                    .decide(key("t", &users[u]), &bands, Op::Charge(1), &clock)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e}", users[u]));
                slowest = slowest.max(started.elapsed());
                if after {
                    let by = usize::from(d.source == DecisionSource::Fallback);
                    seen[owners[u]][by] += 1;
                }
                tokio::time::sleep(PACE).await;
            }
            (seen, slowest)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.nodes_mut()[2].kill();
    killed.store(true, Ordering::Relaxed);
    // well inside the cluster's node timeout (5 s): the others still serve
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut seen = [[0u64; 2]; 3];
    let mut slowest = Duration::ZERO;
    for task in tasks {
        let (s, slow) = task.await.expect("a checking task panicked");
        for node in 0..3 {
            seen[node][0] += s[node][0];
            seen[node][1] += s[node][1];
        }
        slowest = slowest.max(slow);
    }
    println!("after the kill, per node [by Redis, by the fallback]: {seen:?}; slowest {slowest:?}");
    assert!(slowest < timeout + Duration::from_millis(500), "{slowest:?}");
    for node in 0..2 {
        assert_eq!(
            seen[node][1], 0,
            "node {node}'s keys went to the fallback: {seen:?}"
        );
        assert!(seen[node][0] > 20, "{seen:?}");
    }
    assert!(seen[2][1] > 20, "{seen:?}");
}
