use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_second = 1, per_minute = 10, per_hour = 100, per_day = 1_000, per_week = 5_000)]
    Free,
    #[tier(per_second = 1, per_minute = 10, per_hour = 100, per_day = 1_000)]
    #[tier(unit = "tokens", per_second = 10, per_minute = 100, per_hour = 1_000, per_day = 10_000, per_week = 50_000)]
    Pro,
}

fn main() {}
