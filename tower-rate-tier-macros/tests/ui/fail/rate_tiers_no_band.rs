use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(default, name = "free")]
    Free,
}

fn main() {}
