use trt::tier_cost;

#[tier_cost("5")]
async fn search() {}

#[tier_cost(2.5)]
async fn export() {}

fn main() {
    let _ = (search, export);
}
