//! `#[rate_tiers]` and `#[tier_cost]` add no warning, even with the lints a
//! careful library turns on.
#![deny(
    warnings,
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    unused_qualifications
)]

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use trt::{Quota, RateTier, TierIdentity, TierLimitLayer, TierTable, rate_tiers, tier_cost};

/// The plans (public, documented).
#[rate_tiers]
pub enum Plan {
    /// Free users.
    #[tier(per_hour = 100, default)]
    Free,
    /// Paying users.
    #[tier(per_hour = 5_000, burst = 200)]
    Pro,
    /// Teams.
    #[tier(per_minute = 600, name = "team-plus")]
    TeamPlus,
    /// Two bands.
    #[tier(per_second = 5, per_day = 10_000)]
    Startup,
    /// No limit.
    #[tier(unlimited)]
    Enterprise,
}

mod internal {
    /// A private table: its items are as private as the enum, and unused
    /// ones are no dead code.
    #[trt::rate_tiers]
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum Probe {
        #[tier(per_second = 1)]
        Health,
        #[cfg(any())]
        #[tier(per_second = 2, default)]
        Gone,
    }
}

/// The app's state.
#[derive(Clone, Debug)]
pub struct App {
    greeting: &'static str,
}

/// A public, documented handler without arguments.
#[tier_cost(0)]
pub async fn health() -> &'static str {
    "up"
}

/// State and a body extractor, checked by `debug_handler`.
#[tier_cost(5)]
#[axum::debug_handler(state = App)]
pub(crate) async fn search(State(app): State<App>, body: String) -> String {
    format!("{} {body}", app.greeting)
}

/// A generic handler with a where clause.
#[tier_cost(2)]
async fn echo<T>(State(_): State<T>, mut body: String) -> String
where
    T: Clone + Send + Sync + 'static,
{
    body.push('!');
    body
}

fn main() {
    assert_eq!(Plan::ALL.len(), 5);
    assert_eq!(Plan::Pro.quotas(), [Quota::per_hour(5_000).with_burst(200)]);
    assert_eq!("team-plus".parse::<Plan>(), Ok(Plan::TeamPlus));
    assert_eq!(Plan::Enterprise.to_string(), "enterprise");
    assert_eq!(Plan::default_tier(), Some(Plan::Free));
    assert_eq!(internal::Probe::default_tier(), None);
    assert_eq!(internal::Probe::Health.name(), "health");

    let tiers = RateTier::builder().tiers::<Plan>().build();
    assert_eq!(tiers.default_tier(), Some("free"));
    let limiter = TierLimitLayer::new(tiers).identifier_fn(|headers| {
        let user = headers.get("x-user")?.to_str().ok()?;
        Some(TierIdentity::new(user, Plan::Pro))
    });
    let _app: Router = Router::new()
        .route("/health", get(health))
        .route("/search", post(search))
        .route("/echo", post(echo::<App>))
        .layer(limiter)
        .with_state(App { greeting: "hello" });
}
