//! The macro way: plans as a `#[rate_tiers]` enum, costs as `#[tier_cost]`.
//!
//! ```sh
//! cargo run --example axum_macros            # a self-test run, then exits
//! cargo run --example axum_macros -- --serve # keeps serving, for curl
//! ```
//!
//! One router-wide limiter charges each handler's declared cost exactly;
//! handlers without `#[tier_cost]` cost 1. The plan comes from the server's
//! record of the API key (parsed into the enum), never from what the client
//! sends. The self-test run checks every row it prints and exits with
//! status 1 if one differs.

use std::process::ExitCode;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use http::{HeaderMap, Method};
use tower_rate_tier::{RateTier, TierIdentity, TierLimitLayer, rate_tiers, tier_cost};
use tower_rate_tier_examples::{Client, SelfTest, serve_axum, serve_forever, serve_mode, want};

/// The plans. Each mistake in a `#[tier(..)]` is a compile error.
#[rate_tiers]
pub enum Plan {
    /// 10 a minute; also the plan of clients without a key.
    #[tier(per_minute = 10, default)]
    Free,
    /// 1,000 an hour, at most 100 at once.
    #[tier(per_hour = 1_000, burst = 100)]
    Pro,
    /// Two bands: 5 a minute and 10,000 a day.
    #[tier(per_minute = 5, per_day = 10_000, name = "team-plus")]
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

/// The API keys: key -> (account, plan), with the plan stored by name as a
/// database would hold it. A client cannot pick its plan: it only has its key.
const API_KEYS: &[(&str, &str, &str)] = &[
    ("sk_1f9c", "acct_free", "free"),
    ("sk_8a2e", "acct_pro", "pro"),
    ("sk_5d07", "acct_team", "team-plus"),
];

/// `authorization: Bearer <key>`, looked up in [`API_KEYS`].
fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let key = headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let (_, account, plan) = API_KEYS.iter().find(|(k, _, _)| *k == key)?;
    let plan: Plan = plan.parse().ok()?; // "pro" -> Plan::Pro; unknown names fail
    Some(TierIdentity::new(*account, plan))
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
async fn main() -> ExitCode {
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
        println!("  curl -i -H 'authorization: Bearer sk_1f9c' http://{addr}/search     # free");
        println!("  curl -i -X POST -H 'authorization: Bearer sk_8a2e' http://{addr}/export  # pro");
        println!("  curl -i -H 'authorization: Bearer sk_5d07' http://{addr}/           # team-plus");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return ExitCode::SUCCESS;
    }

    let client = Client::new(addr);
    let free = [("authorization", "Bearer sk_1f9c")];
    let pro = [("authorization", "Bearer sk_8a2e")];
    let team = [("authorization", "Bearer sk_5d07")];

    let mut test = SelfTest::new();
    test.equal("Plan::TeamPlus.name()", Plan::TeamPlus.name(), "team-plus");
    test.equal(
        "\"pro\".parse::<Plan>()",
        "pro".parse::<Plan>().ok(),
        Some(Plan::Pro),
    );
    test.row(
        "GET /",
        "free",
        &client.get("/", &free).await,
        want(200, "9", "-"),
    );
    test.row(
        "GET /search",
        "free",
        &client.get("/search", &free).await,
        want(200, "4", "-"),
    );
    // 1 + 5 + 5 = 11 > 10: refused, and it costs nothing; it lacks one unit,
    // which comes back in 6 s
    test.row(
        "GET /search",
        "free",
        &client.get("/search", &free).await,
        want(429, "4", "6"),
    );
    test.row(
        "GET /",
        "free",
        &client.get("/", &free).await,
        want(200, "3", "-"),
    );
    test.row(
        "GET /search",
        "pro",
        &client.get("/search", &pro).await,
        want(200, "95", "-"),
    );
    let body = "{\"format\":\"csv\"}".into();
    let reply = client.send(Method::POST, "/export", &pro, body).await;
    test.row("POST /export", "pro", &reply, want(200, "55", "-"));
    // 40 is more than the free burst of 10: it can never pass
    let reply = client
        .send(Method::POST, "/export", &free, Default::default())
        .await;
    test.row("POST /export", "free", &reply, want(403, "-", "-"));
    for remaining in ["4", "3", "2", "1", "0"] {
        test.row(
            "GET /",
            "team-plus",
            &client.get("/", &team).await,
            want(200, remaining, "-"),
        );
    }
    // the 5-a-minute band refuses the 6th: a unit comes back in 12 s
    test.row(
        "GET /",
        "team-plus",
        &client.get("/", &team).await,
        want(429, "0", "12"),
    );
    // a key that is not in the table: unidentified, the free plan by address
    let forged = [("authorization", "Bearer sk_enterprise")];
    test.row(
        "GET /",
        "unknown key",
        &client.get("/", &forged).await,
        want(200, "9", "-"),
    );

    println!(
        "\nfree: 1 + 5 + 5 = 11 > 10, so the second search is refused (429) and costs nothing;\n\
         the next plain request still passes. An export (40) is more than the free burst (403).\n\
         team-plus: the 5/min band refuses the 6th request in a minute."
    );
    server.abort();
    test.finish()
}
