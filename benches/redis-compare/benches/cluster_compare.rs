//! Checks per second of the Redis storage on a Redis Cluster, batched (the
//! default: a queue per primary) against `batching(false)` (every decision
//! its own call), at 1, 16 and 64 concurrent tasks, on the same local
//! 3-master cluster (started here, on free loopback ports, no replicas).
//!
//! ```text
//! cargo bench -p redis-compare --bench cluster_compare
//! ```
//!
//! Both storages are called directly (no HTTP), with the server's `TIME`,
//! on a quota that admits every check (so every check writes), over 1,000
//! users spread over the three primaries. Each level runs `ROUNDS` rounds
//! (default 9) in which each storage runs for `SECS` seconds (default 1),
//! in alternating order; the table shows the median of each and the median
//! of the per-round ratios (batched / off), which cancels slow drifts of
//! the machine's load. Before each run the nodes' statistics are reset, so
//! `INFO commandstats` gives that run's script calls and server time:
//! server microseconds per decision, and decisions per call; the process's
//! own CPU time gives the client's microseconds per decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tower_rate_tier::Quota;
use tower_rate_tier::storage::{RedisStorage, StorageKey};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::{RedisCluster, own_cluster};

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

/// What one run measured.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    per_sec: f64,
    decisions: u64,
    /// Decisions that failed (a timeout on a loaded machine); not counted
    /// in `decisions`.
    errors: u64,
    calls: u64,
    server_usec: u64,
    /// CPU time of this process (the client) during the run, in clock
    /// ticks (1/100 s).
    client_ticks: u64,
    /// CPU time of the three `redis-server` processes during the run.
    server_ticks: u64,
}

impl Run {
    fn server_us_per_decision(&self) -> f64 {
        self.server_usec as f64 / self.decisions.max(1) as f64
    }

    fn per_call(&self) -> f64 {
        self.decisions as f64 / self.calls.max(1) as f64
    }

    fn client_us_per_decision(&self) -> f64 {
        self.client_ticks as f64 * 10_000.0 / self.decisions.max(1) as f64
    }

    fn server_cpu_us_per_decision(&self) -> f64 {
        self.server_ticks as f64 * 10_000.0 / self.decisions.max(1) as f64
    }
}

/// utime + stime of the servers' processes, in clock ticks.
fn server_ticks(cluster: &RedisCluster) -> u64 {
    let pids = cluster.nodes().iter().filter_map(|n| n.pid());
    pids.map(|pid| cpu_ticks(&format!("/proc/{pid}/stat"))).sum()
}

/// utime + stime of the process whose `stat` file is `stat`, in clock
/// ticks (1/100 s).
fn cpu_ticks(stat: &str) -> u64 {
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    let fields: Vec<u64> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // (the state letter is not a number: utime and stime are the 11th and
    // 12th numbers)
    fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0)
}

/// `(calls, usec)` of the script commands on every node since the last
/// reset.
fn script_stats(cluster: &RedisCluster) -> (u64, u64) {
    let (mut calls, mut usec) = (0, 0);
    for node in cluster.nodes() {
        let info = node.cli(&["INFO", "commandstats"]);
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
    }
    (calls, usec)
}

/// `tasks` tasks check through `storage` for `secs` seconds, each on its
/// own walk through `users`.
async fn run(
    cluster: &RedisCluster,
    storage: &RedisStorage,
    tasks: usize,
    secs: f64,
    users: &Arc<Vec<String>>,
) -> Run {
    for node in cluster.nodes() {
        node.cli(&["CONFIG", "RESETSTAT"]);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (storage, stop, count, errors, users) = (
            storage.clone(),
            stop.clone(),
            count.clone(),
            errors.clone(),
            users.clone(),
        );
        handles.push(tokio::spawn(async move {
            let quota = [Quota::per_second(1_000_000_000)];
            let mut i = t * 7919;
            let (mut n, mut failed) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                i = (i + 1) % users.len();
                let key = StorageKey {
                    namespace: "",
                    tier: "free",
                    user: &users[i],
                };
                match storage.check(key, &quota, 1).await {
                    Ok(_) => n += 1,
                    Err(_) => failed += 1,
                }
                tokio::task::yield_now().await;
            }
            count.fetch_add(n, Ordering::Relaxed);
            errors.fetch_add(failed, Ordering::Relaxed);
        }));
    }
    let started = Instant::now();
    let (ticks, servers) = (cpu_ticks("/proc/self/stat"), server_ticks(cluster));
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("a benchmark task panicked");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let client_ticks = cpu_ticks("/proc/self/stat") - ticks;
    let server_ticks = server_ticks(cluster) - servers;
    let (calls, server_usec) = script_stats(cluster);
    let decisions = count.load(Ordering::Relaxed);
    Run {
        per_sec: decisions as f64 / elapsed,
        decisions,
        errors: errors.load(Ordering::Relaxed),
        calls,
        server_usec,
        client_ticks,
        server_ticks,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Some(cluster) = own_cluster() else {
        eprintln!("cluster_compare: no redis-server, nothing measured");
        return;
    };
    let connect = |prefix: &'static str, batching: bool| {
        RedisStorage::cluster(cluster.urls())
            .prefix(prefix)
            .batching(batching)
            .hash_secret("bench secret, not kept anywhere")
            .connect()
    };
    let batched = connect("bench-batched", true).await.expect("connect (batched)");
    let off = connect("bench-off", false).await.expect("connect (batching off)");
    let secs = env_or("SECS", 1.0);
    let rounds = env_or("ROUNDS", 9usize);
    let users: Arc<Vec<String>> = Arc::new((0..USERS).map(|i| format!("bench-user-{i}")).collect());
    // warm up (script uploads, connections, the slot map)
    for storage in [&batched, &off] {
        run(&cluster, storage, 4, 0.3, &users).await;
    }
    println!();
    println!(
        "Redis Cluster (3 primaries, local): checks per second (median of {rounds} rounds of {secs} s; \
         ratio = median of the per-round ratios batched / off; server us = script time per decision \
         on all nodes from INFO commandstats (wall time, which a busy machine stretches); server CPU \
         us = the redis-server processes' CPU time per decision; client us = this process's CPU time \
         per decision; per call = decisions per script call)"
    );
    println!();
    println!(
        "| tasks | batched | batching off | ratio | server us: batched | off | server CPU us: batched | off \
         | client us: batched | off | per call: batched |"
    );
    println!("|------:|------:|------:|------:|------:|------:|------:|------:|------:|------:|------:|");
    for tasks in LEVELS {
        let (mut on_runs, mut off_runs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            // alternate the order, so that neither always runs first
            let (a, b) = if round % 2 == 0 {
                (&batched, &off)
            } else {
                (&off, &batched)
            };
            let first = run(&cluster, a, tasks, secs, &users).await;
            let second = run(&cluster, b, tasks, secs, &users).await;
            let (on, of) = if round % 2 == 0 {
                (first, second)
            } else {
                (second, first)
            };
            ratios.push(on.per_sec / of.per_sec);
            on_runs.push(on);
            off_runs.push(of);
        }
        let failed: u64 = on_runs.iter().chain(&off_runs).map(|r| r.errors).sum();
        if failed > 0 {
            eprintln!("{tasks} tasks: {failed} decisions failed (timeouts), left out of the rates");
        }
        let med = |runs: &[Run], f: fn(&Run) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
        println!(
            "| {tasks:>5} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} |",
            med(&on_runs, |r| r.per_sec),
            med(&off_runs, |r| r.per_sec),
            median(&mut ratios),
            med(&on_runs, Run::server_us_per_decision),
            med(&off_runs, Run::server_us_per_decision),
            med(&on_runs, Run::server_cpu_us_per_decision),
            med(&off_runs, Run::server_cpu_us_per_decision),
            med(&on_runs, Run::client_us_per_decision),
            med(&off_runs, Run::client_us_per_decision),
            med(&on_runs, Run::per_call),
        );
    }
    println!();
}
