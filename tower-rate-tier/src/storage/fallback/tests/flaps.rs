//! Outages that come and go, and answers a wrapper of the primary gives.

use super::*;

/// A primary that fails every other call (timeouts under load).
#[derive(Debug, Clone, Default)]
struct EveryOther {
    memory: MemoryStorage,
    calls: Arc<AtomicUsize>,
}

impl Storage for EveryOther {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        if self.calls.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
            return Decide::ready(Err(StorageError::new(StorageErrorKind::Timeout, "slow")));
        }
        self.memory.decide(key, bands, op, clock)
    }
}

#[test]
fn a_primary_failing_every_other_call_gives_a_spent_user_one_share_at_most() {
    let clock = FakeClock::new();
    let primary = EveryOther::default();
    let storage = Fallback::builder(primary.clone()).instances(4).build();
    let bands = [Quota::per_day(100)];
    // spent in the primary (its first call, which succeeds)
    assert!(decide(&storage, "spent", &bands, 100, &clock).unwrap().allowed);
    let mut admitted = 0;
    for _ in 0..1_000 {
        let d = decide(&storage, "spent", &bands, 1, &clock).unwrap();
        admitted += u32::from(d.allowed);
        clock.advance(Duration::from_millis(10));
    }
    println!("a primary failing every other call: a spent user admitted {admitted} of 1,000");
    // every failure is answered locally, in one outage's state: a share of
    // 25, never a fresh one per failure
    assert!(!storage.is_local());
    assert!(admitted <= 25, "{admitted} of 1,000 admitted");
    assert_eq!(primary.calls.load(Ordering::SeqCst), 1_001);
}

/// A primary behind a cache that answers some decisions itself (as the
/// Redis storage's deny cache does): `cached` users get a denial from the
/// cache without the primary being asked; every other call fails.
#[derive(Debug, Clone, Default)]
struct DownBehindACache {
    calls: Arc<AtomicUsize>,
}

impl Storage for DownBehindACache {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        if key.user == "cached" {
            let mut tats = [Some(clock.now() + 3_600_000_000_000)];
            let denied = crate::storage::decide_bands(&mut tats, clock.now(), &bands[..1], op);
            return Decide::ready(Ok(denied.with_source(DecisionSource::DenyCache)));
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")))
    }
}

#[test]
fn answers_a_wrapper_gave_neither_end_an_outage_nor_reset_its_count() {
    let clock = FakeClock::new();
    let primary = DownBehindACache::default();
    let storage = Fallback::builder(primary.clone())
        .instances(4)
        .failures_to_switch(3)
        .build();
    let bands = [Quota::per_minute(40)];
    let (mut cached, mut admitted) = (0, 0);
    for _ in 0..100 {
        cached += u32::from(decide(&storage, "cached", &bands, 1, &clock).unwrap().allowed);
        admitted += u32::from(decide(&storage, "ada", &bands, 1, &clock).unwrap().allowed);
    }
    // three failures of the primary switch it, whatever the cache answered
    // in between, and each user gets at most one share (10) in one outage
    // ("cached" is answered locally too once switched)
    assert!(storage.is_local());
    assert_eq!(primary.calls.load(Ordering::SeqCst), 3);
    assert_eq!(admitted, 10);
    assert!(cached <= 10, "{cached}");
}
