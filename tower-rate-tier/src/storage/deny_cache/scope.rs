//! A tier prepared in a [`DenyCache`](super::DenyCache): its decisions
//! guarded by the cache, under the names of the tier's keys.

use std::fmt;
use std::sync::Arc;

use super::{DenyTable, KeyBuf};
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{Decide, DecisionSource, Lease, Op, TierScope};

/// A tier prepared in a [`DenyCache`]: the wrapped storage's scope of the
/// tier, the cache, and the tier's part of its keys' names.
pub(super) struct DenyScope {
    pub(super) inner: Arc<dyn TierScope>,
    pub(super) table: Arc<DenyTable>,
    /// `[len][namespace][len][tier]`, which a user id completes.
    pub(super) prefix: KeyBuf,
}

impl DenyScope {
    /// The name of `user`'s key in the cache.
    fn name(&self, user: &str) -> KeyBuf {
        let mut name = KeyBuf::with_capacity(self.prefix.len() + user.len());
        name.extend_from_slice(&self.prefix);
        name.extend_from_slice(user.as_bytes());
        name
    }
}

impl TierScope for DenyScope {
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.table.guard(self.name(user), bands, op, clock.now(), || {
            self.inner.decide(user, bands, op, clock)
        })
    }

    /// Passed on: a release is never cached.
    fn release(&self, user: &str, bands: &[Quota], lease: Lease, clock: &Arc<dyn Clock>) -> Option<Decide> {
        self.inner.release(user, bands, lease, clock)
    }

    /// Counted as any refund here, and passed on with where its charge was
    /// decided.
    fn refund(
        &self,
        user: &str,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        self.table.guard(self.name(user), bands, op, clock.now(), || {
            self.inner.refund(user, bands, op, decided_by, clock)
        })
    }
}

impl fmt::Debug for DenyScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyScope")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}
