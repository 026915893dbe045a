use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100, burst = 0)]
    Free,
}

fn main() {}
