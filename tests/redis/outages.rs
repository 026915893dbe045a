//! Outages as an attacker meets them: cached denials answering while Redis
//! is dead or asleep, and a Redis whose memory is full. The fallback keeps
//! limiting in each: it counts an outage from what Redis itself answered,
//! and takes every "cannot write" reply as Redis being down.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tower_rate_tier::storage::{DecisionSource, Fallback, Op, RedisStorage, Storage as _, StorageErrorKind};
use tower_rate_tier::{CheckError, Quota, RateTier};
use tower_rate_tier_tests::redis::RedisServer;

use super::key;

const TIMEOUT: Duration = Duration::from_millis(250);
/// What a decision may take beyond the timeout on a loaded test machine.
const SLACK: Duration = Duration::from_millis(250);
const DAY: Quota = Quota::per_day(100);

/// `per_day(100)` over a fallback with a share of 25 (four instances):
/// "spent" has used the whole quota (its denial is cached), "last" has one
/// unit left.
async fn spent_and_last(server: &RedisServer) -> (RateTier, Fallback<RedisStorage>) {
    let redis = RedisStorage::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    assert!(redis.has_deny_cache());
    let storage = Fallback::builder(redis)
        .instances(4)
        .failures_to_switch(3)
        .probe_interval(Duration::from_millis(400))
        .build();
    let tiers = RateTier::builder()
        .tier("free", DAY)
        .storage(storage.clone())
        .build();
    assert!(tiers.check("spent", "free", 100).await.unwrap().is_ok());
    assert!(tiers.check("spent", "free", 1).await.unwrap().is_err());
    assert!(tiers.check("last", "free", 99).await.unwrap().is_ok());
    (tiers, storage)
}

/// 400 decisions for "last", each after a retry of "spent" (answered from
/// the deny cache until the fallback answers locally): how many of each
/// were admitted, how many decisions went by before the fallback answered
/// locally, the slowest.
async fn hammer(tiers: &RateTier, storage: &Fallback<RedisStorage>) -> Hammered {
    let mut seen = Hammered::default();
    for i in 0..400 {
        let started = Instant::now();
        let spent = tiers
            .check("spent", "free", 1)
            .await
            .expect("the fallback always decides");
        seen.spent += u32::from(spent.is_ok());
        seen.last += u32::from(tiers.check("last", "free", 1).await.expect("decided").is_ok());
        seen.slowest = seen.slowest.max(started.elapsed());
        if seen.local_after.is_none() && storage.is_local() {
            seen.local_after = Some(i + 1);
        }
    }
    seen
}

#[derive(Debug, Default)]
struct Hammered {
    spent: u32,
    last: u32,
    local_after: Option<usize>,
    slowest: Duration,
}

impl Hammered {
    /// Each user gets at most the local share (and "last" its unit left in
    /// Redis), the fallback answers locally after a few decisions, and none
    /// waits longer than the timeout.
    fn assert_limited(&self) {
        assert!(self.last <= 25 + 1, "{self:?}");
        assert!(self.spent <= 25, "{self:?}");
        assert!(self.local_after.is_some_and(|n| n <= 3), "{self:?}");
        assert!(self.slowest < TIMEOUT + SLACK, "{self:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_denials_do_not_hide_a_killed_redis() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let (tiers, storage) = spent_and_last(&server).await;
    server.kill();
    let seen = hammer(&tiers, &storage).await;
    println!("killed: {seen:?} (admitted of 400 each)");
    seen.assert_limited();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_denials_do_not_hide_a_paused_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (tiers, storage) = spent_and_last(&server).await;
    server.pause(true);
    let started = Instant::now();
    let seen = hammer(&tiers, &storage).await;
    let took = started.elapsed();
    server.pause(false);
    println!("paused: {seen:?} (admitted of 400 each), all in {took:?}");
    // three timeouts switch it; from then on no decision waits for Redis
    // (a probe runs in the background)
    seen.assert_limited();
    assert!(took < TIMEOUT * 3 + Duration::from_secs(3), "{took:?}");
}

/// A `redis-server --maxmemory 3mb` (the default `noeviction` policy),
/// filled by a flood of distinct identities until it answers `OOM`.
async fn full_redis(batching: bool) -> Option<(RedisServer, RedisStorage)> {
    let server = RedisServer::start_with(&["--maxmemory", "3mb"])?;
    let redis = RedisStorage::builder(server.url())
        .timeout(Duration::from_secs(2))
        .batching(batching)
        .connect()
        .await
        .unwrap();
    let full = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (redis, full) = (redis.clone(), full.clone());
        tasks.push(tokio::spawn(async move {
            let clock: Arc<dyn tower_rate_tier::clock::Clock> = Arc::new(tower_rate_tier::clock::SystemClock);
            for i in 0..20_000u32 {
                if full.load(Ordering::Relaxed) > 0 {
                    return;
                }
                let user = format!("flood-{t}-{i}");
                let bands = [Quota::per_day(5), Quota::per_hour(3)];
                match redis
                    .decide(key("free", &user), &bands, Op::Charge(1), &clock)
                    .await
                {
                    Ok(_) => {}
                    Err(e) => {
                        assert_eq!(e.kind(), StorageErrorKind::Unavailable, "{e}");
                        assert!(e.to_string().contains("OOM"), "{e}");
                        full.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(full.load(Ordering::Relaxed) > 0, "the flood never filled Redis");
    // Once the flood's connections go idle, Redis frees their buffers and a
    // few writes fit again until the flood goes on. Keep it full, as a flood
    // that goes on would: the limit below what the server holds.
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    Some((server, redis))
}

async fn a_full_redis_is_an_outage(batching: bool) {
    let Some((_server, redis)) = full_redis(batching).await else {
        return;
    };
    // without a fallback: the storage's error, for `OnStorageError`
    let alone = RateTier::builder()
        .tier("free", Quota::per_day(5))
        .storage(redis.clone())
        .build();
    match alone.check("newcomer", "free", 1).await {
        Err(CheckError::Storage(e)) => assert_eq!(e.kind(), StorageErrorKind::Unavailable, "{e}"),
        other => panic!("a full Redis must not decide: {other:?}"),
    }
    // with one: the local share (all of it for one instance), never more
    let storage = Fallback::builder(redis).build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(5))
        .storage(storage.clone())
        .build();
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += u32::from(tiers.check("newcomer", "free", 1).await.expect("decided").is_ok());
    }
    println!("full Redis (batching {batching}): a per_day(5) user admitted {admitted} of 100");
    assert_eq!(admitted, 5);
    assert!(storage.is_local());
    let clock: Arc<dyn tower_rate_tier::clock::Clock> = Arc::new(tower_rate_tier::clock::SystemClock);
    let d = storage
        .decide(
            key("free", "newcomer"),
            &[Quota::per_day(5)],
            Op::Charge(0),
            &clock,
        )
        .await
        .unwrap();
    assert_eq!(d.source, DecisionSource::Fallback);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_is_an_outage_for_single_calls() {
    a_full_redis_is_an_outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_is_an_outage_for_batches() {
    a_full_redis_is_an_outage(true).await;
}
