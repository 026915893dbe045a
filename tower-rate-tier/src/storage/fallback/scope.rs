//! A tier prepared in a [`Fallback`](super::Fallback): the primary's scope
//! of the tier and the local limiter's, found once.

use std::fmt;
use std::sync::Arc;

use super::Shared;
use super::local::{Call, Local};
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{Decide, Op, ScopeKey, Storage, TierScope};

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

    fn at(&self) -> ScopeKey<'_> {
        ScopeKey {
            namespace: &self.namespace,
            tier: &self.tier,
        }
    }
}

impl TierScope for FallbackScope {
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let local = match &self.local {
            Some(scope) => Local::Prepared(scope),
            None => Local::Named(self.at()),
        };
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
