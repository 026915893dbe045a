//! Batching: concurrent decisions share script calls and are decided
//! exactly as one call each would decide them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::{Decide, Decision, DecisionSource, Op, RedisStorage, Storage, StorageKey};
use tower_rate_tier::{CheckError, Quota, RateTier};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::RedisServer;

use super::key;

fn script_calls(server: &RedisServer) -> u64 {
    server.command_calls("evalsha") + server.command_calls("eval")
}

/// `tasks` tasks charge one shared key of `tier` until `deadline`; returns
/// (admitted, attempts).
async fn hammer(tiers: &[RateTier], tasks: usize, user: &str, tier: &str, run_for: Duration) -> (u64, u64) {
    let admitted = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + run_for;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let tiers = tiers[t % tiers.len()].clone();
        let (admitted, attempts) = (admitted.clone(), attempts.clone());
        let (user, tier) = (user.to_owned(), tier.to_owned());
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                attempts.fetch_add(1, Ordering::Relaxed);
                match tiers.check(&user, &tier, 1).await {
                    Ok(Ok(_)) => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(_)) => {}
                    Err(e) => panic!("a check failed: {e}"),
                }
                // A denial from the deny cache needs no waiting: without a
                // yield, this loop would keep its worker thread from the
                // connection's task (a server's tasks yield on I/O).
                tokio::task::yield_now().await;
            }
        }));
    }
    for h in handles {
        h.await.expect("a hammering task panicked");
    }
    (admitted.load(Ordering::Relaxed), attempts.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_share_calls_and_admit_exactly_the_quota() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // no deny cache: every decision goes to Redis, so the calls count them
    let redis = RedisStorage::builder(server.url())
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    assert!(redis.is_batching());
    let tiers = RateTier::builder()
        .tier("day", Quota::per_day(1_000))
        .storage(redis)
        .build();
    tiers.check("warm", "day", 1).await.unwrap().unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let (admitted, attempts) = hammer(&[tiers], 64, "shared", "day", Duration::from_millis(500)).await;
    let calls = script_calls(&server);
    println!(
        "64 tasks, batching: {attempts} decisions in {calls} script calls ({:.1} per call)",
        attempts as f64 / calls as f64
    );
    assert_eq!(admitted, 1_000);
    assert!(attempts > 1_000, "{attempts}");
    assert!(calls * 4 < attempts, "{calls} calls for {attempts} decisions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_with_different_batch_settings_share_one_quota() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // a rolling deploy: the same keys, whatever the settings
    let make = |batching: bool, max: usize, cache: bool| {
        let url = server.url();
        async move {
            let storage = RedisStorage::builder(url)
                .batching(batching)
                .max_batch(max)
                .deny_cache(cache)
                .connect()
                .await
                .unwrap();
            RateTier::builder()
                .tier("bands", [Quota::per_hour(300), Quota::per_day(10_000)])
                .storage(storage)
                .build()
        }
    };
    let tiers = [
        make(true, 128, true).await,
        make(false, 128, false).await,
        make(true, 3, false).await,
    ];
    let (admitted, attempts) = hammer(&tiers, 48, "deploy", "bands", Duration::from_millis(600)).await;
    assert!(attempts > 600, "{attempts}");
    assert_eq!(admitted, 300);
    // every instance reads the one state: the daily band lost exactly 300
    for t in &tiers {
        let peek = t.check("deploy", "bands", 0).await.unwrap().unwrap();
        let remaining: Vec<u32> = peek.bands().map(|(_, s)| s.remaining).collect();
        assert_eq!(remaining, [0, 10_000 - 300]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_mid_run_reloads_the_batch_script() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    let tiers = RateTier::builder()
        .tier("day", Quota::per_day(2_000))
        .storage(redis)
        .build();
    let flushes = async {
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(60)).await;
            let port = server.port().to_string();
            tokio::task::spawn_blocking(move || {
                std::process::Command::new("redis-cli")
                    .args(["-p", &port, "SCRIPT", "FLUSH"])
                    .output()
            })
            .await
            .unwrap()
            .unwrap();
        }
    };
    let ((mut admitted, mut attempts), ()) = tokio::join!(
        hammer(
            std::slice::from_ref(&tiers),
            32,
            "flush",
            "day",
            Duration::from_millis(600)
        ),
        flushes
    );
    // A loaded machine may not reach the quota within the flushes: go on
    // until more was asked than the quota holds, however long that takes.
    while attempts <= 2_000 {
        let (more, tried) = hammer(
            std::slice::from_ref(&tiers),
            32,
            "flush",
            "day",
            Duration::from_millis(200),
        )
        .await;
        admitted += more;
        attempts += tried;
    }
    // no check failed (`hammer` panics on an error), none counted twice
    assert_eq!(admitted, 2_000, "{attempts} attempts");
    assert!(server.command_calls("eval") >= 8, "the scripts were loaded again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_keys_in_a_batch_are_fresh_states_and_fail_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    let one = [Quota::per_minute(10)];
    let two = [Quota::per_minute(10), Quota::per_hour(100)];
    let users: Vec<String> = (0..12).map(|i| format!("batch-{i}")).collect();
    // every user has spent 4 of its 10 (asked for together: this batch
    // also loads the batch script)
    let spent: Vec<Decide> = users
        .iter()
        .map(|user| {
            let bands: &[Quota] = if user.ends_with('1') { &two } else { &one };
            redis.check(key("t", user), bands, 4)
        })
        .collect();
    for d in spent {
        assert!(d.await.unwrap().allowed);
    }
    // three keys corrupted: garbage, a hash, a list in the second band
    server.cli(&["SET", &redis.band_key(key("t", "batch-3"), &one[0]), "zzz"]);
    let hashed = redis.band_key(key("t", "batch-7"), &one[0]);
    server.cli(&["DEL", &hashed]);
    server.cli(&["HSET", &hashed, "f", "v"]);
    let listed = redis.band_key(key("t", "batch-11"), &two[1]);
    server.cli(&["DEL", &listed]);
    server.cli(&["LPUSH", &listed, "x"]);
    server.cli(&["CONFIG", "RESETSTAT"]);
    // asked for together: the first goes alone, the other eleven as a batch
    let pending: Vec<Decide> = users
        .iter()
        .map(|user| {
            let bands: &[Quota] = if user.ends_with('1') { &two } else { &one };
            redis.check(key("t", user), bands, 1)
        })
        .collect();
    let mut decided = Vec::new();
    for d in pending {
        decided.push(d.await.expect("no decision of the batch fails"));
    }
    assert_eq!(script_calls(&server), 2, "one single call and one batch");
    for (user, d) in users.iter().zip(&decided) {
        assert!(d.allowed, "{user}");
        let expected = match user.as_str() {
            "batch-3" | "batch-7" => vec![9],
            "batch-11" => vec![5, 99],
            u if u.ends_with('1') => vec![5, 95],
            _ => vec![5],
        };
        let remaining: Vec<u32> = d.bands.iter().map(|b| b.remaining).collect();
        assert_eq!(remaining, expected, "{user}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_that_times_out_is_never_sent_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let timeout = Duration::from_millis(200);
    let redis = RedisStorage::builder(server.url())
        .timeout(timeout)
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    let tiers = RateTier::builder()
        .tier("day", Quota::per_day(100_000))
        .storage(redis)
        .build();
    tiers.check("sleepy", "day", 1).await.unwrap().unwrap();
    let port = server.port().to_string();
    let sleeper = std::thread::spawn(move || {
        std::process::Command::new("redis-cli")
            .args(["-p", &port, "DEBUG", "SLEEP", "1"])
            .output()
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (admitted, timeouts, attempts) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let slowest = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..64 {
        let tiers = tiers.clone();
        let (admitted, timeouts, attempts, slowest) = (
            admitted.clone(),
            timeouts.clone(),
            attempts.clone(),
            slowest.clone(),
        );
        handles.push(tokio::spawn(async move {
            let stop = Instant::now() + Duration::from_millis(700);
            while Instant::now() < stop {
                attempts.fetch_add(1, Ordering::Relaxed);
                let started = Instant::now();
                let result = tiers.check("sleepy", "day", 1).await;
                slowest.fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                match result {
                    Ok(Ok(_)) => admitted.fetch_add(1, Ordering::Relaxed),
                    Err(CheckError::Storage(e))
                        if e.kind() == tower_rate_tier::storage::StorageErrorKind::Timeout =>
                    {
                        timeouts.fetch_add(1, Ordering::Relaxed)
                    }
                    other => panic!("unexpected {other:?}"),
                };
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let _ = sleeper.join();
    let (admitted, timeouts, attempts) = (
        admitted.load(Ordering::Relaxed),
        timeouts.load(Ordering::Relaxed),
        attempts.load(Ordering::Relaxed),
    );
    let slowest = Duration::from_millis(slowest.load(Ordering::Relaxed));
    println!("DEBUG SLEEP under 64 tasks: {attempts} decisions, {timeouts} timed out, slowest {slowest:?}");
    assert!(timeouts >= 64, "{timeouts}");
    assert!(slowest < timeout + Duration::from_millis(150), "{slowest:?}");
    // what Redis counted: every admitted decision, and a timed-out one at
    // most once (a batch is never sent twice)
    let peek = tiers.check("sleepy", "day", 0).await.unwrap().unwrap();
    let counted = u64::from(100_000 - 1 - peek.remaining);
    assert!(
        counted >= admitted && counted <= admitted + timeouts,
        "{counted} {admitted} {timeouts}"
    );
}

/// One decision asked for in a group.
#[derive(Debug, Clone)]
struct Ask {
    user: usize,
    bands: usize,
    refund: bool,
    cost: u32,
}

const BANDSETS: [&[Quota]; 3] = [
    &[Quota::per_minute(10).with_burst(3)],
    &[Quota::per_minute(6), Quota::per_hour(40)],
    &[
        Quota::per_hour(12).with_burst(5),
        Quota::per_minute(30),
        Quota::unlimited(),
    ],
];

fn asks() -> impl Strategy<Value = Vec<(u64, Vec<Ask>)>> {
    let ask = (0..3usize, 0..3usize, prop::bool::weighted(0.15), 0..4u32).prop_map(
        |(user, bands, refund, cost)| Ask {
            user,
            bands,
            refund,
            cost,
        },
    );
    prop::collection::vec((advances(), prop::collection::vec(ask, 1..24)), 1..8)
}

/// How far the fake clock moves between two groups of decisions, in
/// microseconds: 0 to 20 whole seconds. Every band of these tests has an
/// interval of whole seconds, so a stored time is either passed or at least
/// a second ahead of the fake clock, and its key's expiry (which runs on the
/// server's real clock) at least a second away. Advances of any microsecond
/// could bring the clock within a few milliseconds of a stored time; a key
/// then written (a refund writes its expiry again) could expire in real
/// time before a loaded machine asked for the group's next decision: a
/// fresh band on one side and not on the other (seen once in CI).
pub(crate) fn advances() -> impl Strategy<Value = u64> {
    (0..=20u64).prop_map(|secs| secs * 1_000_000)
}

fn ask_storage(storage: &RedisStorage, case: &str, ask: &Ask, clock: &Arc<dyn Clock>) -> Decide {
    let user = format!("u{}", ask.user);
    let key = StorageKey {
        namespace: case,
        tier: ["a", "b", "c"][ask.bands],
        user: &user,
    };
    let op = if ask.refund {
        Op::Refund(ask.cost)
    } else {
        Op::Charge(ask.cost)
    };
    storage.decide(key, BANDSETS[ask.bands], op, clock)
}

fn same(mut a: Decision, b: &Decision) -> bool {
    a.source = b.source;
    a == *b
}

/// Random groups of concurrent decisions (asked for together, so they
/// batch), with the clock moved between groups: each batching storage
/// decides exactly as one script call per decision, in the order asked.
/// With the deny cache the decisions of a group are asked one after the
/// other: a cached denial answers from the state of decisions that have
/// completed, so next to decisions still in flight it is one made before
/// them (a lower bound of the state, hence also of `Retry-After`), not
/// after them in the order asked.
/// A `FakeClock` (the client clock) makes both sides decide at the same
/// instants; long windows keep keys from expiring on the server's real
/// clock while the fake one stands still.
#[test]
fn batched_decisions_equal_one_call_each() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let calls = batched_equal_one_call_each(
        |prefix| RedisStorage::builder(url.clone()).prefix(prefix),
        || {
            server.cli(&["CONFIG", "RESETSTAT"]);
        },
        || script_calls(&server),
    );
    // the batching storages made fewer calls than decisions
    assert!(calls.subject < 3 * calls.asked * 3 / 4, "{calls:?}");
}

/// The storages a comparison decides with, on the server(s) of `builder`
/// (a builder for a key prefix) and on `clock`: a reference deciding each
/// decision in a script call of its own, and three that batch (up to 128,
/// up to 3, and up to 128 behind the deny cache).
pub(crate) async fn compared(
    builder: &impl Fn(&str) -> tower_rate_tier::storage::RedisStorageBuilder,
    clock: &FakeClock,
) -> (RedisStorage, Vec<RedisStorage>) {
    let connect = |prefix: &str, batching: bool, max: usize, cache: bool| {
        builder(prefix)
            .client_clock(clock.clone())
            .batching(batching)
            .max_batch(max)
            .deny_cache(cache)
            .connect()
    };
    let reference = connect("ref", false, 2, false).await.unwrap();
    let subjects = vec![
        connect("b128", true, 128, false).await.unwrap(),
        connect("b3", true, 3, false).await.unwrap(),
        connect("b128c", true, 128, true).await.unwrap(),
    ];
    (reference, subjects)
}

/// What [`batched_equal_one_call_each`] counted.
#[derive(Debug)]
pub(crate) struct Calls {
    /// Decisions asked of each storage.
    pub(crate) asked: u64,
    /// Script calls the three batching storages made for them.
    pub(crate) subject: u64,
}

/// The property of [`batched_decisions_equal_one_call_each`] on the
/// server(s) of `builder` (a builder for a key prefix): `reset` clears the
/// servers' command counts, `script_calls` reads them.
pub(crate) fn batched_equal_one_call_each(
    builder: impl Fn(&str) -> tower_rate_tier::storage::RedisStorageBuilder,
    reset: impl Fn(),
    script_calls: impl Fn() -> u64,
) -> Calls {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::new();
    let fake: Arc<dyn Clock> = Arc::new(clock.clone());
    let (reference, subjects) = runtime.block_on(compared(&builder, &clock));
    let case = AtomicU64::new(0);
    let asked = AtomicU64::new(0);
    let cached = AtomicU64::new(0);
    reset();
    let config = ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in asks())| {
        let case = format!("case{}", case.fetch_add(1, Ordering::Relaxed));
        runtime.block_on(async {
            for (advance, group) in &steps {
                clock.advance(Duration::from_micros(*advance));
                let mut expected = Vec::new();
                asked.fetch_add(group.len() as u64, Ordering::Relaxed);
                for ask in group {
                    expected.push(ask_storage(&reference, &case, ask, &fake).await);
                }
                for subject in &subjects {
                    // Asked for together, so that they batch; the deny
                    // cache one by one (see below).
                    let pending: Vec<Decide> = if subject.has_deny_cache() {
                        let mut decided = Vec::new();
                        for ask in group {
                            decided.push(Decide::ready(ask_storage(subject, &case, ask, &fake).await));
                        }
                        decided
                    } else {
                        group.iter().map(|ask| ask_storage(subject, &case, ask, &fake)).collect()
                    };
                    for ((d, want), ask) in pending.into_iter().zip(&expected).zip(group) {
                        let (got, want) = (d.await, want.as_ref().map_err(|e| e.to_string()));
                        let got = got.map_err(|e| e.to_string());
                        match (&got, &want) {
                            (Ok(g), Ok(w)) => {
                                if g.source == DecisionSource::DenyCache {
                                    cached.fetch_add(1, Ordering::Relaxed);
                                }
                                prop_assert!(same(g.clone(), w), "{subject:?} {ask:?}: {g:?} != {w:?}");
                            }
                            _ => prop_assert!(false, "{subject:?} {ask:?}: {got:?} / {want:?}"),
                        }
                    }
                }
            }
            Ok(())
        })?;
    });
    // the deny cache answered some denials itself (identically, as
    // compared above)
    let asked = asked.load(Ordering::Relaxed);
    let cached = cached.load(Ordering::Relaxed);
    let subject = script_calls() - asked;
    println!(
        "{asked} decisions per storage; the 3 batching ones made {subject} calls; {cached} from the deny cache"
    );
    assert!(cached > 0);
    Calls { asked, subject }
}
