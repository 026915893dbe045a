//! A tier prepared in a [`Fallback`](super::Fallback): the primary's scope
//! of the tier and the local limiter's, found once.

use std::fmt;
use std::sync::Arc;

use super::Shared;
use super::local::{Call, Local};
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{Decide, DecisionSource, Lease, Op, ScopeKey, Storage, TierScope};

/// A tier prepared in a fallback: the primary's scope of the tier, the
/// local limiter's, and the tier's names (for the failure domain of a key).
pub(super) struct FallbackScope {
    primary: Arc<dyn TierScope>,
    /// `None` when the local limiter prepares none: decided there by name.
    local: Option<Arc<dyn TierScope>>,
    shared: Arc<Shared>,
    namespace: Box<str>,
    tier: Box<str>,
}

impl FallbackScope {
    /// The tier `at`, whose scope in the primary is `primary`.
    pub(super) fn new(primary: Arc<dyn TierScope>, shared: &Arc<Shared>, at: ScopeKey<'_>) -> Self {
        FallbackScope {
            primary,
            local: shared.local.prepare(at),
            shared: shared.clone(),
            namespace: at.namespace.into(),
            tier: at.tier.into(),
        }
    }

    /// Where the local limiter keeps the tier.
    fn local(&self) -> Local<'_> {
        match &self.local {
            Some(scope) => Local::Prepared(scope),
            None => Local::Named(self.at()),
        }
    }

    fn at(&self) -> ScopeKey<'_> {
        ScopeKey {
            namespace: &self.namespace,
            tier: &self.tier,
        }
    }
}

impl TierScope for FallbackScope {
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let local = self.local();
        let call = Call {
            user,
            bands,
            op,
            clock,
        };
        if let Op::Release(lease) = op {
            let released = self.shared.release(self.at(), local, call, lease, |lease| {
                Some(self.primary.decide(user, bands, Op::Release(lease), clock))
            });
            return released.unwrap_or_else(|| super::give_back::released_now(clock));
        }
        self.shared.decide(self.at(), local, call, |op| {
            self.primary.decide(user, bands, op, clock)
        })
    }

    /// To whoever charged it (see [`Shared::refund`]).
    fn refund(
        &self,
        user: &str,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        let call = Call {
            user,
            bands,
            op,
            clock,
        };
        self.shared
            .refund(self.at(), self.local(), call, decided_by, |op| {
                self.primary.refund(user, bands, op, decided_by, clock)
            })
    }

    /// Where it was given (see [`Shared::release`]).
    fn release(&self, user: &str, bands: &[Quota], lease: Lease, clock: &Arc<dyn Clock>) -> Option<Decide> {
        let call = Call {
            user,
            bands,
            op: Op::Release(lease),
            clock,
        };
        self.shared
            .release(self.at(), self.local(), call, lease, |lease| {
                self.primary.release(user, bands, lease, clock)
            })
    }
}

impl fmt::Debug for FallbackScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackScope")
            .field("namespace", &self.namespace)
            .field("tier", &self.tier)
            .field("primary", &self.primary)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}
