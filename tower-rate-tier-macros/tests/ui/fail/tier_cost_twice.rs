// A handler has one cost: a second `#[tier_cost]` (by any path) is an error
// on it, and the handler is still routable.
use trt::tier_cost;

#[tier_cost(5)]
#[tier_cost(10)]
async fn search() -> &'static str {
    "found"
}

#[tier_cost(1)]
#[trt::tier_cost(2)]
async fn export() -> &'static str {
    "done"
}

fn main() {
    let _: axum::Router = axum::Router::new()
        .route("/search", axum::routing::get(search))
        .route("/export", axum::routing::get(export));
}
