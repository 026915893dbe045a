use trt::rate_tiers;

const LIMIT: u32 = 100;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = LIMIT * 2)]
    Free,
}

fn main() {
    let _ = LIMIT;
}
