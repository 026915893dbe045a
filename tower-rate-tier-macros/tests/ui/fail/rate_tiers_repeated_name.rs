use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100)]
    Free,
    #[tier(per_hour = 5_000, name = "free")]
    Pro,
}

fn main() {}
