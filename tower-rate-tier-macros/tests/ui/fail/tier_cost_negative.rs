use trt::tier_cost;

#[tier_cost(-1)]
async fn search() {}

fn main() {
    let _ = search;
}
