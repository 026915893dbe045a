//! The deny cache around in-process storages, whose clocks the tests set.

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::*;
use crate::clock::FakeClock;
use crate::storage::{Amounts, MemoryStorage};

mod bad_answers;

/// A storage deciding on a clock of its own (a Redis server's, say),
/// whatever clock the limiter passes; counts the decisions it makes.
#[derive(Debug, Clone)]
struct Remote {
    memory: MemoryStorage,
    clock: Arc<dyn Clock>,
    calls: Arc<AtomicUsize>,
}

impl Remote {
    fn new(clock: &FakeClock) -> Self {
        Remote {
            memory: MemoryStorage::new(),
            clock: Arc::new(clock.clone()),
            calls: Arc::default(),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Storage for Remote {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, _: &Arc<dyn Clock>) -> Decide {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.memory.decide(key, bands, op, &self.clock)
    }
}

const KEY: StorageKey<'static> = StorageKey {
    namespace: "",
    tier: "t",
    user: "u",
};

fn decide<S: Storage>(storage: &S, bands: &[Quota], op: Op, clock: &FakeClock) -> Decision {
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    storage
        .decide(KEY, bands, op, &clock)
        .into_ready()
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no ready decision"))
}

/// The remote's own answer now, without the cache (a charge that is denied
/// changes nothing).
fn truth(remote: &Remote, bands: &[Quota], cost: u32) -> Decision {
    let clock = FakeClock::at(Duration::from_nanos(remote.clock.now()));
    decide(&remote.memory, bands, Op::Charge(cost), &clock)
}

#[test]
fn a_repeated_denial_is_answered_here_exactly_as_the_storage_would_whatever_the_skew() {
    // the limiter's clock runs an hour ahead of the storage's
    let theirs = FakeClock::new();
    let ours = FakeClock::at(Duration::from_secs(FakeClock::START_UNIX_SECS + 3_600));
    let remote = Remote::new(&theirs);
    let cache = DenyCache::new(remote.clone());
    let bands = [Quota::per_second(2), Quota::per_minute(100)];
    for _ in 0..2 {
        assert!(decide(&cache, &bands, Op::Charge(1), &ours).allowed);
    }
    let first = decide(&cache, &bands, Op::Charge(1), &ours);
    assert!(!first.allowed);
    assert_eq!(
        (first.source, remote.calls(), cache.len()),
        (DecisionSource::Storage, 3, 1)
    );
    for step in [0, 120, 200, 130] {
        ours.advance(Duration::from_millis(step));
        theirs.advance(Duration::from_millis(step));
        let cached = decide(&cache, &bands, Op::Charge(1), &ours);
        assert_eq!(cached.source, DecisionSource::DenyCache);
        assert_eq!(remote.calls(), 3, "no call for a cached denial");
        // the storage's own answer at that instant: same states, same time
        assert_eq!(
            cached,
            truth(&remote, &bands, 1).with_source(DecisionSource::DenyCache)
        );
    }
    // 450 ms on: the first band is full enough again for one (refills at
    // 500 ms per unit); the cache lets the request through to the storage
    ours.advance(Duration::from_millis(50));
    theirs.advance(Duration::from_millis(50));
    let admitted = decide(&cache, &bands, Op::Charge(1), &ours);
    assert!(admitted.allowed);
    assert_eq!((admitted.source, remote.calls()), (DecisionSource::Storage, 4));
}

#[test]
fn a_costly_denial_never_denies_a_cheaper_request_the_storage_admits() {
    let clock = FakeClock::new();
    let remote = Remote::new(&clock);
    let cache = DenyCache::new(remote.clone());
    let bands = [Quota::per_minute(50)];
    assert!(decide(&cache, &bands, Op::Charge(20), &clock).allowed);
    let denied = decide(&cache, &bands, Op::Charge(40), &clock);
    assert!(!denied.allowed);
    assert_eq!(denied.bands[0].remaining, 30);
    // cost 1: the storage decides (and admits)
    let cheap = decide(&cache, &bands, Op::Charge(1), &clock);
    assert!(cheap.allowed && cheap.source == DecisionSource::Storage);
    // cost 40 again: denied here, with the state after the cheap one
    let again = decide(&cache, &bands, Op::Charge(40), &clock);
    assert_eq!(again.source, DecisionSource::DenyCache);
    assert_eq!(
        again,
        truth(&remote, &bands, 40).with_source(DecisionSource::DenyCache)
    );
    assert_eq!(again.bands[0].remaining, 29);
    // a peek is never denied
    assert!(decide(&cache, &bands, Op::Charge(0), &clock).allowed);
}

#[test]
fn a_refund_here_drops_the_entry_and_one_elsewhere_waits_for_expiry() {
    let clock = FakeClock::new();
    let remote = Remote::new(&clock);
    let cache = DenyCache::new(remote.clone());
    let bands = [Quota::per_minute(3)];
    for _ in 0..3 {
        decide(&cache, &bands, Op::Charge(1), &clock);
    }
    assert!(!decide(&cache, &bands, Op::Charge(1), &clock).allowed);
    // a refund made directly on the storage (another instance) is not seen
    decide(&remote.memory, &bands, Op::Refund(1), &clock);
    let stale = decide(&cache, &bands, Op::Charge(1), &clock);
    assert_eq!((stale.allowed, stale.source), (false, DecisionSource::DenyCache));
    // a refund through the cache is
    decide(&cache, &bands, Op::Refund(1), &clock);
    assert!(cache.is_empty());
    let after = decide(&cache, &bands, Op::Charge(1), &clock);
    assert!(after.allowed && after.source == DecisionSource::Storage);
}

#[test]
fn entries_expire_and_the_cache_stays_within_its_capacity() {
    let clock = FakeClock::new();
    let remote = Remote::new(&clock);
    let cache = DenyCache::with_capacity(remote.clone(), 10);
    let bands = [Quota::per_second(1)];
    let clock_dyn: Arc<dyn Clock> = Arc::new(clock.clone());
    let deny = |user: &str| {
        let key = StorageKey { user, ..KEY };
        for _ in 0..2 {
            let _ = cache.decide(key, &bands, Op::Charge(1), &clock_dyn).into_ready();
        }
    };
    for i in 0..25 {
        deny(&format!("user-{i}"));
    }
    assert_eq!(cache.len(), 10, "the first ten denied keys, no more");
    // a second on, every entry has expired: the next denial sweeps them out
    clock.advance(Duration::from_secs(1));
    deny("late");
    assert_eq!(cache.len(), 1);
}

#[test]
fn a_changed_tier_ignores_the_entry_and_fallback_decisions_are_never_kept() {
    let clock = FakeClock::new();
    let remote = Remote::new(&clock);
    let cache = DenyCache::new(remote.clone());
    let bands = [Quota::per_minute(1)];
    decide(&cache, &bands, Op::Charge(1), &clock);
    assert!(!decide(&cache, &bands, Op::Charge(1), &clock).allowed);
    // another window: another band, the storage decides
    let hourly = [Quota::per_hour(1)];
    assert!(decide(&cache, &hourly, Op::Charge(1), &clock).source == DecisionSource::Storage);
    let table = DenyTable::new(10);
    let fallback = Decision::new(
        false,
        0,
        [crate::gcra::BandState::default()].into_iter().collect(),
    )
    .with_source(DecisionSource::Fallback);
    let seen = table.refunds.seen(&encode(KEY));
    table.record(encode(KEY), &bands, 0, &fallback, seen);
    assert_eq!(table.len(), 0);
}

const AT: ScopeKey<'static> = ScopeKey {
    namespace: "",
    tier: "t",
};

/// A decision of the user of `KEY` in a tier prepared for `AT`.
fn decide_in(scope: &Arc<dyn TierScope>, bands: &[Quota], op: Op, clock: &FakeClock) -> Decision {
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    scope
        .decide(KEY.user, bands, op, &clock)
        .into_ready()
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no ready decision"))
}

#[test]
fn a_prepared_tier_names_its_keys_as_decisions_by_name_do() {
    for (namespace, tier) in [("", "t"), ("api", "pro"), ("n", &*"x".repeat(300))] {
        let at = ScopeKey { namespace, tier };
        let mut name = tier_prefix(at);
        name.extend_from_slice(b"ada");
        assert_eq!(name, encode(at.user("ada")));
    }
}

#[test]
fn a_prepared_tier_decides_as_the_cache_does_by_name() {
    let clock = FakeClock::new();
    let by_name = DenyCache::new(MemoryStorage::new());
    let prepared = DenyCache::new(MemoryStorage::new());
    let scope = prepared.prepare(AT).expect("the cache prepares every tier");
    let bands = [Quota::per_second(2), Quota::per_minute(100)];
    let mut answers = Vec::new();
    for (op, step) in [
        (Op::Charge(1), 0),
        (Op::Charge(1), 0),
        (Op::Charge(1), 0),
        (Op::Charge(1), 120),
        (Op::Charge(2), 200),
        (Op::Charge(1), 180),
        (Op::Charge(2), 0),
        (Op::Charge(0), 10),
        (Op::Refund(1), 0),
        (Op::Charge(1), 0),
        (Op::Charge(1), 0),
        (Op::Charge(1), 0),
    ] {
        clock.advance(Duration::from_millis(step));
        let expected = decide(&by_name, &bands, op, &clock);
        assert_eq!(decide_in(&scope, &bands, op, &clock), expected, "{op:?}");
        assert_eq!(prepared.len(), by_name.len());
        answers.push((expected.allowed, expected.source));
    }
    use DecisionSource::{DenyCache as Cached, Storage as Stored};
    // admitted, denied by the storage, then from the cache until a band has
    // room; a refund drops the entry
    let (yes, no) = (true, false);
    assert_eq!(
        answers,
        [
            (yes, Stored),
            (yes, Stored),
            (no, Stored),
            (no, Cached),
            (no, Cached),
            (yes, Stored),
            (no, Cached),
            (yes, Stored),
            (yes, Stored),
            (yes, Stored),
            (no, Stored),
            (no, Cached)
        ]
    );
}

#[test]
fn a_tier_prepared_over_a_storage_that_prepares_none_shares_the_cache_with_decisions_by_name() {
    let clock = FakeClock::new();
    let remote = Remote::new(&clock);
    let cache = DenyCache::new(remote.clone());
    let scope = cache.prepare(AT).expect("the cache prepares every tier");
    let bands = [Quota::per_minute(1)];
    assert!(decide_in(&scope, &bands, Op::Charge(1), &clock).allowed);
    let denied = decide_in(&scope, &bands, Op::Charge(1), &clock);
    assert_eq!((denied.allowed, denied.source), (false, DecisionSource::Storage));
    assert_eq!((remote.calls(), cache.len()), (2, 1));
    // by name: the entry the prepared tier made answers
    let cached = decide(&cache, &bands, Op::Charge(1), &clock);
    assert_eq!(cached.source, DecisionSource::DenyCache);
    assert_eq!(cached, decide_in(&scope, &bands, Op::Charge(1), &clock));
    assert_eq!(remote.calls(), 2);
    // a refund by name drops the entry the prepared tier reads
    decide(&cache, &bands, Op::Refund(1), &clock);
    assert!(cache.is_empty());
    let after = decide_in(&scope, &bands, Op::Charge(1), &clock);
    assert_eq!((after.allowed, after.source), (true, DecisionSource::Storage));
    assert_eq!(remote.calls(), 4);
}

use proptest::prelude::*;

/// Requests, tokens (in debt up to the case's bound), a daily cap.
const EACH_BANDS: [Quota; 3] = [Quota::per_second(3), Quota::per_second(20), Quota::per_hour(100)];

fn each_op(debt: u32) -> impl proptest::strategy::Strategy<Value = Op> {
    let amount = prop_oneof![
        3 => (0..4u32).prop_map(crate::storage::Amount::Charge),
        3 => Just(crate::storage::Amount::Require),
        2 => (0..40u32).prop_map(crate::storage::Amount::Force),
        1 => (0..10u32).prop_map(crate::storage::Amount::Refund),
    ];
    (amount.clone(), amount.clone(), amount).prop_map(move |(a, b, c)| {
        Op::Each(crate::storage::Amounts::new().with(a).with_debt(b, debt).with(c))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..Default::default() })]

    /// Amounts per band through the cache answer exactly as the storage
    /// alone: a cached denial only where the storage denies (a requirement
    /// on a band in debt, a charge that does not fit), with its states.
    #[test]
    fn the_cache_never_denies_an_each_the_storage_would_admit(
        steps in (0..30u32).prop_flat_map(|debt| proptest::collection::vec(
            (prop_oneof![Just(0u64), 0..400_000_000u64], each_op(debt)),
            1..60,
        ))
    ) {
        let clock = FakeClock::new();
        let cache = DenyCache::new(MemoryStorage::new());
        let alone = MemoryStorage::new();
        for (advance, op) in &steps {
            clock.advance(Duration::from_nanos(*advance));
            let got = decide(&cache, &EACH_BANDS, *op, &clock);
            let want = decide(&alone, &EACH_BANDS, *op, &clock);
            prop_assert_eq!((got.allowed, &got.bands), (want.allowed, &want.bands), "{:?}", op);
        }
    }
}

#[test]
fn a_band_in_debt_is_a_cached_denial_for_a_requirement_only() {
    use crate::storage::{Amount, Amounts};
    let clock = FakeClock::new();
    let remote = Remote::new(&clock);
    let cache = DenyCache::new(remote.clone());
    let bands = [Quota::per_second(10), Quota::per_second(10)];
    let force = Op::Each(
        Amounts::new()
            .with(Amount::Charge(0))
            .with_debt(Amount::Force(15), 10),
    );
    let admit = Op::Each(
        Amounts::new()
            .with(Amount::Charge(1))
            .with_debt(Amount::Require, 10),
    );
    let peek = Op::Each(
        Amounts::new()
            .with(Amount::Charge(0))
            .with_debt(Amount::Charge(0), 10),
    );
    assert!(decide(&cache, &bands, force, &clock).allowed);
    let first = decide(&cache, &bands, admit, &clock);
    assert!(!first.allowed);
    assert_eq!(first.source, DecisionSource::Storage);
    let calls = remote.calls();
    // the same requirement is denied here, as the storage denied it
    let cached = decide(&cache, &bands, admit, &clock);
    assert_eq!(
        (cached.source, cached.bands.clone()),
        (DecisionSource::DenyCache, first.bands)
    );
    assert_eq!(remote.calls(), calls);
    // a peek, a force and a refund reach the storage
    for op in [peek, force] {
        assert_eq!(decide(&cache, &bands, op, &clock).source, DecisionSource::Storage);
    }
    let refund = Op::Each(
        Amounts::new()
            .with(Amount::Charge(0))
            .with_debt(Amount::Refund(40), 10),
    );
    assert!(decide(&cache, &bands, refund, &clock).allowed);
    assert_eq!(remote.calls(), calls + 3);
    // the refund forgot the key: the requirement holds again
    assert_eq!(cache.len(), 0);
    assert!(decide(&cache, &bands, admit, &clock).allowed);
}

/// An `Op::Each` without one amount per band is the storage's error to
/// give, even for a key the cache holds a denial of.
#[test]
fn a_decision_without_an_amount_per_band_reaches_the_storage() {
    let clock = FakeClock::new();
    let cache = DenyCache::new(MemoryStorage::new());
    let bands = [Quota::per_second(1), Quota::per_second(10)];
    let charge = Op::Each(Amounts::new().with(Amount::Charge(1)).with(Amount::Charge(1)));
    assert!(decide(&cache, &bands, charge, &clock).allowed);
    assert!(!decide(&cache, &bands, charge, &clock).allowed);
    let short = Op::Each(Amounts::new().with(Amount::Charge(1)));
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let answer = cache.decide(KEY, &bands, short, &dyn_clock).into_ready();
    assert!(
        matches!(answer, Ok(Err(_))),
        "the cache answered {answer:?} for the storage"
    );
}

/// A storage that decides at once but answers only when released, in any
/// order: a remote storage whose replies arrive late.
#[derive(Debug, Clone, Default)]
struct Late {
    memory: MemoryStorage,
    held: Arc<std::sync::Mutex<Vec<tokio::sync::oneshot::Sender<()>>>>,
}

impl Storage for Late {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let decided = self.memory.decide(key, bands, op, clock).into_ready().ok();
        let (release, released) = tokio::sync::oneshot::channel();
        self.held.lock().unwrap().push(release);
        Decide::pending(async move {
            let _ = released.await;
            decided.unwrap_or_else(|| {
                Err(crate::storage::StorageError::new(
                    crate::storage::StorageErrorKind::Other,
                    "not ready",
                ))
            })
        })
    }
}

/// A denial decided before a refund and answered after it is not kept:
/// the key is the storage's to decide next. Once no refund is in flight,
/// denials are kept again.
#[tokio::test]
async fn a_denial_answered_after_a_refund_is_not_kept() {
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
    let late = Late::default();
    let cache = DenyCache::new(late.clone());
    let bands = [Quota::per_minute(2)];
    let release = |i: usize| {
        let (spare, _) = tokio::sync::oneshot::channel();
        let sender = std::mem::replace(&mut late.held.lock().unwrap()[i], spare);
        let _ = sender.send(());
    };
    let answer = |op: Op, i: usize| {
        let decided = cache.decide(KEY, &bands, op, &clock);
        release(i);
        decided
    };
    for i in 0..2 {
        assert!(answer(Op::Charge(1), i).await.unwrap().allowed);
    }
    // a denial decided, then a refund decided and answered, then the denial
    // answered
    let denial = cache.decide(KEY, &bands, Op::Charge(1), &clock);
    assert!(answer(Op::Refund(2), 3).await.unwrap().allowed);
    release(2);
    assert!(!denial.await.unwrap().allowed);
    assert_eq!(cache.len(), 0, "the denial from before the refund was kept");
    // the storage decides the next request (admitted), and a denial with no
    // refund in flight is kept again
    assert!(answer(Op::Charge(2), 4).await.unwrap().allowed);
    assert!(!answer(Op::Charge(1), 5).await.unwrap().allowed);
    assert_eq!(cache.len(), 1);
    let cached = cache.decide(KEY, &bands, Op::Charge(1), &clock).into_ready();
    assert!(matches!(cached, Ok(Ok(d)) if d.source == DecisionSource::DenyCache));
}
