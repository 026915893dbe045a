//! The Redis storage against real `redis-server` processes (see
//! `support/redis.rs`; without Redis these tests skip loudly outside CI and
//! fail in CI).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request};
use tower::ServiceExt;
use tower_rate_tier::clock::Clock;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::{MemoryStorage, Op, RedisStorage, Storage, StorageErrorKind, StorageKey};
use tower_rate_tier::{CheckError, OnStorageError, Quota, RateTier, TierIdentity, TierLimitLayer, tier_cost};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::{RedisServer, cluster, own_cluster};

fn key<'a>(tier: &'a str, user: &'a str) -> StorageKey<'a> {
    StorageKey {
        namespace: "",
        tier,
        user,
    }
}

async fn storage(url: &str) -> RedisStorage {
    RedisStorage::connect(url)
        .await
        .expect("connect to the test Redis")
}

fn tiers(storage: RedisStorage) -> RateTier {
    RateTier::builder()
        .tier("one", Quota::per_day(37))
        .tier("bands", [Quota::per_hour(23), Quota::per_day(1_000)])
        .storage(storage)
        .build()
}

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
                redis.refund(k, bands, cost).await.unwrap();
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

#[tokio::test]
async fn keys_are_hashed_expire_and_share_a_hash_tag() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .prefix("myapp")
        .hash_secret("s3cret")
        .connect()
        .await
        .unwrap();
    let bands = [Quota::per_minute(10), Quota::per_day(100)];
    let k = key("pro", "alice@example.com");
    assert!(redis.check(k, &bands, 1).await.unwrap().allowed);
    let keys = server.cli(&["--scan"]);
    let mut names: Vec<&str> = keys.lines().collect();
    names.sort_unstable();
    let mut expected = vec![redis.key_for(k, 0), redis.key_for(k, 1)];
    expected.sort_unstable();
    assert_eq!(names, expected);
    assert!(!keys.contains("alice") && !keys.contains("pro"), "{keys}");
    let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
    assert_eq!(tag(&expected[0]), tag(&expected[1]));
    assert!(expected[0].starts_with("myapp:{"));
    // expiry = time until the TAT: 6 s for one request of 10/min, 864 s for 100/day
    let pttl = |band| {
        server
            .cli(&["PTTL", &redis.key_for(k, band)])
            .parse::<i64>()
            .unwrap()
    };
    assert!((5_000..=6_001).contains(&pttl(0)), "{}", pttl(0));
    assert!((863_000..=864_001).contains(&pttl(1)), "{}", pttl(1));
    // a refund keeps an expiry on what it writes, and deletes a full band
    assert!(redis.check(k, &bands, 2).await.unwrap().allowed);
    redis.refund(k, &bands, 1).await.unwrap();
    assert!((11_000..=12_001).contains(&pttl(0)), "{}", pttl(0));
    redis.refund(k, &bands, 5).await.unwrap();
    assert_eq!(pttl(0), -2, "a full band has no key");
    let peek = redis.check(k, &bands, 0).await.unwrap();
    assert_eq!(peek.bands[0].remaining, 10);
    // another secret (or none) is another bucket
    let other = RedisStorage::builder(server.url())
        .prefix("myapp")
        .connect()
        .await
        .unwrap();
    assert_ne!(other.key_for(k, 0), redis.key_for(k, 0));
}

#[tokio::test]
async fn a_corrupted_value_is_a_fresh_state() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = storage(&server.url()).await;
    let q = [Quota::per_minute(10)];
    let k = key("t", "corrupt");
    for _ in 0..10 {
        assert!(redis.check(k, &q, 1).await.unwrap().allowed);
    }
    assert!(!redis.check(k, &q, 1).await.unwrap().allowed);
    let name = redis.key_for(k, 0);
    for garbage in [
        &["SET", &name, "garbage"][..],
        &["SET", &name, "12.5"],
        &["SET", &name, "-7"],
        &["SET", &name, "nan"],
    ] {
        server.cli(garbage);
        let d = redis.check(k, &q, 1).await.unwrap();
        assert!(d.allowed, "after {garbage:?}");
        assert_eq!(d.bands[0].remaining, 9, "after {garbage:?}");
    }
    // a key of another type
    server.cli(&["DEL", &name]);
    server.cli(&["LPUSH", &name, "x"]);
    let d = redis.check(k, &q, 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.bands[0].remaining, 9);
    assert_eq!(server.cli(&["TYPE", &name]), "string");
    // a TAT a year ahead: at most one full refill (60 s) of waiting
    let year_ahead = (d.now / 1_000 + 365 * 86_400 * 1_000_000).to_string();
    server.cli(&["SET", &name, &year_ahead]);
    let d = redis.check(k, &q, 1).await.unwrap();
    assert!(!d.allowed);
    assert!(d.bands[0].retry_after_ns <= 6_000_000_000, "{d:?}");
}

#[tokio::test]
async fn one_script_call_per_decision() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = storage(&server.url()).await;
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .tier("bands", [Quota::per_second(3), Quota::per_day(100)])
        .storage(redis)
        .build();
    // warm up: the first call loads the script
    tiers.check("warm", "free", 1).await.unwrap().unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let mut decisions = 0;
    for i in 0..40 {
        let (tier, cost) = match i % 4 {
            0 => ("free", 1),
            1 => ("free", 3),
            2 => ("bands", 0),
            _ => ("bands", 2),
        };
        // admitted and denied alike
        let _ = tiers.check(&format!("u{}", i % 3), tier, cost).await.unwrap();
        decisions += 1;
    }
    let calls = server.command_calls("evalsha") + server.command_calls("eval");
    assert_eq!(calls, decisions);
    assert_eq!(
        server.command_calls("eval"),
        0,
        "steady state needs no script upload"
    );
}

#[tokio::test]
async fn script_flush_is_invisible_to_the_caller() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tiers = tiers(storage(&server.url()).await);
    assert_eq!(tiers.check("f", "one", 1).await.unwrap().unwrap().remaining, 36);
    server.cli(&["SCRIPT", "FLUSH"]);
    assert_eq!(tiers.check("f", "one", 1).await.unwrap().unwrap().remaining, 35);
    assert_eq!(tiers.check("f", "one", 1).await.unwrap().unwrap().remaining, 34);
}

#[tokio::test]
async fn evalsha_refused_falls_back_to_eval() {
    let Some(server) = RedisServer::start_with(&["--rename-command", "EVALSHA", ""]) else {
        return;
    };
    let tiers = tiers(storage(&server.url()).await);
    for left in (0..37).rev() {
        assert_eq!(tiers.check("e", "one", 1).await.unwrap().unwrap().remaining, left);
    }
    assert!(tiers.check("e", "one", 1).await.unwrap().is_err());
    assert_eq!(server.command_calls("eval"), 38);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_server_times_out_within_the_timeout() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let timeout = Duration::from_millis(200);
    let redis = RedisStorage::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let tiers = tiers(redis);
    tiers.check("s", "one", 1).await.unwrap().unwrap();
    let port = server.port().to_string();
    let sleeper = std::thread::spawn(move || {
        std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port, "DEBUG", "SLEEP", "1.5"])
            .output()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let err = tiers.check("s", "one", 1).await.unwrap_err();
    let took = started.elapsed();
    eprintln!("DEBUG SLEEP: check failed after {took:?}");
    let CheckError::Storage(e) = err else {
        panic!("expected a storage error, got {err:?}")
    };
    assert_eq!(e.kind(), StorageErrorKind::Timeout);
    assert!(
        took >= timeout && took < timeout + Duration::from_millis(250),
        "{took:?}"
    );
    let _ = sleeper.join();
    // once the server is awake again, checks pass (the timed-out one may
    // have been counted: remaining is 35 or 34)
    let info = tiers.check("s", "one", 1).await.unwrap().unwrap();
    assert!(info.remaining == 35 || info.remaining == 34, "{info:?}");
}

/// 16 tasks checking in a loop; returns (max latency, successes, storage
/// errors by kind) observed while `during` runs.
async fn under_load<F: std::future::Future<Output = ()>>(
    tiers: &RateTier,
    during: F,
) -> (Duration, u64, Vec<StorageErrorKind>) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let tiers = tiers.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut max = Duration::ZERO;
            let mut ok = 0u64;
            let mut errors = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let user = format!("load-{t}-{}", i % 50);
                let started = Instant::now();
                let result = tiers.check(&user, "one", 1).await;
                max = max.max(started.elapsed());
                match result {
                    Ok(_) => ok += 1,
                    Err(CheckError::Storage(e)) => {
                        errors.push(e.kind());
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            (max, ok, errors)
        }));
    }
    during.await;
    stop.store(true, Ordering::Relaxed);
    let mut max = Duration::ZERO;
    let mut ok = 0;
    let mut errors = Vec::new();
    for t in tasks {
        let (m, o, e) = t.await.expect("a checking task panicked");
        max = max.max(m);
        ok += o;
        errors.extend(e);
    }
    (max, ok, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_under_load_answers_within_the_timeout() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let timeout = Duration::from_millis(250);
    let tiers = tiers(
        RedisStorage::builder(server.url())
            .timeout(timeout)
            .connect()
            .await
            .unwrap(),
    );
    let (max, ok, errors) = under_load(&tiers, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.kill();
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    })
    .await;
    eprintln!(
        "kill -9 under load: max latency {max:?}, {ok} answered, {} storage errors",
        errors.len()
    );
    assert!(ok > 0, "no check passed before the kill");
    assert!(!errors.is_empty(), "no storage error after the kill");
    assert!(
        errors
            .iter()
            .all(|k| matches!(k, StorageErrorKind::Unavailable | StorageErrorKind::Timeout)),
        "{errors:?}"
    );
    assert!(max < timeout + Duration::from_millis(250), "max latency {max:?}");
    // still down: a check fails fast with the storage error
    let started = Instant::now();
    let err = tiers.check("down", "one", 1).await.unwrap_err();
    assert!(matches!(err, CheckError::Storage(_)), "{err:?}");
    assert!(started.elapsed() < timeout + Duration::from_millis(250));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_on_the_same_port_recovers_within_two_seconds() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let timeout = Duration::from_millis(250);
    let tiers = tiers(
        RedisStorage::builder(server.url())
            .timeout(timeout)
            .connect()
            .await
            .unwrap(),
    );
    tiers.check("r", "one", 1).await.unwrap().unwrap();
    server.kill();
    // a few checks meet the dead server (and start reconnecting)
    for _ in 0..5 {
        assert!(tiers.check("r", "one", 1).await.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.restart();
    let restarted = Instant::now();
    let recovered = loop {
        if let Ok(Ok(_)) = tiers.check("r", "one", 1).await {
            break restarted.elapsed();
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(2),
            "no successful check within 2 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("restart: first successful check {recovered:?} after the server was back");
    // the restarted server is empty (no persistence): a fresh state, all
    // calls succeeding, under load too
    let (max, ok, errors) = under_load(&tiers, tokio::time::sleep(Duration::from_millis(300))).await;
    // (a call slower than the timeout would be a Timeout error)
    assert!(errors.is_empty(), "{errors:?}");
    assert!(ok > 0, "no check passed after the restart (max latency {max:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_decision_after_an_outage_is_served() {
    // Sparse traffic: one decision during the outage, the next one a second
    // after Redis is back. That one must not fail on the refusal left over
    // from the reconnect attempt the outage started.
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let lazy = tiers(RedisStorage::builder(server.url()).connect_lazy().unwrap());
    let eager = tiers(storage(&server.url()).await);
    assert!(matches!(eager.check("e", "one", 1).await, Ok(Ok(_))));
    let mut server = tokio::task::spawn_blocking(move || {
        server.kill();
        server
    })
    .await
    .unwrap();
    assert!(lazy.check("l", "one", 1).await.is_err());
    assert!(eager.check("e", "one", 1).await.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // the restarted server is empty: fresh buckets
    assert_eq!(lazy.check("l", "one", 1).await.unwrap().unwrap().remaining, 36);
    assert_eq!(eager.check("e", "one", 1).await.unwrap().unwrap().remaining, 36);
    drop(server);
}

#[tokio::test]
async fn connecting_to_a_closed_port_fails_fast() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    drop(server);
    let started = Instant::now();
    let err = RedisStorage::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Unavailable, "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_lazy_storage_starts_while_redis_is_down() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    server.kill();
    let timeout = Duration::from_millis(250);
    // connecting now would fail; the lazy storage is built at once
    let lazy = RedisStorage::builder(server.url())
        .timeout(timeout)
        .connect_lazy()
        .expect("a lazy storage needs no server");
    let tiers = tiers(lazy);
    for _ in 0..3 {
        let started = Instant::now();
        match tiers.check("lazy", "one", 1).await {
            Err(CheckError::Storage(e)) => assert!(
                matches!(
                    e.kind(),
                    StorageErrorKind::Unavailable | StorageErrorKind::Timeout
                ),
                "{e}"
            ),
            other => panic!("a check while Redis is down: {other:?}"),
        }
        assert!(started.elapsed() < timeout + Duration::from_millis(250));
    }
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(2);
    let first = loop {
        if let Ok(Ok(info)) = tiers.check("lazy", "one", 1).await {
            break info;
        }
        assert!(
            Instant::now() < deadline,
            "no successful check within 2 s of the start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // counted in Redis from then on
    assert_eq!(first.remaining, 36);
    assert_eq!(
        tiers.check("lazy", "one", 1).await.unwrap().unwrap().remaining,
        35
    );
    assert!(server.command_calls("evalsha") + server.command_calls("eval") >= 2);
}

#[tokio::test]
async fn a_lazy_storage_needs_a_runtime_and_a_valid_url() {
    let err = std::thread::spawn(|| RedisStorage::builder("redis://127.0.0.1:1").connect_lazy().err())
        .join()
        .unwrap()
        .expect("outside a runtime");
    assert!(err.to_string().contains("tokio runtime"), "{err}");
    let err = RedisStorage::builder("no-such-scheme://x")
        .connect_lazy()
        .expect_err("bad URL");
    assert_eq!(err.kind(), StorageErrorKind::Other, "{err}");
    let err = RedisStorage::builder("redis://127.0.0.1:1")
        .prefix("a{b}")
        .connect_lazy()
        .expect_err("bad prefix");
    assert!(err.to_string().contains("prefix"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_cluster_storage_connects_with_the_first_decision() {
    let Some(cluster) = cluster() else { return };
    let lazy = tiers(
        RedisStorage::cluster(cluster.urls())
            .prefix("trt-cluster-lazy")
            .connect_lazy()
            .expect("a lazy cluster storage"),
    );
    for expected in [36, 35, 34] {
        let info = lazy.check("lazy", "one", 1).await.unwrap().unwrap();
        assert_eq!(info.remaining, expected);
    }
    // and a cluster that is not there: an error within the timeout, no hang
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    drop(server);
    let gone = tiers(
        RedisStorage::cluster([url])
            .timeout(Duration::from_millis(250))
            .connect_lazy()
            .expect("a lazy cluster storage"),
    );
    let started = Instant::now();
    assert!(matches!(
        gone.check("x", "one", 1).await,
        Err(CheckError::Storage(_))
    ));
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cluster_node_fails_its_keys_within_the_timeout_and_others_are_served() {
    let Some(mut cluster) = own_cluster() else { return };
    let timeout = Duration::from_millis(250);
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-node-down")
        .timeout(timeout)
        .connect()
        .await
        .expect("connect to the test cluster");
    let tiers = tiers(storage.clone());
    // 30 users, each with one check counted, spread over the three nodes
    let users: Vec<String> = (0..30).map(|i| format!("user-{i}")).collect();
    for user in &users {
        assert_eq!(tiers.check(user, "one", 1).await.unwrap().unwrap().remaining, 36);
    }
    // which node holds each user's key
    let owner = |user: &str| {
        let key = storage.key_for(key("one", user), 0);
        cluster
            .nodes()
            .iter()
            .position(|n| n.cli(&["EXISTS", &key]).trim() == "1")
            .expect("the key is on some node")
    };
    let owners: Vec<usize> = users.iter().map(|u| owner(u)).collect();
    assert!(
        owners.iter().any(|&o| o != 2) && owners.contains(&2),
        "{owners:?}"
    );
    cluster.nodes_mut()[2].kill();
    let killed = Instant::now();
    // within the cluster's node timeout (5 s) the other nodes still serve
    // their slots: their users are counted on; the dead node's users fail
    // fast, every call within the timeout (no hang, no panic)
    for round in 0..2 {
        for (user, &node) in users.iter().zip(&owners) {
            let started = Instant::now();
            let result = tiers.check(user, "one", 1).await;
            let took = started.elapsed();
            assert!(took < timeout + Duration::from_millis(250), "{user}: {took:?}");
            if node == 2 {
                assert!(
                    matches!(result, Err(CheckError::Storage(_))),
                    "{user}: {result:?}"
                );
            } else {
                let info = result.unwrap().unwrap();
                assert_eq!(info.remaining, 35 - round, "{user}");
            }
        }
    }
    // (all of it well inside the node timeout, after which a cluster without
    // replicas refuses every key)
    assert!(
        killed.elapsed() < Duration::from_secs(4),
        "{:?}",
        killed.elapsed()
    );
}

/// A TCP proxy to `target`: while `open` is false it accepts connections and
/// never answers (a hung link); once open it forwards, `delay` per chunk each
/// way. Returns its `redis://` URL.
async fn hanging_then_slow_proxy(target: String, open: Arc<AtomicBool>, delay: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        delay: Duration,
    ) {
        let mut buf = vec![0u8; 65536];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            tokio::time::sleep(delay).await;
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let target = target.clone();
            let open = open.load(Ordering::SeqCst);
            tokio::spawn(async move {
                if !open {
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    return drop(client);
                }
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let ((cr, cw), (sr, sw)) = (client.into_split(), server.into_split());
                tokio::join!(pump(cr, sw, delay), pump(sr, cw, delay));
            });
        }
    });
    format!("redis://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_cluster_connects_under_steady_traffic_after_a_hang_at_start() {
    // The cluster's seed is behind a link that hangs for 600 ms, then
    // forwards with 3 ms of delay each way; checks arrive one per ms with the
    // default 250 ms timeout. A connection attempt must not be cut short by
    // the check that started it timing out (every later attempt would then
    // get only the gap between two checks).
    let Some(cluster) = cluster() else { return };
    let seed = cluster.urls()[0].trim_start_matches("redis://").to_owned();
    let open = Arc::new(AtomicBool::new(false));
    let url = hanging_then_slow_proxy(seed, open.clone(), Duration::from_millis(3)).await;
    let tiers = tiers(
        RedisStorage::cluster([url])
            .prefix("trt-lazy-hang")
            .connect_lazy()
            .expect("a lazy cluster storage"),
    );
    let started = Instant::now();
    let mut opened = None;
    let first_ok: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    let mut checks = Vec::new();
    let mut i = 0u32;
    while started.elapsed() < Duration::from_millis(2_600) {
        if opened.is_none() && started.elapsed() > Duration::from_millis(600) {
            open.store(true, Ordering::SeqCst);
            opened = Some(Instant::now());
        }
        i += 1;
        let (tiers, first_ok) = (tiers.clone(), first_ok.clone());
        checks.push(tokio::spawn(async move {
            if let Ok(Ok(_)) = tiers.check(&format!("hang-{}", i % 50), "one", 1).await {
                first_ok.lock().unwrap().get_or_insert_with(Instant::now);
            }
        }));
        ticker.tick().await;
    }
    for check in checks {
        check.await.unwrap();
    }
    let opened = opened.expect("the link was opened");
    let first = first_ok
        .lock()
        .unwrap()
        .map(|at| at.saturating_duration_since(opened));
    // the attempt that started during the hang gives up after its own
    // timeout (1 s); the next one connects through the slow link
    assert!(
        first.is_some_and(|d| d < Duration::from_millis(1_500)),
        "first success {first:?} after the link opened"
    );
}

#[test]
fn an_attempt_stranded_on_an_idle_runtime_does_not_block_the_cluster_link() {
    // The first decision runs on a runtime that is then kept but no longer
    // driven, and leaves a connect attempt there (the seed hangs). Decisions
    // on a driven runtime must not wait on that attempt forever.
    let Some(cluster) = cluster() else { return };
    let serving = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seed = cluster.urls()[0].trim_start_matches("redis://").to_owned();
    let open = Arc::new(AtomicBool::new(false));
    let url = serving.block_on(hanging_then_slow_proxy(seed, open.clone(), Duration::ZERO));
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tiers = first.block_on(async {
        tiers(
            RedisStorage::cluster([url])
                .prefix("trt-idle-runtime")
                .connect_lazy()
                .unwrap(),
        )
    });
    assert!(first.block_on(tiers.check("idle", "one", 1)).is_err());
    open.store(true, Ordering::SeqCst);
    let served = serving.block_on(async {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            if let Ok(Ok(info)) = tiers.check("idle", "one", 1).await {
                return Some((started.elapsed(), info.remaining));
            }
        }
        None
    });
    // the stranded attempt is given up after its own timeout (1 s)
    assert!(
        served.is_some_and(|(after, remaining)| after < Duration::from_millis(2_500) && remaining == 36),
        "{served:?}"
    );
    drop(first);
}

/// A storage built in one runtime, used there, then used from another
/// runtime after the first has ended (a `static` storage shared by
/// `#[tokio::test]`s, say): at most one failed decision, then counted again.
fn outlives_its_first_runtime(make: impl std::future::Future<Output = RedisStorage>, user: &str) {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let storage = first.block_on(make);
    let tiers = tiers(storage);
    let remaining = |r: tower_rate_tier::CheckResult| r.ok().and_then(Result::ok).map(|i| i.remaining);
    assert_eq!(remaining(first.block_on(tiers.check(user, "one", 1))), Some(36));
    drop(first);
    let second = runtime();
    let results: Vec<Option<u32>> = (0..4)
        .map(|_| remaining(second.block_on(tiers.check(user, "one", 1))))
        .collect();
    let counted: Vec<u32> = results.iter().flatten().copied().collect();
    assert!(counted.len() >= 3, "{results:?}");
    assert_eq!(
        counted,
        (36 - counted.len() as u32..36).rev().collect::<Vec<_>>(),
        "{results:?}"
    );
}

#[test]
fn a_storage_outlives_the_runtime_of_its_first_decisions() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    outlives_its_first_runtime(
        async {
            RedisStorage::builder(url.clone())
                .prefix("rt-a")
                .connect_lazy()
                .unwrap()
        },
        "a",
    );
    outlives_its_first_runtime(
        async {
            RedisStorage::builder(url.clone())
                .prefix("rt-b")
                .connect()
                .await
                .unwrap()
        },
        "b",
    );
    let Some(cluster) = cluster() else { return };
    let urls = cluster.urls();
    outlives_its_first_runtime(
        async {
            RedisStorage::cluster(urls.clone())
                .prefix("rt-c")
                .connect_lazy()
                .unwrap()
        },
        "c",
    );
    outlives_its_first_runtime(
        async {
            RedisStorage::cluster(urls.clone())
                .prefix("rt-d")
                .connect()
                .await
                .unwrap()
        },
        "d",
    );
}

// ------------------------------------------------------- under the layer

fn identity(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    Some(TierIdentity::new(user, "free"))
}

#[tier_cost(5)]
async fn search() -> &'static str {
    "hits"
}

fn app(storage: RedisStorage, policy: OnStorageError, calls: &Arc<AtomicU32>) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(1_000))
        .storage(storage)
        .build();
    let counted = {
        let calls = calls.clone();
        move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            "ok"
        }
    };
    Router::new()
        .route("/plain", get(counted))
        .route("/export", get(|| async { "csv" }).layer(tier_cost(20)))
        .route("/search", get(search))
        .layer(
            TierLimitLayer::new(tiers)
                .identifier_fn(identity)
                .on_storage_error(policy),
        )
}

/// (status, X-RateLimit-Remaining) of `GET path` as `user`.
async fn get_as(app: &Router, path: &str, user: &str) -> (u16, Option<u32>) {
    let req = Request::builder()
        .uri(path)
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let remaining = res
        .headers()
        .get("x-ratelimit-remaining")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (res.status().as_u16(), remaining)
}

#[tokio::test]
async fn layer_one_script_call_per_request_including_costed_routes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let calls = Arc::new(AtomicU32::new(0));
    let app = app(storage(&server.url()).await, OnStorageError::Deny, &calls);
    // the first request of a costed route teaches the edge its cost
    assert_eq!(get_as(&app, "/export", "ada").await, (200, Some(980)));
    assert_eq!(get_as(&app, "/search", "ada").await, (200, Some(975)));
    server.cli(&["CONFIG", "RESETSTAT"]);
    let mut requests = 0;
    let mut expected = 975;
    for _ in 0..10 {
        for (path, cost) in [("/plain", 1), ("/export", 20), ("/search", 5)] {
            expected -= cost;
            assert_eq!(get_as(&app, path, "ada").await, (200, Some(expected)), "{path}");
            requests += 1;
        }
    }
    let calls_seen = server.command_calls("evalsha") + server.command_calls("eval");
    assert_eq!(calls_seen, requests, "script calls for {requests} requests");
    assert_eq!(calls.load(Ordering::SeqCst), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_fails_open_or_closed_while_redis_is_down() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let timeout = Duration::from_millis(250);
    let connect = || async {
        RedisStorage::builder(server.url())
            .timeout(timeout)
            .connect()
            .await
            .unwrap()
    };
    let calls = Arc::new(AtomicU32::new(0));
    let open = app(connect().await, OnStorageError::Allow, &calls);
    let closed = app(connect().await, OnStorageError::Deny, &calls);
    assert_eq!(get_as(&open, "/plain", "ada").await, (200, Some(999)));
    assert_eq!(get_as(&closed, "/plain", "ada").await, (200, Some(998)));
    server.kill();
    for _ in 0..5 {
        let started = Instant::now();
        // fail open: served, without rate-limit fields
        assert_eq!(get_as(&open, "/plain", "ada").await, (200, None));
        // fail closed: 503, the handler is not called
        assert_eq!(get_as(&closed, "/plain", "ada").await, (503, None));
        assert!(started.elapsed() < 2 * (timeout + Duration::from_millis(250)));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2 + 5);
    server.restart();
    // each app's connection recovers by itself: limited again within 2 s
    // (the restarted server is empty, so remaining starts afresh)
    let deadline = Instant::now() + Duration::from_secs(2);
    for (app, user) in [(&closed, "bob"), (&open, "eve")] {
        loop {
            match get_as(app, "/plain", user).await {
                (200, Some(remaining)) => {
                    assert_eq!(remaining, 999);
                    break;
                }
                other => assert!(Instant::now() < deadline, "{other:?} 2 s after the restart"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
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
    let tiers = exactness::tiers(
        RateTier::builder().storage(storage(&server.url()).await),
        shared,
        own,
    );
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
