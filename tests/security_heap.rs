//! What client-chosen input costs the live heap, measured with a counting
//! allocator: method names the router has no handler for, and user ids of
//! the longest accepted length in the memory storage, and what a flood of
//! distinct ids leaves once its keys are swept.

use std::sync::Mutex;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Method, Request, StatusCode};
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::tier::MAX_USER_ID_LEN;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, tier_cost};
use tower_rate_tier_tests::reply::{header_identity, send};
use tower_rate_tier_tests::{flood, heap};

#[global_allocator]
static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// The measurements are process-wide: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// An extension method of 1 KiB, distinct for each `i`.
fn method(i: usize) -> Method {
    let mut name = format!("M{i:06}");
    name.extend(std::iter::repeat_n('X', 1024 - name.len()));
    Method::from_bytes(name.as_bytes()).unwrap()
}

#[test]
fn distinct_method_names_on_a_costed_route_leave_the_heap_bounded() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1_000_000))
        .clock(FakeClock::new())
        .build();
    // A method router's layers wrap its 405 fallback too: `tier_cost(5)`
    // declares its cost for every method name a client sends.
    let app = Router::new()
        .route("/search", get(|| async { "ok" }).layer(tier_cost(5)))
        .layer(TierLimitLayer::new(tiers).identifier_fn(|_| Some(TierIdentity::new("ada", "free"))));
    let call = |method: Method| {
        let request = Request::builder()
            .method(method)
            .uri("/search")
            .body(Body::empty())
            .unwrap();
        let response = runtime.block_on(app.clone().oneshot(request)).unwrap();
        let remaining = response
            .headers()
            .get("x-ratelimit-remaining")
            .map(|v| v.to_str().unwrap().parse::<u32>().unwrap());
        (response.status(), remaining)
    };
    // warm up: the route learned for GET, the runtime and the storage's key
    // in place
    assert_eq!(call(Method::GET), (StatusCode::OK, Some(999_995)));
    for i in 0..100 {
        assert_eq!(call(method(i)).0, StatusCode::METHOD_NOT_ALLOWED);
    }
    let before = heap::live_bytes();
    for i in 100..5_100 {
        assert_eq!(call(method(i)).0, StatusCode::METHOD_NOT_ALLOWED);
    }
    // standard methods the route has no handler for are not learned either
    for method in [Method::POST, Method::DELETE, Method::PATCH] {
        assert_eq!(call(method).0, StatusCode::METHOD_NOT_ALLOWED);
    }
    let grown = heap::delta(before, heap::live_bytes());
    println!("5,000 distinct 1 KiB method names: live heap grew by {grown} bytes");
    // learned, they would hold 5,000 x 1 KiB
    assert!(grown < 16 * 1024, "the live heap grew by {grown} bytes");
    // the route's cost is still charged exactly, in one decision: 5 per
    // request, 405s included (each ran the declaration)
    let spent = 5 * (1 + 5_100 + 3);
    assert_eq!(call(Method::GET), (StatusCode::OK, Some(1_000_000 - spent - 5)));
}

#[test]
fn bytes_per_key_grow_with_the_id_and_nothing_else() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = 20_000;
    let short = flood::bytes_per_key_with_id_len(n, 12);
    let longest = flood::bytes_per_key_with_id_len(n, MAX_USER_ID_LEN);
    println!(
        "bytes per key at {n} keys: {short:.1} with 12-byte ids, {longest:.1} with {MAX_USER_ID_LEN}-byte ids"
    );
    // the id's bytes are allocated once per key, and nothing else grows
    // with them
    let extra = longest - short;
    let id_extra = (MAX_USER_ID_LEN - 12) as f64;
    assert!((extra - id_extra).abs() < 8.0, "{extra:.1} more bytes per key");
}

/// Allocations of `requests` requests of one user through `app`, after a
/// first one.
fn allocations_per_request(app: &Router, user: &str, requests: usize) -> f64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send = |app: Router| {
        let req = Request::get("/")
            .header("x-user", user)
            .body(Body::empty())
            .unwrap();
        async move { app.oneshot(req).await.unwrap().status() }
    };
    assert_eq!(runtime.block_on(send(app.clone())), StatusCode::OK);
    let before = stats_alloc::INSTRUMENTED_SYSTEM.stats().allocations;
    for _ in 0..requests {
        assert_eq!(runtime.block_on(send(app.clone())), StatusCode::OK);
    }
    let after = stats_alloc::INSTRUMENTED_SYSTEM.stats().allocations;
    (after - before) as f64 / requests as f64
}

#[test]
fn a_kept_contract_builds_nothing_per_request() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1_000_000))
        .clock(FakeClock::new())
        .build();
    // the identifier keeps each customer's identity (as a cache in front of
    // a customer database does) and hands out clones
    let contract = TierIdentity::new("acme", "free").with_quotas([Quota::per_minute(2_000_000)]);
    let app =
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(
                TierLimitLayer::new(tiers).identifier_fn(move |headers: &http::HeaderMap| {
                    let user = headers.get("x-user")?.to_str().ok()?;
                    Some(match user {
                        "acme" => contract.clone(),
                        _ => TierIdentity::new(user, "free"),
                    })
                }),
            );
    let plain = allocations_per_request(&app, "ada", 200);
    let own = allocations_per_request(&app, "acme", 200);
    println!("allocations per request: {plain:.1} with the tier's quota, {own:.1} with a kept contract");
    assert!(
        own <= plain + 0.5,
        "{own:.1} allocations per request with a contract, {plain:.1} without"
    );
}

/// A request body whose data frames come from a channel, ending when the
/// channel closes.
struct ChannelBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|data| data.map(|d| Ok(http_body::Frame::data(d))))
    }
}

/// A body read for identification, sent as 65,536 frames of one byte (as
/// a chunked upload can arrive), holds about its size while it is read,
/// not a buffer per frame.
#[test]
fn a_body_of_one_byte_frames_is_buffered_in_about_its_size() {
    use tower_rate_tier::{TierIdentifier, async_trait};

    struct FromBody;

    #[async_trait]
    impl TierIdentifier for FromBody {
        async fn identify(&self, _: &http::HeaderMap) -> Option<TierIdentity> {
            None
        }
        async fn identify_with_body(&self, _: &http::HeaderMap, body: &bytes::Bytes) -> Option<TierIdentity> {
            (!body.is_empty()).then(|| TierIdentity::new("ada", "free"))
        }
    }

    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let max = 64 * 1024;
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1_000))
        .clock(FakeClock::new())
        .build();
    let app = Router::new()
        .route(
            "/",
            axum::routing::post(|body: bytes::Bytes| async move { body.len().to_string() }),
        )
        .layer(
            TierLimitLayer::new(tiers)
                .identifier(FromBody)
                .buffer_body(true)
                .max_body_size(max),
        );
    runtime.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let request = Request::post("/").body(Body::new(ChannelBody(rx))).unwrap();
        let before = heap::live_bytes();
        let response = tokio::spawn(app.oneshot(request));
        for _ in 0..max {
            tx.send(bytes::Bytes::from_static(b"x")).await.unwrap();
        }
        // every frame read, the body not ended yet
        while tx.capacity() < 64 {
            tokio::task::yield_now().await;
        }
        let held = heap::delta(before, heap::live_bytes());
        drop(tx);
        let response = response.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body, max.to_string());
        assert!(
            held < 4 * max as i64,
            "{held} B held while reading a body of {max} B"
        );
    });
}

/// Floods a tier (with a concurrency limit or without) with distinct ids,
/// lets every key and lease pass and sweeps: the heap grown at the flood's
/// peak and the heap still held after the sweep, in bytes.
fn flood_of_ids(concurrency: bool) -> (i64, i64) {
    const FLOOD: usize = 20_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = FakeClock::new();
        let storage = tower_rate_tier::storage::MemoryStorage::builder().build();
        let mut builder = RateTier::builder()
            .tier("free", Quota::per_minute(10))
            .storage(storage.clone())
            .clock(clock.clone());
        if concurrency {
            builder = builder.tier_concurrency("free", 2);
        }
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(TierLimitLayer::new(builder.build()).identifier_fn(header_identity));
        let request = |user: String| {
            Request::get("/")
                .header("x-user", user)
                .body(Body::empty())
                .unwrap()
        };
        // warm up: the route's learned cost, the storage's tables, its GC
        for i in 0..100 {
            assert_eq!(send(&app, request(format!("w{i}"))).await.status, StatusCode::OK);
        }
        clock.advance(std::time::Duration::from_secs(3_600));
        storage.sweep();
        let before = heap::live_bytes();
        for i in 0..FLOOD {
            assert_eq!(
                send(&app, request(format!("flood-{i:08}"))).await.status,
                StatusCode::OK
            );
        }
        let peak = heap::delta(before, heap::live_bytes());
        clock.advance(std::time::Duration::from_secs(3_600));
        storage.sweep();
        assert_eq!(storage.len(), 0);
        (peak, heap::delta(before, heap::live_bytes()))
    })
}

#[test]
fn a_flood_of_ids_gives_its_memory_back_once_swept() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (peak, held) = flood_of_ids(false);
    assert!(held < peak / 10, "peak {peak} B, held after the sweep {held} B");
}

#[test]
fn a_flood_of_ids_on_a_tier_with_a_concurrency_limit_gives_its_memory_back_once_swept() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (peak, held) = flood_of_ids(true);
    // the table of the users' slot sets is shrunk too
    assert!(held < peak / 10, "peak {peak} B, held after the sweep {held} B");
}

/// Tiers added at run time, used and removed, through a storage wrapper
/// that decides by name (it passes on `decide` and leaves `prepare` to its
/// default, as a first wrapper of one's own does): once their keys have
/// expired and been swept, nothing of them is left, and a tier added later
/// is decided as fast as before (it does not sit behind the removed ones).
#[test]
fn tiers_removed_behind_a_wrapper_that_decides_by_name_leave_nothing_once_swept() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const TIERS: usize = 2_000;
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let clock = FakeClock::new();
    let memory = tower_rate_tier::storage::MemoryStorage::builder().build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .storage(tower_rate_tier_tests::storage_ops::Tally::new(memory.clone()))
        .clock(clock.clone())
        .build();
    runtime.block_on(async {
        // warm up: the storage's tables, the tier table's growth
        for i in 0..TIERS {
            let name = format!("warm-{i:05}");
            tiers.set_tier(name.as_str(), Quota::per_minute(10)).unwrap();
            tiers.check("ada", &name, 1).await.unwrap().unwrap();
            assert!(tiers.remove_tier(&name));
        }
        clock.advance(std::time::Duration::from_secs(3_600));
        memory.sweep();
        let before = heap::live_bytes();
        for i in 0..TIERS {
            let name = format!("plan-{i:05}");
            tiers.set_tier(name.as_str(), Quota::per_minute(10)).unwrap();
            tiers.check("ada", &name, 1).await.unwrap().unwrap();
            assert!(tiers.remove_tier(&name));
        }
        let held = heap::delta(before, heap::live_bytes());
        clock.advance(std::time::Duration::from_secs(3_600));
        memory.sweep();
        assert_eq!(memory.len(), 0);
        let left = heap::delta(before, heap::live_bytes());
        // each removed tier held its maps (about 25 KB) until the sweep
        assert!(held > 10_000 * TIERS as i64, "held {held} B");
        assert!(
            left < 64 * 1024,
            "{TIERS} removed tiers left {left} B after their keys expired"
        );
        // the user of a tier added now has its state where a decision by
        // name finds it again
        tiers.set_tier("late", Quota::per_minute(2)).unwrap();
        for admitted in [true, true, false] {
            let decision = tiers.check("ada", "late", 1).await.unwrap();
            assert_eq!(decision.is_ok(), admitted);
        }
    });
}
