//! The macro way: plans as a `#[rate_tiers]` enum, costs as `#[tier_cost]`.
//!
//! ```sh
//! cargo run --example axum_macros            # a self-test run, then exits
//! cargo run --example axum_macros -- --serve # keeps serving, for curl
//! ```
//!
//! One router-wide limiter charges each handler's declared cost exactly;
//! handlers without `#[tier_cost]` cost 1.

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use http::{HeaderMap, Method};
use tower_rate_tier::{RateTier, TierIdentity, TierLimitLayer, rate_tiers, tier_cost};
use tower_rate_tier_examples::{Client, header, row, serve_axum, serve_forever, serve_mode};

/// The plans. Each mistake in a `#[tier(..)]` is a compile error.
#[rate_tiers]
pub enum Plan {
    /// 10 a minute; also the plan of clients without a key.
    #[tier(per_minute = 10, default)]
    Free,
    /// 5,000 an hour, at most 100 at once.
    #[tier(per_hour = 5_000, burst = 100)]
    Pro,
    /// Two bands: 5 a second and 50,000 a day.
    #[tier(per_second = 5, per_day = 50_000, name = "team-plus")]
    TeamPlus,
    /// No limit.
    #[tier(unlimited)]
    Enterprise,
}

#[derive(Clone)]
struct AppState {
    catalogue: &'static [&'static str],
}

async fn index() -> &'static str {
    "hello\n" // no #[tier_cost]: costs 1
}

#[tier_cost(5)]
async fn search(State(state): State<AppState>) -> String {
    format!("{} results\n", state.catalogue.len())
}

#[tier_cost(40)] // above `#[axum::debug_handler]` when both are used
async fn export(State(state): State<AppState>, body: String) -> String {
    format!(
        "exported {} items ({} bytes of options)\n",
        state.catalogue.len(),
        body.len()
    )
}

/// `authorization: Bearer <key>`; the key's prefix names the plan here (a
/// database in a real service, see the `axum_api_key_redis` example).
fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let key = headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let (plan, _) = key.split_once('_')?;
    let plan: Plan = plan.parse().ok()?; // "pro" -> Plan::Pro; unknown names fail
    Some(TierIdentity::new(key, plan))
}

fn app() -> Router {
    let tiers = RateTier::builder().tiers::<Plan>().build(); // every plan, and the default
    Router::new()
        .route("/", get(index))
        .route("/search", get(search))
        .route("/export", post(export))
        .with_state(AppState {
            catalogue: &["a", "b", "c"],
        })
        .layer(TierLimitLayer::new(tiers).identifier_fn(identify))
}

#[tokio::main]
async fn main() {
    println!("plans:");
    for plan in Plan::ALL {
        let bands: Vec<String> = plan
            .quotas()
            .iter()
            .map(|q| match q.is_unlimited() {
                true => "unlimited".to_owned(),
                false => format!("burst {} refilled in {}s", q.burst(), q.window_secs()),
            })
            .collect();
        println!("  {plan:<10}  {}", bands.join(", "));
    }
    let (addr, server) = serve_axum(app()).await;
    println!("\nserving on http://{addr}\n");

    if serve_mode() {
        println!("try:");
        println!("  curl -i -H 'authorization: Bearer free_k1' http://{addr}/search");
        println!("  curl -i -X POST -H 'authorization: Bearer pro_k2' http://{addr}/export");
        println!("  curl -i -H 'authorization: Bearer team-plus_k3' http://{addr}/");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return;
    }

    let client = Client::new(addr);
    let free = [("authorization", "Bearer free_k1")];
    let pro = [("authorization", "Bearer pro_k2")];
    let team = [("authorization", "Bearer team-plus_k3")];

    header();
    row("GET /", "free_k1", &client.get("/", &free).await);
    for _ in 0..2 {
        row("GET /search", "free_k1", &client.get("/search", &free).await);
    }
    row("GET /", "free_k1", &client.get("/", &free).await);
    row("GET /search", "pro_k2", &client.get("/search", &pro).await);
    let body = "{\"format\":\"csv\"}".into();
    row(
        "POST /export",
        "pro_k2",
        &client.send(Method::POST, "/export", &pro, body).await,
    );
    row(
        "POST /export",
        "free_k1",
        &client
            .send(Method::POST, "/export", &free, Default::default())
            .await,
    );
    for _ in 0..6 {
        row("GET /", "team-plus_k3", &client.get("/", &team).await);
    }

    println!(
        "\nfree_k1: 1 + 5 + 5 = 11 > 10, so the second search is refused (429) and costs nothing;\n\
         the next plain request still passes. An export (40) is more than the free burst (403).\n\
         team-plus: the 5/s band refuses the 6th request in a second."
    );
    server.abort();
}
