//! Concurrency limits per tier: at most N requests of one user in flight,
//! counted by the memory storage; each slot held until the response is over
//! and given back however the request ends.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_tests::bodies::Endless;
use tower_rate_tier_tests::reply::{Reply, header_identity, send};

#[path = "concurrency/fallback_slots.rs"]
mod fallback_slots;

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// `/stream` answers an endless body; `/` answers at once; `/hang` never
/// answers; `/panic` panics.
fn routes() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/stream", get(|| async { Body::new(Endless::default()) }))
        .route("/hang", get(std::future::pending::<&'static str>))
        .route("/panic", get(panics))
}

async fn panics() -> &'static str {
    panic!("the handler failed")
}

fn app(tiers: RateTier) -> Router {
    routes().layer(TierLimitLayer::new(tiers).identifier_fn(header_identity))
}

fn tiers(rate: Quota, slots: u32) -> RateTier {
    RateTier::builder()
        .tier("free", rate)
        .tier_concurrency("free", slots)
        .clock(FakeClock::new())
        .build()
}

fn get_as(user: &str, path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

/// Opens a stream: the response with its body unread (holding its slot).
async fn open(app: &Router, user: &str) -> Response<Body> {
    app.clone().oneshot(get_as(user, "/stream")).await.unwrap()
}

/// A field's items as `sfv` (an RFC 9651 parser) decodes them: name and
/// parameters as text (`2`, `"concurrent-requests"`).
fn items(value: &str) -> Vec<(String, HashMap<String, String>)> {
    tower_rate_tier_tests::fields::items(value)
        .into_iter()
        .map(|(name, params)| {
            let params = params
                .iter()
                .map(|(k, v)| {
                    let v = match (v.as_integer(), v.as_string()) {
                        (Some(n), _) => i64::from(n).to_string(),
                        (_, Some(s)) => format!("{:?}", s.as_str()),
                        _ => panic!("a parameter neither Integer nor String in {value:?}"),
                    };
                    (k.as_str().to_owned(), v)
                })
                .collect();
            (name, params)
        })
        .collect()
}

fn field<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
}

/// The parameters of the item `name` of the field `field`.
fn item(headers: &HeaderMap, field_name: &str, name: &str) -> HashMap<String, String> {
    items(field(headers, field_name))
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no item {name:?} in {field_name}"))
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_in_flight_than_the_limit_under_64_tasks() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (count, peak) = (in_flight.clone(), most.clone());
    let handler = move || {
        let (count, peak) = (count.clone(), peak.clone());
        async move {
            let now = count.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            // let the others pile up (no timing is asserted)
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            count.fetch_sub(1, Ordering::SeqCst);
            "done"
        }
    };
    let app = Router::new()
        .route("/", get(handler))
        .layer(TierLimitLayer::new(tiers(Quota::per_second(100_000), 4)).identifier_fn(header_identity));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            send(&app, get_as("ada", "/")).await.status
        }));
    }
    let mut statuses = HashMap::new();
    for task in tasks {
        *statuses.entry(task.await.unwrap()).or_insert(0) += 1;
    }
    let peak = most.load(Ordering::SeqCst);
    println!("64 tasks, limit 4: at most {peak} in flight, {statuses:?}");
    assert!(peak <= 4, "{peak} requests in flight at once");
    assert!(statuses[&StatusCode::OK] >= 1);
    assert_eq!(statuses.values().sum::<i32>(), 64);
    assert!(
        statuses
            .keys()
            .all(|s| [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS].contains(s))
    );
    // every slot came back: four responses held at once
    let four: Vec<_> = hold(&app, 4).await;
    assert!(four.iter().all(|r| r.status() == StatusCode::OK));
}

/// Sends `n` requests one after the other and keeps their responses
/// (bodies unread, so each holds its slot).
async fn hold(app: &Router, n: usize) -> Vec<Response<Body>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(app.clone().oneshot(get_as("ada", "/")).await.unwrap());
    }
    out
}

#[tokio::test]
async fn the_request_over_the_limit_is_refused_with_the_concurrency_fields() {
    let app = app(tiers(Quota::per_minute(20), 2));
    let first = open(&app, "ada").await;
    assert_eq!(first.status(), StatusCode::OK);
    let policy = item(first.headers(), "ratelimit-policy", "free.concurrency");
    assert_eq!(policy.get("q").map(String::as_str), Some("2"));
    assert_eq!(
        policy.get("qu").map(String::as_str),
        Some("\"concurrent-requests\"")
    );
    assert!(!policy.contains_key("w"), "{policy:?}");
    let state = item(first.headers(), "ratelimit", "free.concurrency");
    assert_eq!(state.get("r").map(String::as_str), Some("1"));
    assert!(!state.contains_key("t"), "{state:?}");
    // the rate band is its own item still
    assert_eq!(
        item(first.headers(), "ratelimit", "free")
            .get("r")
            .map(String::as_str),
        Some("19")
    );

    let second = open(&app, "ada").await;
    assert_eq!(second.status(), StatusCode::OK);
    // another user has slots of their own
    assert_eq!(open(&app, "bob").await.status(), StatusCode::OK);

    let third = send(&app, get_as("ada", "/stream")).await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third.header("retry-after"), Some("1"));
    assert_eq!(third.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(third.header("x-ratelimit-remaining"), Some("0"));
    let policy = item(&third.headers, "ratelimit-policy", "free.concurrency");
    assert_eq!(policy.get("q").map(String::as_str), Some("2"));
    let state = items(third.header("ratelimit").unwrap());
    assert_eq!(state.len(), 1, "{state:?}");
    assert_eq!(state[0].0, "free.concurrency");
    assert_eq!(state[0].1.get("r").map(String::as_str), Some("0"));
    assert!(!state[0].1.contains_key("t"));
    let body = third.json();
    assert_eq!(body["type"], QUOTA_EXCEEDED);
    assert_eq!(body["violated-policies"], serde_json::json!(["free.concurrency"]));
    assert_eq!(body["retry_after"], 1);

    // a stream that ends gives its slot back
    drop(first);
    let fourth = open(&app, "ada").await;
    assert_eq!(fourth.status(), StatusCode::OK);
    assert_eq!(
        item(fourth.headers(), "ratelimit", "free.concurrency")
            .get("r")
            .map(String::as_str),
        Some("0")
    );
    drop(second);
}

#[tokio::test]
async fn a_refusal_by_one_limit_consumes_nothing_of_the_other() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .tier_concurrency("free", 1)
        .clock(clock.clone())
        .build();
    let app = app(tiers);
    let held = open(&app, "ada").await;
    // refused by concurrency five times: no rate spent
    for _ in 0..5 {
        assert_eq!(
            send(&app, get_as("ada", "/")).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    drop(held);
    let ok = send(&app, get_as("ada", "/")).await;
    assert_eq!((ok.status, ok.remaining()), (StatusCode::OK, Some(1)));
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
    // refused by rate: it holds no slot
    let by_rate = send(&app, get_as("ada", "/")).await;
    assert_eq!(by_rate.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(by_rate.json()["violated-policies"], serde_json::json!(["free"]));
    clock.advance(Duration::from_secs(20));
    let after = open(&app, "ada").await;
    assert_eq!(
        after.status(),
        StatusCode::OK,
        "the rate refusal left a slot taken"
    );
}

/// A refusal by rate takes no slot even for a moment: a user whose rate is
/// spent, hammering from 64 tasks on two threads, is refused by its rate
/// every time, never by a slot another of its refused requests holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_refusal_never_holds_a_slot_even_for_a_moment() {
    let app = app(tiers(Quota::per_hour(1), 1));
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut by_slots = 0;
                for _ in 0..50 {
                    let reply = send(&app, get_as("ada", "/")).await;
                    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
                    let violated = reply.json()["violated-policies"].clone();
                    by_slots += usize::from(violated != serde_json::json!(["free"]));
                }
                by_slots
            })
        })
        .collect();
    let mut by_slots = 0;
    for task in tasks {
        by_slots += task.await.unwrap();
    }
    assert_eq!(
        by_slots, 0,
        "{by_slots} of 3,200 refusals were by a slot a rate refusal held"
    );
}

#[tokio::test]
async fn a_dropped_response_future_gives_the_slot_back() {
    let app = app(tiers(Quota::per_minute(100), 1));
    let mut hung = Box::pin(app.clone().oneshot(get_as("ada", "/hang")));
    // admitted, the handler waits
    assert!(futures_poll_once(hung.as_mut()).await.is_none());
    assert_eq!(
        send(&app, get_as("ada", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    drop(hung);
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
}

/// Polls `future` once: its output if it is ready.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut future).poll(cx) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test]
async fn a_half_read_body_holds_the_slot_until_dropped() {
    let app = app(tiers(Quota::per_minute(100), 1));
    let response = open(&app, "ada").await;
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first");
    // the stream is not over: its slot is held
    assert_eq!(
        send(&app, get_as("ada", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    drop(body);
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
    // a body read to its end gives it back too (without being dropped)
    let mut done = app.clone().oneshot(get_as("ada", "/")).await.unwrap().into_body();
    while let Some(frame) = done.frame().await {
        frame.unwrap();
    }
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
    drop(done);
}

#[tokio::test]
async fn a_panicking_handler_gives_the_slot_back() {
    let app = app(tiers(Quota::per_minute(100), 1));
    let panicked = tokio::spawn({
        let app = app.clone();
        async move { app.oneshot(get_as("ada", "/panic")).await }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_timeout_around_the_limiter_gives_the_slot_back() {
    let limiter = TierLimitLayer::new(tiers(Quota::per_minute(100), 1)).identifier_fn(header_identity);
    let mut service = ServiceBuilder::new()
        .timeout(Duration::from_millis(20))
        .layer(limiter)
        .service(routes());
    for path in ["/hang", "/hang", "/"] {
        let ready = ServiceExt::<Request<Body>>::ready(&mut service).await.unwrap();
        let result = ready.call(get_as("ada", path)).await;
        match path {
            // timed out, not refused: the slot of the one before came back
            "/hang" => assert!(result.unwrap_err().is::<tower::timeout::error::Elapsed>()),
            _ => assert_eq!(result.unwrap().status(), StatusCode::OK),
        }
    }
}

#[tokio::test]
async fn a_failing_inner_service_gives_the_slot_back() {
    let limiter = TierLimitLayer::new(tiers(Quota::per_minute(100), 1)).identifier_fn(header_identity);
    let fail = tower::service_fn(|req: Request<Body>| async move {
        if req.uri().path() == "/fail" {
            return Err("the inner service failed");
        }
        Ok::<_, &str>(Response::new(Body::from("ok")))
    });
    let mut service = ServiceBuilder::new().layer(limiter).service(fail);
    let failed = ServiceExt::<Request<Body>>::ready(&mut service)
        .await
        .unwrap()
        .call(get_as("ada", "/fail"))
        .await;
    assert!(failed.is_err());
    let ok = ServiceExt::<Request<Body>>::ready(&mut service)
        .await
        .unwrap()
        .call(get_as("ada", "/"))
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test]
async fn shadow_mode_lets_an_over_limit_request_through_holding_no_slot() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 1)
        .shadow_tier("free")
        .build();
    let app = app(tiers.clone());
    let first = open(&app, "ada").await;
    let over = open(&app, "ada").await;
    assert_eq!(over.status(), StatusCode::OK);
    // enforced from now on; the over-limit stream is still open
    assert!(tiers.set_shadow("free", false));
    drop(first);
    let next = open(&app, "ada").await;
    assert_eq!(next.status(), StatusCode::OK, "the shadowed request held a slot");
    assert_eq!(
        send(&app, get_as("ada", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    drop((over, next));
}

#[tokio::test]
async fn a_customer_limit_overrides_the_tier_and_set_tier_keeps_it() {
    let tiers = tiers(Quota::per_minute(100), 3);
    let contract = |headers: &HeaderMap| {
        let user = headers.get("x-user")?.to_str().ok()?;
        let identity = TierIdentity::new(user, "free");
        Some(match user {
            "acme" => identity.with_concurrency(1),
            "big" => identity.with_quotas(Quota::per_minute(1_000)).with_concurrency(5),
            _ => identity,
        })
    };
    let app = routes().layer(TierLimitLayer::new(tiers.clone()).identifier_fn(contract));
    let held = open(&app, "acme").await;
    assert_eq!(
        send(&app, get_as("acme", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    drop(held);
    let mut big = Vec::new();
    for _ in 0..5 {
        big.push(open(&app, "big").await);
    }
    assert!(big.iter().all(|r| r.status() == StatusCode::OK));
    assert_eq!(
        item(big[4].headers(), "ratelimit-policy", "free.concurrency")["q"],
        "5"
    );
    assert_eq!(
        send(&app, get_as("big", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // the tier's rate changes, its limit stays: 3 for everyone else
    tiers.set_tier("free", Quota::per_minute(200)).unwrap();
    let ada: Vec<_> = [
        open(&app, "ada").await,
        open(&app, "ada").await,
        open(&app, "ada").await,
    ]
    .into();
    assert!(ada.iter().all(|r| r.status() == StatusCode::OK));
    assert_eq!(
        send(&app, get_as("ada", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // replaced: 4
    tiers.set_tier_concurrency("free", Some(4)).unwrap();
    assert_eq!(open(&app, "ada").await.status(), StatusCode::OK);
    drop((ada, big));
}

#[tokio::test]
async fn an_unlimited_tier_may_still_cap_parallel_requests() {
    let tiers = RateTier::builder()
        .tier("enterprise", Quota::unlimited())
        .tier_concurrency("enterprise", 2)
        .build();
    let app = enterprise(tiers);
    let held = [open(&app, "corp").await, open(&app, "corp").await];
    assert!(held.iter().all(|r| r.status() == StatusCode::OK));
    assert_eq!(
        field(held[0].headers(), "ratelimit-policy"),
        r#""enterprise.concurrency";q=2;qu="concurrent-requests""#
    );
    refused_until_dropped(&app, held).await;
}

/// The routes under a limiter of `tiers` whose every user is of the tier
/// `enterprise`.
fn enterprise(tiers: RateTier) -> Router {
    routes().layer(TierLimitLayer::new(tiers).identifier_fn(|h: &HeaderMap| {
        Some(TierIdentity::new(h.get("x-user")?.to_str().ok()?, "enterprise"))
    }))
}

/// While `held` holds every slot of the user `corp` of `enterprise`, its
/// next request is refused by the concurrency limit; once they are
/// dropped, it is admitted.
async fn refused_until_dropped<T>(app: &Router, held: T) {
    let refused: Reply = send(app, get_as("corp", "/")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.json()["violated-policies"],
        serde_json::json!(["enterprise.concurrency"])
    );
    drop(held);
    assert_eq!(send(app, get_as("corp", "/")).await.status, StatusCode::OK);
}

/// Counts slots itself, in one set for everyone, and answers every
/// acquire as the memory storage's unlimited path does: admitted by its
/// bands (it has none), with the slot refused when none is free.
#[derive(Debug, Default)]
struct OneSet(std::sync::Mutex<tower_rate_tier::storage::LeaseSet>);

impl tower_rate_tier::storage::Storage for OneSet {
    fn decide(
        &self,
        _: tower_rate_tier::storage::StorageKey<'_>,
        _: &[Quota],
        op: tower_rate_tier::storage::Op,
        clock: &Arc<dyn tower_rate_tier::clock::Clock>,
    ) -> tower_rate_tier::storage::Decide {
        use tower_rate_tier::storage::{BandStates, Decide, Decision, Op};
        let now = clock.now();
        let mut set = self.0.lock().unwrap();
        let decision = Decision::new(true, now, BandStates::new());
        Decide::ready(Ok(match op {
            Op::Acquire { slots, .. } => {
                let id = u64::from(set.in_use()) + now;
                decision.with_slots(set.acquire(id, now, &slots))
            }
            Op::Release(lease) => {
                set.release(lease);
                decision
            }
            _ => decision,
        }))
    }
}

#[tokio::test]
async fn a_slot_refused_by_a_custom_storage_is_a_429_even_when_its_bands_admit() {
    let tiers = RateTier::builder()
        .tier("enterprise", Quota::unlimited())
        .tier_concurrency("enterprise", 1)
        .storage(OneSet::default())
        .build();
    let app = enterprise(tiers);
    let held = open(&app, "corp").await;
    assert_eq!(held.status(), StatusCode::OK);
    refused_until_dropped(&app, held).await;
}

/// A route priced with `tier_cost` answers with the concurrency item as
/// any admitted response does: its price is settled in the rate bands
/// alone, and the slot it holds is the one its admission took.
#[tokio::test]
async fn a_priced_route_keeps_the_concurrency_item() {
    let app = routes()
        .route(
            "/search",
            get(|| async { "hits" }).layer(tower_rate_tier::tier_cost(3)),
        )
        .layer(TierLimitLayer::new(tiers(Quota::per_minute(20), 2)).identifier_fn(header_identity));
    for (path, left) in [("/", "19"), ("/search", "16")] {
        let reply = send(&app, get_as("ada", path)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(item(&reply.headers, "ratelimit", "free")["r"], left, "{path}");
        let slots = item(&reply.headers, "ratelimit", "free.concurrency");
        assert_eq!(slots["r"], "1", "{path}: one of two slots free while it runs");
        let policy = item(&reply.headers, "ratelimit-policy", "free.concurrency");
        assert_eq!(policy["q"], "2", "{path}");
    }
}

/// The app of `free` (100 a minute) whose users carry the contract
/// `contract` makes of their identity.
fn contract_app(contract: fn(TierIdentity) -> TierIdentity) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .clock(FakeClock::new())
        .build();
    routes().layer(
        TierLimitLayer::new(tiers).identifier_fn(move |headers: &HeaderMap| {
            let user = headers.get("x-user")?.to_str().ok()?;
            Some(contract(TierIdentity::new(user, "free")))
        }),
    )
}

/// One part of a contract a tier could not have is ignored alone: a limit
/// of 0 in flight leaves the contract's own bands in force, and bands a
/// tier could not have (five) leave its own limit in force.
#[tokio::test]
async fn a_contracts_invalid_part_is_ignored_alone() {
    let app = contract_app(|id| id.with_quotas(Quota::per_minute(2)).with_concurrency(0));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(send(&app, get_as("acme", "/")).await.status);
    }
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]
    );

    let app = contract_app(|id| {
        id.with_concurrency(1).with_quotas([
            Quota::per_second(10),
            Quota::per_minute(100),
            Quota::per_hour(1_000),
            Quota::per_day(10_000),
            Quota::per_week(50_000),
        ])
    });
    let held = open(&app, "acme").await;
    assert_eq!(held.status(), StatusCode::OK);
    let second = send(&app, get_as("acme", "/")).await;
    assert_eq!(
        second.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the contract's one slot is held"
    );
    drop(held);
}

/// Behind a deny cache and a fallback, each around the memory storage, a
/// slot is given back as the memory storage alone gives it back, however
/// each wrapper passes the release on.
#[tokio::test]
async fn slots_are_given_back_through_the_storage_wrappers() {
    use tower_rate_tier::storage::{DenyCache, Fallback, MemoryStorage, Storage};
    let storages: [Arc<dyn Storage>; 2] = [
        Arc::new(DenyCache::new(MemoryStorage::new())),
        Arc::new(Fallback::builder(MemoryStorage::new()).build()),
    ];
    for storage in storages {
        let tiers = RateTier::builder()
            .tier("enterprise", Quota::per_minute(100))
            .tier_concurrency("enterprise", 2)
            .storage(storage.clone())
            .build();
        let app = enterprise(tiers);
        for _ in 0..3 {
            let held = [open(&app, "corp").await, open(&app, "corp").await];
            assert!(held.iter().all(|r| r.status() == StatusCode::OK), "{storage:?}");
            refused_until_dropped(&app, held).await;
        }
    }
}

#[test]
fn configuration_mistakes_are_build_errors() {
    use tower_rate_tier::BuildError;
    let unknown = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .tier_concurrency("fre", 2)
        .try_build();
    assert_eq!(
        unknown.unwrap_err(),
        BuildError::UnknownConcurrencyTier("fre".into())
    );
    let zero = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .tier_concurrency("free", 0)
        .try_build();
    assert_eq!(
        zero.unwrap_err().to_string(),
        "tier `free` has a concurrency limit of 0, which no request could pass: give at least 1"
    );
}

#[tokio::test]
async fn metrics_count_concurrency_refusals_and_slots_in_use_per_tier() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let app = metrics::with_local_recorder(&recorder, || {
        routes().layer(
            TierLimitLayer::new(tiers(Quota::per_minute(100), 2))
                .identifier_fn(header_identity)
                .metrics(true),
        )
    });
    let read = || {
        let mut found = (None, None);
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            assert!(
                labels.iter().all(|(k, _)| k == "tier" || k == "outcome"),
                "{labels:?}"
            );
            match (key.name(), value) {
                ("tower_rate_tier_concurrent_requests", DebugValue::Gauge(g)) => {
                    found.0 = Some(g.into_inner())
                }
                ("tower_rate_tier_requests_total", DebugValue::Counter(n))
                    if labels.contains(&("outcome".into(), "concurrency_limited".into())) =>
                {
                    found.1 = Some(n)
                }
                _ => {}
            }
        }
        found
    };
    let held = [open(&app, "ada").await, open(&app, "bob").await];
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
    let ada2 = open(&app, "ada").await;
    assert_eq!(
        send(&app, get_as("ada", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(read(), (Some(3.0), Some(1)));
    drop((held, ada2));
    // the debugging recorder reports what changed since its last snapshot
    assert_eq!(read(), (Some(-3.0), Some(0)));
}

#[tokio::test]
async fn a_stalled_body_holds_its_slot_at_most_for_the_lease() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 1)
        .concurrency_lease(Duration::from_secs(30))
        .clock(clock.clone())
        .build();
    assert_eq!(tiers.concurrency_lease(), Duration::from_secs(30));
    let app = app(tiers);
    let stalled = open(&app, "ada").await;
    clock.advance(Duration::from_secs(29));
    assert_eq!(
        send(&app, get_as("ada", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(2));
    let next = open(&app, "ada").await;
    assert_eq!(next.status(), StatusCode::OK);
    // the stalled body ends late: its release gives back nothing of the new slot
    drop(stalled);
    assert_eq!(
        send(&app, get_as("ada", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    drop(next);
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
}

/// A request refused for want of a slot while its rate (or a unit) would
/// refuse it too waits for the rate: `Retry-After` is the rate's wait, not
/// the slot's second, and `violated-policies` names both; nothing is
/// charged.
#[tokio::test]
async fn a_slot_refusal_waits_for_a_rate_that_refuses_too() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .tier_unit("free", "tokens", Quota::per_minute(100))
        .tier_concurrency("free", 1)
        .clock(clock.clone())
        .build();
    let app = app(tiers.clone());
    let held = open(&app, "ada").await;
    assert_eq!(held.status(), StatusCode::OK);
    // a refusal by the slot alone: the second of old
    let slot_only = send(&app, get_as("ada", "/")).await;
    assert_eq!(slot_only.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(slot_only.header("retry-after"), Some("1"));
    assert_eq!(
        slot_only.json()["violated-policies"],
        serde_json::json!(["free.concurrency"])
    );
    // the rate is spent meanwhile
    assert!(tiers.check("ada", "free", 1).await.unwrap().is_ok());
    let both = send(&app, get_as("ada", "/")).await;
    assert_eq!(both.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(both.header("retry-after"), Some("30"));
    assert_eq!(
        both.json()["violated-policies"],
        serde_json::json!(["free", "free.concurrency"])
    );
    assert_eq!(
        item(&both.headers, "ratelimit", "free")
            .get("t")
            .map(String::as_str),
        Some("30")
    );
    // the body and the fields report the band that refuses longest
    let body = both.json();
    assert_eq!(
        (body["unit"].as_str(), body["limit"].as_u64()),
        (Some("requests"), Some(2))
    );
    assert_eq!(both.header("x-ratelimit-limit"), Some("2"));
    // a gRPC client reads each violation as what it is
    let call = Request::post("/")
        .header("x-user", "ada")
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap();
    let status = tonic::Status::from_header_map(&send(&app, call).await.headers).expect("a gRPC status");
    let failure = tonic_types::StatusExt::get_details_quota_failure(&status).expect("a QuotaFailure");
    let described: Vec<_> = failure
        .violations
        .iter()
        .map(|v| (v.subject.as_str(), v.description.contains("in flight")))
        .collect();
    assert_eq!(described, [("tier:free", false), ("tier:free.concurrency", true)]);
    // a unit in debt instead
    let bob = open(&app, "bob").await;
    tiers.record("bob", "free", "tokens", 150).await.unwrap();
    let in_debt = send(&app, get_as("bob", "/")).await;
    assert_eq!(in_debt.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        in_debt.json()["violated-policies"],
        serde_json::json!(["free.tokens", "free.concurrency"])
    );
    assert_eq!(in_debt.header("retry-after"), Some("31"));
    // neither refusal charged anything: once the rate is back and the
    // stream is over, two requests fit
    drop(held);
    drop(bob);
    clock.advance(Duration::from_secs(60));
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
    assert_eq!(send(&app, get_as("ada", "/")).await.status, StatusCode::OK);
}

/// A route priced 0 up front (a health check, `cost_fn`) is exempt from
/// every limit: a user holding all its slots still reaches it, and it takes
/// none (it was refused 429 for want of a slot, and held one while it ran).
#[tokio::test]
async fn a_route_priced_0_is_reached_with_every_slot_taken_and_takes_none() {
    let tiers = tiers(Quota::per_minute(20), 2);
    let app = routes().layer(
        TierLimitLayer::new(tiers)
            .identifier_fn(header_identity)
            .cost_fn(|parts| (parts.uri.path() == "/").then_some(0)),
    );
    let held = [open(&app, "ada").await, open(&app, "ada").await];
    assert!(held.iter().all(|r| r.status() == StatusCode::OK));
    assert_eq!(open(&app, "ada").await.status(), StatusCode::TOO_MANY_REQUESTS);
    // the health check passes, and a held one holds no slot
    let health = app.clone().oneshot(get_as("ada", "/")).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    drop(held);
    let streams = [open(&app, "ada").await, open(&app, "ada").await];
    assert!(streams.iter().all(|r| r.status() == StatusCode::OK));
    drop(health);
}

/// A price learned at 0 is not final: a route whose declaration of 5 runs
/// only on some requests (behind a layer that answers the others itself)
/// is learned at 0 from one that skipped it, and the requests that pay 5
/// each hold their slot.
#[tokio::test]
async fn a_request_priced_by_a_route_learned_at_0_holds_its_slot() {
    async fn cache(
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        if request.uri().query() == Some("cached") {
            return axum::response::Response::new(Body::from("cached"));
        }
        next.run(request).await
    }
    let route = get(|| async { Body::new(Endless::default()) })
        .layer(tower_rate_tier::tier_cost(5))
        .layer::<_, std::convert::Infallible>(axum::middleware::from_fn(cache))
        .layer(tower_rate_tier::tier_cost(0));
    let app = Router::new()
        .route("/stream", route)
        .layer(TierLimitLayer::new(tiers(Quota::per_minute(100), 1)).identifier_fn(header_identity));
    // learned at 0: the declaration of 5 did not run
    assert_eq!(
        send(&app, get_as("ada", "/stream?cached")).await.status,
        StatusCode::OK
    );
    let first = open(&app, "ada").await;
    assert_eq!(first.status(), StatusCode::OK);
    let second = open(&app, "ada").await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    drop((first, second));
}
