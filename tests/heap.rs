//! Live heap and file descriptors, measured with a counting allocator:
//! a loopback HTTP load, a key-space flood, and bytes per tracked key next to
//! governor's keyed store. Small versions of the release-mode examples
//! `http_load` and `flood` (see RELIABILITY.md).

use std::sync::Mutex;
use std::time::Duration;

use tower_rate_tier_tests::{flood, heap, http_load};

#[global_allocator]
static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// The measurements are process-wide: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn loopback_http_load_has_no_errors_and_leaks_no_fds_or_heap() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let load = http_load::Load {
        requests: 3_000,
        concurrency: 32,
        users: 40,
        quota: 50,
        close_every: 50,
        rounds: 2,
    };
    let r = runtime().block_on(http_load::run(load));
    println!(
        "http load: {} requests in {:?}: {} ok, {} limited, {} errors; fds {} -> {}; heap {} -> {:?} (peak {})",
        load.requests,
        r.elapsed,
        r.ok,
        r.limited,
        r.errors,
        r.fds_before,
        r.fds_after,
        r.heap_before,
        r.heap_after_rounds,
        r.heap_peak
    );
    assert_eq!(r.errors, 0);
    assert_eq!(r.ok + r.limited, load.requests);
    // each user sent 3_072 / 40 ≥ 76 requests, more than the quota of 50:
    // exactly 50 admitted each over HTTP
    assert!(
        r.admitted_per_user.iter().all(|&a| a == 50),
        "{:?}",
        r.admitted_per_user
    );
    assert!(r.limited > 0);
    assert!(
        r.fds_after <= r.fds_before + 2,
        "fds {} -> {}",
        r.fds_before,
        r.fds_after
    );
    let grown = heap::delta(r.heap_before, r.heap_after);
    assert!(grown < 256 * 1024, "live heap grew by {grown} bytes");
    // what the first round added (per-thread caches of rendered header
    // values filling up), the second does not add again
    let second = heap::delta(r.heap_after_rounds[0], r.heap_after_rounds[1]);
    assert!(second < 32 * 1024, "the second round added {second} bytes");
}

#[test]
fn key_flood_stays_under_the_cap_reclaims_and_keeps_legitimate_quotas_exact() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cap = 5_000;
    // the cap's size: what exactly `cap` tracked keys take
    let per_key = flood::bytes_per_key_ours(cap);
    let cap_size = per_key * cap as f64;
    let f = flood::Flood {
        identities: 20_000,
        max_keys: cap,
        legit_users: 5,
        legit_every: 10,
        // a key lives 6 s, which hold 15,000 arrivals: three times the cap;
        // the flood lasts 8 s of fake time, so the first keys expire during it
        step: Duration::from_micros(400),
    };
    let r = runtime().block_on(flood::run(f));
    println!(
        "flood of {}: {r:?}; cap size {cap_size:.0} B ({per_key:.1} B/key)",
        f.identities
    );
    assert_eq!(r.flood_other, 0);
    assert_eq!(r.flood_counted + r.flood_limited, f.identities);
    // the cap held and was reached
    assert!(r.max_len <= cap && r.max_len >= cap * 9 / 10, "{}", r.max_len);
    // at the cap nobody passed uncounted: the identities without room of
    // their own shared the tier's overflow bucket, one quota for all of
    // them (burst + elapsed / interval at most)
    assert_eq!(r.flood_uncounted, 0);
    assert!(r.flood_overflow > 0);
    let shared_admitted = r.flood_overflow - r.flood_limited;
    let shared_bound = u64::from(flood::QUOTA.burst())
        + r.fake_elapsed.as_nanos() as u64 / flood::QUOTA.emission_interval_nanos();
    assert!(
        shared_admitted as u64 <= shared_bound,
        "{shared_admitted} > {shared_bound}"
    );
    // expired keys were reclaimed during the flood (more keys were counted
    // than fit at once) ...
    assert!(r.flood_counted > cap + cap / 2, "{}", r.flood_counted);
    // ... and the heap stayed within twice the cap's size (the shards'
    // tables double once when refilled after a sweep) plus 64 KiB; without
    // the cap, 15,000 live keys would take 3 times the cap's size
    let bound = flood::heap_bound(cap_size);
    assert!(
        (r.heap_peak_growth as f64) < bound,
        "peak {} >= {bound}",
        r.heap_peak_growth
    );
    // legitimate users were counted on every request and got exactly
    // burst + elapsed / interval
    assert_eq!(r.legit_uncounted, 0);
    assert_eq!(r.legit_admitted, r.legit_expected);
    assert!(r.legit_expected.iter().all(|&e| e > 10), "{:?}", r.legit_expected);
    // an hour later the GC has reclaimed every key, and new users are
    // counted again
    assert_eq!(r.len_after_gc, 0);
    // the keys' own allocations (7 bytes of user id or more each) were
    // freed, and the emptied tables were shrunk: the heap is back to within
    // 16 KiB of where the flood started
    let freed = r.heap_growth_after_flood - r.heap_growth_after_gc;
    assert!(freed >= 7 * r.len_after_flood as i64, "{freed} bytes freed");
    assert!(
        r.heap_growth_after_gc < 16 * 1024,
        "{} bytes kept",
        r.heap_growth_after_gc
    );
    assert_eq!(r.counted_after_gc, 1_000);
}

#[test]
fn bytes_per_tracked_key_are_no_more_than_governors() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = 20_000;
    let ours = flood::bytes_per_key_ours(n);
    let governor = flood::bytes_per_key_governor(n);
    println!("bytes per key at {n} keys: ours {ours:.1}, governor {governor:.1}");
    assert!(
        ours > 12.0 && governor > 12.0,
        "the keys themselves take 12 bytes"
    );
    assert!(ours <= governor, "ours {ours:.1} > governor {governor:.1}");
}

/// Tier definitions are ordinary shared values: 10,000 `RateTier`s built
/// (each with tiers of its own names and quotas, checked once so the storage
/// and headers are used) and dropped leave the live heap where it started.
#[test]
fn built_and_dropped_rate_tiers_leave_nothing_behind() {
    use tower_rate_tier::{Quota, RateTier};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = runtime();
    // the process clock and the runtime's own structures settle first
    let warm = RateTier::builder().tier("warm", Quota::per_second(1)).build();
    drop(runtime.block_on(warm.check("u", "warm", 1)));
    drop(warm);
    // A dropped storage's GC task ends on the runtime's workers, a few
    // scheduler turns later: count the heap once every task has ended.
    let settled = || {
        let waited = std::time::Instant::now();
        while runtime.metrics().num_alive_tasks() > 0 && waited.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        heap::live_bytes()
    };
    let before = settled();
    for i in 0..10_000u32 {
        let name = format!("tier-{i}");
        let tiers = RateTier::builder()
            .tier(name.as_str(), Quota::per_minute(1 + i))
            .tier("multi", [Quota::per_second(5), Quota::per_day(100 + i)])
            .default_tier(name.as_str())
            .build();
        let info = runtime.block_on(tiers.check("ada", &name, 1)).unwrap().unwrap();
        assert_eq!(info.tier(), name);
        drop(info);
        drop(tiers);
    }
    let after = settled();
    let kept = heap::delta(before, after);
    println!("10,000 RateTiers built and dropped: {kept} bytes kept");
    assert!(
        kept < 16 * 1024,
        "{kept} bytes kept after dropping 10,000 RateTiers"
    );
}

/// Customers on contracts of their own, and a tier whose quota changes at
/// run time, cost what their keys cost, and give it back once the keys
/// expire.
#[test]
fn per_customer_contracts_and_quota_changes_cost_like_keys() {
    use axum::Router;
    use axum::routing::get;
    use http::{HeaderMap, Request};
    use tower::ServiceExt;
    use tower_rate_tier::clock::FakeClock;
    use tower_rate_tier::storage::MemoryStorage;
    use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = runtime();
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder()
        .gc_interval(Duration::from_secs(3_600))
        .build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    // "cust-N" has a contract of its own: 100 a minute, a burst of 100 + N
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers.clone()).identifier_fn(|headers: &HeaderMap| {
            let user = headers.get("x-user")?.to_str().ok()?;
            let identity = TierIdentity::new(user, "free");
            Some(match user.strip_prefix("cust-") {
                Some(n) => {
                    let n: u32 = n.parse().ok()?;
                    identity.with_quotas([Quota::per_minute(100).with_burst(100 + n)])
                }
                None => identity,
            })
        }),
    );
    let hit = |user: String| {
        let app = app.clone();
        async move {
            let req = Request::get("/")
                .header("x-user", user)
                .body(axum::body::Body::empty())
                .unwrap();
            let status = app.oneshot(req).await.unwrap().status();
            assert_eq!(status, http::StatusCode::OK);
        }
    };
    runtime.block_on(hit("warm".into()));
    let start = heap::live_bytes();
    runtime.block_on(async {
        for i in 0..5_000 {
            hit(format!("user-{i}")).await;
        }
    });
    let plain = heap::delta(start, heap::live_bytes());
    let before = heap::live_bytes();
    runtime.block_on(async {
        for i in 0..5_000 {
            hit(format!("cust-{i}")).await;
        }
    });
    let contracts = heap::delta(before, heap::live_bytes());
    // 3,600 quota changes (a reload every second for an hour), each with a
    // request of its own
    let before = heap::live_bytes();
    runtime.block_on(async {
        for i in 0..3_600u32 {
            tiers
                .set_tier("free", Quota::per_minute(100).with_burst(100 + i))
                .unwrap();
            hit(format!("reload-{}", i % 10)).await;
        }
    });
    let reloads = heap::delta(before, heap::live_bytes());
    println!(
        "5,000 keys of the tier: {plain} B; 5,000 customers with contracts of their own: {contracts} B; \
         3,600 quota changes: {reloads} B"
    );
    assert!(
        contracts < 3 * plain.max(1) && contracts < 4 << 20,
        "{contracts} B for 5,000 contracts, {plain} B for 5,000 keys"
    );
    assert!(reloads < 1 << 20, "{reloads} B for 3,600 quota changes");
    // every key expired and swept: the memory comes back
    clock.advance(Duration::from_secs(3_600));
    storage.sweep();
    assert_eq!(storage.len(), 0);
    let left = heap::delta(start, heap::live_bytes());
    println!("after the keys expired: {left} B of it left");
    assert!(left < (plain + contracts) / 4, "{left} B left after expiry");
}

/// Tiers added and removed at run time under names of their own (a reload
/// that renames plans, say) leave nothing in a shared memory storage once
/// their keys have expired: the storage drops the state no tier refers to.
#[test]
fn tiers_removed_at_run_time_leave_nothing_behind_in_the_storage() {
    use tower_rate_tier::clock::FakeClock;
    use tower_rate_tier::storage::MemoryStorage;
    use tower_rate_tier::{Quota, RateTier};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = runtime();
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder()
        .gc_interval(Duration::from_secs(3_600))
        .build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .default_tier("free")
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    drop(runtime.block_on(tiers.check("warm", "free", 1)));
    let start = heap::live_bytes();
    runtime.block_on(async {
        for i in 0..2_000u32 {
            let name = format!("plan-{i}");
            tiers.set_tier(name.as_str(), Quota::per_minute(10)).unwrap();
            tiers.check("ada", &name, 1).await.unwrap().unwrap();
            assert!(tiers.remove_tier(&name));
        }
    });
    let held = heap::delta(start, heap::live_bytes());
    clock.advance(Duration::from_secs(3_600));
    storage.sweep();
    assert_eq!(storage.len(), 0);
    let left = heap::delta(start, heap::live_bytes());
    println!("2,000 tiers added, used and removed: {held} B held, {left} B left after expiry");
    assert!(
        left < 64 * 1024,
        "{left} B left after 2,000 removed tiers expired"
    );
    // the tier that stays keeps working, and a removed name comes back fresh
    runtime.block_on(async {
        assert!(tiers.check("ada", "free", 1).await.unwrap().is_ok());
        tiers.set_tier("plan-7", Quota::per_minute(1)).unwrap();
        assert!(tiers.check("ada", "plan-7", 1).await.unwrap().is_ok());
        assert!(tiers.check("ada", "plan-7", 1).await.unwrap().is_err());
    });
}
