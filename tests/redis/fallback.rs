//! The fallback around Redis: a killed, sleeping or partly dead Redis is
//! answered locally with the instance's share, and Redis takes over again
//! once it answers.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request};
use tower::ServiceExt;
use tower_rate_tier::storage::{DecisionSource, Fallback, Op, RedisStorage, Storage as _};
use tower_rate_tier::{CheckError, OnStorageError, Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_tests::redis::{RedisServer, own_cluster};

use super::key;

const TIMEOUT: Duration = Duration::from_millis(250);
const PROBE: Duration = Duration::from_millis(400);
/// What a decision may take beyond the timeout on a loaded test machine.
const SLACK: Duration = Duration::from_millis(250);

/// When the fallback switched (`true`: answering locally), as seen by its
/// callback.
type Switches = Arc<Mutex<Vec<(bool, Instant)>>>;

fn fallback(redis: RedisStorage, switches: &Switches) -> Fallback<RedisStorage> {
    let seen = switches.clone();
    Fallback::builder(redis)
        .instances(4)
        .failures_to_switch(3)
        .probe_interval(PROBE)
        .on_switch(move |local| seen.lock().unwrap().push((local, Instant::now())))
        .build()
}

fn identity(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    Some(TierIdentity::new(user, "free"))
}

/// The layer over the fallback, failing closed: any storage error that got
/// through would be a 503.
fn app(storage: Fallback<RedisStorage>) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(40))
        .storage(storage)
        .build();
    Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers)
            .identifier_fn(identity)
            .on_storage_error(OnStorageError::Deny),
    )
}

/// What 16 clients saw while `during` ran: statuses, the slowest answer,
/// and per user the admissions.
#[derive(Debug, Default)]
struct Seen {
    ok: AtomicU64,
    limited: AtomicU64,
    other: AtomicU64,
    slowest_ms: AtomicU64,
    admitted: Vec<AtomicU32>,
}

impl Seen {
    fn summary(&self) -> String {
        let most = self.admitted.iter().map(|a| a.load(Ordering::Relaxed)).max();
        format!(
            "{} admitted, {} limited, {} other, slowest {} ms, most admitted for one user {most:?}",
            self.ok.load(Ordering::Relaxed),
            self.limited.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
            self.slowest_ms.load(Ordering::Relaxed)
        )
    }
}

async fn load<F: std::future::Future<Output = ()>>(app: &Router, users: usize, during: F) -> Arc<Seen> {
    let seen = Arc::new(Seen {
        admitted: (0..users).map(|_| AtomicU32::new(0)).collect(),
        ..Seen::default()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (app, seen, stop) = (app.clone(), seen.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let user = i % users;
                let req = Request::builder()
                    .uri("/")
                    .header("x-user", format!("user-{user}"))
                    .body(Body::empty())
                    .unwrap();
                let started = Instant::now();
                let status = app.clone().oneshot(req).await.unwrap().status().as_u16();
                seen.slowest_ms
                    .fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                match status {
                    200 => {
                        seen.ok.fetch_add(1, Ordering::Relaxed);
                        seen.admitted[user].fetch_add(1, Ordering::Relaxed);
                    }
                    429 => {
                        seen.limited.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        seen.other.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    during.await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("a client task panicked");
    }
    seen
}

/// Whether a decision of `redis` through `storage` comes from Redis now.
async fn from_redis(storage: &Fallback<RedisStorage>, user: &str) -> bool {
    let clock: Arc<dyn tower_rate_tier::clock::Clock> = Arc::new(tower_rate_tier::clock::SystemClock);
    let d = storage
        .decide(key("free", user), &[Quota::per_minute(40)], Op::Charge(0), &clock)
        .await
        .expect("the fallback always decides");
    d.source == DecisionSource::Storage
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_redis_is_answered_locally_and_takes_over_again_after_a_restart() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let switches = Switches::default();
    let storage = fallback(redis, &switches);
    let app = app(storage.clone());
    let outage = load(&app, 400, async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.kill();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    })
    .await;
    println!("kill -9 under load: {}", outage.summary());
    assert_eq!(
        outage.other.load(Ordering::Relaxed),
        0,
        "no 5xx through the layer"
    );
    assert!(outage.limited.load(Ordering::Relaxed) > 0);
    assert!(Duration::from_millis(outage.slowest_ms.load(Ordering::Relaxed)) < TIMEOUT + SLACK);
    assert!(storage.is_local());
    // each user: the first part of its quota from Redis (before the kill),
    // then its share locally (a quarter of 40, plus a unit refilled every
    // 6 s at the share's rate)
    for admitted in &outage.admitted {
        assert!(
            admitted.load(Ordering::Relaxed) <= 40 + 11,
            "{}",
            outage.summary()
        );
    }
    assert_eq!(
        switches.lock().unwrap().iter().map(|s| s.0).collect::<Vec<_>>(),
        [true]
    );
    // local decisions ask nothing of Redis
    assert!(!from_redis(&storage, "probe-less").await);
    // a cost above the share's burst (10) takes the share whole, then is a
    // denial; one above the tier's burst (40) the limiter's refusal as ever
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(40))
        .storage(storage.clone())
        .build();
    let whole = tiers.check("costly", "free", 11).await.unwrap().unwrap();
    assert_eq!(whole.remaining, 0);
    assert!(tiers.check("costly", "free", 11).await.unwrap().is_err());
    assert!(matches!(
        tiers.check("costly", "free", 41).await,
        Err(CheckError::CostExceedsLimit { .. })
    ));
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let restarted = Instant::now();
    let back = load(&app, 400, async {
        while storage.is_local() {
            assert!(
                restarted.elapsed() < PROBE + SLACK,
                "still local after {:?}",
                restarted.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    println!("back on Redis {:?} after the restart", restarted.elapsed());
    assert_eq!(back.other.load(Ordering::Relaxed), 0);
    assert!(from_redis(&storage, "after").await);
    assert_eq!(
        switches.lock().unwrap().iter().map(|s| s.0).collect::<Vec<_>>(),
        [true, false]
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sleeping_redis_is_answered_within_the_timeout_and_resumes_after() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let switches = Switches::default();
    let storage = fallback(redis, &switches);
    let app = app(storage.clone());
    let port = server.port().to_string();
    let slept = load(&app, 400, async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let sleeping = tokio::task::spawn_blocking(move || {
            std::process::Command::new("redis-cli")
                .args(["-p", &port, "DEBUG", "SLEEP", "1.2"])
                .output()
        });
        sleeping.await.unwrap().unwrap();
    })
    .await;
    let awake = Instant::now();
    println!("DEBUG SLEEP under load: {}", slept.summary());
    assert_eq!(slept.other.load(Ordering::Relaxed), 0, "no 5xx through the layer");
    let slowest = Duration::from_millis(slept.slowest_ms.load(Ordering::Relaxed));
    assert!(slowest < TIMEOUT + SLACK, "{slowest:?}");
    assert!(
        slowest >= TIMEOUT,
        "decisions did meet the sleeping server: {slowest:?}"
    );
    let went_local = switches.lock().unwrap().first().copied();
    assert!(matches!(went_local, Some((true, _))), "{went_local:?}");
    // awake: back on Redis within one probe interval
    let back = loop {
        if from_redis(&storage, "awake").await {
            break awake.elapsed();
        }
        assert!(awake.elapsed() < PROBE + SLACK, "still local");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    println!("back on Redis {back:?} after the server woke");
    assert!(!storage.is_local());
}

/// One dead node of three: its keys are answered locally, the other nodes'
/// keys stay on Redis (failure domains by hash slot), nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cluster_node_sends_only_its_keys_to_the_fallback() {
    let Some(mut cluster) = own_cluster() else { return };
    let redis = RedisStorage::cluster(cluster.urls())
        .prefix("trt-fallback")
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let domains = redis.clone();
    let switched = Arc::new(AtomicU32::new(0));
    let seen = switched.clone();
    let storage = Fallback::builder(redis.clone())
        .instances(3)
        .failures_to_switch(2)
        .probe_interval(Duration::from_secs(10))
        .domains(move |key| domains.failure_domain(key))
        .on_switch(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .build();
    let clock: Arc<dyn tower_rate_tier::clock::Clock> = Arc::new(tower_rate_tier::clock::SystemClock);
    let bands = [Quota::per_day(30)];
    let users: Vec<String> = (0..30).map(|i| format!("node-user-{i}")).collect();
    for user in &users {
        let d = storage
            .decide(key("t", user), &bands, Op::Charge(1), &clock)
            .await
            .unwrap();
        assert_eq!(d.source, DecisionSource::Storage);
    }
    let owner = |user: &str| {
        let name = redis.band_key(key("t", user), &bands[0]);
        cluster
            .nodes()
            .iter()
            .position(|n| n.cli(&["EXISTS", &name]).trim() == "1")
            .expect("the key is on some node")
    };
    let owners: Vec<usize> = users.iter().map(|u| owner(u)).collect();
    assert!(
        owners.contains(&2) && owners.iter().any(|&o| o != 2),
        "{owners:?}"
    );
    cluster.nodes_mut()[2].kill();
    for round in 0..3 {
        for (user, &node) in users.iter().zip(&owners) {
            let started = Instant::now();
            let d = storage
                .decide(key("t", user), &bands, Op::Charge(1), &clock)
                .await
                .unwrap();
            assert!(
                started.elapsed() < TIMEOUT + SLACK,
                "{user}: {:?}",
                started.elapsed()
            );
            if node == 2 {
                assert_eq!(d.source, DecisionSource::Fallback, "{user} round {round}");
                // a third of 30: 10 afresh, the first charged in this spell
                assert_eq!(d.bands[0].remaining, 9 - round, "{user}");
            } else {
                assert_eq!(d.source, DecisionSource::Storage, "{user} round {round}");
                assert_eq!(d.bands[0].remaining, 28 - round, "{user}");
            }
        }
    }
    assert!(storage.is_local());
    assert_eq!(switched.load(Ordering::SeqCst), 1, "one report, not one per slot");
}

/// While Redis is down, each unit of a tier has the instance's share, as
/// the request bands do: a quarter of the tokens and of each images band
/// for four instances, with a quarter of the debt bound, from a fresh local
/// state (what the user used in Redis is not known locally).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_each_unit_has_its_share() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let storage = Fallback::builder(redis)
        .instances(4)
        .failures_to_switch(1)
        .build();
    // our side's clock decides locally: exact waits
    let clock = tower_rate_tier::clock::FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(100))
        .tier_unit("free", "tokens", Quota::per_day(1_000))
        .tier_unit("free", "images", [Quota::per_day(40), Quota::per_week(100)])
        .clock(clock)
        .storage(storage.clone())
        .build();
    tiers.record("ada", "free", "tokens", 900).await.unwrap();
    let before = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!(before.source(), DecisionSource::Storage);
    server.kill();

    // tokens: 250 of 1,000
    let tokens = tiers
        .reserve("ada", "free", "tokens", 250)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tokens.source(), DecisionSource::Fallback);
    assert!(storage.is_local());
    let refused = tiers
        .reserve("ada", "free", "tokens", 1)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.source(), DecisionSource::Fallback);
    assert_eq!(refused.violated_policies().collect::<Vec<_>>(), ["free.tokens"]);
    // images: 10 of the day's 40 (the week's 25 of 100 do not bind)
    let images = tiers.reserve("ada", "free", "images", 10).await.unwrap().unwrap();
    let left: Vec<u32> = images
        .bands()
        .filter(|(q, _)| q.unit().as_str() == "images")
        .map(|(_, s)| s.remaining)
        .collect();
    assert_eq!(left, [0, 15]);
    let refused = tiers
        .reserve("ada", "free", "images", 1)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.violated_policies().collect::<Vec<_>>(), ["free.images.0"]);
    // usage beyond the reservation goes into a local debt of at most a
    // quarter of the bound (250 of 1,000): the next request waits for the
    // debt and a token at the share's rate (one token every 345.6 s); the
    // images at zero refuse it too
    tiers.settle("ada", "free", "tokens", 250, 900).await.unwrap();
    let waiting = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(waiting.source(), DecisionSource::Fallback);
    assert_eq!(waiting.retry_after, Duration::from_millis(345_600) * 251);
    assert_eq!(
        waiting.violated_policies().collect::<Vec<_>>(),
        ["free.tokens", "free.images.0"]
    );
    // another user has a share of each unit of her own
    let bob = tiers.check("bob", "free", 1).await.unwrap().unwrap();
    assert_eq!(bob.source(), DecisionSource::Fallback);
    let shares: Vec<u32> = bob.bands().map(|(_, s)| s.remaining).collect();
    assert_eq!(shares, [24, 250, 10, 25], "requests, tokens, images");
}
