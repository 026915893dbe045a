use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(unlimited, per_hour = 100)]
    Enterprise,
}

fn main() {}
