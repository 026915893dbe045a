//! What a charge or a reservation holds, by who charged it, so that a refund
//! gives each part back where it was charged (see
//! [`TierScope::refund`](crate::storage::TierScope::refund)): what a
//! [`Fallback`](crate::storage::Fallback)'s local limiter charged goes back
//! there, never to the primary; what the memory storage's overflow bucket
//! charged (an identity it had no room for) goes back to that bucket, never
//! to a key the identity has since, and the other way round.

use crate::storage::DecisionSource;

/// Units charged, split by who charged them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Parts {
    /// By a fallback's local limiter.
    local: u32,
    /// In the memory storage's overflow bucket of the tier.
    overflow: u32,
    /// In the user's own state in the storage.
    own: u32,
}

impl Parts {
    /// `units` charged by a decision of `decided_by`.
    pub(super) fn by(units: u32, decided_by: DecisionSource) -> Parts {
        let mut parts = Parts::default();
        match decided_by {
            DecisionSource::Fallback => parts.local = units,
            DecisionSource::Overflow => parts.overflow = units,
            _ => parts.own = units,
        }
        parts
    }

    /// Every unit charged.
    pub(super) fn total(self) -> u32 {
        self.local.saturating_add(self.overflow).saturating_add(self.own)
    }

    /// Adds `more`.
    pub(super) fn add(&mut self, more: Parts) {
        self.local = self.local.saturating_add(more.local);
        self.overflow = self.overflow.saturating_add(more.overflow);
        self.own = self.own.saturating_add(more.own);
    }

    /// Takes `units` off (at most what there is): the local limiter's part
    /// first, then the overflow bucket's, then the user's own.
    pub(super) fn take(&mut self, units: u32) -> Parts {
        let mut left = units;
        let mut from = |part: &mut u32| {
            let taken = left.min(*part);
            *part -= taken;
            left -= taken;
            taken
        };
        Parts {
            local: from(&mut self.local),
            overflow: from(&mut self.overflow),
            own: from(&mut self.own),
        }
    }

    /// Each part that gives something back, with who charged it.
    pub(super) fn each(self) -> impl Iterator<Item = (u32, DecisionSource)> {
        [
            (self.local, DecisionSource::Fallback),
            (self.overflow, DecisionSource::Overflow),
            (self.own, DecisionSource::Storage),
        ]
        .into_iter()
        .filter(|&(units, _)| units > 0)
    }
}
