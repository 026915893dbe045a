//! Key-space flood: a stream of distinct identities through the layer on
//! memory storage with a key cap, while a few legitimate users keep asking.
//!
//! Time is a [`FakeClock`] advanced by [`Flood::step`] per request, so the
//! run is deterministic: each flood identity sends one request and its key
//! expires one emission interval later. The binary must install the counting
//! allocator (see [`crate::heap`]).

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request, StatusCode};
use tower::ServiceExt;
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::MemoryStorage;
use tower_rate_tier::{Quota, RateLimitEvent, RateTier, TierIdentity, TierLimitLayer};

use crate::heap;

/// The quota of every identity in the flood: 10 per minute, burst 10 (one
/// request keeps a key for 6 s).
pub const QUOTA: Quota = Quota::per_minute(10);

/// The size of a flood.
#[derive(Debug, Clone, Copy)]
pub struct Flood {
    /// Distinct flood identities, one request each.
    pub identities: usize,
    /// The storage's `max_keys`.
    pub max_keys: usize,
    /// Legitimate users, asking throughout.
    pub legit_users: usize,
    /// A legitimate user asks once every this many flood requests.
    pub legit_every: usize,
    /// Fake time per flood request.
    pub step: Duration,
}

/// What a flood measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Flood requests admitted and counted by the limiter (200 with
    /// rate-limit headers), in their own bucket or the overflow bucket.
    pub flood_counted: usize,
    /// Flood requests refused with 429 (only the shared overflow bucket
    /// refuses: each flood identity sends one request, within its burst).
    pub flood_limited: usize,
    /// Flood requests decided in the tier's overflow bucket, the storage
    /// being full (`RateLimitEvent::Overflow`), admitted or not.
    pub flood_overflow: usize,
    /// Flood requests let through uncounted (200 without rate-limit
    /// headers).
    pub flood_uncounted: usize,
    /// Flood requests answered anything else.
    pub flood_other: usize,
    /// Legitimate requests admitted, per user.
    pub legit_admitted: Vec<u64>,
    /// What each legitimate user may be admitted: `B + floor(span / I)`.
    pub legit_expected: Vec<u64>,
    /// Legitimate responses without rate-limit headers (uncounted) or with
    /// a status other than 200/429.
    pub legit_uncounted: usize,
    /// The most keys tracked at a sample point.
    pub max_len: usize,
    /// Live heap before the flood (router, tiers, legitimate users' keys).
    pub heap_before: usize,
    /// The highest live heap sampled during the flood, minus `heap_before`.
    pub heap_peak_growth: usize,
    /// Keys tracked after the flood.
    pub len_after_flood: usize,
    /// Live heap growth over `heap_before` right after the flood.
    pub heap_growth_after_flood: i64,
    /// Keys tracked after the clock moved an hour on and the GC ran.
    pub len_after_gc: usize,
    /// Live heap growth over `heap_before` after the GC.
    pub heap_growth_after_gc: i64,
    /// Requests of new identities counted after the GC (capacity regained).
    pub counted_after_gc: usize,
    /// Fake time the flood took.
    pub fake_elapsed: Duration,
}

fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    Some(TierIdentity::new(user, "free"))
}

fn request(user: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .expect("a valid request")
}

/// `(status, counted)` of one request.
async fn send(app: &Router, user: &str) -> (StatusCode, bool) {
    let response = app.clone().oneshot(request(user)).await.expect("infallible");
    (
        response.status(),
        response.headers().contains_key("x-ratelimit-remaining"),
    )
}

async fn ask_legit(app: &Router, user: &str, who: usize, report: &mut Report) {
    match send(app, user).await {
        (StatusCode::OK, true) => report.legit_admitted[who] += 1,
        (StatusCode::TOO_MANY_REQUESTS, true) => {}
        _ => report.legit_uncounted += 1,
    }
}

/// How often the storage's background GC runs (real time).
const GC_INTERVAL: Duration = Duration::from_millis(50);

/// Runs the flood on the current runtime.
pub async fn run(flood: Flood) -> Report {
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder()
        .max_keys(flood.max_keys)
        .gc_interval(GC_INTERVAL)
        .build();
    let tiers = RateTier::builder()
        .tier("free", QUOTA)
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    let overflowed = Arc::new(AtomicUsize::new(0));
    let seen = overflowed.clone();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers)
            .identifier_fn(identify)
            .on_event(move |event| {
                if let RateLimitEvent::Overflow { .. } = event {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }),
    );

    let legit: Vec<String> = (0..flood.legit_users).map(|i| format!("legit-{i}")).collect();
    let mut report = Report {
        legit_admitted: vec![0; flood.legit_users],
        ..Report::default()
    };
    let mut legit_first = vec![None::<u64>; flood.legit_users];
    let mut legit_last = vec![0u64; flood.legit_users];
    for who in 0..flood.legit_users {
        let now = clock.now();
        ask_legit(&app, &legit[who], who, &mut report).await;
        legit_first[who].get_or_insert(now);
        legit_last[who] = now;
    }
    report.heap_before = heap::live_bytes();
    let start = clock.now();
    let overflowed_before = overflowed.load(Ordering::Relaxed);

    let mut user = String::with_capacity(24);
    let mut peak = 0usize;
    // The background GC runs every 50 ms of real time. A real flood spans
    // real seconds; this loop runs faster than its fake clock, so it pauses
    // twice per fake second to give the GC its turns. Otherwise how much the
    // GC reclaims during the flood would depend on how fast the code runs.
    const PAUSE_EVERY_NS: u64 = 500_000_000;
    let mut next_pause = start + PAUSE_EVERY_NS;
    for i in 0..flood.identities {
        clock.advance(flood.step);
        if clock.now() >= next_pause {
            tokio::time::sleep(GC_INTERVAL * 2).await;
            next_pause += PAUSE_EVERY_NS;
        }
        user.clear();
        let _ = write!(user, "flood-{i}");
        match send(&app, &user).await {
            (StatusCode::OK, true) => report.flood_counted += 1,
            (StatusCode::TOO_MANY_REQUESTS, true) => report.flood_limited += 1,
            (StatusCode::OK, false) => report.flood_uncounted += 1,
            _ => report.flood_other += 1,
        }
        if flood.legit_users > 0 && i % flood.legit_every == 0 {
            let who = (i / flood.legit_every) % flood.legit_users;
            let now = clock.now();
            ask_legit(&app, &legit[who], who, &mut report).await;
            legit_first[who].get_or_insert(now);
            legit_last[who] = now;
        }
        if i % 1_000 == 0 {
            peak = peak.max(heap::live_bytes());
            report.max_len = report.max_len.max(storage.len());
        }
    }
    peak = peak.max(heap::live_bytes());
    // the legitimate users' requests are all in their own buckets
    report.flood_overflow = overflowed.load(Ordering::Relaxed) - overflowed_before;
    report.heap_peak_growth = peak.saturating_sub(report.heap_before);
    report.fake_elapsed = Duration::from_nanos(clock.now() - start);
    report.len_after_flood = storage.len();
    report.heap_growth_after_flood = heap::delta(report.heap_before, heap::live_bytes());
    let interval = QUOTA.emission_interval_nanos();
    report.legit_expected = legit_first
        .iter()
        .zip(&legit_last)
        .map(|(first, last)| u64::from(QUOTA.burst()) + (last - first.unwrap_or(*last)) / interval)
        .collect();

    // An hour later every key has expired; the background GC reclaims them.
    clock.advance(Duration::from_secs(3_600));
    let waited = std::time::Instant::now();
    while !storage.is_empty() && waited.elapsed() < Duration::from_secs(10) {
        // a check starts the GC task if nothing has yet
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report.len_after_gc = storage.len();
    report.heap_growth_after_gc = heap::delta(report.heap_before, heap::live_bytes());
    for i in 0..flood.max_keys.min(1_000) {
        if send(&app, &format!("after-{i}")).await == (StatusCode::OK, true) {
            report.counted_after_gc += 1;
        }
    }
    report
}

/// The stated bound of the live heap a flood may add over its start:
/// twice the cap's size plus 64 KiB.
///
/// `cap_size` is what exactly `max_keys` keys take in a fresh storage
/// ([`bytes_per_key_ours`] × `max_keys`). The factor 2: at the cap, each
/// shard's table is close to hashbrown's 7/8 load limit; a sweep leaves
/// tombstones, and refilling over them makes hashbrown double the table
/// (it rehashes in place only when less than half full). It never grows
/// past that, since the cap keeps every shard under half of the doubled
/// table.
pub fn heap_bound(cap_size: f64) -> f64 {
    2.0 * cap_size + 64.0 * 1024.0
}

/// The keys of a bytes-per-key measurement: `user-0000000`, ... (12 bytes).
pub fn key(i: usize) -> String {
    format!("user-{i:07}")
}

/// Live heap bytes per key of our [`MemoryStorage`] (one-band tier,
/// [`QUOTA`]) holding `n` keys [`key`]`(0..n)`, checked through
/// [`RateTier::check`].
pub fn bytes_per_key_ours(n: usize) -> f64 {
    bytes_per_key_with_id_len(n, 12)
}

/// Live heap bytes per key of our [`MemoryStorage`] (one-band tier
/// `free`, [`QUOTA`]) holding `n` keys whose user ids are `id_len` bytes
/// long (at least 12: [`key`]`(i)` padded with `x`).
pub fn bytes_per_key_with_id_len(n: usize, id_len: usize) -> f64 {
    let tiers = RateTier::builder()
        .tier("free", QUOTA)
        .clock(FakeClock::new())
        .storage(MemoryStorage::builder().max_keys(n).build())
        .build();
    let before = heap::live_bytes();
    let mut buf = String::with_capacity(id_len.max(16));
    for i in 0..n {
        buf.clear();
        buf.push_str(&key(i));
        while buf.len() < id_len {
            buf.push('x');
        }
        let done = now_or_never(tiers.check(&buf, "free", 1));
        assert!(matches!(done, Some(Ok(Ok(_)))), "key {i} was not admitted");
    }
    let grown = heap::delta(before, heap::live_bytes());
    drop(tiers);
    grown as f64 / n as f64
}

/// Live heap bytes per key of governor 0.10's keyed DashMap store
/// (`RateLimiter::dashmap`, `String` keys) holding the same keys.
pub fn bytes_per_key_governor(n: usize) -> f64 {
    let quota = governor::Quota::per_minute(std::num::NonZeroU32::new(10).expect("non-zero"));
    let limiter = governor::RateLimiter::dashmap(quota);
    let before = heap::live_bytes();
    for i in 0..n {
        assert!(limiter.check_key(&key(i)).is_ok(), "key {i} was not admitted");
    }
    let grown = heap::delta(before, heap::live_bytes());
    assert_eq!(limiter.len(), n);
    drop(limiter);
    grown as f64 / n as f64
}

fn now_or_never<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    match f
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}
