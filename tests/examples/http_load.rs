//! Loopback HTTP load, full size: 200,000 requests from 64 concurrent
//! clients. `cargo run --release -p tower-rate-tier-tests --example http_load`

use tower_rate_tier_tests::{heap, http_load};

#[global_allocator]
static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let load = http_load::Load {
        requests: 200_000,
        concurrency: 64,
        users: 1_000,
        quota: 100,
        close_every: 100,
        rounds: 4,
    };
    let r = http_load::run(load).await;
    let grown = heap::delta(r.heap_before, r.heap_after);
    println!(
        "{} requests in {:.2?} ({:.0}/s): {} ok, {} limited, {} errors; users admitted exactly {}: {}/{}; fds {} -> {}; live heap {} -> {} ({grown:+} B, peak {}); after each round of 50,000: {:?}",
        load.requests,
        r.elapsed,
        load.requests as f64 / r.elapsed.as_secs_f64(),
        r.ok,
        r.limited,
        r.errors,
        load.quota,
        r.admitted_per_user.iter().filter(|&&a| a == load.quota).count(),
        load.users,
        r.fds_before,
        r.fds_after,
        r.heap_before,
        r.heap_after,
        r.heap_peak,
        r.heap_after_rounds,
    );
    assert_eq!(r.errors, 0);
    assert!(r.fds_after <= r.fds_before + 2);
    assert!(grown < 256 * 1024);
}
