use trt::rate_tiers;

#[rate_tiers]
struct Plan {
    name: String,
}

fn main() {}
