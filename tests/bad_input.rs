//! Bad input through the layer, and identity safety. Each case gets a clear
//! answer, panics nowhere, and leaves other users' quotas exact (the table
//! of input -> status is in RELIABILITY.md).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::tier::MAX_USER_ID_LEN;
use tower_rate_tier::{
    OnMissing, OnUnknownTier, Quota, RateTier, TierCost, TierIdentity, TierLimitLayer, tier_cost,
};
use tower_rate_tier_tests::reply::{header_identity, send};

// ---------------------------------------------------------------- helpers

fn tiers(clock: &FakeClock, on_missing: OnMissing) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .tier("multi", [Quota::per_second(2), Quota::per_hour(5)])
        .tier("enterprise", Quota::unlimited())
        .default_tier("free")
        .on_missing(on_missing)
        .clock(clock.clone())
        .build()
}

fn app_with(layer: TierLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/max", get(|| async { "ok" }).layer(tier_cost(u32::MAX)))
        .route("/zero", get(|| async { "ok" }).layer(tier_cost(0)))
        .route("/attr", get(max_cost_handler))
        .layer(layer)
}

fn app(clock: &FakeClock) -> Router {
    app_with(TierLimitLayer::new(tiers(clock, OnMissing::UseDefault)).identifier_fn(header_identity))
}

#[tower_rate_tier::tier_cost(4294967295)]
async fn max_cost_handler() -> &'static str {
    "ok"
}

/// A request from `peer` with these headers (raw bytes allowed).
fn req(path: &str, peer: &str, headers: &[(&str, &[u8])]) -> Request<Body> {
    let mut r = Request::get(path).body(Body::empty()).unwrap();
    let addr: SocketAddr = format!("{peer}:40000").parse().unwrap();
    r.extensions_mut().insert(ConnectInfo(addr));
    for (name, value) in headers {
        r.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    r
}

fn user(name: &str) -> Request<Body> {
    req("/", "10.9.9.9", &[("x-user", name.as_bytes())])
}

/// `ada`, a bystander, still gets her exact quota: the next request leaves
/// `expect` remaining.
async fn bystander_is_exact(app: &Router, expect: u32) {
    let r = send(app, user("ada")).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(expect)));
}

/// Serves `app` on 127.0.0.1 with peer addresses; aborts on drop.
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(app: Router) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    Server { addr, task }
}

/// Writes `raw` (a whole HTTP/1.1 request, sent with `Connection: close`)
/// and reads the answer: (status, the whole response text).
async fn raw(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(raw).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes")
        .ok();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, text)
}

fn raw_get(extra_headers: &[u8]) -> Vec<u8> {
    let mut r = b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n".to_vec();
    r.extend_from_slice(extra_headers);
    r.extend_from_slice(b"\r\n");
    r
}

fn header_of<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    response.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

// ---------------------------------------------------------------- identities

#[tokio::test]
async fn a_non_utf8_identity_header_is_an_unidentified_client() {
    let clock = FakeClock::new();
    let app = app(&clock);
    // UseDefault: the default tier, keyed by the peer address
    for expect in [9, 8] {
        let r = send(&app, req("/", "10.0.0.1", &[("x-user", b"\xffada\xfe")])).await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(expect)));
        assert_eq!(r.header("ratelimit-policy"), Some(r#""free";q=10;w=60"#));
    }
    // the same peer without the header is the same anonymous client
    let r = send(&app, req("/", "10.0.0.1", &[])).await;
    assert_eq!(r.remaining(), Some(7));
    bystander_is_exact(&app, 9).await;
    // Deny: the configured status
    let deny = app_with(
        TierLimitLayer::new(tiers(&clock, OnMissing::Deny(StatusCode::UNAUTHORIZED)))
            .identifier_fn(header_identity),
    );
    let r = send(&deny, req("/", "10.0.0.1", &[("x-user", b"\xff\xfe")])).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json()["status"], 401);
}

#[tokio::test]
async fn an_empty_or_too_long_user_id_is_an_unidentified_client() {
    let clock = FakeClock::new();
    let app = app(&clock);
    let long = "u".repeat(MAX_USER_ID_LEN + 1);
    let longest = "v".repeat(MAX_USER_ID_LEN);
    let r = send(&app, req("/", "10.0.0.2", &[("x-user", b"")])).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(9)));
    let r = send(&app, req("/", "10.0.0.2", &[("x-user", long.as_bytes())])).await;
    assert_eq!(
        (r.status, r.remaining()),
        (StatusCode::OK, Some(8)),
        "same anonymous peer"
    );
    // 1024 bytes is still an id, of its own
    let r = send(&app, req("/", "10.0.0.2", &[("x-user", longest.as_bytes())])).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(9)));
    let r = send(&app, req("/", "10.0.0.2", &[("x-user", longest.as_bytes())])).await;
    assert_eq!(r.remaining(), Some(8));
    bystander_is_exact(&app, 9).await;
    // under Deny they are refused, not let through
    let deny = app_with(
        TierLimitLayer::new(tiers(&clock, OnMissing::Deny(StatusCode::UNAUTHORIZED)))
            .identifier_fn(header_identity),
    );
    for bad in [&b""[..], long.as_bytes()] {
        let r = send(&deny, req("/", "10.0.0.2", &[("x-user", bad)])).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    // without a default tier: 403
    let no_default = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(
            RateTier::builder()
                .tier("free", Quota::per_minute(10))
                .clock(clock.clone())
                .build(),
        )
        .identifier_fn(header_identity),
    );
    let r = send(&no_default, req("/", "10.0.0.2", &[("x-user", b"")])).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_identity_headers_over_a_real_socket() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .build();
    let server = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity)),
    )
    .await;
    let addr = server.addr;
    // non-UTF-8 bytes (obs-text) reach the identifier and make the client
    // anonymous: keyed by 127.0.0.1
    let (status, text) = raw(addr, &raw_get(b"x-user: \xffada\xfe\r\n")).await;
    assert_eq!(
        (status, header_of(&text, "x-ratelimit-remaining")),
        (200, Some("9"))
    );
    // a user id over MAX_USER_ID_LEN (2 KiB, within hyper's limits): the
    // same anonymous client
    let mut long = b"x-user: ".to_vec();
    long.extend(std::iter::repeat_n(b'u', 2048));
    long.extend_from_slice(b"\r\n");
    let (status, text) = raw(addr, &raw_get(&long)).await;
    assert_eq!(
        (status, header_of(&text, "x-ratelimit-remaining")),
        (200, Some("8"))
    );
    // a header block over hyper's buffer limit (~400 KiB): 431 from hyper,
    // before the limiter runs
    let mut huge = b"x-user: ".to_vec();
    huge.extend(std::iter::repeat_n(b'u', 512 * 1024));
    huge.extend_from_slice(b"\r\n");
    let (status, _) = raw(addr, &raw_get(&huge)).await;
    assert_eq!(status, 431);
    // more headers than hyper parses (100): 431
    let many: Vec<u8> = (0..150)
        .flat_map(|i| format!("x-h{i}: v\r\n").into_bytes())
        .collect();
    let (status, _) = raw(addr, &raw_get(&many)).await;
    assert_eq!(status, 431);
    // a control character in a header value: 400 from hyper
    let (status, _) = raw(addr, &raw_get(b"x-user: a\x01b\r\n")).await;
    assert_eq!(status, 400);
    // the server goes on; the anonymous client was charged twice, a user
    // has their whole quota
    let (status, text) = raw(addr, &raw_get(b"")).await;
    assert_eq!(
        (status, header_of(&text, "x-ratelimit-remaining")),
        (200, Some("7"))
    );
    let (status, text) = raw(addr, &raw_get(b"x-user: ada\r\n")).await;
    assert_eq!(
        (status, header_of(&text, "x-ratelimit-remaining")),
        (200, Some("9"))
    );
}

#[tokio::test]
async fn an_unknown_tier_never_bypasses_the_limit() {
    // The policies themselves: tests/layer.rs `on_unknown_tier_policies`.
    // Here: odd names (long, control characters, markup) are handled the
    // same, and never echoed.
    let clock = FakeClock::new();
    let app = app(&clock);
    let odd = [
        "platinum",
        &"x".repeat(4_000),
        "fr\tee",
        "<script>alert(1)</script>",
        "free ",
    ];
    for (i, tier) in odd.iter().enumerate() {
        let who = format!("odd-{i}");
        let r = send(
            &app,
            req(
                "/",
                "10.0.0.3",
                &[("x-user", who.as_bytes()), ("x-tier", tier.as_bytes())],
            ),
        )
        .await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(9)), "{tier:?}");
    }
    let deny = app_with(
        TierLimitLayer::new(tiers(&clock, OnMissing::UseDefault))
            .identifier_fn(header_identity)
            .on_unknown_tier(OnUnknownTier::Deny(StatusCode::FORBIDDEN)),
    );
    let r = send(
        &deny,
        req(
            "/",
            "10.0.0.3",
            &[("x-user", b"eve"), ("x-tier", b"<script>alert(1)</script>")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        !String::from_utf8_lossy(&r.body).contains("script"),
        "{:?}",
        r.body
    );
    bystander_is_exact(&app, 9).await;
}

// ---------------------------------------------------------------- costs

#[tokio::test]
async fn cost_zero_consumes_nothing_even_for_a_spent_quota() {
    let clock = FakeClock::new();
    let app = app(&clock);
    let zero = || {
        let mut r = user("ada");
        r.extensions_mut().insert(TierCost(0));
        r
    };
    for _ in 0..3 {
        let r = send(&app, zero()).await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(10)));
    }
    for _ in 0..10 {
        send(&app, user("ada")).await;
    }
    assert_eq!(
        send(&app, user("ada")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // a cost known at the edge is free even now (route-level cost 0:
    // tests/layer.rs `cost_zero_route_*`)
    let r = send(&app, zero()).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(0)));
}

#[tokio::test]
async fn cost_u32_max_is_403_without_retry_after_and_consumes_nothing() {
    let clock = FakeClock::new();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let app = app_with(
        TierLimitLayer::new(tiers(&clock, OnMissing::UseDefault))
            .identifier_fn(header_identity)
            .cost_fn(move |parts| {
                if parts.uri.path() == "/" && parts.headers.contains_key("x-max") {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return Some(u32::MAX);
                }
                None
            }),
    );
    let extension = || {
        let mut r = user("ada");
        r.extensions_mut().insert(TierCost(u32::MAX));
        r
    };
    let by_cost_fn = || req("/", "10.9.9.9", &[("x-user", b"ada"), ("x-max", b"1")]);
    let route = |path: &str| req(path, "10.9.9.9", &[("x-user", b"ada")]);
    // twice each: the route-level ones are learned after the first request
    for request in [
        extension(),
        extension(),
        by_cost_fn(),
        route("/max"),
        route("/max"),
        route("/attr"),
        route("/attr"),
    ] {
        let path = request.uri().path().to_owned();
        let r = send(&app, request).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(r.header("retry-after"), None);
        let body = r.json();
        assert_eq!(
            (body["cost"].as_u64(), body["limit"].as_u64()),
            (Some(u64::from(u32::MAX)), Some(10))
        );
        assert_eq!(body["tier"], "free");
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    // nothing was consumed
    bystander_is_exact(&app, 9).await;
    // an unlimited tier admits any cost, without rate-limit fields
    let mut r = req("/", "10.9.9.9", &[("x-user", b"boss"), ("x-tier", b"enterprise")]);
    r.extensions_mut().insert(TierCost(u32::MAX));
    let r = send(&app, r).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, None));
}

// ---------------------------------------------------------------- clock

#[tokio::test]
async fn a_clock_jump_backwards_locks_out_for_at_most_one_full_refill() {
    let clock = FakeClock::new();
    let app = app(&clock);
    for _ in 0..10 {
        send(&app, user("ada")).await;
    }
    let multi = || req("/", "10.9.9.9", &[("x-user", b"mo"), ("x-tier", b"multi")]);
    for _ in 0..2 {
        assert_eq!(send(&app, multi()).await.status, StatusCode::OK);
    }
    // the clock steps back an hour
    clock.rewind(Duration::from_secs(3_600));
    let now_secs = FakeClock::START_UNIX_SECS - 3_600;
    let r = send(&app, user("ada")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // one emission interval to wait, a full refill at most: not an hour
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(r.header("x-ratelimit-reset"), Some(&*(now_secs + 60).to_string()));
    assert_eq!(r.json()["retry_after"], 6);
    // a multi-band key loses an hour of refill in every band, at most a
    // full refill: its hourly band (5 per hour, 720 s a unit) is now empty
    let r = send(&app, multi()).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("720"));
    // others are unaffected
    let r = send(&app, user("bob")).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(9)));
    // one full refill after the jump, the whole burst is back
    clock.advance(Duration::from_secs(60));
    for expect in (0..10).rev() {
        assert_eq!(send(&app, user("ada")).await.remaining(), Some(expect));
    }
    clock.advance(Duration::from_secs(3_600 - 60));
    let r = send(&app, multi()).await;
    assert_eq!(
        (r.status, r.header("ratelimit")),
        (StatusCode::OK, Some(r#""multi.0";r=1;t=1, "multi.1";r=4;t=720"#))
    );
    // even a clock at the epoch answers
    clock.set(Duration::ZERO);
    let r = send(&app, user("ada")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("x-ratelimit-reset"), Some("60"));
    let r = send(&app, user("carol")).await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(9)));
}

// ---------------------------------------------------------------- bodies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_over_a_real_socket_is_408_while_others_are_served() {
    // Over the limit, failing mid-stream, stalled (in process):
    // tests/body.rs. Here over TCP: the client promises 50 bytes, sends 10
    // and waits.
    struct BodyKey;
    #[tower_rate_tier::async_trait]
    impl tower_rate_tier::TierIdentifier for BodyKey {
        async fn identify(&self, headers: &HeaderMap) -> Option<TierIdentity> {
            header_identity(headers)
        }
        async fn identify_with_body(&self, _: &HeaderMap, body: &Bytes) -> Option<TierIdentity> {
            let user = std::str::from_utf8(body).ok()?.trim();
            Some(TierIdentity::new(user, "free"))
        }
    }
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .build();
    let server = serve(
        Router::new().route("/", post(|| async { "ok" })).layer(
            TierLimitLayer::new(tiers)
                .identifier(BodyKey)
                .buffer_body(true)
                .max_body_size(64)
                .body_timeout(Duration::from_millis(300)),
        ),
    )
    .await;
    let addr = server.addr;
    let started = std::time::Instant::now();
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(b"POST / HTTP/1.1\r\nhost: localhost\r\ncontent-length: 50\r\n\r\n0123456789")
        .await
        .unwrap();
    // meanwhile another client is served at once
    let post = |body: &str| {
        format!(
            "POST / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let (status, text) = raw(addr, post("ada").as_bytes()).await;
    assert_eq!(
        (status, header_of(&text, "x-ratelimit-remaining")),
        (200, Some("9"))
    );
    let mut answer = vec![0; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut answer))
        .await
        .expect("the stalled request is answered")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // a body over the limit over TCP: 413
    let (status, _) = raw(addr, post(&"x".repeat(100)).as_bytes()).await;
    assert_eq!(status, 413);
    let (status, text) = raw(addr, post("ada").as_bytes()).await;
    assert_eq!(
        (status, header_of(&text, "x-ratelimit-remaining")),
        (200, Some("8"))
    );
}

// ---------------------------------------------------------------- identity safety

/// Headers that carry a client address, none of which is trusted by
/// default.
const FORWARDING: [&str; 8] = [
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "fastly-client-ip",
];

fn anonymous_tiers(clock: &FakeClock) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .default_tier("free")
        .clock(clock.clone())
        .build()
}

#[tokio::test]
async fn no_forwarding_header_is_trusted_by_default() {
    let clock = FakeClock::new();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(anonymous_tiers(&clock)));
    for header in FORWARDING {
        let mut statuses = Vec::new();
        for i in 0..4 {
            let value = if header == "forwarded" {
                format!("for=198.51.100.{i}")
            } else {
                format!("198.51.100.{i}")
            };
            let peer = format!(
                "10.1.0.{}",
                header.len() * 10 + header.as_bytes()[0] as usize % 10
            );
            let r = send(&app, req("/", &peer, &[(header, value.as_bytes())])).await;
            statuses.push(r.status.as_u16());
        }
        // four spoofed addresses, one peer: one bucket of 3
        assert_eq!(statuses, [200, 200, 200, 429], "{header}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_forwarding_header_is_trusted_by_default_over_a_real_socket() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .default_tier("free")
        .build();
    let server = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(TierLimitLayer::new(tiers)),
    )
    .await;
    let mut statuses = Vec::new();
    for (i, header) in FORWARDING.iter().enumerate() {
        let line = format!("{header}: 203.0.113.{i}\r\n");
        statuses.push(raw(server.addr, &raw_get(line.as_bytes())).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429]);
}

#[tokio::test]
async fn only_a_trusted_proxy_is_believed_and_only_for_the_right_most_hops() {
    let clock = FakeClock::new();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(anonymous_tiers(&clock)).trusted_proxies([
            "10.0.0.1".parse::<std::net::IpAddr>().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "fd00::1".parse().unwrap(),
        ]),
    );
    let remaining = |peer: &str, headers: &[(&str, &[u8])]| {
        let r = req("/", peer, headers);
        let app = app.clone();
        async move { send(&app, r).await.remaining() }
    };
    // an untrusted peer's X-Forwarded-For is ignored: keyed by the peer
    assert_eq!(
        remaining("10.0.0.9", &[("x-forwarded-for", b"1.1.1.1")]).await,
        Some(2)
    );
    assert_eq!(
        remaining("10.0.0.9", &[("x-forwarded-for", b"2.2.2.2")]).await,
        Some(1)
    );
    // through a trusted proxy: the client it saw
    assert_eq!(
        remaining("10.0.0.1", &[("x-forwarded-for", b"1.1.1.1")]).await,
        Some(2)
    );
    // a client prepending a forged hop does not escape its bucket; two
    // trusted hops are skipped
    assert_eq!(
        remaining("10.0.0.1", &[("x-forwarded-for", b"6.6.6.6, 1.1.1.1, 10.0.0.2")]).await,
        Some(1)
    );
    // several header lines count as one list
    assert_eq!(
        remaining(
            "10.0.0.1",
            &[("x-forwarded-for", b"7.7.7.7"), ("x-forwarded-for", b"1.1.1.1")]
        )
        .await,
        Some(0)
    );
    // IPv6 proxies and clients
    let v6 = "[fd00::1]";
    let mut r = Request::get("/").body(Body::empty()).unwrap();
    r.extensions_mut()
        .insert(ConnectInfo(format!("{v6}:443").parse::<SocketAddr>().unwrap()));
    r.headers_mut()
        .insert("x-forwarded-for", "2001:db8::7".parse().unwrap());
    assert_eq!(send(&app, r).await.remaining(), Some(2));
    // a trusted proxy's Forwarded is read too: 3.3.3.3 has its own bucket
    assert_eq!(
        remaining("10.0.0.2", &[("forwarded", b"for=3.3.3.3")]).await,
        Some(2)
    );
    assert_eq!(
        remaining("10.0.0.2", &[("forwarded", b"for=3.3.3.3")]).await,
        Some(1)
    );
    // X-Real-IP is never read: the proxy itself is the client
    assert_eq!(remaining("10.0.0.2", &[("x-real-ip", b"4.4.4.4")]).await, Some(2));
    // garbage stops the walk at the last address believed
    assert_eq!(
        remaining("10.0.0.2", &[("x-forwarded-for", b"not an ip")]).await,
        Some(1)
    );
}

#[tokio::test]
async fn refusal_bodies_are_json_and_never_reflect_client_input() {
    let clock = FakeClock::new();
    // configured names with quotes, markup, control and non-ASCII characters
    let odd = "fr\"ee</script><b>\u{1}\n\u{e9}\\";
    let tiers = RateTier::builder()
        .tier(odd, Quota::per_minute(1))
        .default_tier(odd)
        .clock(clock.clone())
        .build();
    let app = app_with(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    // the client's own user id and tier claim carry markup too
    let evil = |cost: Option<u32>| {
        let mut r = req(
            "/",
            "10.0.0.5",
            &[
                ("x-user", b"<img src=x onerror=alert(1)>\"'"),
                ("x-tier", b"<script>alert(1)</script>"),
            ],
        );
        if let Some(cost) = cost {
            r.extensions_mut().insert(TierCost(cost));
        }
        r
    };
    assert_eq!(send(&app, evil(None)).await.status, StatusCode::OK);
    for (cost, status) in [
        (None, StatusCode::TOO_MANY_REQUESTS),
        (Some(u32::MAX), StatusCode::FORBIDDEN),
    ] {
        let r = send(&app, evil(cost)).await;
        assert_eq!(r.status, status);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        let text = std::str::from_utf8(&r.body).unwrap();
        for reflected in ["<img", "onerror", "<script", "alert"] {
            assert!(!text.contains(reflected), "{text}");
        }
        // the configured name round-trips through JSON, escaped
        let body = r.json();
        assert_eq!(body["tier"], odd);
        assert!(!text.contains('\n') && !text.contains('\u{1}'), "{text:?}");
        // headers: visible ASCII only, the name as an RFC 8941 string
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(
                r.header("ratelimit-policy"),
                Some(r#""fr\"ee</script><b>???\\";q=1;w=60"#)
            );
            assert_eq!(body["retry_after"], 60);
        }
    }
}
