// A unit's name is a string literal of 1 to 24 bytes: lowercase ASCII
// letters, digits, `-` and `_`, starting with a letter; `requests` and
// `concurrent-requests` are reserved. Each wrong name is reported.
use trt::rate_tiers;

#[rate_tiers]
pub enum Plan {
    #[tier(per_hour = 100)]
    #[tier(unit = "requests", per_hour = 1)]
    #[tier(unit = "concurrent-requests", per_hour = 1)]
    #[tier(unit = "Tokens", per_hour = 1)]
    #[tier(unit = "", per_hour = 1)]
    Free,
    // (two variants: a tier has at most 8 bands with its units)
    #[tier(per_hour = 100)]
    #[tier(unit = "a-unit-name-of-twenty-seven", per_hour = 1)]
    #[tier(unit = "2fa", per_hour = 1)]
    #[tier(unit = "_private", per_hour = 1)]
    #[tier(unit = "content bytes", per_hour = 1)]
    Team,
    #[tier(per_hour = 100)]
    #[tier(unit = tokens, per_hour = 1)]
    #[tier(unit, per_hour = 1)]
    // 24 bytes: the longest name.
    #[tier(unit = "a-twenty-four-byte-unit_", per_hour = 1)]
    Pro,
}

fn main() {
    let _ = (Plan::ALL, Plan::Pro.name(), Plan::Pro.quotas());
}
