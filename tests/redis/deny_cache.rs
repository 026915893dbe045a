//! The deny cache built into the Redis storage: our side runs on a
//! `FakeClock` (given to the `RateTier`), Redis on its own real time; the
//! fake clock starts on 2024-01-01, so the two clocks are more than a year
//! apart, which the cache must not notice. Whether a decision came from the
//! cache shows in `INFO commandstats`: a cached denial makes no script call.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::{DecisionSource, Op, RedisStorage, Storage as _};
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::redis::RedisServer;

use super::{key, storage};

fn script_calls(server: &RedisServer) -> u64 {
    server.command_calls("evalsha") + server.command_calls("eval")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_denials_cost_no_round_trip_and_the_cache_lets_go_on_time() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("minute", Quota::per_minute(5))
        .clock(clock.clone())
        .storage(storage(&server.url()).await)
        .build();
    for left in (0..5).rev() {
        assert_eq!(
            tiers.check("ada", "minute", 1).await.unwrap().unwrap().remaining,
            left
        );
    }
    // Redis denies; the answer is kept
    let first = tiers.check("ada", "minute", 1).await.unwrap().unwrap_err();
    assert!(first.retry_after > Duration::from_secs(11), "{first:?}");
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..20 {
        let again = tiers.check("ada", "minute", 1).await.unwrap().unwrap_err();
        // our clock stood still: the very state Redis reported
        assert_eq!(again.retry_after, first.retry_after);
        assert_eq!(again.remaining, 0);
    }
    assert_eq!(script_calls(&server), 0, "cached denials make no call");
    // 1 ms before the anchored state refills, still denied here
    clock.advance(first.retry_after - Duration::from_millis(1));
    let last = tiers.check("ada", "minute", 1).await.unwrap().unwrap_err();
    assert_eq!(last.retry_after, Duration::from_millis(1));
    assert_eq!(script_calls(&server), 0);
    // then the cache lets go, and Redis decides (on its own clock, which has
    // barely moved: denied again, never admitted by the cache)
    clock.advance(Duration::from_millis(1));
    let redis_says = tiers.check("ada", "minute", 1).await.unwrap().unwrap_err();
    assert!(redis_says.retry_after > Duration::from_secs(10));
    assert_eq!(script_calls(&server), 1);
    // another user is not affected
    assert!(tiers.check("bob", "minute", 1).await.unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_freed_when_redis_refills_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    let redis = storage(&server.url()).await;
    let ours: Arc<dyn Clock> = Arc::new(clock.clone());
    // 10 per second, burst 2: one unit every 100 ms of Redis's time
    let bands = [Quota::per_second(10).with_burst(2)];
    let k = key("t", "freed");
    for _ in 0..2 {
        assert!(
            redis
                .decide(k, &bands, Op::Charge(1), &ours)
                .await
                .unwrap()
                .allowed
        );
    }
    let denied = redis.decide(k, &bands, Op::Charge(1), &ours).await.unwrap();
    assert_eq!((denied.allowed, denied.source), (false, DecisionSource::Storage));
    let cached = redis.decide(k, &bands, Op::Charge(1), &ours).await.unwrap();
    assert_eq!(
        (cached.allowed, cached.source),
        (false, DecisionSource::DenyCache)
    );
    assert_eq!(cached.bands, denied.bands);
    // both clocks move on past the refill: Redis admits, the cache let it
    let wait = Duration::from_nanos(denied.bands[0].retry_after_ns) + Duration::from_millis(5);
    tokio::time::sleep(wait).await;
    clock.advance(wait);
    let admitted = redis.decide(k, &bands, Op::Charge(1), &ours).await.unwrap();
    assert_eq!(
        (admitted.allowed, admitted.source),
        (true, DecisionSource::Storage)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_costly_denial_does_not_deny_a_cheap_request() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tiers = RateTier::builder()
        .tier("hour", Quota::per_hour(50))
        .clock(FakeClock::new())
        .storage(storage(&server.url()).await)
        .build();
    assert_eq!(
        tiers.check("cy", "hour", 20).await.unwrap().unwrap().remaining,
        30
    );
    let costly = tiers.check("cy", "hour", 40).await.unwrap().unwrap_err();
    assert_eq!(costly.remaining, 30);
    server.cli(&["CONFIG", "RESETSTAT"]);
    assert_eq!(tiers.check("cy", "hour", 1).await.unwrap().unwrap().remaining, 29);
    assert_eq!(script_calls(&server), 1, "Redis decided the cheap request");
    let again = tiers.check("cy", "hour", 40).await.unwrap().unwrap_err();
    assert_eq!(again.remaining, 29);
    assert_eq!(script_calls(&server), 1, "the cache denied the costly one");
    // a refund through this limiter drops the entry: Redis decides again
    tiers.refund("cy", "hour", 20).await.unwrap();
    assert_eq!(tiers.check("cy", "hour", 40).await.unwrap().unwrap().remaining, 9);
}

/// 64 tasks hammer a quota (with real time on both sides): exactly the
/// quota is admitted, and once it is spent almost no denial reaches Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_on_a_spent_quota_barely_call_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tiers = RateTier::builder()
        .tier("day", Quota::per_day(500))
        .storage(storage(&server.url()).await)
        .build();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let (admitted, denied) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (tiers, admitted, denied) = (tiers.clone(), admitted.clone(), denied.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                match tiers.check("hot", "day", 1).await {
                    Ok(Ok(_)) => admitted.fetch_add(1, Ordering::Relaxed),
                    Ok(Err(_)) => denied.fetch_add(1, Ordering::Relaxed),
                    Err(e) => panic!("{e}"),
                };
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (admitted, denied) = (admitted.load(Ordering::Relaxed), denied.load(Ordering::Relaxed));
    let calls = script_calls(&server);
    println!("spent quota, 64 tasks: {admitted} admitted, {denied} denied, {calls} script calls");
    assert_eq!(admitted, 500);
    assert!(denied > 5_000, "{denied}");
    // at most one batch per task could reach Redis after the quota ran out
    assert!(calls <= 500 + 64, "{calls} calls");
    assert!(
        calls as f64 / denied as f64 <= 0.05,
        "{calls} calls, {denied} denied"
    );
}

#[tokio::test]
async fn off_by_the_builder() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    assert!(!redis.has_deny_cache());
    let tiers = RateTier::builder()
        .tier("day", Quota::per_day(1))
        .storage(redis)
        .build();
    tiers.check("dee", "day", 1).await.unwrap().unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..5 {
        assert!(tiers.check("dee", "day", 1).await.unwrap().is_err());
    }
    assert_eq!(script_calls(&server), 5);
    // the storage's Debug says what it does
    let text = format!("{tiers:?}");
    assert!(text.contains("deny_cache: false"), "{text}");
}

/// A tier with two units on Redis with its deny cache: `free` has 100
/// requests a day, 1,000 tokens and 50 images a day.
async fn units(server: &RedisServer, clock: &FakeClock) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_day(100))
        .tier_unit("free", "tokens", Quota::per_day(1_000))
        .tier_unit("free", "images", Quota::per_day(50))
        .clock(clock.clone())
        .storage(storage(&server.url()).await)
        .build()
}

/// A unit in debt is a cached denial for a request's admission, never for
/// usage recorded after the fact (which always reaches Redis and is
/// charged) nor for a reservation (another instance's settlement, which
/// this cache never sees, could have made room: Redis decides it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_in_debt_is_a_cached_denial_only_for_what_it_denies() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    let tiers = units(&server, &clock).await;
    tiers.record("ada", "free", "tokens", 1_500).await.unwrap();
    let first = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(first.source(), DecisionSource::Storage);
    server.cli(&["CONFIG", "RESETSTAT"]);
    // the admission is denied here; a reservation of tokens by Redis
    for _ in 0..3 {
        let again = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
        assert_eq!(again.source(), DecisionSource::DenyCache);
        // our clock stood still; Redis's ran (by milliseconds) between its
        // answers to the reservations, which refreshed the cached state
        assert!(again.retry_after <= first.retry_after, "{again:?}");
        let ran = first.retry_after - again.retry_after;
        assert!(ran < Quota::per_day(1_000).emission_interval(), "{ran:?}");
        let reserve = tiers
            .reserve("ada", "free", "tokens", 5)
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(reserve.source(), DecisionSource::Storage);
    }
    assert_eq!(script_calls(&server), 3, "the three reservations");
    // usage recorded reaches Redis, and is charged: 10 tokens more to wait
    // (Redis's answer to the record refreshed the cached state)
    tiers.record("ada", "free", "tokens", 10).await.unwrap();
    assert_eq!(script_calls(&server), 4);
    let more = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(more.source(), DecisionSource::DenyCache);
    let interval = Quota::per_day(1_000).emission_interval();
    let waited = more.retry_after - first.retry_after;
    // Redis's clock ran between the two decisions, ours did not
    assert!(
        waited <= interval * 10 && waited > interval * 9,
        "{waited:?} more after 10 tokens"
    );
    // another unit's reservation is Redis's to decide, and fits
    let images = tiers.reserve("ada", "free", "images", 50).await.unwrap().unwrap();
    assert_eq!(images.source(), DecisionSource::Storage);
    assert_eq!(
        script_calls(&server),
        5,
        "the reservations, the record and the images"
    );
}

/// Polls `future` once (sending a storage decision's command), and gives
/// it back if it is not done.
async fn poll_once<F: std::future::Future + Unpin>(mut future: F) -> Result<F::Output, F> {
    use std::task::Poll;
    let polled = std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut future).poll(cx))).await;
    match polled {
        Poll::Ready(out) => Ok(out),
        Poll::Pending => Err(future),
    }
}

/// A reservation given back while a denial of the same user is in flight:
/// Redis decided the denial before the refund, and its answer, arriving
/// after the refund, must not be kept as the user's state (it would deny
/// the user here for up to a day while Redis admits).
///
/// On a runtime of one thread, so that the connection's task (which reads
/// the replies) runs only when this test waits: the admission polled once
/// is sent, and cannot be answered before the refund is sent after it.
#[tokio::test(flavor = "current_thread")]
async fn a_denial_answered_after_a_refund_is_not_kept() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    let tiers = units(&server, &clock).await;
    // every token reserved by a request still running
    tiers
        .reserve("ada", "free", "tokens", 1_000)
        .await
        .unwrap()
        .unwrap();
    // another request's admission is sent (the tokens are at zero: Redis
    // will deny it), then the running request gives its tokens back
    let in_flight = poll_once(Box::pin(tiers.check("ada", "free", 1)))
        .await
        .expect_err("a decision of Redis waits for its reply");
    tiers.settle("ada", "free", "tokens", 1_000, 0).await.unwrap();
    let denied = in_flight.await.unwrap().unwrap_err();
    assert_eq!(denied.source(), DecisionSource::Storage);
    // the next request is admitted: Redis holds the tokens given back
    let next = tiers.check("ada", "free", 1).await.unwrap();
    let next = next.unwrap_or_else(|refused| panic!("refused by {:?}", refused.source()));
    assert_eq!(next.source(), DecisionSource::Storage);
}
