// Two units of one tier whose ids (the runtime's FNV-1a hash of the name)
// are the same would share their state: the second is reported. The same
// two names on different tiers are fine.
use trt::rate_tiers;

#[rate_tiers]
pub enum Plan {
    #[tier(per_hour = 100)]
    #[tier(unit = "glbvs", per_hour = 10)]
    #[tier(unit = "tokens", per_hour = 10)]
    #[tier(unit = "yacxa", per_hour = 10)]
    Free,
    #[tier(per_hour = 100)]
    #[tier(unit = "glbvs", per_hour = 10)]
    Pro,
    #[tier(per_hour = 100)]
    #[tier(unit = "yacxa", per_hour = 10)]
    Team,
}

fn main() {
    let _ = (Plan::ALL, Plan::Pro.name(), Plan::Pro.quotas());
}
