//! A memory storage that fails while a flag is set: a primary for a
//! fallback, without a Redis to stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tower_rate_tier::Quota;
use tower_rate_tier::clock::Clock;
use tower_rate_tier::storage::{
    Decide, MemoryStorage, Op, Storage, StorageError, StorageErrorKind, StorageKey,
};

/// Fails every decision (`Unavailable`) while `down` is set.
#[derive(Debug, Clone, Default)]
pub struct Flaky {
    inner: MemoryStorage,
    /// Set: the storage is down.
    pub down: Arc<AtomicBool>,
}

impl Storage for Flaky {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        if self.down.load(Ordering::SeqCst) {
            return Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")));
        }
        self.inner.decide(key, bands, op, clock)
    }
}
