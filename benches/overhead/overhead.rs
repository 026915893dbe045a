//! Pushes requests through an axum `Router` in process, for counting
//! instructions under callgrind: without a limiter, with tower-rate-tier's
//! layer, and with tower_governor's. See `run.sh` and `BENCHMARKS.md`.
//!
//! `overhead MODE N` with MODE one of `none`, `noop`, `ours`, `governor`,
//! `governor-plain` (without `use_headers()`), `ours-ietf` (ours with the
//! two IETF fields), `ours-none` (ours without rate-limit fields), `ours-unlimited`
//! (every user on an unlimited tier), `fields`, `fields+id` (see
//! `app`), `contracts-first`, `contracts-late` (every user on a contract of
//! its own; `late`: after 20,000 other distinct contracts were decided), or
//! `core-ours`, `core-governor`, `core-governor-state` (governor answering with
//! the state, as ours does), `core-new-keys` (every check a key not seen
//! before), `core-ab ROUNDS` for the bare check.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use tower::ServiceExt;
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, response};

const USERS: usize = 1_000;

/// tower_governor keyed by the same header.
#[derive(Clone)]
struct UserHeader;

impl KeyExtractor for UserHeader {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, GovernorError> {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    Some(TierIdentity::new(user, Cow::Borrowed("free")))
}

/// The five fields `ours` adds to an admitted response, with constant values.
fn insert_fields(mut res: http::Response<Body>) -> http::Response<Body> {
    let headers = res.headers_mut();
    headers.reserve(5);
    headers.insert(response::X_RATELIMIT_LIMIT, HeaderValue::from_static("10000"));
    headers.insert(response::X_RATELIMIT_REMAINING, HeaderValue::from_static("9999"));
    headers.insert(
        response::X_RATELIMIT_RESET,
        HeaderValue::from_static("1704067201"),
    );
    headers.insert(
        response::RATELIMIT_POLICY,
        HeaderValue::from_static("\"free\";q=10000;w=3600"),
    );
    headers.insert(
        response::RATELIMIT,
        HeaderValue::from_static("\"free\";r=9999;t=1"),
    );
    res
}

/// The tier `free` of `quota`, the default tier.
fn free(quota: Quota) -> tower_rate_tier::RateTierBuilder {
    RateTier::builder().tier("free", quota).default_tier("free")
}

/// Our layer over `tiers`, identifying users by the `x-user` header.
fn ours(tiers: RateTier) -> TierLimitLayer {
    TierLimitLayer::new(tiers).identifier_fn(identify)
}

fn app(mode: &str) -> Router {
    let router = Router::new().route("/", get(|| async { "ok" }));
    match mode {
        "none" => router,
        // the cost of any router-wide layer in axum (boxing, futures), for reference
        "noop" => router.layer(tower::layer::util::Identity::new()),
        "ours" => router.layer(ours(free(Quota::per_hour(10_000)).build())),
        // ours with a concurrency limit on the tier: each request takes a
        // slot and gives it back when its response is dropped
        "ours-concurrency" => {
            let tiers = free(Quota::per_hour(10_000)).tier_concurrency("free", 4).build();
            router.layer(ours(tiers))
        }
        // ours on a tier that also counts a unit (tokens): each request is
        // admitted when the unit has room, without charging it
        "ours-unit" => {
            let tiers = free(Quota::per_hour(10_000))
                .tier_unit("free", "tokens", Quota::per_hour(1_000_000))
                .build();
            router.layer(ours(tiers))
        }
        // ours with the two IETF fields (`RateLimitHeaders::IETF`), as
        // tower_governor's `use_headers()` adds two
        "ours-ietf" => router.layer(
            ours(free(Quota::per_hour(10_000)).build()).headers(tower_rate_tier::RateLimitHeaders::IETF),
        ),
        // ours, every user on an unlimited tier (no storage, no fields)
        "ours-unlimited" => router.layer(ours(free(Quota::unlimited()).build())),
        // ours without rate-limit fields (`RateLimitHeaders::NONE`)
        "ours-none" => router.layer(
            ours(free(Quota::per_hour(10_000)).build()).headers(tower_rate_tier::RateLimitHeaders::NONE),
        ),
        // ours counting every request through the `metrics` facade, with no
        // recorder installed (feature `metrics` of this bench)
        #[cfg(feature = "metrics")]
        "ours-metrics" => router.layer(ours(free(Quota::per_hour(10_000)).build()).metrics(true)),
        // Every user on a contract of its own, kept by the identifier (as a
        // cache in front of a customer database keeps it) and cloned per
        // request; "cust-N" users, decided before measuring in
        // `contracts-late`, each get a new contract.
        "contracts-first" | "contracts-late" => {
            let tiers = RateTier::builder()
                .tier("free", Quota::per_hour(10_000))
                .default_tier("free")
                .build();
            let kept: Vec<TierIdentity> = (0..USERS as u32)
                .map(|i| {
                    TierIdentity::new(format!("user-{i}"), "free")
                        .with_quotas([Quota::per_hour(10_000).with_burst(10_000 + i)])
                })
                .collect();
            let identify = move |headers: &HeaderMap| {
                let user = headers.get("x-user")?.to_str().ok()?;
                if let Some(n) = user.strip_prefix("cust-") {
                    let n: u32 = n.parse().ok()?;
                    let contract = Quota::per_hour(10_000).with_burst(20_000 + n);
                    return Some(TierIdentity::new(user, "free").with_quotas([contract]));
                }
                let i: usize = user.strip_prefix("user-")?.parse().ok()?;
                kept.get(i).cloned()
            };
            router.layer(TierLimitLayer::new(tiers).identifier_fn(identify))
        }
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .per_millisecond(360)
                .burst_size(10_000)
                .key_extractor(UserHeader)
                .use_headers()
                .finish()
                .expect("valid governor config");
            router.layer(tower_governor::GovernorLayer::new(Arc::new(config)))
        }
        // tower_governor without its rate-limit headers
        "governor-plain" => {
            let config = GovernorConfigBuilder::default()
                .per_millisecond(360)
                .burst_size(10_000)
                .key_extractor(UserHeader)
                .finish()
                .expect("valid governor config");
            router.layer(tower_governor::GovernorLayer::new(Arc::new(config)))
        }
        // Floors, for reference: a router-wide layer that only inserts the
        // five header fields ours adds (constant values, no limiting)...
        "fields" => router.layer(tower::util::MapResponseLayer::new(insert_fields)),
        // ...and one that also runs the same identifier as `ours`.
        "fields+id" => router.layer(
            tower::ServiceBuilder::new()
                .map_request(|req: Request<Body>| {
                    std::hint::black_box(identify(req.headers()));
                    req
                })
                .map_response(insert_fields),
        ),
        other => panic!(
            "unknown mode {other}: use none, noop, ours, ours-unit, ours-concurrency, ours-ietf, ours-none, ours-unlimited, governor, governor-plain, fields, fields+id, \
             contracts-first or contracts-late"
        ),
    }
}

/// `RateTier::check` / governor's `check_key` alone, 10,000 keys round robin.
/// The loops are functions of their own, so that callgrind can count them
/// alone (`--toggle-collect=overhead::core_loop_*`), without the clocks'
/// calibration; the first pass inserts every key.
fn core(mode: &str, n: usize) {
    let keys: Vec<String> = (0..10_000).map(|i| format!("user-{i:05}")).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _entered = rt.enter();
    let with_unit = || {
        RateTier::builder()
            .tier("free", Quota::per_second(1_000_000))
            .tier_unit("free", "tokens", Quota::per_second(1_000_000))
            .build()
    };
    let ok = if mode == "core-ours" {
        let tiers = RateTier::builder()
            .tier("free", Quota::per_second(1_000_000))
            .build();
        core_loop_ours(&tiers, &keys, keys.len());
        core_loop_ours(&tiers, &keys, n)
    } else if mode == "core-new-keys" {
        // every check a user the storage has not seen: the path of a new
        // key (its room taken, its state inserted), after 10,000 others
        let tiers = RateTier::builder()
            .tier("free", Quota::per_second(1_000_000))
            .build();
        core_loop_ours(&tiers, &keys, keys.len());
        let new: Vec<String> = (0..n).map(|i| format!("new-{i:07}")).collect();
        core_loop_new_keys(&tiers, &new)
    } else if mode == "core-ours-unit" {
        // the same loop as `core-ours`, on a tier with a unit
        let tiers = with_unit();
        core_loop_ours(&tiers, &keys, keys.len());
        core_loop_ours(&tiers, &keys, n)
    } else if mode == "core-record" {
        let tiers = with_unit();
        core_loop_ours(&tiers, &keys, keys.len());
        core_loop_record(&tiers, &keys, n)
    } else if mode == "core-governor-state" {
        let limiter = governor::RateLimiter::dashmap_with_hasher(
            governor::Quota::per_second(std::num::NonZeroU32::new(1_000_000).expect("non-zero")),
            foldhash::fast::RandomState::default(),
        )
        .with_middleware::<governor::middleware::StateInformationMiddleware>();
        core_loop_governor_state(&limiter, &keys, keys.len());
        core_loop_governor_state(&limiter, &keys, n)
    } else {
        let limiter = governor::RateLimiter::dashmap_with_hasher(
            governor::Quota::per_second(std::num::NonZeroU32::new(1_000_000).expect("non-zero")),
            foldhash::fast::RandomState::default(),
        );
        core_loop_governor(&limiter, &keys, keys.len());
        core_loop_governor(&limiter, &keys, n)
    };
    assert_eq!(ok, n, "every check must be admitted");
}

/// `n` checks of ours, each future built and polled in place.
#[inline(never)]
fn core_loop_ours(tiers: &RateTier, keys: &[String], n: usize) -> usize {
    in_place(tiers, keys, n)
}

/// A check of ours of each of `keys`, none seen before (a loop of its
/// own, which the compiler cannot fold into `core_loop_ours`).
#[inline(never)]
fn core_loop_new_keys(tiers: &RateTier, keys: &[String]) -> usize {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut ok = 0;
    for key in keys {
        let mut check = std::pin::pin!(tiers.check(std::hint::black_box(key), "free", 1));
        if let std::task::Poll::Ready(Ok(Ok(_))) = check.as_mut().poll(&mut cx) {
            ok += 1;
        }
    }
    ok
}

/// `n` records of one token of usage (`RateTier::record`), each future
/// built and polled in place, on the same tier.
#[inline(never)]
fn core_loop_record(tiers: &RateTier, keys: &[String], n: usize) -> usize {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut ok = 0;
    for i in 0..n {
        let key = &keys[i % keys.len()];
        let mut record = std::pin::pin!(tiers.record(std::hint::black_box(key), "free", "tokens", 1));
        if let std::task::Poll::Ready(Ok(())) = record.as_mut().poll(&mut cx) {
            ok += 1;
        }
    }
    ok
}

/// governor's keyed limiter on its default clock, keyed by `String` in a
/// DashMap on foldhash.
type GovernorKeyed = governor::RateLimiter<
    String,
    governor::state::keyed::DashMapStateStore<String, foldhash::fast::RandomState>,
    governor::clock::DefaultClock,
>;

/// governor's keyed limiter answering with the remaining capacity, as ours
/// does (`StateInformationMiddleware`).
type GovernorKeyedState = governor::RateLimiter<
    String,
    governor::state::keyed::DashMapStateStore<String, foldhash::fast::RandomState>,
    governor::clock::DefaultClock,
    governor::middleware::StateInformationMiddleware,
>;

/// `n` checks of governor's with the state of the key after each.
#[inline(never)]
fn core_loop_governor_state(limiter: &GovernorKeyedState, keys: &[String], n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        if let Ok(state) = limiter.check_key(std::hint::black_box(&keys[i % keys.len()])) {
            std::hint::black_box(state.remaining_burst_capacity());
            ok += 1;
        }
    }
    ok
}

/// `n` checks of governor's.
#[inline(never)]
fn core_loop_governor(limiter: &GovernorKeyed, keys: &[String], n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        ok += usize::from(
            limiter
                .check_key(std::hint::black_box(&keys[i % keys.len()]))
                .is_ok(),
        );
    }
    ok
}

/// Polls a future that completes at once (every check on the memory
/// storage does) with a no-op waker.
fn ready<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("a check on the memory storage waited"),
    }
}

/// One check as an application makes it: awaited from an async fn.
#[inline(never)]
async fn admitted(tiers: &RateTier, key: &str) -> bool {
    matches!(tiers.check(key, "free", 1).await, Ok(Ok(_)))
}

/// `n` checks awaited one after the other from an async fn.
async fn awaited(tiers: &RateTier, keys: &[String], n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        ok += usize::from(admitted(tiers, std::hint::black_box(&keys[i % keys.len()])).await);
    }
    ok
}

/// `n` checks, each future built and polled in place.
fn in_place(tiers: &RateTier, keys: &[String], n: usize) -> usize {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut ok = 0;
    for i in 0..n {
        let key = &keys[i % keys.len()];
        let mut check = std::pin::pin!(tiers.check(std::hint::black_box(key), "free", 1));
        if let std::task::Poll::Ready(Ok(Ok(_))) = check.as_mut().poll(&mut cx) {
            ok += 1;
        }
    }
    ok
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Alternating rounds of 200,000 checks each: ours awaited from an async fn,
/// ours polled in place, and governor's `check_key`, both keyed maps on the
/// same hasher (foldhash) and both on their default clocks. Prints the
/// median ns per check of each and the median of the per-round ratios.
fn core_ab(rounds: usize) {
    let keys: Vec<String> = (0..10_000).map(|i| format!("user-{i:05}")).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _entered = rt.enter();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_second(1_000_000))
        .build();
    let limiter = governor::RateLimiter::dashmap_with_hasher(
        governor::Quota::per_second(std::num::NonZeroU32::new(1_000_000).expect("non-zero")),
        foldhash::fast::RandomState::default(),
    );
    // Every key exists before measuring (the steady state of a busy server).
    for key in &keys {
        assert!(ready(admitted(&tiers, key)));
        assert!(limiter.check_key(key).is_ok());
    }
    const N: usize = 200_000;
    let time = |f: &mut dyn FnMut() -> usize| {
        let t = std::time::Instant::now();
        assert_eq!(f(), N, "every check must be admitted");
        t.elapsed().as_nanos() as f64 / N as f64
    };
    let (mut a, mut p, mut g, mut ra, mut rp) = (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let awaited_ns = time(&mut || ready(awaited(&tiers, &keys, N)));
        let in_place_ns = time(&mut || in_place(&tiers, &keys, N));
        let gov_ns = time(&mut || core_loop_governor(&limiter, &keys, N));
        ra.push(awaited_ns / gov_ns);
        rp.push(in_place_ns / gov_ns);
        a.push(awaited_ns);
        p.push(in_place_ns);
        g.push(gov_ns);
    }
    println!(
        "medians of {rounds} rounds: ours awaited {:.1} ns, ours in place {:.1} ns, governor {:.1} ns; \
         ratio awaited/governor {:.2}, in place/governor {:.2}",
        median(a),
        median(p),
        median(g),
        median(ra),
        median(rp)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "ours".into());
    let n: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    if mode == "core-ab" {
        return core_ab(n);
    }
    if mode.starts_with("core-") {
        return core(&mode, n);
    }
    let users: Vec<HeaderValue> = (0..USERS)
        .map(|i| HeaderValue::from_str(&format!("user-{i}")).expect("ascii"))
        .collect();
    let app = app(&mode);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    if mode == "contracts-late" {
        // 20,000 distinct contracts decided first (not counted)
        rt.block_on(async {
            for i in 0..20_000 {
                let mut req = Request::new(Body::empty());
                let user = HeaderValue::from_str(&format!("cust-{i}")).expect("ascii");
                req.headers_mut().insert("x-user", user);
                let response = app.clone().oneshot(req).await.expect("infallible");
                assert_eq!(response.status(), StatusCode::OK);
            }
        });
    }
    let ok = serve(&rt, &app, &users, n);
    assert_eq!(ok, n, "every request must be admitted");
    println!("{mode}: {n} requests admitted");
}

/// The measured part: `run.sh` counts only the instructions executed inside
/// this function (`--toggle-collect`), so one-time set-up (the clock's
/// calibration, which runs for a wall-clock time and so for a varying number
/// of instructions under valgrind) does not blur the figures.
#[inline(never)]
fn serve(rt: &tokio::runtime::Runtime, app: &Router, users: &[HeaderValue], n: usize) -> usize {
    rt.block_on(async {
        let mut ok = 0usize;
        for i in 0..n {
            let mut req = Request::new(Body::empty());
            req.headers_mut().insert("x-user", users[i % USERS].clone());
            let response = app.clone().oneshot(req).await.expect("infallible");
            ok += usize::from(response.status() == StatusCode::OK);
        }
        ok
    })
}
