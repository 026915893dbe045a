use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100, per_hour = 200)]
    Free,
}

fn main() {}
