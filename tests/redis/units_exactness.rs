//! 64 concurrent tasks recording usage of a unit against one user (records
//! after the fact and reservations settled afterwards, mixed), in memory
//! and in Redis: the unit never takes more than the real-time bound of its
//! band plus the debt of the requests in flight, which stays below one
//! burst, and no usage is forgiven. See `support/units.rs` for the scenario
//! and why each assertion follows from the storage's own reports, whatever
//! the machine's load.
//!
//! The Redis storages here have a timeout of 5 s rather than 250 ms: a
//! decision that timed out on our side may still have been counted by
//! Redis, which no account kept by the tasks can tell, and timeouts are
//! not what these tests are about (`failures.rs` and `batching.rs` test
//! them).

use std::sync::Arc;
use std::time::Duration;

use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::{Amount, Amounts, MemoryStorage, Op, RedisStorage, Storage, StorageKey};
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::redis::RedisServer;
use tower_rate_tier_tests::units::{
    self, MOST_PER_REQUEST, Observed, SLOW_TOKENS, TIER, TOKENS, USER, Usage,
};

const TASKS: usize = 64;
/// How long the tasks make requests (wall time), and how many each makes
/// at least.
const RUN_FOR: Duration = Duration::from_millis(500);
const MIN_ROUNDS: usize = 40;
const TIMEOUT: Duration = Duration::from_secs(5);

/// The most debt the tasks can put a band of `quota` in: one request in
/// flight per task, each recording at most [`MOST_PER_REQUEST`] units
/// (below the debt bound of 1,000).
fn in_flight_debt_ns(quota: &Quota) -> u64 {
    TASKS as u64 * u64::from(MOST_PER_REQUEST) * quota.emission_interval_nanos()
}

/// Runs the scenario on `tiers` (whose unit has the bands `tokens`, and
/// whose storage `observed` wraps) and checks what every run must keep;
/// returns the units recorded.
async fn run_and_check<S>(what: &str, tiers: &RateTier, tokens: [Quota; 2], observed: &Observed<S>) -> u64 {
    let usage = units::run(tiers, TASKS, RUN_FOR, MIN_ROUNDS).await;
    let seen = observed.seen();
    let recorded = Usage::get(&usage.recorded);
    let refusals = Usage::get(&usage.refused_by_unit) + Usage::get(&usage.refused_reservations);
    println!(
        "{what}: {} requests, {} admitted, {} refused by the tokens, {} reservations refused, \
         {recorded} tokens recorded; {} decisions over {} ms; most debt {} units (first band), \
         bound {}",
        Usage::get(&usage.requests),
        Usage::get(&usage.admitted),
        Usage::get(&usage.refused_by_unit),
        Usage::get(&usage.refused_reservations),
        seen.decisions,
        seen.span_ns() / 1_000_000,
        seen.max_debt_ns[1] as f64 / tokens[0].emission_interval_nanos() as f64,
        seen.bound(1, &tokens[0]),
    );
    assert_eq!(Usage::get(&usage.errors), 0, "{what}");
    for (i, quota) in tokens.iter().enumerate() {
        let band = 1 + i;
        assert_eq!(
            seen.forgiven[band], 0,
            "{what}: usage was forgiven in band {band}"
        );
        assert!(
            seen.max_debt_ns[band] <= in_flight_debt_ns(quota),
            "{what}: band {band} in debt of {} ns, more than the requests in flight can cause",
            seen.max_debt_ns[band]
        );
        assert!(
            recorded <= seen.bound(band, quota),
            "{what}: {recorded} recorded, more than band {band} allows ({seen:?})"
        );
    }
    // The limit was reached: had nothing been refused, each request would
    // have recorded a unit at least, more than the first band's bound holds
    // unless it refilled faster than the tasks asked.
    let demand = Usage::get(&usage.requests);
    assert!(
        refusals > 0 || seen.bound(1, &tokens[0]) >= demand,
        "{what}: nothing refused ({seen:?})"
    );
    recorded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_64_tasks_keep_the_real_time_bound() {
    let observed = Observed::new(MemoryStorage::new());
    let tiers = units::tiers(RateTier::builder().storage(observed.clone()), TOKENS);
    run_and_check("memory", &tiers, TOKENS, &observed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_redis_64_tasks_keep_the_real_time_bound() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // batching and the deny cache on, as users run it; Redis's own time
    let redis = RedisStorage::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    assert!(redis.is_batching() && redis.has_deny_cache());
    let observed = Observed::new(redis);
    let tiers = units::tiers(RateTier::builder().storage(observed.clone()), TOKENS);
    run_and_check("redis", &tiers, TOKENS, &observed).await;
}

/// The time each band of the unit `tokens` has taken, as the storage
/// holds it (a peek of every band, each unit band with its debt bound).
async fn unit_used_ns(storage: &dyn Storage, tokens: [Quota; 2], clock: &Arc<dyn Clock>) -> Vec<u64> {
    let key = StorageKey {
        namespace: "",
        tier: TIER,
        user: USER,
    };
    let debt = tokens.iter().map(Quota::burst).min().unwrap_or(0);
    let peek = Op::Each(
        Amounts::new()
            .with(Amount::Charge(0))
            .with_debt(Amount::Charge(0), debt)
            .with_debt(Amount::Charge(0), debt),
    );
    let decision = storage
        .decide(key, &units::bands(tokens), peek, clock)
        .await
        .unwrap();
    decision.bands[1..].iter().map(|b| b.reset_after_ns).collect()
}

/// With a clock that stands still, nothing refills: after the run each
/// band of the unit holds exactly the units the tasks recorded (every
/// record charged what it said, every settlement gave back or charged its
/// difference, nothing was lost or counted twice by batching), in memory
/// and in Redis (with the fake clock as its client clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_still_clock_the_unit_holds_exactly_what_was_recorded() {
    let clock = FakeClock::new();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let expected = |recorded: u64| -> Vec<u64> {
        SLOW_TOKENS
            .iter()
            .map(|q| recorded * q.emission_interval_nanos())
            .collect()
    };
    let memory = Observed::new(MemoryStorage::new());
    let builder = RateTier::builder().clock(clock.clone()).storage(memory.clone());
    let tiers = units::tiers(builder, SLOW_TOKENS);
    let recorded = run_and_check("memory, still clock", &tiers, SLOW_TOKENS, &memory).await;
    let used = unit_used_ns(memory.inner_ref(), SLOW_TOKENS, &shared).await;
    assert_eq!(used, expected(recorded), "memory");

    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .client_clock(clock.clone())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let observed = Observed::new(redis);
    let builder = RateTier::builder().clock(clock.clone()).storage(observed.clone());
    let tiers = units::tiers(builder, SLOW_TOKENS);
    let recorded = run_and_check("redis, still clock", &tiers, SLOW_TOKENS, &observed).await;
    let used = unit_used_ns(observed.inner_ref(), SLOW_TOKENS, &shared).await;
    assert_eq!(used, expected(recorded), "redis");
}
