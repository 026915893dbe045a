//! Usage-based quotas on Redis, through `RateTier` (the behaviours of
//! `tests/units.rs`, there in memory on a fake clock): units in one and
//! several bands, admission refused by a unit in debt while the request
//! bands have room, reservations settled with a refund or an excess (a debt
//! bounded by one burst of the unit's smallest band), usage recorded twice,
//! bad input; and a tier with units and a concurrency limit, whose unit
//! refusals take no slot (memory and Redis, through the layer).
//!
//! Redis decides on its own clock here, which runs while a test does. The
//! bands are long (a token a day or a week, many hours per request), so
//! what a test reads is exact for as long as less than one interval of a
//! band has passed since its first charge (86.4 s for the shortest one):
//! `remaining` as in memory, and a wait `W` computed as memory computes it
//! comes back as `W − elapsed`, in `(W − I, W]`.

use std::time::Duration;

use tower_rate_tier::storage::RedisStorage;
use tower_rate_tier::{CheckError, Quota, RateLimited, RateTier};
use tower_rate_tier_tests::redis::RedisServer;

/// A token every 86.4 s.
const DAY_1000: Quota = Quota::per_day(1_000);
/// A token every 120.96 s (the unit's second band).
const WEEK_5000: Quota = Quota::per_week(5_000);
/// A token every 864 s.
const DAY_100: Quota = Quota::per_day(100);

/// Two storages on `server`, under prefixes of their own: the default one
/// (batching and deny cache on) and one whose every decision is a script
/// call of its own; with a timeout generous enough for a loaded machine
/// (timeouts are not what these tests are about).
async fn storages(server: &RedisServer) -> [(&'static str, RedisStorage); 2] {
    let connect = |prefix: &'static str, batched: bool| {
        RedisStorage::builder(server.url())
            .prefix(prefix)
            .batching(batched)
            .deny_cache(batched)
            .timeout(Duration::from_secs(5))
            .connect()
    };
    [
        ("default", connect("units-default", true).await.unwrap()),
        ("script only", connect("units-plain", false).await.unwrap()),
    ]
}

/// `free`: 10 requests a day, tokens in two bands; `team`: unlimited
/// requests, tokens in one band.
fn llm(storage: RedisStorage) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_day(10))
        .tier_unit("free", "tokens", [DAY_1000, WEEK_5000])
        .tier("team", Quota::unlimited())
        .tier_unit("team", "tokens", DAY_100)
        .storage(storage)
        .build()
}

/// `refused` asks to wait what memory computes, `units` intervals of
/// `band`, less the time Redis's clock ran since the band was first
/// charged (under one interval).
fn assert_wait(refused: &RateLimited, units: u32, band: Quota, what: &str) {
    let interval = band.emission_interval();
    let expected = interval * units;
    assert!(
        refused.retry_after <= expected && refused.retry_after > expected - interval,
        "{what}: waits {:?}, expected {expected:?} less under {interval:?}",
        refused.retry_after
    );
}

/// The `remaining` of each band of `unit` in a decision's bands.
fn unit_left(bands: impl Iterator<Item = (Quota, tower_rate_tier::storage::BandState)>) -> Vec<u32> {
    bands
        .filter(|(q, _)| q.unit().as_str() == "tokens")
        .map(|(_, s)| s.remaining)
        .collect()
}

/// The `remaining` of the request band in a decision's bands.
fn requests_left(mut bands: impl Iterator<Item = (Quota, tower_rate_tier::storage::BandState)>) -> u32 {
    bands.next().expect("a request band").1.remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_in_debt_refuses_requests_while_request_bands_have_room() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (config, storage) in storages(&server).await {
        let tiers = llm(storage);
        // admission charges requests only: the token bands are untouched
        let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
        assert_eq!((info.limit, info.remaining), (10, 9), "{config}");
        assert_eq!(unit_left(info.bands()), [1_000, 5_000], "{config}");
        // 1,500 tokens used: 500 of debt in the day band (bound: 1,000)
        tiers.record("ada", "free", "tokens", 1_500).await.unwrap();
        for attempt in 0..3 {
            let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
            // the day band refused: 500 tokens of debt and one token
            assert_wait(&refused, 501, DAY_1000, config);
            assert_eq!(refused.limit, 1_000, "{config}");
            assert_eq!(
                refused.violated_policies().collect::<Vec<_>>(),
                ["free.tokens.0"],
                "{config}"
            );
            // the refusals charged no request (the request band kept its 9),
            // and the week band holds what was recorded
            assert_eq!(requests_left(refused.bands()), 9, "{config} #{attempt}");
            assert_eq!(unit_left(refused.bands()), [0, 3_500], "{config}");
        }
        // another user is not affected
        let bob = tiers.check("bob", "free", 1).await.unwrap().unwrap();
        assert_eq!(bob.remaining, 9, "{config}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debt_is_bounded_by_one_burst_of_the_smallest_band() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (config, storage) in storages(&server).await {
        let tiers = llm(storage);
        tiers.record("ada", "free", "tokens", u32::MAX).await.unwrap();
        let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
        // each band 1,000 tokens (the smallest burst) in debt: the week
        // band waits longest, 1,000 of its intervals and one more
        assert_wait(&refused, 1_001, WEEK_5000, config);
        let debts: Vec<u64> = refused
            .bands()
            .filter(|(q, _)| q.unit().as_str() == "tokens")
            .map(|(q, s)| s.debt_ns.div_ceil(q.emission_interval_nanos()))
            .collect();
        assert_eq!(debts, [1_000, 1_000], "{config}");
        // a record of 0 changes nothing
        tiers.record("bob", "free", "tokens", 0).await.unwrap();
        let bob = tiers.check("bob", "free", 10).await.unwrap().unwrap();
        assert_eq!(unit_left(bob.bands()), [1_000, 5_000], "{config}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_take_up_front_and_settle_what_was_used() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (config, storage) in storages(&server).await {
        let tiers = llm(storage);
        let reserved = tiers
            .reserve("ada", "free", "tokens", 800)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            reserved.remaining, 10,
            "{config}: a reservation charges no request"
        );
        assert_eq!(unit_left(reserved.bands()), [200, 4_200], "{config}");
        // 800 of 1,000 taken: 300 more do not fit, and take nothing
        let refused = tiers
            .reserve("ada", "free", "tokens", 300)
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(
            refused.violated_policies().collect::<Vec<_>>(),
            ["free.tokens.0"],
            "{config}"
        );
        assert_wait(&refused, 100, DAY_1000, config);
        // 500 used of 800: 300 come back, so 500 are left
        tiers.settle("ada", "free", "tokens", 800, 500).await.unwrap();
        let again = tiers
            .reserve("ada", "free", "tokens", 500)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(unit_left(again.bands()), [0, 4_000], "{config}");
        assert!(tiers.reserve("ada", "free", "tokens", 1).await.unwrap().is_err());
        // a settlement above the reservation charges the rest, into debt
        tiers.settle("ada", "free", "tokens", 500, 700).await.unwrap();
        let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
        assert_wait(&refused, 201, DAY_1000, config);
        assert_eq!(unit_left(refused.bands()), [0, 3_800], "{config}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_recorded_twice_is_charged_twice() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (config, storage) in storages(&server).await {
        let tiers = llm(storage);
        tiers.record("ada", "free", "tokens", 300).await.unwrap();
        tiers.record("ada", "free", "tokens", 300).await.unwrap();
        let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
        assert_eq!(unit_left(info.bands()), [400, 4_400], "{config}");
        // a third record beyond what is left: 300 tokens of debt
        tiers.record("ada", "free", "tokens", 700).await.unwrap();
        let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
        assert_wait(&refused, 301, DAY_1000, config);
        assert_eq!(unit_left(refused.bands()), [0, 3_700], "{config}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_tier_is_limited_by_its_units_alone() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (config, storage) in storages(&server).await {
        let tiers = llm(storage);
        for _ in 0..50 {
            assert!(tiers.check("ada", "team", 1).await.unwrap().is_ok());
        }
        tiers.record("ada", "team", "tokens", 150).await.unwrap();
        let refused = tiers.check("ada", "team", 1).await.unwrap().unwrap_err();
        assert_eq!(refused.limit, 100, "{config}");
        assert_wait(&refused, 51, DAY_100, config);
        assert_eq!(
            refused.violated_policies().collect::<Vec<_>>(),
            ["team.tokens"],
            "{config}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_usage_gets_a_clear_error_and_reaches_no_key() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (config, storage) in storages(&server).await {
        let prefix = storage.prefix().to_owned();
        let keys = || server.cli(&["--scan", "--pattern", &format!("{prefix}:*")]);
        let tiers = llm(storage);
        let unknown = tiers.record("ada", "free", "tokenz", 5).await.unwrap_err();
        assert!(matches!(unknown, CheckError::UnknownUnit { .. }), "{config}");
        assert_eq!(unknown.to_string(), "tier `free` has no unit `tokenz`");
        assert!(matches!(
            tiers.reserve("ada", "gold", "tokens", 5).await,
            Err(CheckError::UnknownTier(_))
        ));
        assert!(matches!(
            tiers.settle("ada", "team", "bytes", 5, 2).await,
            Err(CheckError::UnknownUnit { .. })
        ));
        assert!(matches!(
            tiers.record("", "free", "tokens", 5).await,
            Err(CheckError::InvalidUserId)
        ));
        // above the smallest burst a reservation could never fit: not a 429
        let never = tiers.reserve("ada", "free", "tokens", 1_001).await.unwrap_err();
        assert!(
            matches!(
                never,
                CheckError::CostExceedsLimit {
                    cost: 1_001,
                    limit: 1_000,
                    ..
                }
            ),
            "{config}: {never:?}"
        );
        // none of them reached Redis
        assert_eq!(keys(), "", "{config}");
        // the whole smallest burst fits once; then the unit, at zero,
        // refuses the next request (at least one token is required)
        tiers
            .reserve("ada", "free", "tokens", 1_000)
            .await
            .unwrap()
            .unwrap();
        let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
        assert_wait(&refused, 1, DAY_1000, config);
        assert_eq!(requests_left(refused.bands()), 10, "{config}");
    }
}

/// Two instances on one Redis, each with the default storage (deny cache
/// on): a reservation refused while the other held the unit fits again
/// once the other settles (the deny cache never answers a reservation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_refused_before_another_instance_settles_fits_after_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let instance = |storage| {
        RateTier::builder()
            .tier("free", DAY_100)
            .tier_unit("free", "tokens", DAY_1000)
            .storage(storage)
            .build()
    };
    let connect = || {
        RedisStorage::builder(server.url())
            .prefix("settled-elsewhere")
            .connect()
    };
    let a = instance(connect().await.unwrap());
    let b = instance(connect().await.unwrap());
    b.reserve("ada", "free", "tokens", 1_000).await.unwrap().unwrap();
    assert!(a.reserve("ada", "free", "tokens", 500).await.unwrap().is_err());
    b.settle("ada", "free", "tokens", 1_000, 0).await.unwrap();
    a.reserve("ada", "free", "tokens", 500)
        .await
        .unwrap()
        .expect("the units the other instance gave back");
}

/// A forced charge far beyond a band's debt bound: Redis reports the units
/// forgiven as memory does (the script's increment is capped at 2^51 µs;
/// the client counts the units it could not carry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_record_is_forgiven_as_in_memory() {
    use std::sync::Arc;
    use tower_rate_tier::clock::{Clock, SystemClock};
    use tower_rate_tier::quota::Unit;
    use tower_rate_tier::storage::{Amount, Amounts, MemoryStorage, Op, Storage};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let bands = [DAY_1000.in_unit(Unit::new("tokens").unwrap())];
    let op = Op::Each(Amounts::new().with_debt(Amount::Force(u32::MAX), 1_000));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let key = super::key("free", "huge");
    let memory = MemoryStorage::new()
        .decide(key, &bands, op, &clock)
        .await
        .unwrap();
    let redis = super::script_only(&server.url())
        .await
        .decide(key, &bands, op, &clock)
        .await
        .unwrap();
    assert_eq!(memory.bands[0].forgiven, u32::MAX - 2_000);
    assert_eq!(redis.bands[0].forgiven, memory.bands[0].forgiven);
}
