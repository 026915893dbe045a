//! Tiers prepared in a fallback (and in a deny cache inside it) decide as
//! the same storages do by name: cached denials, local answers, probes and
//! the return to the primary, and users' state across `set_tier`.

use super::*;
use crate::RateTier;
use crate::storage::{DenyCache, MAX_BANDS, ScopeKey, TierScope};

/// A primary in memory that prepares its tiers; it fails while `down` and
/// answers through a future when `later`. Counts the decisions it gets by
/// name and in prepared tiers.
#[derive(Debug, Clone, Default)]
struct Breakable {
    memory: MemoryStorage,
    state: Arc<Switches>,
}

#[derive(Debug, Default)]
struct Switches {
    down: AtomicBool,
    later: AtomicBool,
    by_name: AtomicUsize,
    prepared: AtomicUsize,
}

impl Switches {
    /// What `decide` answers, or a failure while down; through a future
    /// when `later`.
    fn answer(&self, decide: impl FnOnce() -> Decide) -> Decide {
        let answer = if self.down.load(Ordering::SeqCst) {
            Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")))
        } else {
            decide()
        };
        if self.later.load(Ordering::SeqCst) {
            Decide::pending(answer)
        } else {
            answer
        }
    }

    fn calls(&self) -> usize {
        self.by_name.load(Ordering::SeqCst) + self.prepared.load(Ordering::SeqCst)
    }
}

impl Storage for Breakable {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.state.by_name.fetch_add(1, Ordering::SeqCst);
        self.state.answer(|| self.memory.decide(key, bands, op, clock))
    }

    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        Some(Arc::new(BreakableScope {
            memory: self.memory.prepare(at)?,
            state: self.state.clone(),
        }))
    }
}

#[derive(Debug)]
struct BreakableScope {
    memory: Arc<dyn TierScope>,
    state: Arc<Switches>,
}

impl TierScope for BreakableScope {
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.state.prepared.fetch_add(1, Ordering::SeqCst);
        self.state.answer(|| self.memory.decide(user, bands, op, clock))
    }
}

/// A storage decided by name only: it prepares nothing (as the Redis
/// storage, or a custom wrapper).
#[derive(Debug)]
struct ByNameOnly<S>(S);

impl<S: Storage> Storage for ByNameOnly<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.0.decide(key, bands, op, clock)
    }
}

/// How the storage under test is put together around its primary.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// `Fallback<DenyCache<_>>` around a primary that prepares.
    CachedPrepared,
    /// `Fallback<DenyCache<_>>` around a primary that prepares nothing.
    CachedByName,
    /// `Fallback<_>` around a primary that prepares nothing (the Redis
    /// storage's shape).
    ByName,
}

/// The storage of `shape` around `primary`: a share of 1/2, a switch after
/// two failures, a probe every second.
fn storage(shape: Shape, primary: &Breakable) -> Arc<dyn Storage> {
    fn around<S: Storage>(primary: S) -> Arc<dyn Storage> {
        let fallback = Fallback::builder(primary)
            .instances(2)
            .failures_to_switch(2)
            .probe_interval(Duration::from_secs(1))
            .build();
        Arc::new(fallback)
    }
    match shape {
        Shape::CachedPrepared => around(DenyCache::new(primary.clone())),
        Shape::CachedByName => around(DenyCache::new(ByNameOnly(primary.clone()))),
        Shape::ByName => around(ByNameOnly(primary.clone())),
    }
}

/// The same storage twice, each with its own primary: the limiter of one
/// prepares its tiers, the other's decides by name only.
struct Pair {
    prepared: (Breakable, RateTier),
    by_name: (Breakable, RateTier),
}

impl Pair {
    fn new(shape: Shape, later: bool, clock: &FakeClock) -> Self {
        let limiter = |prepared: bool| {
            let primary = Breakable::default();
            primary.state.later.store(later, Ordering::SeqCst);
            let storage = storage(shape, &primary);
            let builder = RateTier::builder()
                .tier("free", Quota::per_minute(4))
                .clock(clock.clone());
            let tiers = match prepared {
                true => builder.storage(storage),
                false => builder.storage(ByNameOnly(storage)),
            };
            (primary, tiers.build())
        };
        Pair {
            prepared: limiter(true),
            by_name: limiter(false),
        }
    }

    /// Checks one unit for `user` in both: the same answer, whose
    /// admission and source it returns. Then lets the probes sent run.
    async fn check(&self, user: &str) -> (bool, DecisionSource) {
        let prepared = self.prepared.1.check(user, "free", 1).await.expect("decided");
        let by_name = self.by_name.1.check(user, "free", 1).await.expect("decided");
        assert_eq!(prepared, by_name, "{user}");
        tokio::task::yield_now().await;
        match prepared {
            Ok(info) => (true, info.source()),
            Err(limited) => (false, limited.source()),
        }
    }

    fn set_down(&self, down: bool) {
        for (primary, _) in [&self.prepared, &self.by_name] {
            primary.state.down.store(down, Ordering::SeqCst);
        }
    }

    fn set_tier_again(&self) {
        for (_, tiers) in [&self.prepared, &self.by_name] {
            tiers.set_tier("free", Quota::per_minute(4)).unwrap();
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_prepared_tier_decides_as_the_same_storage_by_name() {
    use DecisionSource::{DenyCache as Cached, Fallback as Local, Storage as Primary};
    let (yes, no) = (true, false);
    for shape in [Shape::CachedPrepared, Shape::CachedByName, Shape::ByName] {
        for later in [false, true] {
            let clock = FakeClock::new();
            let pair = Pair::new(shape, later, &clock);
            let cached = if shape == Shape::ByName { Primary } else { Cached };
            // "ada" spends the tier in the primary; her next denial comes
            // from the cache
            for _ in 0..4 {
                assert_eq!(pair.check("ada").await, (yes, Primary));
            }
            assert_eq!(pair.check("ada").await, (no, Primary));
            assert_eq!(pair.check("ada").await, (no, cached));
            // the primary goes down: two failures answered locally, then
            // local answers without asking it, with half the burst
            pair.set_down(true);
            for _ in 0..2 {
                assert_eq!(pair.check("bob").await, (yes, Local));
            }
            assert_eq!(pair.check("bob").await, (no, Local));
            let calls = pair.prepared.0.state.calls();
            // the tier set again: its local state is kept
            pair.set_tier_again();
            assert_eq!(pair.check("bob").await, (no, Local));
            assert_eq!(pair.check("ada").await, (yes, Local));
            assert_eq!(pair.prepared.0.state.calls(), calls, "no call while local");
            // back: a probe a second on (answered locally), then the trial
            // brings the primary back
            pair.set_down(false);
            clock.advance(Duration::from_secs(1));
            assert_eq!(pair.check("cy").await, (yes, Local));
            assert_eq!(pair.check("cy").await, (yes, Primary));
            // the primary's state of "ada", and her cached denial, kept
            // across a change of the tier
            pair.set_tier_again();
            assert_eq!(pair.check("ada").await, (no, cached));
            // one unit back 15 s on, and no more (an admission refreshes
            // the cache's entry, which denies the next)
            clock.advance(Duration::from_secs(15));
            assert_eq!(pair.check("ada").await, (yes, Primary));
            assert_eq!(pair.check("ada").await, (no, cached));
            // both primaries asked alike; a primary that prepares is asked
            // in its prepared tier only
            let (prepared, by_name) = (&pair.prepared.0.state, &pair.by_name.0.state);
            assert_eq!(prepared.calls(), by_name.calls(), "{shape:?}");
            assert_eq!(by_name.prepared.load(Ordering::SeqCst), 0);
            if shape == Shape::CachedPrepared {
                assert_eq!(prepared.by_name.load(Ordering::SeqCst), 0);
            }
        }
    }
}

#[test]
fn a_tier_prepared_in_a_fallback_shares_its_outage_with_decisions_by_name() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let storage = Fallback::builder(primary.clone())
        .instances(4)
        .failures_to_switch(2)
        .build();
    let scope = storage
        .prepare(ScopeKey {
            namespace: "",
            tier: "t",
        })
        .expect("a fallback prepares every tier");
    let bands = [Quota::per_minute(40)];
    let clock_dyn: Arc<dyn Clock> = Arc::new(clock.clone());
    let prepared = |user: &str| match scope.decide(user, &bands, Op::Charge(1), &clock_dyn).into_ready() {
        Ok(result) => result.unwrap(),
        Err(_) => panic!("not ready"),
    };
    primary.fail(&[""]);
    // one failure by name, one in the prepared tier: the switch
    assert_eq!(
        decide(&storage, "ada", &bands, 1, &clock).unwrap().source,
        DecisionSource::Fallback
    );
    assert!(!storage.is_local());
    assert_eq!(prepared("ada").source, DecisionSource::Fallback);
    assert!(storage.is_local());
    // one local state of "ada" (a share of 10): 2 spent, 8 left either way
    for _ in 0..4 {
        assert!(prepared("ada").allowed);
        assert!(decide(&storage, "ada", &bands, 1, &clock).unwrap().allowed);
    }
    let (spent_here, spent_by_name) = (
        prepared("ada"),
        decide(&storage, "ada", &bands, 1, &clock).unwrap(),
    );
    assert!(!spent_here.allowed && !spent_by_name.allowed);
    assert_eq!(
        spent_here.bands[0].retry_after_ns,
        spent_by_name.bands[0].retry_after_ns
    );
    assert_eq!(primary.calls(), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn too_many_bands_answered_locally_are_an_error_whenever_the_primary_fails() {
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
    let bands = [Quota::per_minute(40); MAX_BANDS + 1];
    for later in [false, true] {
        let primary = Breakable::default();
        primary.state.down.store(true, Ordering::SeqCst);
        primary.state.later.store(later, Ordering::SeqCst);
        let storage = Fallback::builder(primary).build();
        let key = StorageKey {
            namespace: "",
            tier: "t",
            user: "ada",
        };
        let failed = storage.decide(key, &bands, Op::Charge(1), &clock).await;
        assert_eq!(
            failed.unwrap_err().kind(),
            StorageErrorKind::Other,
            "later: {later}"
        );
    }
}
