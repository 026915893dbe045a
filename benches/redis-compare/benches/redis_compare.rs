//! Checks per second of the Redis storage at 1, 16 and 64 concurrent tasks,
//! next to the published tower-rate-tier 0.3.0's Redis storage, in the same
//! run against the same local `redis-server` (started here, on a free
//! loopback port).
//!
//! ```text
//! cargo bench -p redis-compare
//! ```
//!
//! Both storages are called directly (no HTTP), each over one multiplexed
//! connection from a `ConnectionManager`, with the server's `TIME`, on a
//! quota that admits every check (so every check writes), over 1,000 users.
//! Each level runs `ROUNDS` rounds (default 9) in which each subject runs
//! for `SECS` seconds (default 1), 0.3.0 and ours in alternating order; the
//! table shows the median of each and the median of the per-round ratios
//! (ours / 0.3.0), which cancels slow drifts of the machine's load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tower_rate_tier::storage::{RedisStorage, StorageKey};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::RedisServer;
use trt03::storage::Storage as _;

const LEVELS: [usize; 3] = [1, 16, 64];
const USERS: usize = 1_000;
fn secs() -> f64 {
    std::env::var("SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

fn rounds() -> usize {
    std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(9)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[derive(Clone, Copy, PartialEq)]
enum Which {
    Ours,
    OursTwoBands,
    Published,
}

#[derive(Clone)]
struct Subjects {
    ours: RedisStorage,
    published: Arc<trt03::RedisStorage>,
}

async fn run(subjects: &Subjects, which: Which, tasks: usize, secs: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let users: Arc<Vec<String>> = Arc::new((0..USERS).map(|i| format!("bench-user-{i}")).collect());
    let mut handles = Vec::new();
    for t in 0..tasks {
        let subjects = subjects.clone();
        let stop = stop.clone();
        let count = count.clone();
        let users = users.clone();
        handles.push(tokio::spawn(async move {
            let one = [tower_rate_tier::Quota::per_second(1_000_000_000)];
            let two = [
                tower_rate_tier::Quota::per_second(1_000_000_000),
                tower_rate_tier::Quota::per_day(u32::MAX),
            ];
            let theirs = trt03::Quota::per_second(1_000_000_000);
            let mut i = t * 7919;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i = (i + 1) % USERS;
                let user = &users[i];
                let ok = match which {
                    Which::Ours | Which::OursTwoBands => {
                        let bands: &[_] = if which == Which::Ours { &one } else { &two };
                        let key = StorageKey {
                            namespace: "",
                            tier: "free",
                            user,
                        };
                        subjects.ours.check(key, bands, 1).await.is_ok_and(|d| d.allowed)
                    }
                    Which::Published => {
                        let key = trt03::StorageKey::new(user, "free");
                        matches!(
                            subjects.published.check_and_update(key, &theirs, 1, 0).await,
                            Ok(Ok(_))
                        )
                    }
                };
                assert!(ok, "a benchmark check failed or was denied");
                n += 1;
            }
            count.fetch_add(n, Ordering::Relaxed);
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("a benchmark task panicked");
    }
    count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Some(server) = RedisServer::start() else {
        eprintln!("redis-compare: no redis-server, nothing measured");
        return;
    };
    let ours = RedisStorage::builder(server.url())
        .prefix("bench-ours")
        .connect()
        .await
        .expect("connect (ours)");
    let client = redis::Client::open(server.url()).expect("client");
    let conn = client.get_connection_manager().await.expect("connect (0.3.0)");
    let published = Arc::new(trt03::RedisStorage::new(conn).key_prefix("bench-030:"));
    let subjects = Subjects { ours, published };
    let secs = secs();
    if let Ok(only) = std::env::var("ONLY") {
        // one configuration, for profiling: ONLY=ours|published TASKS=16
        let which = if only == "published" {
            Which::Published
        } else {
            Which::Ours
        };
        let tasks = std::env::var("TASKS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(16);
        server.cli(&["CONFIG", "RESETSTAT"]);
        let cpu = || {
            // utime + stime of this process, in clock ticks (1/100 s)
            let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
            let fields: Vec<u64> = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect();
            fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0)
        };
        let before = cpu();
        let rate = run(&subjects, which, tasks, secs).await;
        let ticks = cpu() - before;
        println!(
            "client CPU: {:.2} us per check",
            ticks as f64 * 10_000.0 / (rate * secs)
        );
        let stats = server.cli(&["INFO", "commandstats"]);
        let evalsha = stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha"))
            .unwrap_or("");
        println!("{only} at {tasks} tasks: {rate:.0} checks/s; server: {evalsha}");
        return;
    }
    // warm up both (script upload, connections)
    run(&subjects, Which::Ours, 4, 0.3).await;
    run(&subjects, Which::Published, 4, 0.3).await;
    run(&subjects, Which::OursTwoBands, 4, 0.3).await;

    let rounds = rounds();
    println!();
    println!(
        "Redis storage: checks per second (median of {rounds} rounds of {secs} s; ratio = median of \
         the per-round ratios; one local redis-server)"
    );
    println!();
    println!("| tasks | tower-rate-tier 0.3.0 | ours, 1 band | ratio | ours, 2 bands |");
    println!("|------:|----------------------:|-------------:|------:|--------------:|");
    for tasks in LEVELS {
        let (mut published, mut ours, mut two, mut ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            // alternate the order, so that neither always runs first
            let (p, o) = if round % 2 == 0 {
                let p = run(&subjects, Which::Published, tasks, secs).await;
                (p, run(&subjects, Which::Ours, tasks, secs).await)
            } else {
                let o = run(&subjects, Which::Ours, tasks, secs).await;
                (run(&subjects, Which::Published, tasks, secs).await, o)
            };
            published.push(p);
            ours.push(o);
            ratios.push(o / p);
            two.push(run(&subjects, Which::OursTwoBands, tasks, secs).await);
        }
        println!(
            "| {tasks:>5} | {:>21.0} | {:>12.0} | {:>5.2} | {:>13.0} |",
            median(&mut published),
            median(&mut ours),
            median(&mut ratios),
            median(&mut two),
        );
    }
    println!();
    drop(server);
}
