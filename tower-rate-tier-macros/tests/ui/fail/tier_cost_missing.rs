use trt::tier_cost;

#[tier_cost]
async fn search() {}

#[tier_cost()]
async fn export() {}

fn main() {
    let _ = (search, export);
}
