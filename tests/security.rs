//! What a client controls must never buy it uncounted requests or reach a
//! log line as it is: floods of new identities at the key cap, user ids past
//! `MAX_USER_ID_LEN`, conditional route costs behind a buffering limiter,
//! user ids and tier names in logs and events. Each through a real axum
//! `Router`.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::{
    Decide, MemoryStorage, Op, Storage, StorageError, StorageErrorKind, StorageKey,
};
use tower_rate_tier::tier::MAX_USER_ID_LEN;
use tower_rate_tier::{
    CheckError, OnMissing, Quota, RateLimitEvent, RateTier, TierIdentifier, TierIdentity, TierLimitLayer,
    tier_cost,
};
use tower_rate_tier_tests::reply::{Reply, header_identity, send};

// ---------------------------------------------------------------- helpers

/// What the `tracing` events of one test wrote, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Writes every event of this thread (all levels) here until the guard
    /// is dropped.
    ///
    /// `tracing` caches a callsite's interest process-wide when it is first
    /// hit, and while at most one dispatcher is registered it asks only the
    /// registering thread's default: a parallel test without a subscriber
    /// could make a callsite "never" for this one too. A second dispatcher
    /// kept registered meanwhile makes it ask every registered dispatcher.
    fn install(&self) -> (tracing::subscriber::DefaultGuard, tracing::Dispatch) {
        let sink = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        let anchor = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::new());
        let guard = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        (guard, anchor)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every event a layer reports, in its `Debug` form.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<String>>>);

impl Events {
    /// Records each event's `Debug` form, then its `user` and `tier` fields
    /// as they are (`raw user=.. tier=..`).
    fn hook(&self) -> impl Fn(&RateLimitEvent<'_>) + Send + Sync + 'static {
        let events = self.clone();
        move |event| {
            let raw = match event {
                RateLimitEvent::UnknownTier { user, tier } => format!(" raw user={user} tier={tier}"),
                RateLimitEvent::Limited { user, .. }
                | RateLimitEvent::CostExceedsLimit { user, .. }
                | RateLimitEvent::StorageError { user, .. }
                | RateLimitEvent::Overflow { user, .. } => format!(" raw user={user}"),
                _ => String::new(),
            };
            events.0.lock().unwrap().push(format!("{event:?}{raw}"));
        }
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self, variant: &str) -> usize {
        self.all().iter().filter(|e| e.starts_with(variant)).count()
    }
}

fn from(user: &str) -> Request<Body> {
    let mut r = Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    r.extensions_mut()
        .insert(ConnectInfo("10.9.9.9:4000".parse::<SocketAddr>().unwrap()));
    r
}

// ---------------------------------------------------------------- the cap

#[tokio::test]
async fn a_flood_at_the_key_cap_shares_one_quota_and_nobody_passes_uncounted() {
    let logs = Captured::default();
    let _logging = logs.install();
    let clock = FakeClock::new();
    let cap = 64;
    let storage = MemoryStorage::builder().max_keys(cap).build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    let events = Events::default();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers)
            .identifier_fn(header_identity)
            .on_event(events.hook()),
    );
    // a tracked user, before the flood: 4 of 10 spent
    for _ in 0..4 {
        assert_eq!(send(&app, from("tracked")).await.status, StatusCode::OK);
    }

    let (mut admitted, mut limited, mut uncounted) = (0, 0, 0);
    for i in 0..1_000 {
        let r = send(&app, from(&format!("flood-{i}"))).await;
        match (r.status, r.remaining()) {
            (StatusCode::OK, Some(_)) => admitted += 1,
            (StatusCode::TOO_MANY_REQUESTS, Some(_)) => limited += 1,
            _ => uncounted += 1,
        }
    }
    // 63 identities got a key of their own (the tracked user holds the
    // 64th); each got its first request. The 937 others shared the tier's
    // overflow bucket: one quota of 10 between all of them.
    assert_eq!(storage.len(), cap);
    assert_eq!(uncounted, 0);
    assert_eq!(admitted, (cap - 1) + 10);
    assert_eq!(limited, 1_000 - admitted);
    assert_eq!(events.count("Overflow"), 1_000 - (cap - 1));
    assert_eq!(events.count("Limited"), limited);

    // the tracked user keeps an exact quota: 6 left, then 429
    for left in (0..6).rev() {
        let r = send(&app, from("tracked")).await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(left)));
    }
    assert_eq!(
        send(&app, from("tracked")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // a new user waits for the shared bucket to refill (6 s per request) ...
    assert_eq!(
        send(&app, from("late")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(std::time::Duration::from_secs(6));
    assert_eq!(send(&app, from("late")).await.status, StatusCode::OK);

    // ... and the storage warned once (at most once per 10 s), with the
    // count of shared decisions
    let text = logs.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("rate-limit memory storage is full"))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("max_keys=64"));
}

#[tokio::test]
async fn at_the_key_cap_alternating_contracts_share_one_overflow_bucket() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder().max_keys(1).build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    // customers on contracts of their own that differ only in burst, in
    // turn: 10 a minute, with a burst of 10 or 11
    let app =
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(TierLimitLayer::new(tiers).identifier_fn(|headers: &HeaderMap| {
                let user = headers.get("x-user")?.to_str().ok()?;
                let burst = if user.len() % 2 == 0 { 10 } else { 11 };
                Some(TierIdentity::new(user, "free").with_quotas([Quota::per_minute(10).with_burst(burst)]))
            }));
    assert_eq!(send(&app, from("a")).await.status, StatusCode::OK);
    assert_eq!(storage.len(), 1);
    let mut admitted = 0;
    for i in 0..200 {
        let user = if i % 2 == 0 {
            format!("new-{i}")
        } else {
            format!("new-{i}x")
        };
        admitted += u32::from(send(&app, from(&user)).await.status == StatusCode::OK);
    }
    println!("alternating contracts at the key cap: {admitted} of 200 new identities admitted");
    // one bucket of the larger contract at most, never a fresh one per change
    assert!(admitted <= 11, "{admitted} of 200 new identities admitted");
    assert!(admitted >= 10, "{admitted}");
}

/// The memory storage, whose refunds fail.
#[derive(Debug, Clone, Default)]
struct RefundsFail(MemoryStorage);

impl Storage for RefundsFail {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        match op {
            Op::Refund(_) => Decide::ready(Err(StorageError::new(StorageErrorKind::Other, "refunds fail"))),
            _ => self.0.decide(key, bands, op, clock),
        }
    }
}

#[tokio::test]
async fn warnings_a_client_causes_on_every_request_are_throttled() {
    let logs = Captured::default();
    let _logging = logs.install();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1_000))
        .storage(RefundsFail::default())
        .build();
    // a customer record with five bands (a tier has at most four), and a
    // route that fails, whose charge is given back
    let app = Router::new()
        .route("/", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .layer(
            TierLimitLayer::new(tiers)
                .identifier_fn(|headers: &HeaderMap| {
                    let user = headers.get("x-user")?.to_str().ok()?;
                    let identity = TierIdentity::new(user, "free");
                    Some(match user {
                        "five-bands" => identity.with_quotas([
                            Quota::per_second(10),
                            Quota::per_minute(100),
                            Quota::per_hour(1_000),
                            Quota::per_day(10_000),
                            Quota::per_week(50_000),
                        ]),
                        _ => identity,
                    })
                })
                .refund_on(|status| status.is_server_error()),
        );
    for _ in 0..100 {
        assert_eq!(
            send(&app, from("five-bands")).await.status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            send(&app, from("ada")).await.status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
    let text = logs.text();
    let count = |what: &str| text.lines().filter(|l| l.contains(what)).count();
    // the first of each, then none for 10 s
    assert_eq!(count("an identity's own quotas were ignored"), 1, "{text}");
    assert_eq!(count("rate-limit refund failed"), 1, "{text}");
    assert!(text.lines().filter(|l| l.contains("WARN")).count() <= 3, "{text}");
}

// ---------------------------------------------------------------- user ids

#[tokio::test]
async fn a_10_kib_user_id_is_an_unidentified_client() {
    assert_eq!(MAX_USER_ID_LEN, 256);
    let clock = FakeClock::new();
    let storage = MemoryStorage::new();
    let tiers = |on_missing| {
        RateTier::builder()
            .tier("free", Quota::per_minute(10))
            .default_tier("free")
            .on_missing(on_missing)
            .clock(clock.clone())
            .storage(storage.clone())
            .build()
    };
    let app = |on_missing| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(TierLimitLayer::new(tiers(on_missing)).identifier_fn(header_identity))
    };
    let huge = |c: char| c.to_string().repeat(10 * 1024);

    // under `OnMissing::UseDefault`, any number of distinct 10 KiB ids from
    // one address are that address's one anonymous client
    let default = app(OnMissing::UseDefault);
    for (c, left) in [('a', 9), ('b', 8), ('c', 7)] {
        let r = send(&default, from(&huge(c))).await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, Some(left)));
    }
    assert_eq!(storage.len(), 1, "one key, of the address");
    // exactly MAX_USER_ID_LEN bytes is an id of its own; one more is not
    let longest = "v".repeat(MAX_USER_ID_LEN);
    assert_eq!(send(&default, from(&longest)).await.remaining(), Some(9));
    let over = "v".repeat(MAX_USER_ID_LEN + 1);
    assert_eq!(send(&default, from(&over)).await.remaining(), Some(6));

    // under `Deny(status)`, refused with that status
    let deny = app(OnMissing::Deny(StatusCode::UNAUTHORIZED));
    assert_eq!(
        send(&deny, from(&huge('d'))).await.status,
        StatusCode::UNAUTHORIZED
    );
    // and `RateTier::check` refuses it as an invalid id, storing nothing
    let direct = tiers(OnMissing::UseDefault).check(&huge('e'), "free", 1).await;
    assert!(matches!(direct, Err(CheckError::InvalidUserId)), "{direct:?}");
    assert_eq!(storage.len(), 2);
}

// ---------------------------------------------------- buffered conditional cost

/// Reads `user=<id>` from the body.
struct BodyUser;

#[tower_rate_tier::async_trait]
impl TierIdentifier for BodyUser {
    async fn identify(&self, _headers: &HeaderMap) -> Option<TierIdentity> {
        None
    }

    async fn identify_with_body(&self, _headers: &HeaderMap, body: &Bytes) -> Option<TierIdentity> {
        let user = std::str::from_utf8(body).ok()?.strip_prefix("user=")?;
        Some(TierIdentity::new(user, "free"))
    }
}

#[tokio::test]
async fn a_buffered_route_behind_a_cache_answers_200_and_charges_its_cost() {
    // A cache layer answers requests marked `x-cached` before the route's
    // `tier_cost(5)` runs; the limiter buffers bodies to identify clients.
    let route = post(|body: String| async move { format!("computed for {body}") })
        .layer(tier_cost(5))
        .layer(axum::middleware::from_fn(
            |req: Request<Body>, next: axum::middleware::Next| async move {
                if req.headers().contains_key("x-cached") {
                    return http::Response::new(Body::from("cached"));
                }
                next.run(req).await
            },
        ));
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .clock(FakeClock::new())
        .build();
    let app = Router::new()
        .route("/maybe", route)
        .layer(TierLimitLayer::new(tiers).identifier(BodyUser).buffer_body(true));
    let call = |user: &str, cached: bool| {
        let mut r = Request::post("/maybe")
            .body(Body::from(format!("user={user}")))
            .unwrap();
        if cached {
            r.headers_mut().insert("x-cached", "1".parse().unwrap());
        }
        r
    };
    let seen = |r: &Reply| {
        (
            r.status,
            r.remaining(),
            String::from_utf8_lossy(&r.body).into_owned(),
        )
    };

    // the limiter's first requests to the route were cached: it learns that
    // the route declares nothing (they cost 1) ...
    for left in [9, 8] {
        let r = send(&app, call("ada", true)).await;
        assert_eq!(seen(&r), (StatusCode::OK, Some(left), "cached".into()));
    }
    // ... and a request that reaches the declaration is answered and
    // charged 5
    let r = send(&app, call("ada", false)).await;
    assert_eq!(
        seen(&r),
        (StatusCode::OK, Some(3), "computed for user=ada".into())
    );
    let r = send(&app, call("ada", true)).await;
    assert_eq!(seen(&r), (StatusCode::OK, Some(2), "cached".into()));
    // 5 does not fit in the 2 left: 429, nothing consumed
    let r = send(&app, call("ada", false)).await;
    assert_eq!(
        (r.status, r.remaining()),
        (StatusCode::TOO_MANY_REQUESTS, Some(2))
    );
    // another user's uncached request: 200, charged 5
    let r = send(&app, call("bob", false)).await;
    assert_eq!(
        seen(&r),
        (StatusCode::OK, Some(5), "computed for user=bob".into())
    );
}

// ---------------------------------------------------------------- logs and events

/// A storage that is down.
#[derive(Debug)]
struct Down;

impl Storage for Down {
    fn decide(&self, _: StorageKey<'_>, _: &[Quota], _: Op, _: &Arc<dyn Clock>) -> Decide {
        Decide::ready(Err(StorageError::new(
            StorageErrorKind::Unavailable,
            "down for the test",
        )))
    }
}

#[tokio::test]
async fn no_user_id_reaches_a_log_line_or_an_event() {
    let logs = Captured::default();
    let _logging = logs.install();
    let events = Events::default();
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .default_tier("free")
        .clock(clock.clone())
        .storage(MemoryStorage::builder().max_keys(2).build())
        .build();
    // the usual identifier, with `ESC` in a tier name read as the escape
    // character (which no header value may carry)
    let identify = |h: &HeaderMap| {
        header_identity(h).map(|mut id| {
            id.tier = id.tier.replace("ESC", "\u{1b}").into();
            id
        })
    };
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(identify)
        .on_event(events.hook());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/big", get(|| async { "ok" }).layer(tier_cost(50)))
        .layer(layer.clone());
    let call = |path: &str, user: &str, tier: Option<&str>| {
        let mut r = from(user);
        *r.uri_mut() = path.parse().unwrap();
        if let Some(tier) = tier {
            r.headers_mut().insert("x-tier", tier.parse().unwrap());
        }
        r
    };
    let secrets = [
        "ada-secret-0001",
        "bob-secret-0002",
        "cy-secret-0003",
        "dee-secret-0004",
    ];

    // limited (429)
    for _ in 0..3 {
        send(&app, call("/", secrets[0], None)).await;
    }
    // a cost above the burst (403), again and again
    for _ in 0..20 {
        assert_eq!(
            send(&app, call("/big", secrets[1], None)).await.status,
            StatusCode::FORBIDDEN
        );
    }
    // an unknown tier the client chose: long, with an escape sequence
    let evil_tier = format!("goldESC[31m{}", "x".repeat(4_000));
    for _ in 0..20 {
        send(&app, call("/", secrets[2], Some(&evil_tier))).await;
    }
    // the storage full (two keys taken): the overflow bucket
    send(&app, call("/", secrets[3], None)).await;
    // a storage that fails
    let down = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .storage(Down)
        .build();
    let down_app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(down)
            .identifier_fn(header_identity)
            .on_event(events.hook()),
    );
    for _ in 0..20 {
        assert_eq!(
            send(&down_app, call("/", secrets[0], None)).await.status,
            StatusCode::OK
        );
    }

    let text = logs.text();
    let all = events.all();
    for kind in [
        "Limited",
        "CostExceedsLimit",
        "UnknownTier",
        "Overflow",
        "StorageError",
    ] {
        assert!(
            all.iter().any(|e| e.starts_with(kind)),
            "no {kind} event: {all:#?}"
        );
    }
    for needle in [
        "rate limited",
        "exceeds the tier's burst",
        "unknown tier",
        "storage failed",
    ] {
        assert!(text.contains(needle), "no `{needle}` line in\n{text}");
    }
    for secret in secrets {
        assert!(!text.contains(secret), "{secret} in the logs:\n{text}");
        assert!(!all.iter().any(|e| e.contains(secret)), "{secret} in an event");
    }
    // the logs and events name a user by the layer's pseudonym for it
    let ada = layer.user_pseudonym(secrets[0]);
    assert!(text.contains(&ada) && all.iter().any(|e| e.contains(&ada)));
    // the client's tier name: cut to 64 characters and escaped, in both
    assert!(!text.contains('\u{1b}') && !all.iter().any(|e| e.contains('\u{1b}')));
    assert!(!text.contains(&"x".repeat(100)) && !all.iter().any(|e| e.contains(&"x".repeat(100))));
    assert!(
        all.iter()
            .any(|e| e.contains(r"raw user=") && e.contains(r"tier=gold\u{1b}[31mxxx")),
        "{all:#?}"
    );
    let shown = all.iter().find(|e| e.starts_with("UnknownTier")).unwrap();
    assert!(shown.ends_with(&format!("{}…", "x".repeat(64 - 9))), "{shown}");
    // each warning a client can cause at will was written once, though it
    // was caused 20 times; every occurrence is still an event
    for warning in ["exceeds the tier's burst", "unknown tier", "storage failed"] {
        let n = text
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(warning))
            .count();
        assert_eq!(n, 1, "`{warning}` written {n} times:\n{text}");
    }
    assert_eq!(events.count("CostExceedsLimit"), 20);
    assert_eq!(events.count("UnknownTier"), 20);
    assert_eq!(events.count("StorageError"), 20);
}
