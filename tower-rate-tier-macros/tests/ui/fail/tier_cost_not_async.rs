use trt::tier_cost;

#[tier_cost(5)]
fn search() -> &'static str {
    "hits"
}

fn main() {
    let _ = search;
}
