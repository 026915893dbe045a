//! Key-space flood, full size: 1,000,000 distinct identities through the
//! layer on memory storage capped at 100,000 keys, and bytes per tracked key
//! next to governor's keyed DashMap store at 1,000,000 keys.
//! `cargo run --release -p tower-rate-tier-tests --example flood`

use std::time::Duration;

use tower_rate_tier_tests::flood;

#[global_allocator]
static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    for n in [100_000, 1_000_000] {
        let ours = flood::bytes_per_key_ours(n);
        let governor = flood::bytes_per_key_governor(n);
        println!("bytes per tracked key at {n} keys: ours {ours:.1}, governor 0.10 {governor:.1}");
    }

    let cap = 100_000;
    let per_key = flood::bytes_per_key_ours(cap);
    let cap_size = per_key * cap as f64;
    let f = flood::Flood {
        identities: 1_000_000,
        max_keys: cap,
        legit_users: 10,
        legit_every: 100,
        // a key lives 6 s, which hold 300,000 arrivals (three times the
        // cap); the flood lasts 20 s of fake time, over three key lifetimes
        step: Duration::from_micros(20),
    };
    let started = std::time::Instant::now();
    let r = flood::run(f).await;
    println!(
        "flood of {} identities in {:.2?}: {r:#?}",
        f.identities,
        started.elapsed()
    );
    let bound = flood::heap_bound(cap_size);
    println!(
        "cap {cap} keys = {cap_size:.0} B ({per_key:.1} B/key); heap peak growth {} B = {:.2} x cap size (bound {bound:.0} B)",
        r.heap_peak_growth,
        r.heap_peak_growth as f64 / cap_size
    );
    let shared_admitted = r.flood_overflow - r.flood_limited;
    let shared_bound = u64::from(flood::QUOTA.burst())
        + r.fake_elapsed.as_nanos() as u64 / flood::QUOTA.emission_interval_nanos();
    println!(
        "uncounted {}; decided in the overflow bucket {}, of which admitted {shared_admitted} (bound {shared_bound})",
        r.flood_uncounted, r.flood_overflow
    );
    let long_ids = flood::bytes_per_key_with_id_len(1_000_000, tower_rate_tier::tier::MAX_USER_ID_LEN);
    println!(
        "bytes per tracked key at 1,000,000 keys of {}-byte ids: {long_ids:.1}",
        tower_rate_tier::tier::MAX_USER_ID_LEN
    );
    assert_eq!(r.flood_other, 0);
    assert_eq!(r.flood_uncounted, 0);
    assert!(shared_admitted as u64 <= shared_bound);
    assert!(r.max_len <= cap);
    assert!((r.heap_peak_growth as f64) < bound);
    assert_eq!(r.legit_uncounted, 0);
    assert_eq!(r.legit_admitted, r.legit_expected);
    assert_eq!(r.len_after_gc, 0);
}
