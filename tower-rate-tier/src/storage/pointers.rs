//! A storage behind a pointer is the storage: every method passed on.

use std::sync::Arc;

use super::{Decide, DecisionSource, Op, ScopeKey, Storage, StorageKey, TierScope};
use crate::clock::Clock;
use crate::quota::Quota;

impl<S: Storage + ?Sized> Storage for Arc<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        (**self).decide(key, bands, op, clock)
    }

    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        (**self).prepare(at)
    }

    fn refund(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        (**self).refund(key, bands, op, decided_by, clock)
    }
}

impl<S: Storage + ?Sized> Storage for Box<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        (**self).decide(key, bands, op, clock)
    }

    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        (**self).prepare(at)
    }

    fn refund(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        (**self).refund(key, bands, op, decided_by, clock)
    }
}
