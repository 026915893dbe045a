use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(unlimited, concurrent = 100, concurrent = 50)]
    Enterprise,
}

fn main() {}
