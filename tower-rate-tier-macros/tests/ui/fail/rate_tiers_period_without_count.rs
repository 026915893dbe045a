use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100, period_secs = 900)]
    Free,
}

fn main() {}
