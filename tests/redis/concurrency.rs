//! Concurrency limits in Redis: instances share the count of requests in
//! flight, a dead instance's slots come back after the lease, an acquire is
//! one script call (on a Cluster too) that takes no slot when the rate
//! refuses, the deny cache never repeats a concurrency refusal, and the
//! fallback gives each instance its share of the slots while Redis is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing;
use http::{HeaderMap, Request, StatusCode};
use tower::ServiceExt;
use tower_rate_tier::clock::{Clock, FakeClock, SystemClock};
use tower_rate_tier::storage::{Decision, Fallback, Op, RedisStorage, Slots, Storage};
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::{RedisServer, cluster};

use super::{key, script_only, storage};

fn identity(headers: &HeaderMap) -> Option<TierIdentity> {
    Some(TierIdentity::new(headers.get("x-user")?.to_str().ok()?, "free"))
}

/// One instance of the application on `storage`: `/` answers a body that
/// holds its slot until it is dropped (unread).
fn instance(storage: impl Storage, rate: Quota, slots: u32) -> Router {
    let tiers = RateTier::builder()
        .tier("free", rate)
        .tier_concurrency("free", slots)
        .storage(storage)
        .build();
    Router::new()
        .route("/", routing::get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identity))
}

async fn get(app: &Router, user: &str) -> http::Response<axum::body::Body> {
    let req = Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap()
}

async fn acquire(storage: &impl Storage, user: &str, limit: u32, lease: Duration) -> Decision {
    acquire_at(storage, user, Quota::per_hour(1_000), limit, lease).await
}

/// An acquire of one slot of `limit` and one unit of `rate`.
async fn acquire_at(
    storage: &impl Storage,
    user: &str,
    rate: Quota,
    limit: u32,
    lease: Duration,
) -> Decision {
    let op = Op::Acquire {
        cost: 1,
        slots: Slots { limit, lease },
    };
    decide(storage, user, rate, op).await
}

async fn decide(storage: &impl Storage, user: &str, rate: Quota, op: Op) -> Decision {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    storage
        .decide(key("free", user), &[rate], op, &clock)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_count() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let one = instance(storage(&server.url()).await, Quota::per_minute(100), 2);
    let two = instance(storage(&server.url()).await, Quota::per_minute(100), 2);
    let a = get(&one, "ada").await;
    let b = get(&two, "ada").await;
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(get(&one, "ada").await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get(&two, "ada").await.status(), StatusCode::TOO_MANY_REQUESTS);
    // another user has slots of their own
    assert_eq!(get(&one, "bob").await.status(), StatusCode::OK);
    // a response over on one instance frees a slot for the other; the
    // release is sent in a task of its own, so wait for it to land
    drop(a);
    let mut admitted = None;
    for _ in 0..200 {
        let response = get(&two, "ada").await;
        if response.status() == StatusCode::OK {
            admitted = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        admitted.is_some(),
        "the slot given back on one instance never reached the other"
    );
    drop((b, admitted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_slots_come_back_after_the_lease() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let lease = Duration::from_secs(2);
    let dead = storage(&server.url()).await;
    let started = Instant::now();
    assert!(acquire(&dead, "ada", 1, lease).await.allowed);
    // the instance dies holding its slot: no release is ever sent
    drop(dead);
    let alive = storage(&server.url()).await;
    let refused = acquire(&alive, "ada", 1, lease).await;
    if started.elapsed() < lease {
        assert!(!refused.allowed && refused.slots.unwrap().refused);
    }
    // the lease passes: the slot is free again
    let mut waited = 0;
    while !acquire(&alive, "ada", 1, lease).await.allowed {
        waited += 1;
        assert!(waited < 200, "the dead instance's slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= lease, "admitted before the lease ended");
    // and the set holds one lease, the live one (it expires with it)
    let key = server.cli(&["--scan", "--pattern", "*slots"]);
    assert_eq!(server.cli(&["ZCARD", key.trim()]).trim(), "1");
    let ttl: i64 = server.cli(&["PTTL", key.trim()]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 2_001, "{ttl}");
}

/// Two instances with different leases share a user's slots (a rolling
/// deploy that changes the lease): a slot taken with a short lease does not
/// shorten the life of one taken with a long lease, in Redis as in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_keeps_the_slot_of_a_longer_one() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis: Arc<dyn Storage> = Arc::new(storage(&server.url()).await);
    let memory: Arc<dyn Storage> = Arc::new(tower_rate_tier::storage::MemoryStorage::new());
    for (name, s) in [("memory", memory), ("redis", redis)] {
        assert!(
            acquire(&s, "ada", 2, Duration::from_secs(600)).await.allowed,
            "{name}"
        );
        assert!(
            acquire(&s, "ada", 2, Duration::from_millis(50)).await.allowed,
            "{name}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        // the short lease has passed; the long one still holds its slot
        let third = acquire(&s, "ada", 2, Duration::from_secs(600)).await;
        assert!(third.allowed, "{name}");
        let fourth = acquire(&s, "ada", 2, Duration::from_secs(600)).await;
        assert!(
            !fourth.allowed,
            "{name}: three requests in flight under a limit of 2"
        );
    }
    let key = server.cli(&["--scan", "--pattern", "*slots"]);
    let ttl: i64 = server.cli(&["PTTL", key.trim()]).trim().parse().unwrap();
    assert!(ttl > 590_000, "the set expires with its longest lease: {ttl} ms");
}

/// Waits until no slot is taken in the server (the releases of ended
/// responses are sent in tasks of their own).
async fn settle(server: &RedisServer) {
    for _ in 0..400 {
        let keys = server.cli(&["--scan", "--pattern", "*slots"]);
        let taken = keys
            .split_whitespace()
            .any(|key| server.cli(&["ZCARD", key]).trim() != "0");
        if !taken {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a slot is still taken after every response ended");
}

/// A request that goes away while its acquire waits for Redis (a timeout
/// layer gave up, the client left) holds no slot: the script takes one when
/// it runs all the same, and the limiter gives it back once the answer
/// comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_its_acquire_waits_gives_the_slot_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let app = instance(storage(&server.url()).await, Quota::per_minute(100), 1);
    // connected, the script loaded
    drop(get(&app, "ada").await);
    settle(&server).await;
    server.pause(true);
    let gave_up = tokio::time::timeout(Duration::from_millis(50), get(&app, "ada")).await;
    server.pause(false);
    assert!(gave_up.is_err(), "answered while Redis was paused");
    // the acquire of the request that went away ran, and its slot is back
    settle(&server).await;
    assert_eq!(get(&app, "ada").await.status(), StatusCode::OK);
}

async fn body(response: http::Response<Body>) -> String {
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_one_limit_consumes_nothing_of_the_other() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let app = instance(storage(&server.url()).await, Quota::per_hour(3), 1);
    let held = get(&app, "ada").await;
    for _ in 0..4 {
        assert_eq!(get(&app, "ada").await.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    drop(held);
    settle(&server).await;
    // two more fit the rate: the concurrency refusals charged nothing
    for _ in 0..2 {
        let response = get(&app, "ada").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body(response).await, "ok");
        settle(&server).await;
    }
    // refused by rate: it names the rate band, and holds no slot
    let refused = get(&app, "ada").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let refused = body(refused).await;
    assert!(refused.contains(r#""violated-policies":["free"]"#), "{refused}");
    settle(&server).await;
}

/// What the server ran, from `INFO commandstats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ran {
    evalsha: u64,
    eval: u64,
    zadd: u64,
    zrem: u64,
    set: u64,
}

impl Ran {
    fn now(server: &RedisServer) -> Ran {
        let info = server.cli(&["INFO", "commandstats"]);
        let calls = |command| tower_rate_tier_tests::redis::command_calls(&info, command);
        Ran {
            evalsha: calls("evalsha"),
            eval: calls("eval"),
            zadd: calls("zadd"),
            zrem: calls("zrem"),
            set: calls("set"),
        }
    }

    fn since(self, before: Ran) -> Ran {
        Ran {
            evalsha: self.evalsha - before.evalsha,
            eval: self.eval - before.eval,
            zadd: self.zadd - before.zadd,
            zrem: self.zrem - before.zrem,
            set: self.set - before.set,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_is_one_script_call_whatever_its_outcome() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // every decision its own call, none answered in process
    let storage = script_only(&server.url()).await;
    let lease = Duration::from_secs(60);
    let rate = Quota::per_hour(2);
    // the script is loaded (a NOSCRIPT answered by EVAL) before counting
    assert!(acquire_at(&storage, "warm", rate, 1, lease).await.allowed);
    let before = Ran::now(&server);

    let first = acquire_at(&storage, "ada", rate, 1, lease).await;
    let slot = first.slots.unwrap();
    assert!(
        first.allowed && slot.lease.is_some() && slot.in_use == 1,
        "{first:?}"
    );
    assert_eq!(first.bands[0].remaining, 1);
    // no slot free: refused, nothing charged
    let full = acquire_at(&storage, "ada", rate, 1, lease).await;
    let slot = full.slots.unwrap();
    assert!(!full.allowed && slot.refused && slot.lease.is_none(), "{full:?}");
    decide(
        &storage,
        "ada",
        rate,
        Op::Release(first.slots.unwrap().lease.unwrap()),
    )
    .await;
    let second = acquire_at(&storage, "ada", rate, 1, lease).await;
    assert!(second.allowed, "{second:?}");
    assert_eq!(second.bands[0].remaining, 0, "the refusal charged nothing");
    decide(
        &storage,
        "ada",
        rate,
        Op::Release(second.slots.unwrap().lease.unwrap()),
    )
    .await;
    // the rate spent: refused by the band, no slot taken
    let spent = acquire_at(&storage, "ada", rate, 1, lease).await;
    let slot = spent.slots.unwrap();
    assert!(
        !spent.allowed && !slot.refused && slot.lease.is_none(),
        "{spent:?}"
    );
    assert_eq!(slot.in_use, 0);
    assert!(spent.bands[0].retry_after_ns > 0, "{spent:?}");

    // four acquires and two releases: six calls, one each; two slots
    // taken and two given back (by the releases), two charges written
    let ran = Ran::now(&server).since(before);
    let expected = Ran {
        evalsha: 6,
        eval: 0,
        zadd: 2,
        zrem: 2,
        set: 2,
    };
    assert_eq!(ran, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_decides_its_bands_as_a_charge_does() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    let storage = RedisStorage::builder(server.url())
        .client_clock(clock.clone())
        .batching(false)
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let slots = Slots {
        limit: 1_000,
        lease: Duration::from_secs(60),
    };
    // one limited band (the script's short path) and two (its general one)
    let tiers = [
        vec![Quota::per_second(4)],
        vec![Quota::per_second(5), Quota::per_minute(40)],
    ];
    for (t, bands) in tiers.iter().enumerate() {
        let (charger, acquirer) = (format!("charge-{t}"), format!("acquire-{t}"));
        let mut outcomes = [0; 2];
        for step in 0..60 {
            let cost = [1, 2, 3][step % 3];
            let charged = storage.check(key("free", &charger), bands, cost).await.unwrap();
            let acquire = Op::Acquire { cost, slots };
            let acquired = storage
                .decide(key("free", &acquirer), bands, acquire, &shared)
                .await
                .unwrap();
            if let Some(lease) = acquired.slots.unwrap().lease {
                decide(&storage, &acquirer, bands[0], Op::Release(lease)).await;
            }
            assert_eq!(
                acquired.allowed, charged.allowed,
                "step {step}: {acquired:?} {charged:?}"
            );
            assert_eq!(acquired.bands, charged.bands, "step {step}");
            assert_eq!(acquired.now, charged.now, "step {step}");
            outcomes[usize::from(charged.allowed)] += 1;
            clock.advance(Duration::from_millis(90));
        }
        assert!(outcomes[0] > 5 && outcomes[1] > 5, "{outcomes:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_refusal_holds_no_slot_even_for_a_moment() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let storage = script_only(&server.url()).await;
    let lease = Duration::from_secs(60);
    let rate = Quota::per_hour(1);
    // the user's one unit is spent by a request that held the one slot
    let spend = acquire_at(&storage, "ada", rate, 1, lease).await;
    assert!(spend.allowed, "{spend:?}");
    let band = storage.band_key(key("free", "ada"), &rate);
    let slots_key = format!("{}slots", &band[..=band.rfind(':').unwrap()]);
    assert_eq!(server.cli(&["--scan", "--pattern", "*slots"]), slots_key);
    decide(
        &storage,
        "ada",
        rate,
        Op::Release(spend.slots.unwrap().lease.unwrap()),
    )
    .await;

    // a second connection watches the slot set while 64 tasks acquire
    let client = redis::Client::open(server.url()).unwrap();
    let mut watcher = client.get_multiplexed_async_connection().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (looks, most) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let watch = tokio::spawn({
        let (stop, looks, most) = (stop.clone(), looks.clone(), most.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let taken: u64 = redis::cmd("ZCARD")
                    .arg(&slots_key)
                    .query_async(&mut watcher)
                    .await
                    .unwrap();
                most.fetch_max(taken, Ordering::Relaxed);
                looks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    while looks.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let before = Ran::now(&server);
    let looked_before = looks.load(Ordering::Relaxed);
    let (tasks, each) = (64, 20);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let storage = storage.clone();
        handles.push(tokio::spawn(async move {
            let mut decisions = Vec::new();
            for _ in 0..each {
                decisions.push(acquire_at(&storage, "ada", rate, 1, lease).await);
            }
            decisions
        }));
    }
    let mut decisions = Vec::new();
    for handle in handles {
        decisions.extend(handle.await.unwrap());
    }
    let ran = Ran::now(&server).since(before);
    let looked_during = looks.load(Ordering::Relaxed) - looked_before;
    stop.store(true, Ordering::Relaxed);
    watch.await.unwrap();

    let by_slots = decisions.iter().filter(|d| d.slots.unwrap().refused).count();
    let admitted = decisions.iter().filter(|d| d.allowed).count();
    eprintln!(
        "{} acquires: {admitted} admitted, {by_slots} refused by the slot limit; \
         the watcher saw at most {} slots taken in {looked_during} looks; the server ran {ran:?}",
        decisions.len(),
        most.load(Ordering::Relaxed),
    );
    // every acquire refused by the rate: none found the slot taken by
    // another (which would refuse it for concurrency, with `Retry-After: 1`
    // rather than the rate's wait)
    assert_eq!(decisions.len(), tasks * each);
    for decision in &decisions {
        let slot = decision.slots.unwrap();
        assert!(!decision.allowed, "{decision:?}");
        assert!(
            !slot.refused && slot.lease.is_none() && slot.in_use == 0,
            "{decision:?}"
        );
        assert!(decision.bands[0].retry_after_ns > 0, "{decision:?}");
    }
    // seen from outside, the slot set stayed empty; inside, nothing was
    // written: one call per acquire, no slot taken or given back, no charge
    assert!(
        looked_during > 0,
        "the watcher never looked while the tasks acquired"
    );
    assert_eq!(most.load(Ordering::Relaxed), 0, "a refused request held a slot");
    let expected = Ran {
        evalsha: (tasks * each) as u64,
        eval: 0,
        zadd: 0,
        zrem: 0,
        set: 0,
    };
    assert_eq!(ran, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_on_a_cluster_is_one_call_to_the_users_node() {
    let Some(cluster) = cluster() else { return };
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-cluster-slots")
        .batching(false)
        .deny_cache(false)
        .connect()
        .await
        .expect("connect to the test cluster");
    let lease = Duration::from_secs(60);
    let rate = Quota::per_hour(2);
    // users spread over the three nodes: each call's slot set and band
    // share the user's hash slot
    for i in 0..12 {
        let user = format!("user-{i}");
        let first = acquire_at(&storage, &user, rate, 1, lease).await;
        assert!(first.allowed, "{first:?}");
        let full = acquire_at(&storage, &user, rate, 1, lease).await;
        assert!(full.slots.unwrap().refused, "{full:?}");
        decide(
            &storage,
            &user,
            rate,
            Op::Release(first.slots.unwrap().lease.unwrap()),
        )
        .await;
        let second = acquire_at(&storage, &user, rate, 1, lease).await;
        assert_eq!(second.bands[0].remaining, 0, "{second:?}");
        decide(
            &storage,
            &user,
            rate,
            Op::Release(second.slots.unwrap().lease.unwrap()),
        )
        .await;
        let spent = acquire_at(&storage, &user, rate, 1, lease).await;
        let slot = spent.slots.unwrap();
        assert!(!spent.allowed && !slot.refused && slot.in_use == 0, "{spent:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_never_repeats_a_concurrency_refusal() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // the deny cache is on by default
    let storage: RedisStorage = storage(&server.url()).await;
    let lease = Duration::from_secs(60);
    let first = acquire(&storage, "ada", 1, lease).await;
    let refused = acquire(&storage, "ada", 1, lease).await;
    assert!(refused.slots.unwrap().refused);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let release = Op::Release(first.slots.unwrap().lease.unwrap());
    storage
        .decide(key("free", "ada"), &[Quota::per_hour(1_000)], release, &clock)
        .await
        .unwrap();
    let again = acquire(&storage, "ada", 1, lease).await;
    assert!(again.allowed, "{again:?}");
    assert_eq!(again.source, tower_rate_tier::storage::DecisionSource::Storage);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_each_instance_has_its_share_of_the_slots() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let fallback = Fallback::builder(redis)
        .instances(2)
        .failures_to_switch(1)
        .build();
    server.kill();
    let lease = Duration::from_secs(60);
    // 3 slots between 2 instances: 2 each (rounded up)
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let op = Op::Acquire {
        cost: 1,
        slots: Slots { limit: 3, lease },
    };
    let mut taken = Vec::new();
    for _ in 0..10 {
        // the failure that switches may be an error of its own
        let Ok(decision) = fallback
            .decide(key("free", "ada"), &[Quota::per_hour(1_000)], op, &clock)
            .await
        else {
            continue;
        };
        if decision.source == tower_rate_tier::storage::DecisionSource::Fallback {
            taken.push(decision);
        }
        if taken.len() == 3 {
            break;
        }
    }
    assert!(fallback.is_local());
    let allowed: Vec<bool> = taken.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, true, false], "{taken:?}");
    assert_eq!(taken[2].slots.unwrap().limit, 2);
}

/// Redis stalls just past the storage timeout (a fork for a save, a slow
/// command, a network hiccup): the acquires time out here (the requests
/// pass uncounted, `OnStorageError::Allow`) and run when Redis resumes.
/// Their leases are given back after them, so once every response is over
/// the user is admitted again, well before the lease (6 s) would have
/// freed the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_that_timed_out_give_their_slots_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1_000))
        .tier_concurrency("free", 2)
        .concurrency_lease(Duration::from_secs(6))
        .storage(redis)
        .build();
    let app = Router::new()
        .route("/", routing::get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identity));
    let get = |user: &str| {
        Request::get("/")
            .header("x-user", user)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        app.clone().oneshot(get("warm")).await.unwrap().status(),
        StatusCode::OK
    );
    server.pause(true);
    for _ in 0..2 {
        let response = app.clone().oneshot(get("ada")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "let through uncounted");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.pause(false);
    let resumed = Instant::now();
    loop {
        let status = app.clone().oneshot(get("ada")).await.unwrap().status();
        if status == StatusCode::OK {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(3),
            "locked out with nothing in flight"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An acquire refused for want of a slot asks the bands whether they would
/// refuse too, charging nothing: a spent rate band, or a unit in debt,
/// reports its wait, so that the refusal waits for it (as in memory), on a
/// single server and on a Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_refusal_reports_the_bands_that_would_refuse_too() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut storages = vec![script_only(&server.url()).await];
    if let Some(cluster) = cluster() {
        let on_cluster = RedisStorage::cluster(cluster.urls())
            .prefix("trt-cluster-slot-refusals")
            .batching(false)
            .deny_cache(false)
            .connect()
            .await
            .expect("connect to the test cluster");
        storages.push(on_cluster);
    }
    for (n, storage) in storages.iter().enumerate() {
        let storage = storage.clone();
        let rate = Quota::per_minute(2);
        let lease = Duration::from_secs(60);
        let user = format!("slot-and-rate-{n}");
        assert!(acquire_at(&storage, &user, rate, 1, lease).await.allowed);
        // the slot alone refuses: no band refuses
        let slot_only = acquire_at(&storage, &user, rate, 1, lease).await;
        assert!(!slot_only.allowed && slot_only.slots.unwrap().refused);
        assert!(
            slot_only.bands.iter().all(|b| b.retry_after_ns == 0),
            "{slot_only:?}"
        );
        assert_eq!(slot_only.bands[0].remaining, 1, "nothing charged");
        // the rate is spent meanwhile: the refusal says it would refuse too
        assert!(decide(&storage, &user, rate, Op::Charge(1)).await.allowed);
        let both = acquire_at(&storage, &user, rate, 1, lease).await;
        assert!(!both.allowed && both.slots.unwrap().refused);
        let wait = both.bands[0].retry_after_ns;
        assert!((29_000_000_000..=30_000_000_000).contains(&wait), "{both:?}");
        // a unit in debt, asked as a requirement
        let tokens = Quota::per_minute(100).in_unit(tower_rate_tier::quota::Unit::new("tokens").unwrap());
        let bands = [Quota::per_hour(1_000), tokens];
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let debtor = format!("slot-and-debt-{n}");
        let admit = tower_rate_tier::storage::Amounts::new()
            .with(tower_rate_tier::storage::Amount::Charge(1))
            .with_debt(tower_rate_tier::storage::Amount::Require, 100);
        let acquire_each = Op::AcquireEach {
            amounts: admit,
            slots: Slots { limit: 1, lease },
        };
        let key = key("free", &debtor);
        assert!(
            storage
                .decide(key, &bands, acquire_each, &clock)
                .await
                .unwrap()
                .allowed
        );
        let force = tower_rate_tier::storage::Amounts::new()
            .with(tower_rate_tier::storage::Amount::Charge(0))
            .with_debt(tower_rate_tier::storage::Amount::Force(150), 100);
        assert!(
            storage
                .decide(key, &bands, Op::Each(force), &clock)
                .await
                .unwrap()
                .allowed
        );
        let refused = storage.decide(key, &bands, acquire_each, &clock).await.unwrap();
        assert!(!refused.allowed && refused.slots.unwrap().refused);
        assert_eq!(refused.bands[0].retry_after_ns, 0, "{refused:?}");
        assert!(refused.bands[1].retry_after_ns > 30_000_000_000, "{refused:?}");
    }
}

/// A client that reads each response to its end before it sends the next
/// request never finds its own slot still taken: a body tells its end once
/// its slot is back in Redis (the release went out in a task of its own,
/// which the next acquire could overtake).
#[tokio::test]
async fn one_request_after_another_never_meets_its_own_slot() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let app = instance(storage(&server.url()).await, Quota::per_minute(1_000), 1);
    for i in 0..50 {
        let response = get(&app, "ada").await;
        assert_eq!(response.status(), StatusCode::OK, "request {i}");
        assert_eq!(body(response).await, "ok");
    }
}

/// A body that never says it is at its end before `None`, of an exact size
/// or not: a server stops reading it at its length (hyper drops it there).
struct Parts(std::collections::VecDeque<bytes::Bytes>, Option<u64>);

impl http_body::Body for Parts {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(
            self.get_mut()
                .0
                .pop_front()
                .map(|b| Ok(http_body::Frame::data(b))),
        )
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.1
            .map_or_else(http_body::SizeHint::default, http_body::SizeHint::with_exact)
    }
}

/// `abcd` in two frames, of an exact size when `exact`.
fn parts(exact: bool) -> Body {
    let parts = ["ab", "cd"].map(|s| bytes::Bytes::from_static(s.as_bytes()));
    Body::new(Parts(parts.into(), exact.then_some(4)))
}

/// The same over HTTP/1.1 with bodies a server stops reading at their
/// length (an exact size, a `Content-Length` header), one request after
/// another and pipelined: their last byte ends them, and the client that
/// read it never meets its own slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_read_to_its_length_has_given_its_slot_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1_000_000))
        .tier_concurrency("free", 1)
        .storage(storage(&server.url()).await)
        .build();
    let app = Router::new()
        .route("/len", routing::get(|| async { parts(true) }))
        .route(
            "/header",
            routing::get(|| async {
                http::Response::builder()
                    .header("content-length", "4")
                    .body(parts(false))
                    .unwrap()
            }),
        )
        .layer(TierLimitLayer::new(tiers).identifier_fn(identity));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut connection = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = |path: &str| format!("GET {path} HTTP/1.1\r\nhost: x\r\nx-user: ada\r\n\r\n");
    let mut statuses = Vec::new();
    let mut buffer = Vec::new();
    for round in 0..100 {
        // every tenth round two requests at once (pipelined)
        let paths: &[&str] = if round % 10 == 9 {
            &["/len", "/header"]
        } else {
            &[["/len", "/header"][round % 2]]
        };
        let requests: String = paths.iter().map(|path| request(path)).collect();
        connection.write_all(requests.as_bytes()).await.unwrap();
        for _ in paths {
            // a response is its head and 4 bytes of body
            let response = loop {
                if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(str::to_owned)
                        })
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if buffer.len() >= end + 4 + length {
                        buffer.drain(..end + 4 + length);
                        break head;
                    }
                }
                let mut chunk = [0; 4096];
                let n = connection.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the connection closed");
                buffer.extend_from_slice(&chunk[..n]);
            };
            statuses.push(response.lines().next().unwrap_or_default().to_owned());
        }
    }
    let refused = statuses.iter().filter(|s| s.contains("429")).count();
    assert_eq!(
        refused,
        0,
        "{refused} of {} requests met their own slot",
        statuses.len()
    );
}
