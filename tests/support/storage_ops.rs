//! Calling a storage directly, as the tests that compare storages do.

use std::sync::{Arc, LazyLock};

use tower_rate_tier::Quota;
use tower_rate_tier::clock::{Clock, SystemClock};
use tower_rate_tier::storage::{Decide, Op, Storage, StorageKey};

static SYSTEM_CLOCK: LazyLock<Arc<dyn Clock>> = LazyLock::new(|| Arc::new(SystemClock));

/// `check` and `refund` on any storage, with the system clock (which the
/// Redis storage ignores: it decides on the server's time).
pub trait StorageOps: Storage {
    /// Charges `cost` in every band of `key`, or nothing.
    fn check(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Decide {
        self.decide(key, bands, Op::Charge(cost), &SYSTEM_CLOCK)
    }

    /// Gives `cost` back to every band of `key`.
    fn refund(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Decide {
        self.decide(key, bands, Op::Refund(cost), &SYSTEM_CLOCK)
    }
}

impl<S: Storage + ?Sized> StorageOps for S {}
