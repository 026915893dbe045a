use trt::tier_cost;

#[tier_cost(4_294_967_296)]
async fn search() {}

fn main() {
    let _ = search;
}
