//! Exactness under load, full length: 64 tasks, 3 s per mode, in-memory
//! storage. `cargo run --release -p tower-rate-tier-tests --example exactness`

use std::time::Duration;

use tower_rate_tier::clock::{FakeClock, SystemClock};
use tower_rate_tier::storage::MemoryStorage;
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::exactness::{self, Hammer};

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let hammer = Hammer {
        tasks: 64,
        run_for: Duration::from_secs(3),
        min_attempts: 1_000,
    };

    let (shared, own) = (Quota::per_hour(10_000), Quota::per_hour(100));
    let tiers = exactness::tiers(
        RateTier::builder()
            .clock(FakeClock::new())
            .storage(MemoryStorage::new()),
        shared,
        own,
    );
    let r = exactness::run(&tiers, hammer).await;
    let own_ok = r
        .own
        .iter()
        .filter(|k| k.admitted == 100 && k.errors == 0)
        .count();
    println!(
        "frozen clock: {} checks in {:.2?} ({:.0}/s); shared key admitted {} of {} attempts (quota 10000); own keys admitting exactly 100: {own_ok}/64",
        r.total_attempts(),
        r.elapsed,
        r.total_attempts() as f64 / r.elapsed.as_secs_f64(),
        r.shared.admitted,
        r.shared.attempts,
    );
    assert_eq!(r.shared.admitted, 10_000);
    assert_eq!(own_ok, 64);

    let shared = Quota::per_second(1_000).with_burst(500);
    let own = Quota::per_second(100).with_burst(50);
    let tiers = exactness::tiers(
        RateTier::builder()
            .clock(SystemClock)
            .storage(MemoryStorage::new()),
        shared,
        own,
    );
    let r = exactness::run(&tiers, hammer).await;
    let rows = exactness::real_time_rows(&r, &shared, &own);
    let over = rows
        .iter()
        .filter(|row| row.admitted + row.left > row.bound)
        .count();
    let worst = rows.iter().map(|row| row.shortfall).max().unwrap_or(0);
    let exact = rows.iter().filter(|row| row.shortfall == 0).count();
    println!(
        "real time: {} checks in {:.2?}; shared key admitted {} + {} left, bound {} (span {:.3?}); own keys: bound {}..{}; keys over the bound: {over}; keys with admitted + left == bound: {exact}/65; worst shortfall {worst} (margin {})",
        r.total_attempts(),
        r.elapsed,
        rows[0].admitted,
        rows[0].left,
        rows[0].bound,
        r.shared.span(),
        rows[1..].iter().map(|row| row.bound).min().unwrap_or(0),
        rows[1..].iter().map(|row| row.bound).max().unwrap_or(0),
        exactness::margin(rows[0].bound),
    );
    assert_eq!(over, 0);
    assert!(
        rows.iter()
            .all(|row| row.shortfall <= exactness::margin(row.bound))
    );
}
