//! Decisions of a tier with units (an amount per band: admissions,
//! records, reservations, refunds) are batched as charges are, on one
//! server and on a Cluster, and each is decided exactly as a script call of
//! its own would decide it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::quota::Unit;
use tower_rate_tier::storage::{
    Amount, Amounts, Decide, Decision, DecisionSource, Op, RedisStorage, RedisStorageBuilder, Storage,
    StorageKey,
};
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::redis::{RedisServer, own_cluster};

use super::batching::{advances, compared};
use super::cluster_batching::HEAVY;

fn script_calls(server: &RedisServer) -> u64 {
    server.command_calls("evalsha") + server.command_calls("eval")
}

/// The debt bound of the unit bands: the smallest burst of the unit.
const DEBT: u32 = 60;

/// Generous: timeouts are not what these tests are about, and a decision
/// that timed out on a loaded machine would fail a comparison.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A tier with units as a decision names its bands: 10 requests a minute
/// (burst 3), then tokens, 60 an hour and 200 a day. A fake clock decides
/// here while Redis expires keys on its real one: the shortest state a key
/// holds (one request, 6 s) outlasts a case.
fn llm_bands() -> [Quota; 3] {
    let tokens = Unit::new("tokens").unwrap();
    [
        Quota::per_minute(10).with_burst(3),
        Quota::per_hour(60).in_unit(tokens),
        Quota::per_day(200).in_unit(tokens),
    ]
}

const ONE: [Quota; 1] = [Quota::per_minute(10).with_burst(3)];
const TWO: [Quota; 2] = [Quota::per_minute(6), Quota::per_hour(40)];

/// One decision asked for in a group: of a tier with units as the limiter
/// asks them (each unit band with the unit's debt bound), or a plain
/// charge of one band (decided inline by the batch script) or of two.
#[derive(Debug, Clone, Copy)]
enum Ask {
    /// A request's admission: `cost` requests, at least one token.
    Admit(usize, u32),
    /// Usage recorded after the fact, into debt if need be.
    Record(usize, u32),
    /// A reservation of tokens.
    Reserve(usize, u32),
    /// Tokens given back.
    GiveBack(usize, u32),
    /// A charge of a one-band tier.
    One(usize, u32),
    /// A charge of a two-band tier.
    Two(usize, u32),
}

fn unit_op(requests: Amount, tokens: Amount) -> Op {
    Op::Each(
        Amounts::new()
            .with(requests)
            .with_debt(tokens, DEBT)
            .with_debt(tokens, DEBT),
    )
}

fn ask(storage: &RedisStorage, case: &str, ask: Ask, clock: &Arc<dyn Clock>) -> Decide {
    let llm = llm_bands();
    let (user, tier, bands, op): (usize, &str, &[Quota], Op) = match ask {
        Ask::Admit(u, n) => (u, "llm", &llm, unit_op(Amount::Charge(n), Amount::Require)),
        Ask::Record(u, n) => (u, "llm", &llm, unit_op(Amount::Charge(0), Amount::Force(n))),
        Ask::Reserve(u, n) => (u, "llm", &llm, unit_op(Amount::Charge(0), Amount::Charge(n))),
        Ask::GiveBack(u, n) => (u, "llm", &llm, unit_op(Amount::Charge(0), Amount::Refund(n))),
        Ask::One(u, n) => (u, "one", &ONE, Op::Charge(n)),
        Ask::Two(u, n) => (u, "two", &TWO, Op::Charge(n)),
    };
    let user = format!("u{user}");
    let key = StorageKey {
        namespace: case,
        tier,
        user: &user,
    };
    storage.decide(key, bands, op, clock)
}

fn asks() -> impl Strategy<Value = Vec<(u64, Vec<Ask>)>> {
    let ask = prop_oneof![
        3 => (0..3usize, 0..3u32).prop_map(|(u, n)| Ask::Admit(u, n)),
        3 => (0..3usize, 0..90u32).prop_map(|(u, n)| Ask::Record(u, n)),
        2 => (0..3usize, 1..40u32).prop_map(|(u, n)| Ask::Reserve(u, n)),
        1 => (0..3usize, 1..40u32).prop_map(|(u, n)| Ask::GiveBack(u, n)),
        2 => (0..3usize, 0..3u32).prop_map(|(u, n)| Ask::One(u, n)),
        1 => (0..3usize, 0..3u32).prop_map(|(u, n)| Ask::Two(u, n)),
    ];
    prop::collection::vec((advances(), prop::collection::vec(ask, 1..24)), 1..8)
}

fn same(mut a: Decision, b: &Decision) -> bool {
    a.source = b.source;
    a == *b
}

/// Random groups of concurrent decisions of a tier with units, mixed with
/// plain charges (asked for together, so they batch), the clock moved
/// between groups: each batching storage (`builder`) decides exactly as
/// one script call per decision; with the deny cache the decisions of a
/// group are asked one after the other (see `batching.rs`). Returns the
/// decisions asked of each storage and the script calls the batching ones
/// made (`reset` clears the servers' counts, `script_calls` reads them).
fn agree(
    builder: impl Fn(&str) -> RedisStorageBuilder,
    reset: impl Fn(),
    script_calls: impl Fn() -> u64,
) -> (u64, u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::new();
    let fake: Arc<dyn Clock> = Arc::new(clock.clone());
    let (reference, subjects) = runtime.block_on(compared(&builder, &clock));
    let (case, asked) = (AtomicU64::new(0), AtomicU64::new(0));
    reset();
    let config = ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in asks())| {
        let case = format!("units{}", case.fetch_add(1, Ordering::Relaxed));
        runtime.block_on(async {
            for (advance, group) in &steps {
                clock.advance(Duration::from_micros(*advance));
                asked.fetch_add(group.len() as u64, Ordering::Relaxed);
                let mut expected = Vec::new();
                for a in group {
                    expected.push(ask(&reference, &case, *a, &fake).await);
                }
                for subject in &subjects {
                    let pending: Vec<Decide> = if subject.has_deny_cache() {
                        let mut decided = Vec::new();
                        for a in group {
                            decided.push(Decide::ready(ask(subject, &case, *a, &fake).await));
                        }
                        decided
                    } else {
                        group.iter().map(|a| ask(subject, &case, *a, &fake)).collect()
                    };
                    for ((d, want), a) in pending.into_iter().zip(&expected).zip(group) {
                        match (d.await, want) {
                            (Ok(got), Ok(want)) => {
                                prop_assert!(same(got.clone(), want), "{subject:?} {a:?}: {got:?} != {want:?}");
                            }
                            (got, want) => prop_assert!(false, "{subject:?} {a:?}: {got:?} / {want:?}"),
                        }
                    }
                }
            }
            Ok(())
        })?;
    });
    let asked = asked.load(Ordering::Relaxed);
    let subject = script_calls() - asked;
    println!("{asked} decisions per storage; the 3 batching ones made {subject} calls");
    (asked, subject)
}

#[test]
fn unit_decisions_batched_equal_one_call_each() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let (asked, subject) = agree(
        |prefix| RedisStorage::builder(url.clone()).prefix(prefix).timeout(TIMEOUT),
        || {
            server.cli(&["CONFIG", "RESETSTAT"]);
        },
        || script_calls(&server),
    );
    assert!(
        subject < 3 * asked * 3 / 4,
        "{subject} calls for {asked} decisions"
    );
}

#[test]
fn unit_decisions_batched_equal_one_call_each_on_a_cluster() {
    let _heavy = HEAVY.blocking_lock();
    let Some(cluster) = own_cluster() else { return };
    let urls = cluster.urls();
    let (asked, subject) = agree(
        |prefix| {
            RedisStorage::cluster(urls.clone())
                .prefix(prefix)
                .timeout(TIMEOUT)
        },
        || {
            for node in cluster.nodes() {
                node.cli(&["CONFIG", "RESETSTAT"]);
            }
        },
        || cluster.command_calls("evalsha") + cluster.command_calls("eval"),
    );
    assert!(
        subject < 3 * asked * 9 / 10,
        "{subject} calls for {asked} decisions"
    );
}

/// Twelve decisions of a tier with units asked for together: the first is
/// sent at once, the other eleven wait for it and go as one batch (two
/// script calls in all), each decided as a storage without batching
/// decides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_decisions_asked_together_go_in_one_batch() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = FakeClock::new();
    let fake: Arc<dyn Clock> = Arc::new(clock.clone());
    let connect = |prefix: &'static str, batching: bool| {
        RedisStorage::builder(server.url())
            .prefix(prefix)
            .client_clock(clock.clone())
            .batching(batching)
            .deny_cache(false)
            .timeout(TIMEOUT)
            .connect()
    };
    let batched = connect("together", true).await.unwrap();
    let alone = connect("alone", false).await.unwrap();
    let group: Vec<Ask> = (0..4)
        .flat_map(|u| {
            [
                Ask::Admit(u, 1),
                Ask::Record(u, 40 + 10 * u as u32),
                Ask::Admit(u, 1),
            ]
        })
        .collect();
    // a first group loads the scripts (a NOSCRIPT answered by EVAL)
    for storage in [&batched, &alone] {
        let warm: Vec<Decide> = group.iter().map(|a| ask(storage, "warm", *a, &fake)).collect();
        for d in warm {
            d.await.unwrap();
        }
    }
    server.cli(&["CONFIG", "RESETSTAT"]);
    let pending: Vec<Decide> = group.iter().map(|a| ask(&batched, "case", *a, &fake)).collect();
    let mut decided = Vec::new();
    for d in pending {
        decided.push(d.await.unwrap());
    }
    assert_eq!(script_calls(&server), 2, "one call alone, then one batch");
    let mut refused = 0;
    for (a, got) in group.iter().zip(&decided) {
        let want = ask(&alone, "case", *a, &fake).await.unwrap();
        assert!(same(got.clone(), &want), "{a:?}: {got:?} != {want:?}");
        assert_eq!(got.source, DecisionSource::Storage);
        refused += usize::from(!got.allowed);
    }
    // the records of 60 and 70 tokens spent the minute band of users 2
    // and 3 (the second in debt), whose next admission the batch refused
    assert_eq!(refused, 2, "{decided:?}");
}

/// 64 tasks make requests of one user of a tier with units through
/// `RateTier` and record what each used: their decisions share script
/// calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_recording_usage_share_calls() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // no deny cache: every decision goes to Redis, so the calls count them
    let redis = RedisStorage::builder(server.url())
        .deny_cache(false)
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let tiers = RateTier::builder()
        .tier("llm", Quota::per_day(1_000_000))
        .tier_unit(
            "llm",
            "tokens",
            [Quota::per_day(1_000_000), Quota::per_week(5_000_000)],
        )
        .storage(redis)
        .build();
    tiers.record("warm", "llm", "tokens", 1).await.unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let decisions = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let (tiers, decisions) = (tiers.clone(), decisions.clone());
            tokio::spawn(async move {
                for round in 0..20 {
                    tiers.check("shared", "llm", 1).await.unwrap().unwrap();
                    tiers
                        .record("shared", "llm", "tokens", 1 + t + round)
                        .await
                        .unwrap();
                    decisions.fetch_add(2, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let (decisions, calls) = (decisions.load(Ordering::Relaxed), script_calls(&server));
    println!(
        "64 tasks, units: {decisions} decisions in {calls} script calls ({:.1} per call)",
        decisions as f64 / calls as f64
    );
    assert!(calls * 4 < decisions, "{calls} calls for {decisions} decisions");
}
