use trt::tier_cost;

const SEARCH_COST: u64 = 5;

#[tier_cost(SEARCH_COST)]
async fn search() {}

fn main() {
    let _ = search;
}
