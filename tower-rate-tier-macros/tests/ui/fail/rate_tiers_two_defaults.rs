use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100, default)]
    Free,
    #[tier(per_hour = 5_000, default)]
    Pro,
}

fn main() {}
