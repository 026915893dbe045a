//! `tower_rate_tier_units_total{tier, unit, outcome}`: the units of each
//! tier's named units that handlers and the layer recorded, forgave or
//! could not record ([`UNITS_TOTAL`](super::UNITS_TOTAL)).

use metrics::Counter;

use super::UNITS_TOTAL;
use crate::tier::RateTier;

/// What became of units recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnitOutcome {
    /// Charged to the unit (into its debt if need be).
    Recorded = 0,
    /// Beyond the unit's debt bound: forgiven.
    Forgiven = 1,
    /// Not recorded: the storage failed.
    Lost = 2,
}

const OUTCOMES: [&str; 3] = ["recorded", "forgiven", "lost"];

/// A unit's name and its counters, one per [`UnitOutcome`].
type UnitRow = (Box<str>, [Counter; 3]);

/// The counters of every configured (tier, unit), registered when the
/// layer is built (a unit added later gets its row at its first record),
/// found by the tier's name and the unit's without allocating. Labels are
/// bounded: only units a tier has are counted.
#[derive(Default)]
pub(crate) struct UnitCounters(dashmap::DashMap<Box<str>, Vec<UnitRow>, foldhash::fast::RandomState>);

impl UnitCounters {
    pub(crate) fn new(tiers: &RateTier) -> Self {
        metrics::describe_counter!(
            UNITS_TOTAL,
            metrics::Unit::Count,
            "Units of tiers' named units (tokens, content-bytes, ...) recorded, forgiven beyond the debt bound, or lost, by tier and unit"
        );
        let counters = UnitCounters::default();
        for tier in tiers.tier_names() {
            for unit in tiers.units(&tier) {
                let _registered = counters.register(&tier, &unit);
            }
        }
        counters
    }

    /// Adds `units` to the count of `outcome` for `unit` of `tier` (a unit
    /// the tier has: the caller checked).
    pub(crate) fn count(&self, tier: &str, unit: &str, outcome: UnitOutcome, units: u64) {
        if units == 0 {
            return;
        }
        if let Some(row) = self.0.get(tier)
            && let Some((_, counters)) = row.iter().find(|(u, _)| **u == *unit)
        {
            return counters[outcome as usize].increment(units);
        }
        self.register(tier, unit)[outcome as usize].increment(units);
    }

    /// The counters of `unit` of `tier`, registered now if they are not.
    #[cold]
    fn register(&self, tier: &str, unit: &str) -> [Counter; 3] {
        let mut row = self.0.entry(tier.into()).or_default();
        if let Some((_, counters)) = row.iter().find(|(u, _)| **u == *unit) {
            return counters.clone();
        }
        let counters = OUTCOMES.map(|outcome| {
            metrics::counter!(UNITS_TOTAL, "tier" => tier.to_owned(), "unit" => unit.to_owned(), "outcome" => outcome)
        });
        row.push((unit.into(), counters.clone()));
        counters
    }
}
