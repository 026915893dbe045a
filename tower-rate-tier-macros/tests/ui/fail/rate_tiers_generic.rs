use trt::rate_tiers;

#[rate_tiers]
enum Plan<T> {
    #[tier(per_hour = 100)]
    Free,
    #[tier(per_hour = 5_000)]
    Pro,
    #[tier(unlimited)]
    Other(T),
}

fn main() {}
