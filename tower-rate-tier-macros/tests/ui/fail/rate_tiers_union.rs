use trt::rate_tiers;

#[rate_tiers]
union Plan {
    id: u32,
}

fn main() {}
