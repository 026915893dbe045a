//! The gauge of slots in use per tier with a concurrency limit
//! ([`CONCURRENT_REQUESTS`](super::CONCURRENT_REQUESTS)), never per user.

use super::CONCURRENT_REQUESTS;
use crate::tier::RateTier;

/// One gauge per configured tier with a concurrency limit: registered when
/// the layer is built, with the recorder in force (a tier given one later
/// gets its gauge at its first request).
#[derive(Default)]
pub(crate) struct SlotGauges(dashmap::DashMap<Box<str>, metrics::Gauge, foldhash::fast::RandomState>);

impl SlotGauges {
    pub(crate) fn new(tiers: &RateTier) -> Self {
        let gauges = SlotGauges::default();
        for name in tiers.tier_names() {
            if tiers.concurrency(&name).is_some() {
                let _registered = gauges.get(&name);
            }
        }
        gauges
    }

    /// The gauge of the configured tier `tier`.
    pub(crate) fn get(&self, tier: &str) -> metrics::Gauge {
        let gauge = || metrics::gauge!(CONCURRENT_REQUESTS, "tier" => tier.to_owned());
        self.0.entry(tier.into()).or_insert_with(gauge).clone()
    }
}
