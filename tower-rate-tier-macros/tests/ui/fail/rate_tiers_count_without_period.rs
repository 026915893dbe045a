use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(count = 50)]
    Free,
}

fn main() {}
