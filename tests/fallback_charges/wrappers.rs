//! A fallback behind other wrappers: the crate's `MeteredStorage` and
//! `DenyCache`, and a user's pass-through wrapper written as the storage
//! docs show (by name, and preparing its tiers). Each gives a refund back
//! where its charge was made and a slot back to both limiters, as the
//! fallback alone does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::metrics::MeteredStorage;
use tower_rate_tier::storage::{
    Decide, DecisionSource, DenyCache, Fallback, Op, ScopeKey, Slots, Storage, StorageKey, TierScope,
};
use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
use tower_rate_tier_tests::flaky::Flaky;
use tower_rate_tier_tests::reply::header_identity;

/// The storage docs' wrapper: counts decisions, passes `decide` and
/// `refund` on, prepares nothing.
#[derive(Debug, Clone)]
struct Counting<S> {
    inner: S,
    decisions: Arc<AtomicU64>,
}

impl<S: Storage> Storage for Counting<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.decisions.fetch_add(1, Ordering::Relaxed);
        self.inner.decide(key, bands, op, clock)
    }

    fn refund(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        self.decisions.fetch_add(1, Ordering::Relaxed);
        self.inner.refund(key, bands, op, decided_by, clock)
    }
}

fn counting<S>(inner: S) -> Counting<S> {
    Counting {
        inner,
        decisions: Arc::default(),
    }
}

/// A wrapper that prepares the tiers of the storage it wraps; its scope
/// passes `decide` and `refund` on, and leaves `release` to its default.
#[derive(Debug)]
struct Preparing<S>(S);

#[derive(Debug)]
struct PreparingScope(Arc<dyn TierScope>);

impl TierScope for PreparingScope {
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.0.decide(user, bands, op, clock)
    }

    fn refund(
        &self,
        user: &str,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        self.0.refund(user, bands, op, decided_by, clock)
    }
}

impl<S: Storage> Storage for Preparing<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.0.decide(key, bands, op, clock)
    }

    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        Some(Arc::new(PreparingScope(self.0.prepare(at)?)))
    }
}

/// A quota of 4 a minute, spent in the primary; one request answered by
/// the fallback's local limiter while the primary fails; the primary back
/// (and denying); the outage's request given back where it was decided.
/// Whether the primary then admits: it never charged that request.
async fn primary_admits_after_a_local_refund<S: Storage>(wrap: impl FnOnce(Fallback<Flaky>) -> S) -> bool {
    let flaky = Flaky::default();
    let down = flaky.down.clone();
    let storage = wrap(Fallback::builder(flaky).instances(1).build());
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(4))
        .clock(FakeClock::new())
        .storage(storage)
        .build();
    for _ in 0..4 {
        let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
        assert_eq!(info.source(), DecisionSource::Storage);
    }
    down.store(true, Ordering::SeqCst);
    let local = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!(local.source(), DecisionSource::Fallback);
    down.store(false, Ordering::SeqCst);
    let denied = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(denied.source(), DecisionSource::Storage);
    tiers
        .refund_decided("ada", "free", 1, local.source())
        .await
        .unwrap();
    tiers.check("ada", "free", 1).await.unwrap().is_ok()
}

#[tokio::test]
async fn a_local_charge_refunded_through_any_wrapper_gives_the_primary_nothing() {
    assert!(
        !primary_admits_after_a_local_refund(|f| f).await,
        "the fallback alone"
    );
    assert!(
        !primary_admits_after_a_local_refund(DenyCache::new).await,
        "a deny cache"
    );
    let metered = |f| MeteredStorage::new(f, "redis");
    assert!(
        !primary_admits_after_a_local_refund(metered).await,
        "MeteredStorage"
    );
    assert!(
        !primary_admits_after_a_local_refund(counting).await,
        "a wrapper by name"
    );
    assert!(
        !primary_admits_after_a_local_refund(Preparing).await,
        "a preparing wrapper"
    );
    let both = |f| counting(MeteredStorage::new(DenyCache::new(f), "redis"));
    assert!(
        !primary_admits_after_a_local_refund(both).await,
        "wrappers stacked"
    );
}

/// A wrapper whose scope passes on `decide` alone (the one method a scope
/// must have).
#[derive(Debug)]
struct DecideOnly<S>(S);

#[derive(Debug)]
struct DecideOnlyScope(Arc<dyn TierScope>);

impl TierScope for DecideOnlyScope {
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.0.decide(user, bands, op, clock)
    }
}

impl<S: Storage> Storage for DecideOnly<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.0.decide(key, bands, op, clock)
    }

    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        Some(Arc::new(DecideOnlyScope(self.0.prepare(at)?)))
    }
}

/// ada holds her only slot, taken in the primary; the primary fails once
/// (bob is answered locally, the fallback switches) and is reachable again
/// before any probe; ada's request ends. Whether the primary still counts
/// her slot in use (it would refuse her for the lease's two minutes).
async fn slot_left_in_primary<S: Storage>(wrap: impl FnOnce(Fallback<Flaky>) -> S) -> bool {
    let primary = Flaky::default();
    let (down, in_primary) = (primary.down.clone(), primary.clone());
    let storage = wrap(
        Fallback::builder(primary)
            .instances(1)
            .failures_to_switch(1)
            .build(),
    );
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 1)
        .clock(clock.clone())
        .storage(storage)
        .build();
    let (gate, entered) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let (g, e) = (gate.clone(), entered.clone());
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let (g, e) = (g.clone(), e.clone());
                async move {
                    e.notify_one();
                    g.notified().await;
                    "done"
                }
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(header_identity));
    let slow = Request::get("/slow")
        .header("x-user", "ada")
        .body(Body::empty())
        .unwrap();
    let in_flight = tokio::spawn(app.clone().oneshot(slow));
    entered.notified().await;
    down.store(true, Ordering::SeqCst);
    let bob = Request::get("/")
        .header("x-user", "bob")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(bob).await.unwrap().status(), StatusCode::OK);
    down.store(false, Ordering::SeqCst);
    gate.notify_one();
    let response = in_flight.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    let clock: Arc<dyn Clock> = Arc::new(clock);
    let key = StorageKey {
        namespace: "",
        tier: "free",
        user: "ada",
    };
    let slots = Slots {
        limit: 1,
        lease: Duration::from_secs(120),
    };
    let taken = in_primary
        .decide(
            key,
            &[Quota::per_minute(100)],
            Op::Acquire { cost: 0, slots },
            &clock,
        )
        .await
        .unwrap();
    taken.slots.expect("the primary counts slots").refused
}

#[tokio::test]
async fn a_slot_released_through_any_wrapper_comes_back_in_the_primary() {
    assert!(!slot_left_in_primary(|f| f).await, "the fallback alone");
    let metered = |f| MeteredStorage::new(f, "redis");
    assert!(!slot_left_in_primary(metered).await, "MeteredStorage");
    assert!(!slot_left_in_primary(counting).await, "a wrapper by name");
    assert!(!slot_left_in_primary(Preparing).await, "a preparing wrapper");
    assert!(
        !slot_left_in_primary(DecideOnly).await,
        "a scope passing on decide alone"
    );
    let cached = |f| DenyCache::new(counting(f));
    assert!(
        !slot_left_in_primary(cached).await,
        "a deny cache around a wrapper by name"
    );
}
