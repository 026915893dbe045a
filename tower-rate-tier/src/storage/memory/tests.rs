//! The memory storage's bounds and state keeping, decided by key.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::MemoryStorage;
use crate::clock::{Clock, FakeClock};
use crate::quota::Quota;
use crate::storage::{Decide, Decision, Op, Slots, Storage, StorageKey};

fn ready(decide: Decide) -> Decision {
    match decide.into_ready() {
        Ok(decided) => decided.expect("a decision"),
        Err(_) => panic!("the memory storage waited"),
    }
}

fn key(user: &str) -> StorageKey<'_> {
    StorageKey {
        namespace: "",
        tier: "t",
        user,
    }
}

/// At the key cap, a flood of distinct identities refused by the shared
/// overflow bucket leaves no slot set behind: a set a refusal leaves empty
/// goes, past the cap, as a release's does.
#[test]
fn refused_acquires_at_the_cap_leave_no_slot_sets() {
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
    let storage = MemoryStorage::builder().max_keys(10).build();
    let bands = [Quota::per_minute(5)];
    let op = Op::Acquire {
        cost: 1,
        slots: Slots {
            limit: 2,
            lease: Duration::from_secs(30),
        },
    };
    let mut admitted = 0;
    for i in 0..10_000 {
        let user = format!("user-{i}");
        let decision = ready(storage.decide(key(&user), &bands, op, &clock));
        if let Some(lease) = decision.slots.and_then(|s| s.lease) {
            admitted += 1;
            // the request ends: its slot is given back
            ready(storage.decide(key(&user), &bands, Op::Release(lease), &clock));
        }
    }
    let sets = storage.inner.slot_sets.load(Ordering::Relaxed);
    assert!(admitted < 100, "{admitted} admitted past the cap");
    assert!(
        sets <= 11,
        "{sets} slot sets kept for {} refused identities",
        10_000 - admitted
    );
}

/// A user whose one-band state is kept under its band's name (its window
/// differs from the one the tier's first map holds) finds it again once
/// that map has emptied and another window claimed it.
#[test]
fn a_spent_user_stays_spent_when_another_window_claims_the_first_map() {
    let fake = FakeClock::new();
    let clock: Arc<dyn Clock> = Arc::new(fake.clone());
    let storage = MemoryStorage::new();
    let minute = [Quota::per_minute(1)];
    let day = [Quota::per_day(1)];
    assert!(ready(storage.decide(key("a"), &minute, Op::Charge(1), &clock)).allowed);
    assert!(ready(storage.decide(key("b"), &day, Op::Charge(1), &clock)).allowed);
    assert!(!ready(storage.decide(key("b"), &day, Op::Charge(1), &clock)).allowed);
    fake.advance(Duration::from_secs(120));
    storage.sweep();
    assert!(
        !ready(storage.decide(key("b"), &day, Op::Charge(1), &clock)).allowed,
        "b's daily quota was handed out again"
    );
    // a user new to the tier is kept in the map its window claimed
    assert!(ready(storage.decide(key("c"), &day, Op::Charge(1), &clock)).allowed);
    assert!(!ready(storage.decide(key("c"), &day, Op::Charge(1), &clock)).allowed);
}

/// Past the key cap, an acquire that fails (an operation the storage
/// refuses) removes the user's set when only passed leases were left in
/// it, as a release does.
#[test]
fn a_failed_acquire_past_the_cap_removes_a_set_of_passed_leases() {
    let fake = FakeClock::new();
    let clock: Arc<dyn Clock> = Arc::new(fake.clone());
    let storage = MemoryStorage::builder().max_keys(1).build();
    let bands = [Quota::per_minute(50), Quota::per_hour(500)];
    let slots = Slots {
        limit: 3,
        lease: Duration::from_secs(1),
    };
    let acquire = Op::Acquire { cost: 1, slots };
    for user in ["a", "b"] {
        assert!(ready(storage.decide(key(user), &bands, acquire, &clock)).allowed);
    }
    assert_eq!(storage.inner.slot_sets.load(Ordering::Relaxed), 2);
    fake.advance(Duration::from_secs(2));
    // one amount for two bands: refused by the storage
    let bad = Op::AcquireEach {
        amounts: crate::storage::Amounts::new().with(crate::storage::Amount::Charge(1)),
        slots,
    };
    let failed = storage.decide(key("a"), &bands, bad, &clock).into_ready();
    assert!(matches!(failed, Ok(Err(_))));
    assert_eq!(storage.inner.slot_sets.load(Ordering::Relaxed), 1);
}

/// A key whose one band lives in the scope's one-band map, then decided by
/// a set of other bands (an entry of several bands is made without it),
/// then by a set that has its band again: that band's state moves into the
/// entry, and the key is counted once.
#[test]
fn a_band_kept_in_the_one_band_map_joins_an_entry_made_without_it() {
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
    let storage = MemoryStorage::new();
    let second = [Quota::per_second(5)];
    ready(storage.decide(key("ada"), &second, Op::Charge(4), &clock));
    assert_eq!(storage.len(), 1);
    let other = [Quota::per_minute(7), Quota::per_day(40)];
    ready(storage.decide(key("ada"), &other, Op::Charge(1), &clock));
    assert_eq!(storage.len(), 2);
    let both = [Quota::per_second(5), Quota::per_hour(20)];
    let d = ready(storage.decide(key("ada"), &both, Op::Charge(0), &clock));
    assert_eq!(d.bands[0].remaining, 1);
    assert_eq!(storage.len(), 1);
    // the one-band map no longer holds it: the entry's state is the one
    // decided from now on
    let d = ready(storage.decide(key("ada"), &both, Op::Charge(1), &clock));
    assert_eq!(d.bands[0].remaining, 0);
    assert!(!ready(storage.decide(key("ada"), &second, Op::Charge(1), &clock)).allowed);
    // and the other set's bands were kept through it
    let d = ready(storage.decide(key("ada"), &other, Op::Charge(0), &clock));
    assert_eq!((d.bands[0].remaining, d.bands[1].remaining), (6, 39));
}

/// One key decided by two band sets in turn (a tier's bands, and a
/// contract's with another second band): each set's decision reads and
/// writes its own bands' times, by position while the key holds exactly
/// its bands, and never wipes the other set's state.
#[test]
fn two_band_sets_on_one_key_keep_each_others_state() {
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
    let storage = MemoryStorage::new();
    let tier = [Quota::per_second(100), Quota::per_minute(3)];
    let contract = [Quota::per_second(100), Quota::per_hour(2)];
    let remaining = |d: &Decision| d.bands.iter().map(|s| s.remaining).collect::<Vec<_>>();
    let d = ready(storage.decide(key("ada"), &tier, Op::Charge(1), &clock));
    assert_eq!(remaining(&d), [99, 2]);
    // the same layout again: written in place
    let d = ready(storage.decide(key("ada"), &tier, Op::Charge(1), &clock));
    assert_eq!(remaining(&d), [98, 1]);
    // the contract's set: the shared per-second band, and its own hour
    let d = ready(storage.decide(key("ada"), &contract, Op::Charge(1), &clock));
    assert_eq!(remaining(&d), [97, 1]);
    // back to the tier's set: its minute band kept through the other's
    let d = ready(storage.decide(key("ada"), &tier, Op::Charge(1), &clock));
    assert_eq!(remaining(&d), [96, 0]);
    let refused = ready(storage.decide(key("ada"), &tier, Op::Charge(1), &clock));
    assert!(!refused.allowed);
    assert_eq!(remaining(&refused), [96, 0]);
    // and the contract's hour band kept through the tier's
    let d = ready(storage.decide(key("ada"), &contract, Op::Charge(1), &clock));
    assert_eq!(remaining(&d), [95, 0]);
    assert!(!ready(storage.decide(key("ada"), &contract, Op::Charge(1), &clock)).allowed);
}

/// A clock moved by hand whose first reading on a thread named `gated`,
/// once armed, waits until the test releases it: a decision stopped after
/// it found no entry of several bands, and before it made one.
#[derive(Debug)]
struct GateClock {
    now: std::sync::atomic::AtomicU64,
    #[allow(clippy::type_complexity)]
    held: std::sync::Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
}

impl GateClock {
    fn new() -> Arc<Self> {
        Arc::new(GateClock {
            now: std::sync::atomic::AtomicU64::new(1_700_000_000_000_000_000),
            held: std::sync::Mutex::default(),
        })
    }

    fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for GateClock {
    fn now(&self) -> crate::clock::Nanos {
        if std::thread::current().name() == Some("gated") {
            let held = self.held.lock().unwrap().take();
            if let Some((arrived, release)) = held {
                arrived.send(()).unwrap();
                release.recv().unwrap();
            }
        }
        self.now.load(Ordering::SeqCst)
    }
}

/// Decides `gated` for `user` on a thread stopped after it found no entry
/// of several bands; meanwhile decides `other` for the same user here;
/// then lets the first go on. Its decision.
fn race(
    storage: &MemoryStorage,
    gate: &Arc<GateClock>,
    user: &str,
    gated: Vec<Quota>,
    other: &[Quota],
) -> Decision {
    let clock: Arc<dyn Clock> = gate.clone();
    let (arrived_tx, arrived) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    *gate.held.lock().unwrap() = Some((arrived_tx, release_rx));
    let (s, c, u) = (storage.clone(), clock.clone(), user.to_owned());
    let thread = std::thread::Builder::new()
        .name("gated".into())
        .spawn(move || ready(s.decide(key(&u), &gated, Op::Charge(1), &c)))
        .unwrap();
    arrived.recv().unwrap();
    ready(storage.decide(key(user), other, Op::Charge(1), &clock));
    release.send(()).unwrap();
    thread.join().unwrap()
}

/// Two first decisions of several bands of one user at once, its key in
/// the one-band map: one key counted once (and none after every key
/// expired), and a spent band stays spent.
#[test]
fn racing_first_decisions_of_several_bands_count_one_key_and_keep_its_state() {
    let gate = GateClock::new();
    let clock: Arc<dyn Clock> = gate.clone();
    let storage = MemoryStorage::builder().max_keys(3).build();
    let minute = Quota::per_minute(10);
    let both = vec![minute, Quota::per_day(1_000)];
    for _ in 0..10 {
        assert!(ready(storage.decide(key("ada"), &[minute], Op::Charge(1), &clock)).allowed);
    }
    let gated = race(&storage, &gate, "ada", both.clone(), &both);
    assert!(!gated.allowed, "ada's minute is spent: {gated:?}");
    assert_eq!(storage.len(), 1, "one user, one key");
    gate.advance(Duration::from_secs(2 * 86_400));
    storage.sweep();
    assert_eq!(storage.len(), 0);
    // an empty storage has room: twice more, then a new key is its own
    for user in ["u1", "u2"] {
        ready(storage.decide(key(user), &[minute], Op::Charge(1), &clock));
        race(&storage, &gate, user, both.clone(), &both);
        gate.advance(Duration::from_secs(2 * 86_400));
        storage.sweep();
    }
    let fresh = ready(storage.decide(key("zed"), &[minute], Op::Charge(1), &clock));
    assert_eq!(
        (storage.len(), fresh.source),
        (1, crate::storage::DecisionSource::Storage)
    );
}

/// A first decision of other bands made while a first decision of several
/// bands of the same user waits: neither wipes the other's state.
#[test]
fn racing_first_decisions_of_other_bands_keep_each_others_state() {
    let gate = GateClock::new();
    let clock: Arc<dyn Clock> = gate.clone();
    let storage = MemoryStorage::new();
    let (minute, hour) = (Quota::per_minute(10), Quota::per_hour(100));
    for _ in 0..10 {
        assert!(ready(storage.decide(key("ada"), &[minute], Op::Charge(1), &clock)).allowed);
    }
    // the gated decision is of the hour band alone; the other of both
    let gated = race(&storage, &gate, "ada", vec![hour], &[minute, hour]);
    assert!(gated.allowed);
    let next = ready(storage.decide(key("ada"), &[minute, hour], Op::Charge(1), &clock));
    assert!(!next.allowed, "ada's minute is spent: {next:?}");
}

/// A decision by name (through a wrapper that prepares nothing) racing the
/// sweep that retires its tier's empty scope: what it charged is never
/// lost to the retired scope (the next decision sees it), and the key
/// count stays exact.
#[test]
fn a_decision_by_name_racing_the_retirement_of_its_scope_keeps_its_charge() {
    let fake = FakeClock::new();
    let clock: Arc<dyn Clock> = Arc::new(fake.clone());
    let storage = MemoryStorage::builder().build();
    let bands = [Quota::per_minute(1)];
    // the storage's sweeps keep to the clock of its first decision
    ready(storage.decide(key("ada"), &bands, Op::Charge(0), &clock));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = {
        let (storage, done) = (storage.clone(), done.clone());
        std::thread::spawn(move || {
            let mut sweeps = 0u64;
            while !done.load(Ordering::Relaxed) {
                storage.sweep();
                sweeps += 1;
            }
            sweeps
        })
    };
    for round in 0..100_000 {
        // the last round's key expires: a sweep may retire the scope now
        fake.advance(Duration::from_secs(61));
        let first = ready(storage.decide(key("ada"), &bands, Op::Charge(1), &clock));
        assert!(first.allowed, "round {round}");
        let second = ready(storage.decide(key("ada"), &bands, Op::Charge(1), &clock));
        assert!(!second.allowed, "round {round}: the first charge was lost");
    }
    done.store(true, Ordering::Relaxed);
    assert!(sweeper.join().unwrap() > 100);
    fake.advance(Duration::from_secs(61));
    storage.sweep();
    assert_eq!(storage.len(), 0);
}

/// A refund of several bands that meets the user's state in the one-band
/// map (a tier that gained a band) gives it back, even when it leaves
/// every band fresh, and the key goes with its state.
#[test]
fn a_refund_that_moves_a_one_band_state_and_leaves_it_fresh_is_kept() {
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
    let storage = MemoryStorage::new();
    let hour = Quota::per_hour(5);
    let both = [hour, Quota::per_day(1_000)];
    assert!(ready(storage.decide(key("ada"), &[hour], Op::Charge(1), &clock)).allowed);
    assert_eq!(storage.len(), 1);
    assert!(ready(storage.decide(key("ada"), &both, Op::Refund(1), &clock)).allowed);
    assert_eq!(storage.len(), 0, "the key left fresh is no key");
    let admitted = (0..10)
        .filter(|_| ready(storage.decide(key("ada"), &[hour], Op::Charge(1), &clock)).allowed)
        .count();
    assert_eq!(admitted, 5, "the refund was lost");
}
