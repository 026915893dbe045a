//! Calling a storage directly, as the tests that compare storages do.

use std::sync::{Arc, LazyLock};

use tower_rate_tier::Quota;
use tower_rate_tier::clock::{Clock, SystemClock};
use tower_rate_tier::storage::{Decide, DecisionSource, Op, Storage, StorageKey};

static SYSTEM_CLOCK: LazyLock<Arc<dyn Clock>> = LazyLock::new(|| Arc::new(SystemClock));

/// `check` and `refund` on any storage, with the system clock (which the
/// Redis storage ignores: it decides on the server's time).
pub trait StorageOps: Storage {
    /// Charges `cost` in every band of `key`, or nothing.
    fn check(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Decide {
        self.decide(key, bands, Op::Charge(cost), &SYSTEM_CLOCK)
    }

    /// Gives `cost` back to every band of `key`.
    fn give_back(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Decide {
        self.decide(key, bands, Op::Refund(cost), &SYSTEM_CLOCK)
    }
}

impl<S: Storage + ?Sized> StorageOps for S {}

/// A storage that counts the operations it passes on to `inner`: the
/// wrapper the storage docs show, generic so that wrappers compose.
#[derive(Debug, Clone)]
pub struct Tally<S> {
    inner: S,
    charges: Arc<std::sync::atomic::AtomicUsize>,
    refunds: Arc<std::sync::atomic::AtomicUsize>,
}

impl<S> Tally<S> {
    /// Counts what passes through to `inner`.
    pub fn new(inner: S) -> Self {
        Tally {
            inner,
            charges: Arc::default(),
            refunds: Arc::default(),
        }
    }

    /// The wrapped storage.
    pub fn inner_ref(&self) -> &S {
        &self.inner
    }

    /// Charges (peeks included) and refunds passed on so far.
    pub fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        (self.charges.load(SeqCst), self.refunds.load(SeqCst))
    }
}

impl<S: Storage> Storage for Tally<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let counter = match op {
            Op::Refund(_) => &self.refunds,
            // slots given back are not counted
            Op::Release(_) => return self.inner.decide(key, bands, op, clock),
            // charges, admissions with a slot, amounts per band
            _ => &self.charges,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
        self.refunds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.refund(key, bands, op, decided_by, clock)
    }
}
