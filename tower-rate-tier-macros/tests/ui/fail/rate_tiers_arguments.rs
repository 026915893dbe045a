use trt::rate_tiers;

#[rate_tiers(default = "free")]
enum Plan {
    #[tier(per_hour = 100)]
    Free,
}

fn main() {}
