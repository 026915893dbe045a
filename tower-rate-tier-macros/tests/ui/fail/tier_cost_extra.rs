use trt::tier_cost;

#[tier_cost(5, 6)]
async fn search() {}

fn main() {
    let _ = search;
}
