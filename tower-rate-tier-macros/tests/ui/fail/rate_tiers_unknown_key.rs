use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_month = 100)]
    Free,
}

fn main() {}
