use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 0)]
    Free,
}

fn main() {}
