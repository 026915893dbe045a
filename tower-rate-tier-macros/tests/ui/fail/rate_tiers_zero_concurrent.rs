use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_minute = 20, concurrent = 0)]
    Free,
}

fn main() {}
