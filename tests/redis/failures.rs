//! A slow, dead, restarted or missing server: bounded failures, then recovery.

use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tower_rate_tier::storage::{RedisStorage, StorageErrorKind};
use tower_rate_tier::{CheckError, Quota, RateTier};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::RedisServer;

use super::{key, storage, tiers};

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
    // the error says what was attempted, and keeps redis-rs's error
    assert_eq!(
        err.to_string(),
        "rate-limit storage unavailable: connecting to Redis failed: connection refused"
    );
    let source = err.source().and_then(|s| s.downcast_ref::<redis::RedisError>());
    assert!(
        source.is_some_and(redis::RedisError::is_connection_refusal),
        "{source:?}"
    );
    // a decision of a lazy storage names its operation, and no key or user
    let lazy = RedisStorage::builder(url).connect_lazy().unwrap();
    let err = lazy
        .check(key("free", "alice@example.com"), &[Quota::per_minute(10)], 1)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rate-limit storage unavailable: Redis charge failed: connection refused"
    );
    let source = err.source().and_then(|s| s.downcast_ref::<redis::RedisError>());
    assert!(
        source.is_some_and(redis::RedisError::is_connection_refusal),
        "{source:?}"
    );
    let err = lazy
        .give_back(key("free", "alice@example.com"), &[Quota::per_minute(10)], 1)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Redis refund failed"), "{err}");
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

/// Redis restarted while no decision was under way (a quick restart in a
/// quiet hour): the first decision once it is back is served, not failed on
/// the connection the restart dropped. The same, batching off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_decision_after_a_quiet_restart_is_served() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let batched = tiers(storage(&server.url()).await);
    let single = tiers(
        RedisStorage::builder(server.url())
            .batching(false)
            .connect()
            .await
            .unwrap(),
    );
    for (t, user) in [(&batched, "ada"), (&single, "bob")] {
        assert_eq!(t.check(user, "one", 1).await.unwrap().unwrap().remaining, 36);
    }
    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.kill();
        server.restart();
        server
    })
    .await
    .unwrap();
    for (t, user) in [(&batched, "ada"), (&single, "bob")] {
        // the restarted server is empty: a fresh bucket
        let first = t.check(user, "one", 1).await;
        assert!(
            matches!(&first, Ok(Ok(info)) if info.remaining == 36),
            "{first:?}"
        );
    }
    drop(server);
}

/// A server that closes idle clients (`timeout 1` in its configuration, as
/// managed Redis services set; a NAT or a proxy does the same): the first
/// decision after an idle spell is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_decision_after_the_server_closed_an_idle_connection_is_served() {
    let Some(server) = RedisServer::start_with(&["--timeout", "1"]) else {
        return;
    };
    let t = tiers(storage(&server.url()).await);
    assert_eq!(t.check("ada", "one", 1).await.unwrap().unwrap().remaining, 36);
    // idle for longer than the server keeps an idle client
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first = t.check("ada", "one", 1).await;
    assert!(
        matches!(&first, Ok(Ok(info)) if info.remaining == 35),
        "{first:?}"
    );
}
