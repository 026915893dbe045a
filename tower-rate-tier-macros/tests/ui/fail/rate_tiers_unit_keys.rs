// Misused keys in unit attributes (`#[tier(unit = "..", ..)]`) are all
// reported at once, each on its own tokens, and the rest of the crate (which
// uses the enum) adds no errors of its own.
use trt::rate_tiers;

#[rate_tiers]
pub enum Plan {
    // A typo among the band keys; a key of the tier itself is not suggested.
    #[tier(per_minute = 20)]
    #[tier(unit = "tokens", per_minut = 40_000)]
    #[tier(unit = "images", per_hour = 10, defualt)]
    Free,
    // The keys of the tier itself go on its attribute without `unit`; with
    // one of them, "no band" is not said as well.
    #[tier(per_minute = 600)]
    #[tier(unit = "tokens", per_hour = 1, unlimited, default, shadow)]
    #[tier(unit = "images", per_hour = 1, concurrent = 2, name = "pro")]
    #[tier(unit = "bytes")]
    Pro,
    // The same unit twice, and `unit` twice in one attribute.
    #[tier(unlimited)]
    #[tier(unit = "tokens", per_hour = 1)]
    #[tier(unit = "tokens", per_day = 10)]
    #[tier(unit = "images", unit = "pictures", per_day = 10)]
    Enterprise,
    // The band rules of a request attribute hold for a unit's bands.
    #[tier(per_hour = 1)]
    #[tier(unit = "tokens", per_minute = 0, per_day = 10, burst = 5)]
    #[tier(unit = "images", count = 50)]
    Trial,
    // Units, and no attribute for the requests.
    #[tier(unit = "tokens", per_hour = 1)]
    Internal,
}

fn main() {
    let tiers = trt::RateTier::builder().tiers::<Plan>();
    let _ = (tiers, Plan::ALL, Plan::Pro.name(), Plan::Pro.quotas());
    let _ = "pro".parse::<Plan>().map(|plan| plan.to_string());
    let _ = trt::TierTable::tier_units(Plan::Free);
}
