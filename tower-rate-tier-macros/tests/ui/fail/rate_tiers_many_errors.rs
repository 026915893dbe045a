// Independent mistakes in one enum are all reported at once, each on its
// own tokens, and the rest of the crate (which uses the enum) adds no
// errors of its own.
use trt::rate_tiers;

#[rate_tiers]
#[derive(Debug)]
pub enum Plan {
    #[tier(per_hour = 0, default)]
    Free,
    #[tier(per_hour = 5_000, per_hour = 6_000, burst = 0)]
    Pro,
    #[tier(per_minute = 600, name = "free", default)]
    Team,
    #[tier(unlimited, per_day = 1, colour = "gold")]
    Enterprise,
    Internal,
}

fn main() {
    let tiers = trt::RateTier::builder().tiers::<Plan>();
    let _ = (tiers, Plan::ALL, Plan::Pro.name(), Plan::Pro.quotas());
    let _ = "pro".parse::<Plan>().map(|plan| plan.to_string());
}
