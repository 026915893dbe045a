//! What a charge or a reservation holds, by who charged it: a refund gives
//! back what a [`Fallback`](crate::storage::Fallback)'s local limiter
//! charged there, never to the primary (see
//! [`TierScope::refund`](crate::storage::TierScope::refund)).

use crate::storage::DecisionSource;

/// Units to give back, split by who charged them: the local limiter's part
/// first (taken from what it charged), then the primary's.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Parts {
    pub(super) local: u32,
    pub(super) primary: u32,
}

impl Parts {
    /// `units` given back of a charge of which `local` units the local
    /// limiter charged.
    pub(super) fn of(units: u32, local: u32) -> Parts {
        let local = units.min(local);
        Parts {
            local,
            primary: units - local,
        }
    }

    /// Each part that gives something back, with who charged it.
    pub(super) fn each(self) -> impl Iterator<Item = (u32, DecisionSource)> {
        [
            (self.local, DecisionSource::Fallback),
            (self.primary, DecisionSource::Storage),
        ]
        .into_iter()
        .filter(|&(units, _)| units > 0)
    }
}

/// The units of one unit reserved and not yet settled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reserved {
    pub(super) units: u32,
    /// Of `units`, those a fallback's local limiter reserved: what is not
    /// used goes back there first (see [`Parts`]).
    pub(super) local: u32,
}
