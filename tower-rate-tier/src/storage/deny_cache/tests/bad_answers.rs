//! A storage's answers no storage should give: the cache keeps them no
//! longer than a real one could last.

use std::sync::atomic::AtomicBool;

use super::*;

/// A storage answering its denials as far in the future as a time can be
/// (a custom storage's bug), while `wrong` is set.
#[derive(Debug, Default)]
struct FarFuture {
    memory: MemoryStorage,
    wrong: AtomicBool,
}

impl Storage for FarFuture {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let mut decided = self
            .memory
            .decide(key, bands, op, clock)
            .into_ready()
            .expect("memory is ready");
        if let Ok(decision) = &mut decided
            && !decision.allowed
            && self.wrong.load(Ordering::SeqCst)
        {
            for state in decision.bands.iter_mut() {
                state.reset_after_ns = u64::MAX;
                state.retry_after_ns = u64::MAX;
            }
        }
        Decide::ready(decided)
    }
}

#[test]
fn one_answer_beyond_any_refill_keeps_the_entry_no_longer_than_a_refill_and_its_debt() {
    let clock = FakeClock::new();
    let storage = DenyCache::new(FarFuture::default());
    storage.get_ref().wrong.store(true, Ordering::SeqCst);
    let bands = [Quota::per_minute(1)];
    assert!(decide(&storage, &bands, Op::Charge(1), &clock).allowed);
    let denied = decide(&storage, &bands, Op::Charge(1), &clock);
    assert_eq!((denied.allowed, denied.source), (false, DecisionSource::Storage));
    assert_eq!(storage.len(), 1);
    storage.get_ref().wrong.store(false, Ordering::SeqCst);
    // within a refill and a debt of one burst, the entry may still answer
    clock.advance(Duration::from_secs(119));
    assert!(!decide(&storage, &bands, Op::Charge(1), &clock).allowed);
    // past them, the storage is asked, and admits
    clock.advance(Duration::from_secs(1));
    let after = decide(&storage, &bands, Op::Charge(1), &clock);
    assert_eq!((after.allowed, after.source), (true, DecisionSource::Storage));
}
