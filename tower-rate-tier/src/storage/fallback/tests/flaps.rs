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

/// A primary whose answer to `early` waits for a gate (a reply read late,
/// after the replies of calls sent later), and that fails every other user
/// while `down` is set.
#[derive(Debug, Clone, Default)]
struct LateReply {
    memory: MemoryStorage,
    gate: Arc<Mutex<Option<tokio::sync::oneshot::Receiver<()>>>>,
    down: Arc<AtomicBool>,
}

impl Storage for LateReply {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        if key.user == "early" {
            let decided = self
                .memory
                .decide(key, bands, op, clock)
                .into_ready()
                .expect("memory is ready");
            let gate = self.gate.lock().unwrap().take().expect("one early call");
            return Decide::pending(async move {
                let _ = gate.await;
                decided
            });
        }
        if self.down.load(Ordering::SeqCst) {
            return Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")));
        }
        self.memory.decide(key, bands, op, clock)
    }
}

/// A call sent before the primary's failures began, answered after they
/// switched to the local limiter, says nothing of the primary since: the
/// fallback stays local (it switched back, then again at the next failure:
/// a flap for every reply read late).
#[tokio::test]
async fn a_reply_read_late_does_not_end_an_outage_that_began_after_it_was_sent() {
    let clock = FakeClock::new();
    let primary = LateReply::default();
    let (open, gate) = tokio::sync::oneshot::channel();
    *primary.gate.lock().unwrap() = Some(gate);
    let storage = Fallback::builder(primary.clone()).build();
    let bands = [Quota::per_day(100)];
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let key = StorageKey {
        namespace: "",
        tier: "t",
        user: "early",
    };
    let early = storage.decide(key, &bands, Op::Charge(1), &dyn_clock);
    clock.advance(Duration::from_millis(1));
    primary.down.store(true, Ordering::SeqCst);
    for _ in 0..DEFAULT_FAILURES_TO_SWITCH {
        assert!(decide(&storage, "other", &bands, 1, &clock).unwrap().allowed);
    }
    assert!(storage.is_local());
    let _ = open.send(());
    assert_eq!(early.await.unwrap().source, DecisionSource::Storage);
    assert!(storage.is_local(), "the late reply ended the outage");
}
