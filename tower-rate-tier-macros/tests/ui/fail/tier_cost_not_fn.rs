use trt::tier_cost;

#[tier_cost(5)]
struct Search;

fn main() {
    let _ = Search;
}
