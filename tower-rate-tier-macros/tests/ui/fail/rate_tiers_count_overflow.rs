use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_day = 5_000_000_000)]
    Free,
}

fn main() {}
