//! Decisions with an amount per band (`Op::Each`): Redis decides them as
//! the memory storage does (`decide_bands`), on one server and on a
//! Cluster, with and without the deny cache.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tower_rate_tier::Quota;
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::{
    Amount, Amounts, Decision, MemoryStorage, Op, RedisStorage, RedisStorageBuilder, Storage, StorageKey,
};
use tower_rate_tier_tests::redis::{RedisServer, cluster};

/// Requests, tokens (may go into debt) and a daily token cap; whole
/// microsecond intervals, so both storages count the same; windows long
/// enough that no key expires on the server's real clock during a case.
const BANDS: [Quota; 3] = [
    Quota::per_minute(10).with_burst(3),
    Quota::per_minute(60),
    Quota::per_hour(200),
];

fn amount() -> impl Strategy<Value = Amount> {
    prop_oneof![
        3 => (0..4u32).prop_map(Amount::Charge),
        3 => Just(Amount::Require),
        3 => (0..150u32).prop_map(Amount::Force),
        1 => (0..40u32).prop_map(Amount::Refund),
    ]
}

/// A decision: mostly an amount per band, the tokens band with the case's
/// debt bound (a band's bound is the same in every decision of it, as the
/// limiter gives it); a uniform op (bound 0 everywhere) now and then when
/// the case allows no debt.
fn op(debt: u32) -> impl Strategy<Value = Op> {
    let each = (amount(), amount(), amount())
        .prop_map(move |(a, b, c)| Op::Each(Amounts::new().with(a).with_debt(b, debt).with(c)));
    let uniform = if debt == 0 { 1 } else { 0 };
    prop_oneof![
        6 => each,
        uniform => (0..3u32).prop_map(Op::Charge),
        uniform => (0..3u32).prop_map(Op::Refund),
    ]
}

fn steps() -> impl Strategy<Value = Vec<(u64, Op)>> {
    prop_oneof![Just(0u32), 1..40u32].prop_flat_map(|debt| {
        prop::collection::vec(
            (prop_oneof![2 => Just(0u64), 3 => 0..5_000_000u64], op(debt)),
            1..40,
        )
    })
}

/// What the two must agree on: the outcome and every band's state.
fn seen(d: &Decision) -> (bool, Vec<tower_rate_tier::storage::BandState>) {
    (d.allowed, d.bands.to_vec())
}

/// Random sequences of mixed decisions on one key: each Redis storage of
/// `builders` (with the fake clock as its client clock) answers exactly as
/// the memory storage.
fn agree(builders: Vec<RedisStorageBuilder>, case_prefix: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::new();
    let fake: Arc<dyn Clock> = Arc::new(clock.clone());
    let redis: Vec<RedisStorage> = runtime.block_on(async {
        let mut out = Vec::new();
        for builder in builders {
            out.push(builder.client_clock(clock.clone()).connect().await.unwrap());
        }
        out
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in steps())| {
        let user = format!("{case_prefix}{}", case.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let key = StorageKey { namespace: "each", tier: "llm", user: &user };
        let memory = MemoryStorage::new();
        runtime.block_on(async {
            for (i, (advance, op)) in steps.iter().enumerate() {
                clock.advance(Duration::from_micros(*advance));
                let expected = memory.decide(key, &BANDS, *op, &fake).await.unwrap();
                for storage in &redis {
                    let got = storage.decide(key, &BANDS, *op, &fake).await.unwrap();
                    prop_assert_eq!(seen(&got), seen(&expected), "step {} {:?} of {:?}", i, op, steps);
                }
            }
            Ok(())
        })?;
    });
}

#[test]
fn redis_decides_an_amount_per_band_as_memory_does() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    agree(
        vec![
            RedisStorage::builder(url.clone())
                .prefix("each-plain")
                .batching(false)
                .deny_cache(false),
            RedisStorage::builder(url).prefix("each-cached"),
        ],
        "u",
    );
}

#[test]
fn a_cluster_decides_an_amount_per_band_as_memory_does() {
    let Some(cluster) = cluster() else { return };
    agree(
        vec![RedisStorage::cluster(cluster.urls()).prefix("each-cluster")],
        "c",
    );
}

#[tokio::test]
async fn a_mismatched_amount_count_is_an_error_not_a_panic() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let storage = super::script_only(&server.url()).await;
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
    let key = super::key("llm", "x");
    let op = Op::Each(Amounts::new().with(Amount::Charge(1)));
    assert!(storage.decide(key, &BANDS, op, &clock).await.is_err());
    assert!(
        MemoryStorage::new()
            .decide(key, &BANDS, op, &clock)
            .await
            .is_err()
    );
}

/// A forced charge too long for the script's span (units times the
/// interval past 2^51 µs) is cut, and the cut counted as forgiven; a
/// decision another band refused forces nothing, so it forgives nothing,
/// as in memory.
#[tokio::test]
async fn a_refused_decision_forgives_nothing_of_a_force_it_did_not_make() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = super::script_only(&server.url()).await;
    let memory = MemoryStorage::new();
    let clock: Arc<dyn Clock> = Arc::new(tower_rate_tier::clock::SystemClock);
    let tokens = tower_rate_tier::quota::Unit::new("tokens").unwrap();
    let bands = [Quota::per_minute(10), Quota::per_day(1_000).in_unit(tokens)];
    let force = |requests| {
        Op::Each(
            Amounts::new()
                .with(Amount::Charge(requests))
                .with_debt(Amount::Force(30_000_000), 100),
        )
    };
    for (user, requests, allowed) in [("recorded", 0, true), ("refused", 11, false)] {
        let key = super::key("llm", user);
        let m = memory.decide(key, &bands, force(requests), &clock).await.unwrap();
        let r = redis.decide(key, &bands, force(requests), &clock).await.unwrap();
        assert_eq!((m.allowed, r.allowed), (allowed, allowed), "{user}");
        assert_eq!(r.bands[1].forgiven, m.bands[1].forgiven, "{user}");
    }
}

/// A unit band whose interval is not a whole number of microseconds
/// (7,000,000 an hour: 514,286 ns, which the scripts count as 515 µs):
/// Redis behind its deny cache admits a requirement as soon as Redis alone
/// does. The cache keeps the states the scripts report in their own units.
#[tokio::test]
async fn the_deny_cache_admits_a_requirement_as_soon_as_redis_does() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    clock.advance(Duration::from_secs(1_000_000));
    let fake: Arc<dyn Clock> = Arc::new(clock.clone());
    let connect = |prefix: &'static str, cache: bool| {
        RedisStorage::builder(server.url())
            .prefix(prefix)
            .batching(false)
            .deny_cache(cache)
            .client_clock(clock.clone())
            .connect()
    };
    let plain = connect("each-plain", false).await.unwrap();
    let cached = connect("each-cached", true).await.unwrap();
    let memory = MemoryStorage::new();
    let key = StorageKey {
        namespace: "",
        tier: "llm",
        user: "u",
    };
    let bands = [Quota::per_hour(7_000_000)];
    let fill = Op::Each(Amounts::new().with(Amount::Force(7_000_000)));
    let require = Op::Each(Amounts::new().with(Amount::Require));
    for storage in [&plain as &dyn Storage, &cached, &memory] {
        assert!(storage.decide(key, &bands, fill, &fake).await.unwrap().allowed);
        // spent: denied everywhere, and the cache keeps this denial
        assert!(!storage.decide(key, &bands, require, &fake).await.unwrap().allowed);
    }
    clock.advance(Duration::from_secs(1));
    for storage in [&plain as &dyn Storage, &cached, &memory] {
        let decision = storage.decide(key, &bands, require, &fake).await.unwrap();
        assert!(
            decision.allowed,
            "{storage:?} denied a requirement one second after the band was spent ({:?}, retry after {} ns)",
            decision.source, decision.bands[0].retry_after_ns
        );
    }
}
