//! `RateTier::check` on `MemoryStorage` against governor's keyed DashMap
//! limiter on the same hasher (foldhash), in one criterion group: 10,000
//! `String` keys round robin, every request admitted, both on the real
//! clock.
//!
//! Run with `cargo bench -p tower-rate-tier --bench check`; the figures are in
//! `BENCHMARKS.md`.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tower_rate_tier::{Quota, RateTier};

const KEYS: usize = 10_000;
/// Generous enough that every request is admitted: each key is hit once per
/// 10,000 checks, and may take a million at once.
const PER_SECOND: u32 = 1_000_000;

/// Drives `check` as a caller without a runtime would: `MemoryStorage`
/// decides synchronously, so one poll with a no-op waker completes it.
///
/// Inlined, as an `.await` in an async fn is: the future is built in place
/// and polled there. Called out of line, this helper would copy the future
/// (about 100 bytes) into its frame first, and on this machine that copy
/// alone costs about 25 ns per check (loads reading back stores of other
/// widths), which no caller of `check` in a real program pays.
#[inline(always)]
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a check on MemoryStorage did not complete at once"),
    }
}

fn check_10k_keys(c: &mut Criterion) {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user-{i:05}")).collect();
    // As in a server, checks run inside a tokio runtime (the memory storage
    // starts its GC task there); the bench polls them itself.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let _entered = rt.enter();

    let tiers = RateTier::builder()
        .tier("free", Quota::per_second(PER_SECOND))
        .build();
    let per_second = NonZeroU32::new(PER_SECOND).unwrap_or(NonZeroU32::MIN);
    // the same hasher as ours (foldhash), governor's default clock
    let governor = governor::RateLimiter::dashmap_with_hasher(
        governor::Quota::per_second(per_second),
        foldhash::fast::RandomState::default(),
    );
    // Every key exists before measuring: the steady state of a busy server.
    for key in &keys {
        assert!(matches!(ready(tiers.check(key, "free", 1)), Ok(Ok(_))));
        assert!(governor.check_key(key).is_ok());
    }

    let mut group = c.benchmark_group("check_10k_string_keys_round_robin");
    group.throughput(Throughput::Elements(1));
    group.bench_function("tower_rate_tier_memory", |b| {
        let mut i = 0;
        b.iter(|| {
            let key = &keys[i];
            i = (i + 1) % KEYS;
            let admitted = matches!(ready(tiers.check(black_box(key), "free", 1)), Ok(Ok(_)));
            assert!(admitted, "every request must be admitted");
        })
    });
    group.bench_function("governor_dashmap", |b| {
        let mut i = 0;
        b.iter(|| {
            let key = &keys[i];
            i = (i + 1) % KEYS;
            let admitted = governor.check_key(black_box(key)).is_ok();
            assert!(admitted, "every request must be admitted");
        })
    });
    group.finish();
}

criterion_group!(benches, check_10k_keys);
criterion_main!(benches);
