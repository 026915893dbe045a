//! A Redis Cluster slot held half moved: its node `MIGRATING`, another
//! `IMPORTING`, its key already on the importing node, which serves it only
//! to a caller that sent `ASKING` first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tower_rate_tier::storage::{RedisStorage, StorageErrorKind};
use tower_rate_tier::{CheckError, Quota, RateTier};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::own_cluster;

use super::cluster_batching::{HEAVY, PACE, first_slots, node_id};
use super::key;

/// 8 tasks check the key of a slot held half moved while 8 others check
/// keys of the importing node (so that its connection, which every caller
/// shares, always has other commands on it): every decision on the moved
/// key is made by the importing node after the source's `ASK`, none fails
/// other than by the timeout, and the key counts every request admitted
/// and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_half_moved_slot_decides_its_moved_key_on_the_importing_node() {
    let _heavy = HEAVY.lock().await;
    let Some(cluster) = own_cluster() else { return };
    let timeout = Duration::from_millis(250);
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-half-moved")
        .timeout(timeout)
        .deny_cache(false)
        .connect()
        .await
        .expect("connect to the test cluster");
    // a unit back every 14.4 minutes: the count stays exact over the test
    let quota = Quota::per_day(100).with_burst(100_000);
    let tiers = RateTier::builder()
        .tier("q", quota)
        .storage(storage.clone())
        .build();
    let slot_of = |user: &str| {
        let name = storage.band_key(key("q", user), &quota);
        cluster
            .cli(&["CLUSTER", "KEYSLOT", &name])
            .parse::<u16>()
            .unwrap()
    };
    let on_node = |node: usize| {
        (0..)
            .map(|i| format!("half-{i}"))
            .filter(move |u| first_slots(slot_of(u)) == node)
    };
    let moved = on_node(0).next().unwrap();
    let others: Arc<Vec<String>> = Arc::new(on_node(1).take(8).collect());
    assert_eq!(
        tiers.check(&moved, "q", 1).await.unwrap().unwrap().remaining,
        99_999
    );

    // node 1 imports the slot, node 0 migrates it, and its key moves
    let nodes = cluster.nodes();
    let (slot, name) = (
        slot_of(&moved).to_string(),
        storage.band_key(key("q", &moved), &quota),
    );
    let (from, to) = (node_id(&nodes[0]), node_id(&nodes[1]));
    nodes[1].cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from]);
    nodes[0].cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to]);
    let port = nodes[1].port().to_string();
    assert_eq!(
        nodes[0].cli(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &name]),
        "OK"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let (tiers, moved, others, stop) = (tiers.clone(), moved.clone(), others.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let (mut admitted, mut timeouts) = (0u64, 0u64);
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let user = if t % 2 == 0 {
                    &moved
                } else {
                    &others[i % others.len()]
                };
                i += 1;
                match tiers.check(user, "q", 1).await {
                    Ok(Ok(_)) if user == &moved => admitted += 1,
                    Ok(_) => {}
                    Err(CheckError::Storage(e)) if e.kind() == StorageErrorKind::Timeout => {
                        timeouts += u64::from(user == &moved);
                    }
                    Err(e) => panic!("{user}: {e:?}"),
                }
                tokio::time::sleep(PACE).await;
            }
            (admitted, timeouts)
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut admitted, mut timeouts) = (1u64, 0u64);
    for task in tasks {
        let (a, t) = task.await.expect("a checking task panicked");
        admitted += a;
        timeouts += t;
    }

    // the move ends: node 1 serves the slot
    for node in [1, 0, 2] {
        nodes[node].cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to]);
    }
    println!("half-moved key: {admitted} admitted, {timeouts} timeouts");
    assert!(admitted > 50, "{admitted} admitted");
    // the source never wrote the key again
    assert_eq!(nodes[0].cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot]), "0");
    let peek = tiers.check(&moved, "q", 0).await.unwrap().unwrap();
    let counted = u64::from(100_000 - peek.remaining);
    // a check that timed out may or may not have been counted
    assert!(
        counted >= admitted && counted <= admitted + timeouts,
        "{counted} counted, {admitted} admitted, {timeouts} timeouts"
    );
}

/// A slot held half moved with one user's keys split between the nodes (one
/// band's key migrated, the other not yet: every decision of that user
/// meets TRYAGAIN until the move goes on). Users of *other* slots of the
/// same healthy node must keep being served: the stuck user's decisions may
/// fail, theirs must not time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_split_by_a_half_moved_slot_holds_up_none_of_its_neighbours() {
    let _heavy = HEAVY.lock().await;
    let Some(cluster) = own_cluster() else { return };
    // long enough that a neighbour never times out on a loaded machine,
    // and as long as a stuck call held the node's turn
    let timeout = Duration::from_secs(1);
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-split")
        .timeout(timeout)
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    let bands = [
        Quota::per_day(100).with_burst(100_000),
        Quota::per_hour(100).with_burst(100_000),
    ];
    let slot_of = |user: &str| {
        let name = storage.band_key(key("q", user), &bands[0]);
        cluster
            .cli(&["CLUSTER", "KEYSLOT", &name])
            .parse::<u16>()
            .unwrap()
    };
    let on_node0: Vec<String> = (0..)
        .map(|i| format!("split-{i}"))
        .filter(|u| first_slots(slot_of(u)) == 0)
        .take(9)
        .collect();
    let stuck = on_node0[0].clone();
    let others: Arc<Vec<String>> = Arc::new(
        on_node0[1..]
            .iter()
            .filter(|u| slot_of(u) != slot_of(&stuck))
            .cloned()
            .collect(),
    );
    storage.check(key("q", &stuck), &bands, 1).await.unwrap();
    for u in others.iter() {
        storage.check(key("q", u), &bands, 1).await.unwrap();
    }
    let nodes = cluster.nodes();
    let slot = slot_of(&stuck).to_string();
    let (from, to) = (node_id(&nodes[0]), node_id(&nodes[1]));
    nodes[1].cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from]);
    nodes[0].cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to]);
    let port = nodes[1].port().to_string();
    let name = storage.band_key(key("q", &stuck), &bands[1]);
    assert_eq!(
        nodes[0].cli(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &name]),
        "OK"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let (storage, stuck, others, stop) = (storage.clone(), stuck.clone(), others.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut timeouts, mut other_errors) = (0u64, 0u64, Vec::new());
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                if t % 2 == 0 {
                    let _ = storage.check(key("q", &stuck), &bands, 1).await;
                } else {
                    let u = &others[i % others.len()];
                    match storage.check(key("q", u), &bands, 1).await {
                        Ok(_) => ok += 1,
                        Err(e) if e.kind() == StorageErrorKind::Timeout => timeouts += 1,
                        Err(e) => other_errors.push(e.to_string()),
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (ok, timeouts, other_errors)
        }));
    }
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut timeouts, mut errors) = (0, 0, Vec::new());
    for task in tasks {
        let (o, t, e) = task.await.unwrap();
        ok += o;
        timeouts += t;
        errors.extend(e);
    }
    for node in [1, 0, 2] {
        nodes[node].cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to]);
    }
    assert!(ok > 0);
    assert_eq!((timeouts, errors.len()), (0, 0), "{ok} served; {errors:?}");
}
