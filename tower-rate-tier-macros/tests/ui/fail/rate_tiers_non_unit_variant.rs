use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100)]
    Free(u32),
    #[tier(per_hour = 5_000)]
    Pro { seats: String },
}

fn main() {}
