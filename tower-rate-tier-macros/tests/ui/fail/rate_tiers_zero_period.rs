use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(count = 50, period_secs = 0)]
    Free,
}

fn main() {}
