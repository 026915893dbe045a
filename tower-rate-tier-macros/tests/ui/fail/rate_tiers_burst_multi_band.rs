use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_second = 5, per_day = 10_000, burst = 10)]
    Free,
}

fn main() {}
