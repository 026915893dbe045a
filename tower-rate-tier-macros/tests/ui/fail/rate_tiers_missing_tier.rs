use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100)]
    Free,
    /// Forgot the attribute.
    Pro,
}

fn main() {}
