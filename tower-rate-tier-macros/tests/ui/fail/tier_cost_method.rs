use trt::tier_cost;

struct Api;

impl Api {
    #[tier_cost(5)]
    async fn search(&self) -> &'static str {
        "hits"
    }
}

fn main() {
    let _ = Api.search();
}
