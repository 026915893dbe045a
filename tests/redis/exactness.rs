//! Exactly the quota, across instances, nodes and tasks, and the script against the in-process GCRA.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tower_rate_tier::clock::Clock;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::{MemoryStorage, Op, RedisStorage, Storage, StorageKey};
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::{RedisServer, cluster};

use super::{key, storage, tiers};

/// Two `RateTier`s on separate connections, `tasks` tasks each, hammer
/// `users` users of `tier`; returns how many checks each user got through.
async fn hammer(a: RateTier, b: RateTier, tier: &'static str, users: usize, per_task: usize) -> Vec<u32> {
    let admitted: Arc<Vec<AtomicU32>> = Arc::new((0..users).map(|_| AtomicU32::new(0)).collect());
    let mut tasks = Vec::new();
    for t in 0..16 {
        let tiers = if t % 2 == 0 { a.clone() } else { b.clone() };
        let admitted = admitted.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_task {
                let u = (i + t) % users;
                let user = format!("hammer-{tier}-{u}");
                match tiers.check(&user, tier, 1).await {
                    Ok(Ok(_)) => {
                        admitted[u].fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(_)) => {}
                    Err(e) => panic!("check failed: {e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("a hammering task panicked");
    }
    admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_admit_exactly_the_quota_one_band() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = tiers(storage(&server.url()).await);
    let b = tiers(storage(&server.url()).await);
    // 16 tasks x 100 checks over 8 users: 200 attempts per user, quota 37
    let admitted = hammer(a, b, "one", 8, 100).await;
    assert_eq!(admitted, vec![37; 8]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_admit_exactly_the_quota_multi_band() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = tiers(storage(&server.url()).await);
    let b = tiers(storage(&server.url()).await);
    let admitted = hammer(a.clone(), b, "bands", 8, 100).await;
    assert_eq!(admitted, vec![23; 8]);
    // the denied checks charged no band: the daily band lost exactly 23
    let peek = a.check("hammer-bands-0", "bands", 0).await.unwrap().unwrap();
    let remaining: Vec<u32> = peek.bands().map(|(_, s)| s.remaining).collect();
    assert_eq!(remaining, vec![0, 1_000 - 23]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_instances_admit_exactly_the_quota() {
    let Some(cluster) = cluster() else { return };
    let connect = || async {
        RedisStorage::cluster(cluster.urls())
            .prefix("trt-cluster-exact")
            .connect()
            .await
            .expect("connect to the test cluster")
    };
    let a = tiers(connect().await);
    let b = tiers(connect().await);
    // 32 users spread over the three nodes' slots
    let admitted = hammer(a.clone(), b.clone(), "one", 32, 200).await;
    assert_eq!(admitted, vec![37; 32]);
    let admitted = hammer(a.clone(), b, "bands", 32, 200).await;
    assert_eq!(admitted, vec![23; 32]);
    // the keys really are spread over more than one node
    let holding = cluster
        .nodes()
        .iter()
        .filter(|n| n.cli(&["DBSIZE"]).parse::<u64>().unwrap_or(0) > 0)
        .count();
    assert!(holding >= 2, "keys on {holding} node(s) only");
    // a multi-band decision (two keys) went to one slot: the daily band moved
    let peek = a.check("hammer-bands-5", "bands", 0).await.unwrap().unwrap();
    let remaining: Vec<u32> = peek.bands().map(|(_, s)| s.remaining).collect();
    assert_eq!(remaining, vec![0, 1_000 - 23]);
}

/// Same clock, same quotas (whole microseconds), same requests and refunds:
/// the Lua script decides exactly as the in-process GCRA.
///
/// Time only moves forward here: keys expire on the server's real clock, so
/// after a step back of the fake clock Redis may have forgotten a TAT that
/// memory still holds (both are right). The clamp of a clock that moved back
/// has its own test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_matches_the_reference_gcra() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    let redis = RedisStorage::builder(server.url())
        .client_clock(clock.clone())
        .prefix("trt-ref")
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    let memory = MemoryStorage::new();
    let fake: Arc<dyn Clock> = Arc::new(clock.clone());
    let bandsets: [&[Quota]; 4] = [
        &[Quota::per_second(4)],
        &[Quota::per_minute(10).with_burst(3)],
        &[Quota::per_second(5), Quota::per_minute(20)],
        &[
            Quota::per_second(8).with_burst(2),
            Quota::per_second(1).with_burst(6),
            Quota::per_hour(50),
        ],
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for step in 0..3_000 {
        let set = next(bandsets.len() as u64) as usize;
        let bands = bandsets[set];
        let user = format!("ref-{}", next(3));
        let k = StorageKey {
            namespace: "",
            tier: ["a", "b", "c", "d"][set],
            user: &user,
        };
        match next(20) {
            0..=4 => clock.advance(Duration::from_micros(next(400_000))),
            5..=7 => {
                let cost = next(4) as u32;
                redis.give_back(k, bands, cost).await.unwrap();
                memory.decide(k, bands, Op::Refund(cost), &fake).await.unwrap();
            }
            _ => {
                let cost = next(4) as u32;
                let r = redis.check(k, bands, cost).await.unwrap();
                let m = memory.decide(k, bands, Op::Charge(cost), &fake).await.unwrap();
                assert_eq!(r, m, "step {step}: {bands:?} cost {cost}");
            }
        }
    }
}

#[tokio::test]
async fn a_clock_that_moved_back_locks_out_for_one_refill_at_most() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    let redis = RedisStorage::builder(server.url())
        .client_clock(clock.clone())
        .connect()
        .await
        .unwrap();
    let q = [Quota::per_second(10)];
    for _ in 0..10 {
        assert!(redis.check(key("t", "back"), &q, 1).await.unwrap().allowed);
    }
    clock.rewind(Duration::from_secs(3_600));
    let denied = redis.check(key("t", "back"), &q, 1).await.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.bands[0].retry_after_ns, 100_000_000);
    clock.advance(Duration::from_secs(1));
    assert!(redis.check(key("t", "back"), &q, 10).await.unwrap().allowed);
}

/// Issue 7's scenario on Redis: 64 tasks on a multi-threaded runtime hammer
/// one shared key and one key each (quotas whose refill is negligible during
/// the run): exactly the quota of every key is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_admit_exactly_the_quota_of_every_key() {
    use tower_rate_tier_tests::exactness::{self, Hammer};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tiers = exactness::tiers(
        RateTier::builder().storage(storage(&server.url()).await),
        Quota::per_day(1_000),
        Quota::per_day(50),
    );
    let hammer = Hammer {
        tasks: 64,
        run_for: Duration::from_millis(400),
        min_attempts: 60,
    };
    let report = exactness::run(&tiers, hammer).await;
    println!(
        "redis, negligible refill: {} checks in {:?}; shared key {} of {} admitted",
        report.total_attempts(),
        report.elapsed,
        report.shared.admitted,
        report.shared.attempts
    );
    assert_eq!(report.shared.errors, 0);
    assert!(report.shared.attempts > 1_000, "{:?}", report.shared);
    assert_eq!(report.shared.admitted, 1_000);
    for key in &report.own {
        assert!(key.attempts >= 60, "{key:?}");
        assert_eq!((key.admitted, key.errors), (50, 0), "{key:?}");
    }
}

/// The same with real (server) time: per key, never more than
/// `B + span / I` as the server's clock measured the span, and never short
/// of it by more than the stated margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_with_real_time_never_exceed_burst_plus_refill() {
    use tower_rate_tier_tests::exactness::{self, Hammer};
    let Some(server) = RedisServer::start() else {
        return;
    };
    // Both buckets are drained well faster than they refill (64 tasks on the
    // shared key; every task checks its own key far more often than every
    // 50 ms), so no token is lost to a bucket sitting full and the lower
    // bound is meaningful at Redis speeds too.
    let shared = Quota::per_second(1_000).with_burst(500);
    let own = Quota::per_second(20).with_burst(5);
    // Batched, as in production, but without the deny cache: the bounds are
    // computed from the times of the decisions, and a cached denial reports
    // an estimate of Redis's time (its own decision's time plus the local
    // time since the request was sent: an upper bound), which would stretch
    // the span and so the bound.
    let storage = RedisStorage::builder(server.url())
        .deny_cache(false)
        .connect()
        .await
        .expect("connect to the test Redis");
    let tiers = exactness::tiers(RateTier::builder().storage(storage), shared, own);
    let hammer = Hammer {
        tasks: 64,
        run_for: Duration::from_millis(600),
        min_attempts: 60,
    };
    let report = exactness::run(&tiers, hammer).await;
    let rows = exactness::real_time_rows(&report, &shared, &own);
    println!(
        "redis, real time: {} checks in {:?}; shared key admitted {} + {} left, bound {} over {:?}",
        report.total_attempts(),
        report.elapsed,
        rows[0].admitted,
        rows[0].left,
        rows[0].bound,
        report.shared.span()
    );
    assert_eq!(report.shared.errors, 0);
    for row in &rows {
        // + 1 for the clock's granularity (whole microseconds on Redis)
        assert!(row.admitted + row.left <= row.bound + 1, "{row:?}");
        assert!(row.shortfall <= exactness::margin(row.bound), "{row:?}");
    }
}
