//! Checks per second of the Redis storage at 1, 16 and 64 concurrent tasks,
//! next to the published tower-rate-tier 0.3.0's Redis storage, in the same
//! run against the same local `redis-server` (started here, on a free
//! loopback port); then a spent quota hammered by 16 tasks.
//!
//! ```text
//! cargo bench -p redis-compare
//! ```
//!
//! Both storages are called directly (no HTTP), each over one multiplexed
//! connection from a `ConnectionManager`, with the server's `TIME`, on a
//! quota that admits every check (so every check writes), over 1,000 users.
//! Each level runs `ROUNDS` rounds (default 9) in which each subject runs
//! for `SECS` seconds (default 1), 0.3.0 and ours in alternating order, then
//! ours with batching off; the table shows the median of each and the median
//! of the per-round ratios (ours / 0.3.0), which cancels slow drifts of the
//! machine's load. Before each run the server's statistics are reset, so
//! `INFO commandstats` gives that run's script calls and server time:
//! server microseconds per decision, and decisions per call (the mean batch
//! size).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tower_rate_tier::storage::{RedisStorage, StorageKey};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::RedisServer;
use trt03::storage::Storage as _;

const LEVELS: [usize; 3] = [1, 16, 64];
const USERS: usize = 1_000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Which {
    /// Ours with the defaults (batching and deny cache on).
    Ours,
    /// Ours with batching off.
    OursSingle,
    Published,
}

#[derive(Clone)]
struct Subjects {
    ours: RedisStorage,
    single: RedisStorage,
    published: Arc<trt03::RedisStorage>,
}

/// What one run measured.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    per_sec: f64,
    decisions: u64,
    admitted: u64,
    /// Decisions that failed (a timeout on a loaded machine); not counted
    /// in `decisions`.
    errors: u64,
    calls: u64,
    server_usec: u64,
}

impl Run {
    fn server_us_per_decision(&self) -> f64 {
        self.server_usec as f64 / self.decisions.max(1) as f64
    }

    fn per_call(&self) -> f64 {
        self.decisions as f64 / self.calls.max(1) as f64
    }
}

/// `(calls, usec)` of the script commands since the last reset.
fn script_stats(server: &RedisServer) -> (u64, u64) {
    let info = server.cli(&["INFO", "commandstats"]);
    let mut calls = 0;
    let mut usec = 0;
    for line in info.lines() {
        let Some(rest) = line
            .strip_prefix("cmdstat_evalsha:")
            .or_else(|| line.strip_prefix("cmdstat_eval:"))
        else {
            continue;
        };
        for kv in rest.split(',') {
            if let Some(n) = kv.strip_prefix("calls=") {
                calls += n.parse::<u64>().unwrap_or(0);
            } else if let Some(n) = kv.strip_prefix("usec=") {
                usec += n.parse::<u64>().unwrap_or(0);
            }
        }
    }
    (calls, usec)
}

/// The quota of a run: one that admits every check, or one of a single
/// check per day (spent after each user's first check).
#[derive(Clone, Copy, PartialEq)]
enum Load {
    AdmitAll,
    Spent,
}

/// `tasks` tasks check for `secs` seconds, each on its own walk through
/// `users`.
async fn run(
    server: &RedisServer,
    subjects: &Subjects,
    which: Which,
    tasks: usize,
    secs: f64,
    users: Arc<Vec<String>>,
    load: Load,
) -> Run {
    server.cli(&["CONFIG", "RESETSTAT"]);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (subjects, stop, count, admitted, errors, users) = (
            subjects.clone(),
            stop.clone(),
            count.clone(),
            admitted.clone(),
            errors.clone(),
            users.clone(),
        );
        handles.push(tokio::spawn(async move {
            let (ours, theirs) = match load {
                Load::AdmitAll => (
                    [tower_rate_tier::Quota::per_second(1_000_000_000)],
                    trt03::Quota::per_second(1_000_000_000),
                ),
                Load::Spent => ([tower_rate_tier::Quota::per_day(1)], trt03::Quota::per_day(1)),
            };
            let mut i = t * 7919;
            let (mut n, mut ok, mut failed) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                i = (i + 1) % users.len();
                let user = &users[i];
                let allowed = match which {
                    Which::Ours | Which::OursSingle => {
                        let storage = if which == Which::Ours {
                            &subjects.ours
                        } else {
                            &subjects.single
                        };
                        let key = StorageKey {
                            namespace: "",
                            tier: "free",
                            user,
                        };
                        storage.check(key, &ours, 1).await.ok().map(|d| d.allowed)
                    }
                    Which::Published => {
                        let key = trt03::StorageKey::new(user, "free");
                        let outcome = subjects.published.check_and_update(key, &theirs, 1, 0).await;
                        outcome.ok().map(|o| o.is_ok())
                    }
                };
                match allowed {
                    Some(allowed) => {
                        n += 1;
                        ok += u64::from(allowed);
                    }
                    None => failed += 1,
                }
                // a decision answered in process (a cached denial) needs no
                // waiting: let the other tasks and the connection run
                tokio::task::yield_now().await;
            }
            count.fetch_add(n, Ordering::Relaxed);
            admitted.fetch_add(ok, Ordering::Relaxed);
            errors.fetch_add(failed, Ordering::Relaxed);
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("a benchmark task panicked");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (calls, server_usec) = script_stats(server);
    let decisions = count.load(Ordering::Relaxed);
    Run {
        per_sec: decisions as f64 / elapsed,
        decisions,
        admitted: admitted.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        calls,
        server_usec,
    }
}

/// Hammers `users` (a spent quota) at `rate` checks per second in all,
/// paced, until `stop`: the abusive clients next to admitted ones. Returns
/// how many checks it made. Without `checks`, the pacers wake as often and
/// check nothing: the control that shows what the pacing itself costs.
fn hammer(
    subjects: &Subjects,
    rate: u32,
    users: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
    checks: bool,
) -> tokio::task::JoinHandle<u64> {
    let subjects = subjects.clone();
    tokio::spawn(async move {
        // 5 pacers, each on a tick of 5 / rate seconds
        let pacers = 5u32;
        let period = Duration::from_secs_f64(f64::from(pacers) / f64::from(rate.max(1)));
        let mut tasks = Vec::new();
        for p in 0..pacers {
            let (subjects, users, stop) = (subjects.clone(), users.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let quota = [tower_rate_tier::Quota::per_day(1)];
                let (mut i, mut n) = (p as usize, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    i = (i + 1) % users.len();
                    let key = StorageKey {
                        namespace: "",
                        tier: "free",
                        user: &users[i],
                    };
                    if checks {
                        let _ = subjects.ours.check(key, &quota, 1).await;
                    } else {
                        std::hint::black_box(key);
                    }
                    n += 1;
                }
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap_or(0);
        }
        total
    })
}

/// 16 admitted tasks for `secs` next to the hammering of `spent` at 5,000
/// checks/s (or its pacers alone, without `checks`); and how many checks
/// the hammering made.
async fn beside_hammering(
    server: &RedisServer,
    subjects: &Subjects,
    secs: f64,
    users: &Arc<Vec<String>>,
    spent: &Arc<Vec<String>>,
    checks: bool,
) -> (Run, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let pacer = hammer(subjects, 5_000, spent.clone(), stop.clone(), checks);
    let b = run(
        server,
        subjects,
        Which::Ours,
        16,
        secs,
        users.clone(),
        Load::AdmitAll,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    (b, pacer.await.unwrap_or(0))
}

/// utime + stime of this process, in clock ticks (1/100 s).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // (the state letter is not a number: utime and stime are the 11th and 12th numbers)
    fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Some(server) = RedisServer::start() else {
        eprintln!("redis-compare: no redis-server, nothing measured");
        return;
    };
    let connect = |prefix: &'static str, batching: bool| {
        RedisStorage::builder(server.url())
            .prefix(prefix)
            .batching(batching)
            .hash_secret("bench secret, not kept anywhere")
            .connect()
    };
    let ours = connect("bench-ours", true).await.expect("connect (ours)");
    let single = connect("bench-single", false)
        .await
        .expect("connect (ours, single)");
    let client = redis::Client::open(server.url()).expect("client");
    let conn = client.get_connection_manager().await.expect("connect (0.3.0)");
    let published = Arc::new(trt03::RedisStorage::new(conn).key_prefix("bench-030:"));
    let subjects = Subjects {
        ours,
        single,
        published,
    };
    let secs = env_or("SECS", 1.0);
    let rounds = env_or("ROUNDS", 9usize);
    let users: Arc<Vec<String>> = Arc::new((0..USERS).map(|i| format!("bench-user-{i}")).collect());
    let admit_all = Load::AdmitAll;
    let spent: Arc<Vec<String>> = Arc::new((0..100).map(|i| format!("spent-user-{i}")).collect());
    if std::env::var("ONLY").as_deref() == Ok("hammer") {
        // the last table alone
        run(
            &server,
            &subjects,
            Which::Ours,
            16,
            0.3,
            spent.clone(),
            Load::Spent,
        )
        .await;
        hammering_table(&server, &subjects, secs, rounds, &users, &spent).await;
        return;
    }
    if let Ok(only) = std::env::var("ONLY") {
        // one configuration, for profiling: ONLY=ours|single|published TASKS=16
        let which = match only.as_str() {
            "published" => Which::Published,
            "single" => Which::OursSingle,
            _ => Which::Ours,
        };
        let tasks = env_or("TASKS", 16usize);
        let before = cpu_ticks();
        let r = run(&server, &subjects, which, tasks, secs, users, admit_all).await;
        let client_us = (cpu_ticks() - before) as f64 * 10_000.0 / r.decisions.max(1) as f64;
        println!(
            "{which:?} at {tasks} tasks: {:.0} checks/s, {:.2} server us and {client_us:.2} client CPU us \
             per decision, {:.1} decisions per call",
            r.per_sec,
            r.server_us_per_decision(),
            r.per_call()
        );
        return;
    }
    // warm up (script uploads, connections)
    for which in [Which::Ours, Which::Published, Which::OursSingle] {
        run(&server, &subjects, which, 4, 0.3, users.clone(), admit_all).await;
    }

    println!();
    println!(
        "Redis storage: checks per second (median of {rounds} rounds of {secs} s; ratio = median of \
         the per-round ratios; one local redis-server; server us = script time per decision from \
         INFO commandstats; per call = decisions per script call)"
    );
    println!();
    println!(
        "| tasks | 0.3.0 | ours (batching) | ratio | ours, batching off | server us: 0.3.0 | ours | \
         ours, off | per call: ours |"
    );
    println!("|------:|------:|------:|------:|------:|------:|------:|------:|------:|");
    for tasks in LEVELS {
        let mut runs: [Vec<Run>; 3] = Default::default();
        let mut ratios = Vec::new();
        for round in 0..rounds {
            // alternate the order, so that neither always runs first
            let order = if round % 2 == 0 {
                [Which::Published, Which::Ours, Which::OursSingle]
            } else {
                [Which::Ours, Which::Published, Which::OursSingle]
            };
            let mut this = [Run::default(); 3];
            for which in order {
                let slot = which as usize;
                this[slot] = run(&server, &subjects, which, tasks, secs, users.clone(), admit_all).await;
                runs[slot].push(this[slot]);
            }
            ratios.push(this[Which::Ours as usize].per_sec / this[Which::Published as usize].per_sec);
        }
        let failed: u64 = runs.iter().flatten().map(|r| r.errors).sum();
        if failed > 0 {
            eprintln!("{tasks} tasks: {failed} decisions failed (timeouts), left out of the rates");
        }
        let med = |which: Which, f: fn(&Run) -> f64| {
            median(&mut runs[which as usize].iter().map(f).collect::<Vec<_>>())
        };
        println!(
            "| {tasks:>5} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} |",
            med(Which::Published, |r| r.per_sec),
            med(Which::Ours, |r| r.per_sec),
            median(&mut ratios),
            med(Which::OursSingle, |r| r.per_sec),
            med(Which::Published, Run::server_us_per_decision),
            med(Which::Ours, Run::server_us_per_decision),
            med(Which::OursSingle, Run::server_us_per_decision),
            med(Which::Ours, Run::per_call),
        );
    }

    // A spent quota: 16 tasks hammer 100 users with a quota of one check a
    // day (the deny cache answers; 0.3.0 asks Redis every time). Each user's
    // first check passes (one warm-up run spends them all).
    for which in [Which::Ours, Which::Published] {
        run(&server, &subjects, which, 16, 0.3, spent.clone(), Load::Spent).await;
    }
    println!();
    println!("Spent quota, 16 tasks, {secs} s per run (median of {rounds}):");
    println!();
    println!("| subject | denied decisions/s | script calls per denied decision |");
    println!("|---|---:|---:|");
    for which in [Which::Ours, Which::Published] {
        let mut per_sec = Vec::new();
        let mut per_denial = Vec::new();
        for _ in 0..rounds {
            let r = run(&server, &subjects, which, 16, secs, spent.clone(), Load::Spent).await;
            assert_eq!(r.admitted, 0, "the quota was spent");
            if r.errors > 0 {
                eprintln!("spent quota, {which:?}: {} decisions failed", r.errors);
            }
            per_sec.push(r.per_sec);
            per_denial.push(r.calls as f64 / r.decisions.max(1) as f64);
        }
        let name = if which == Which::Ours {
            "ours (deny cache)"
        } else {
            "0.3.0"
        };
        println!(
            "| {name} | {:.0} | {:.4} |",
            median(&mut per_sec),
            median(&mut per_denial)
        );
    }
    println!();

    hammering_table(&server, &subjects, secs, rounds, &users, &spent).await;
    drop(server);
}

/// Abusive clients next to admitted ones: 16 admitted tasks alone, next to
/// hammering callers held at 5,000 checks/s on the spent quota `spent`, and
/// next to the same pacers checking nothing (the control), in an order that
/// rotates each round; the admitted throughput should barely move.
async fn hammering_table(
    server: &RedisServer,
    subjects: &Subjects,
    secs: f64,
    rounds: usize,
    users: &Arc<Vec<String>>,
    spent: &Arc<Vec<String>>,
) {
    println!(
        "Admitted callers (16 tasks) alone, next to a spent quota hammered at 5,000 checks/s, and next to \
         the same pacers checking nothing (the control; median of {rounds}, rotating order):"
    );
    println!();
    println!(
        "| admitted alone (checks/s) | next to the hammering | ratio | next to the pacing alone | ratio | \
         hammering checks/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    // the three cases, as indices into each round's results
    const ALONE: usize = 0;
    const HAMMERED: usize = 1;
    const PACED: usize = 2;
    let mut seen: [Vec<f64>; 3] = Default::default();
    let (mut ratios, mut controls, mut hammered) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // rotate which goes first, so that drift within a round favours none
        let mut this = [0.0; 3];
        for k in 0..3 {
            let case = (round + k) % 3;
            this[case] = if case == ALONE {
                let alone = Load::AdmitAll;
                run(server, subjects, Which::Ours, 16, secs, users.clone(), alone)
                    .await
                    .per_sec
            } else {
                let checks = case == HAMMERED;
                let (b, made) = beside_hammering(server, subjects, secs, users, spent, checks).await;
                if checks {
                    hammered.push(made as f64 / secs);
                }
                b.per_sec
            };
        }
        for (all, value) in seen.iter_mut().zip(this) {
            all.push(value);
        }
        ratios.push(this[HAMMERED] / this[ALONE]);
        controls.push(this[PACED] / this[ALONE]);
    }
    let [alone, beside, paced] = &mut seen;
    println!(
        "| {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} |",
        median(alone),
        median(beside),
        median(&mut ratios),
        median(paced),
        median(&mut controls),
        median(&mut hammered)
    );
    println!();
}
