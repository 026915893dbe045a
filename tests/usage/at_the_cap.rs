//! Reservations across the memory storage's key cap: what a reservation
//! did not use goes back where it was reserved, the tier's overflow bucket
//! (shared by the identities the storage had no room for) or the user's
//! own key, whichever holds the user's state when it is settled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use http::{Request, StatusCode};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::MemoryStorage;
use tower_rate_tier::{Quota, RateLimitEvent, RateTier, TierLimitLayer, TierRefusal, TierUsage};
use tower_rate_tier_tests::reply::{header_identity, send};

/// Reservations kept open by `/hold`, settled by the test (as a streamed
/// answer settles its reservation when it ends).
type Held = Arc<Mutex<Vec<TierUsage>>>;

/// The `n=` of a query.
fn n(uri: &http::Uri) -> u32 {
    let query = uri.query().unwrap_or("");
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("n="))
        .and_then(|n| n.parse().ok())
        .expect("a query n=N")
}

/// Reserves N tokens and keeps the handle.
async fn hold(
    State(held): State<Held>,
    usage: TierUsage,
    uri: http::Uri,
) -> Result<&'static str, TierRefusal> {
    usage.reserve("tokens", n(&uri)).await?;
    held.lock().unwrap().push(usage);
    Ok("held")
}

/// Reserves and records N tokens.
async fn spend(usage: TierUsage, uri: http::Uri) -> Result<&'static str, TierRefusal> {
    usage.reserve("tokens", n(&uri)).await?;
    usage.record("tokens", n(&uri));
    Ok("spent")
}

/// Reserves 1 token and records N (beyond the reservation: into debt).
async fn over(usage: TierUsage, uri: http::Uri) -> Result<&'static str, TierRefusal> {
    usage.reserve("tokens", 1).await?;
    usage.record("tokens", n(&uri));
    Ok("over")
}

/// A tier of 100 requests and 1,000 tokens a minute in a storage of one
/// key.
fn tiers() -> (FakeClock, MemoryStorage, RateTier) {
    let clock = FakeClock::new();
    let (storage, tiers) = tiers_on(clock.clone());
    (clock, storage, tiers)
}

/// [`tiers`], reading `clock`.
fn tiers_on(clock: impl tower_rate_tier::clock::Clock) -> (MemoryStorage, RateTier) {
    let storage = MemoryStorage::builder().max_keys(1).build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .storage(storage.clone())
        .clock(clock)
        .build();
    (storage, tiers)
}

/// [`tiers`] and an app whose handlers reserve tokens; the count of
/// forgiven usage.
fn setup() -> (FakeClock, MemoryStorage, Router, Held, Arc<AtomicU64>) {
    let (clock, storage, tiers) = tiers();
    let held = Held::default();
    let forgiven = Arc::new(AtomicU64::new(0));
    let counted = forgiven.clone();
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(header_identity)
        .on_event(move |event| {
            if let RateLimitEvent::UsageForgiven { .. } = event {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
    let app = Router::new()
        .route("/hold", get(hold))
        .route("/spend", get(spend))
        .route("/over", get(over))
        .with_state(held.clone())
        .layer(layer);
    (clock, storage, app, held, forgiven)
}

fn get_as(user: &str, uri: &str) -> Request<Body> {
    Request::get(uri)
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

/// Settles the oldest reservation kept open at `used` tokens.
fn settle_held(held: &Held, used: u32) {
    let usage = held.lock().unwrap().remove(0);
    usage.record("tokens", used);
}

/// x reserves 1,000 tokens in its own key and answers for over a minute
/// (its key expires and is swept meanwhile); then a flood fills the
/// storage and spends the shared bucket's tokens.
async fn outlive_then_flood(app: &Router, time: &FakeClock, storage: &MemoryStorage) {
    let status =
        |user: &'static str, uri: &'static str| async move { send(app, get_as(user, uri)).await.status };
    assert_eq!(status("x", "/hold?n=1000").await, StatusCode::OK);
    time.advance(Duration::from_secs(61));
    storage.sweep();
    assert_eq!(storage.len(), 0);
    assert_eq!(status("filler", "/spend?n=1").await, StatusCode::OK);
    assert_eq!(status("m1", "/spend?n=1000").await, StatusCode::OK);
    assert_eq!(
        status("m2", "/spend?n=999").await,
        StatusCode::TOO_MANY_REQUESTS,
        "the shared bucket is spent"
    );
}

#[tokio::test]
async fn an_overflow_reservation_is_not_given_back_to_the_users_own_key() {
    let (clock, storage, app, held, _) = setup();
    assert_eq!(
        send(&app, get_as("filler", "/spend?n=1")).await.status,
        StatusCode::OK
    );
    assert_eq!(storage.len(), 1, "the storage is full");
    // x has no key: its 1,000 tokens are reserved in the overflow bucket
    assert_eq!(
        send(&app, get_as("x", "/hold?n=1000")).await.status,
        StatusCode::OK
    );
    // the filler's key expires and is swept: room for x, which spends its
    // own key's whole burst
    clock.advance(Duration::from_secs(1));
    storage.sweep();
    assert_eq!(
        send(&app, get_as("x", "/spend?n=1000")).await.status,
        StatusCode::OK
    );
    assert_eq!(storage.len(), 1, "x has a key of its own");
    assert_eq!(
        send(&app, get_as("x", "/spend?n=1000")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // the answer that reserved in the overflow bucket ends having used none
    settle_held(&held, 0);
    assert_eq!(
        send(&app, get_as("x", "/spend?n=1000")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the overflow bucket's reservation was given back to x's own key"
    );
}

#[tokio::test]
async fn an_own_keys_reservation_is_not_given_back_to_the_overflow_bucket() {
    let (clock, storage, app, held, _) = setup();
    outlive_then_flood(&app, &clock, &storage).await;
    // x's answer ends having used nothing
    settle_held(&held, 0);
    assert_eq!(
        send(&app, get_as("m3", "/spend?n=999")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "x's own key's reservation was given to the flood's overflow bucket"
    );
}

#[tokio::test]
async fn usage_across_the_cap_stays_within_a_burst_and_one_burst_of_debt() {
    let (clock, storage, app, held, forgiven) = setup();
    assert_eq!(
        send(&app, get_as("filler", "/spend?n=1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, get_as("x", "/hold?n=1000")).await.status,
        StatusCode::OK
    );
    clock.advance(Duration::from_secs(1));
    storage.sweep();
    // from here on no time passes: x's own key may take its burst (1,000),
    // a second's refill (16) and one burst of debt (1,000)
    let mut used = 0;
    if send(&app, get_as("x", "/spend?n=1000")).await.status == StatusCode::OK {
        used += 1_000;
    }
    settle_held(&held, 0);
    for (uri, n) in [("/spend?n=999", 999), ("/over?n=1001", 1_001)] {
        if send(&app, get_as("x", uri)).await.status == StatusCode::OK {
            used += n;
        }
    }
    assert_eq!(forgiven.load(Ordering::Relaxed), 0);
    assert!(used <= 2_017, "x took {used} tokens recorded within one second");
}

/// A program's reservation decided in the overflow bucket (the storage was
/// full) and settled with `settle_decided` after the user got a key of its
/// own: the unused part goes back to the bucket, never to the key.
#[tokio::test]
async fn a_programs_overflow_reservation_is_settled_in_the_overflow_bucket() {
    let (clock, storage, tiers) = tiers();
    tiers.record("filler", "free", "tokens", 1).await.unwrap();
    let reserved = tiers
        .reserve("x", "free", "tokens", 1_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        reserved.source(),
        tower_rate_tier::storage::DecisionSource::Overflow
    );
    clock.advance(Duration::from_secs(1));
    storage.sweep();
    tiers.record("x", "free", "tokens", 1_000).await.unwrap();
    assert_eq!(storage.len(), 1, "x has a key of its own");
    tiers
        .settle_decided("x", "free", "tokens", 1_000, 0, reserved.source())
        .await
        .unwrap();
    let left = super::left(&tiers, "x", "tokens").await;
    assert!(left < 100, "x's own key got {left} back");
}

/// What another thread does between two steps of a decision.
type Hook = Box<dyn FnOnce() + Send>;

/// A clock that, once armed, runs a hook on its next reading: another
/// thread acting between two steps of a decision.
#[derive(Clone)]
struct HookClock {
    time: FakeClock,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl std::fmt::Debug for HookClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookClock")
    }
}

impl tower_rate_tier::clock::Clock for HookClock {
    fn now(&self) -> u64 {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        tower_rate_tier::clock::Clock::now(&self.time)
    }
}

/// x's own key's reservation outlives the key; when it is settled the
/// storage has room, and another identity takes the last key while the
/// refund decides: what x's key charged still goes nowhere, never to the
/// flood's overflow bucket.
#[tokio::test]
async fn an_own_keys_refund_racing_the_last_key_stays_out_of_the_overflow_bucket() {
    use tower_rate_tier::storage::{Op, Storage, StorageKey};
    let time = FakeClock::new();
    let clock = HookClock {
        time: time.clone(),
        hook: Arc::default(),
    };
    let (storage, tiers) = tiers_on(clock.clone());
    let held = Held::default();
    let app = Router::new()
        .route("/hold", get(hold))
        .route("/spend", get(spend))
        .with_state(held.clone())
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    outlive_then_flood(&app, &time, &storage).await;
    // the filler's key expires and is swept: room for one key
    time.advance(Duration::from_secs(1));
    storage.sweep();
    assert_eq!(storage.len(), 0);
    // another identity takes the last key while x's settlement decides
    let (filling, fake) = (storage.clone(), time.clone());
    *clock.hook.lock().unwrap() = Some(Box::new(move || {
        let by: Arc<dyn tower_rate_tier::clock::Clock> = Arc::new(fake);
        let key = StorageKey {
            namespace: "",
            tier: "other",
            user: "newcomer",
        };
        let decided = filling
            .decide(key, &[Quota::per_minute(10)], Op::Charge(1), &by)
            .into_ready();
        assert!(matches!(decided, Ok(Ok(_))));
    }));
    settle_held(&held, 0);
    assert!(clock.hook.lock().unwrap().is_none(), "the hook ran");
    assert_eq!(storage.len(), 1, "full again");
    assert_eq!(
        send(&app, get_as("m3", "/spend?n=999")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "x's own key's reservation was given to the flood's overflow bucket"
    );
}
