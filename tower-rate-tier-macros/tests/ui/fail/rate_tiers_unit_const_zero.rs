// A `const` that is zero in a unit's band fails the build on its path, like
// one in the request bands.
use trt::rate_tiers;

mod limits {
    pub const TOKENS_PER_MINUTE: u32 = 0;
}

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100)]
    #[tier(unit = "tokens", per_minute = limits::TOKENS_PER_MINUTE)]
    Free,
}

fn main() {
    let _ = trt::TierTable::tier_units(Plan::Free);
}
