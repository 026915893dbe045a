//! A tier prepared in a [`Fallback`](super::Fallback): the primary's scope
//! of the tier and the local limiter's, found once.

use std::fmt;
use std::sync::Arc;

use super::Shared;
use super::local::{Call, Local};
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{BandStates, Decide, Decision, DecisionSource, Lease, Op, ScopeKey, Storage, TierScope};

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
        self.shared.decide(self.at(), local, call, |op| {
            self.primary.decide(user, bands, op, clock)
        })
    }

    /// A refund of what the local limiter charged goes to it while the
    /// key's domain answers locally (into the spell of now), and nowhere once
    /// the primary answers again: the primary never charged it, and the
    /// local state is never merged into the primary's. Any other refund goes
    /// to the primary, told who charged it, whether or not the key's domain
    /// answers locally now: the local limiter never charged it (a refund
    /// the primary cannot take is reported as failed, never given to the
    /// local limiter).
    fn refund(
        &self,
        user: &str,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        if decided_by != DecisionSource::Fallback {
            return self.primary.refund(user, bands, op, decided_by, clock);
        }
        let Some(epoch) = self.shared.local_epoch(self.shared.domain(self.at(), user)) else {
            let nothing = Decision::new(true, clock.now(), BandStates::new());
            return Decide::ready(Ok(nothing.with_source(DecisionSource::Fallback)));
        };
        let local = self.local();
        let call = Call {
            user,
            bands,
            op,
            clock,
        };
        Decide::ready(self.shared.answer_locally(local, call, epoch))
    }

    /// A slot is given back where it was taken, which its lease does not
    /// say: in the local limiter while the key's domain answers locally,
    /// and in the primary always (a lease one of them never gave is nothing
    /// to it). A release the primary cannot take is left to the lease.
    fn release(&self, user: &str, bands: &[Quota], lease: Lease, clock: &Arc<dyn Clock>) -> Option<Decide> {
        if let Some(epoch) = self.shared.local_epoch(self.shared.domain(self.at(), user)) {
            let call = Call {
                user,
                bands,
                op: Op::Release(lease),
                clock,
            };
            let _ = self.shared.answer_locally(self.local(), call, epoch);
        }
        self.primary.release(user, bands, lease, clock)
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
