//! `#[rate_tiers]` and `#[tier_cost]` add no warning, even with the lints a
//! careful library turns on.
#![deny(
    warnings,
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    unused_qualifications
)]

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use trt::{Quota, RateTier, TierIdentity, TierLimitLayer, TierTable, rate_tiers, tier_cost};

/// The plans (public, documented).
#[rate_tiers]
pub enum Plan {
    /// Free users, with units besides requests.
    #[tier(per_hour = 100, default)]
    #[tier(unit = "tokens", per_minute = 40_000, per_day = 1_000_000)]
    #[tier(unit = "content-bytes", per_hour = limits::BYTES_PER_HOUR)]
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
    /// No limit on requests; a limit on tokens.
    #[tier(unlimited)]
    #[tier(unit = "tokens", count = 1_000_000, period_secs = 3_600)]
    Enterprise,
}

/// Limits kept as constants.
pub mod limits {
    /// Configured users per hour.
    pub const PER_HOUR: u32 = 100;
    /// Their burst.
    pub const BURST: u32 = 20;
    /// Thirty days.
    pub const MONTH_SECS: u64 = 30 * 86_400;
    /// What an export costs (nothing).
    pub const EXPORT_COST: u32 = 0;
    /// Content bytes per hour of free users.
    pub const BYTES_PER_HOUR: u32 = 100 << 20;
}

/// The other keys: `const` paths, `per_week`, `count` with `period_secs`.
#[rate_tiers]
pub enum Extended {
    /// A `const` count and burst.
    #[tier(per_hour = limits::PER_HOUR, burst = limits::BURST)]
    Configured,
    /// A week, counted by an associated `const`.
    #[tier(per_week = Self::WEEKLY)]
    Weekly,
    /// Thirty days, refilled continuously.
    #[tier(count = 3_000, period_secs = limits::MONTH_SECS)]
    Monthly,
    /// Configured away, with a `const` that does not exist.
    #[cfg(any())]
    #[tier(per_hour = limits::GONE)]
    Gone,
    /// Deprecated: the generated items use it without a warning.
    #[deprecated = "use `Monthly`"]
    #[tier(per_day = 100, default)]
    #[tier(unit = "tokens", per_day = 1_000)]
    Legacy,
}

/// A deprecated table: the generated items use it without a warning.
#[deprecated = "use `Plan`"]
#[rate_tiers]
pub enum OldPlan {
    /// Its only tier, deprecated too.
    #[deprecated = "use `Plan::Free`"]
    #[tier(per_hour = limits::PER_HOUR, burst = limits::BURST, concurrent = 2, shadow)]
    #[tier(unit = "tokens", count = 10, period_secs = limits::MONTH_SECS)]
    Free,
}

impl Extended {
    /// Requests per week of `Weekly`.
    pub const WEEKLY: u32 = 1_000;
}

mod internal {
    /// A private table: its items are as private as the enum, and unused
    /// ones are no dead code.
    #[trt::rate_tiers]
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum Probe {
        #[tier(per_second = 1)]
        #[tier(unit = "checks", per_second = 1)]
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

/// A cost from a `const`.
#[tier_cost(limits::EXPORT_COST)]
pub async fn export() -> &'static str {
    "done"
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
    assert_eq!(
        Plan::Free.tier_units(),
        [
            ("tokens", &[Quota::per_minute(40_000), Quota::per_day(1_000_000)][..]),
            ("content-bytes", &[Quota::per_hour(100 << 20)][..]),
        ]
    );
    let hour = Duration::from_secs(3_600);
    assert_eq!(
        Plan::Enterprise.tier_units(),
        [("tokens", &[Quota::per_period(1_000_000, hour)][..])]
    );
    assert_eq!(Plan::Pro.tier_units(), []);
    assert_eq!(internal::Probe::Health.tier_units()[0].0, "checks");

    assert_eq!(Extended::Configured.quotas(), [Quota::per_hour(100).with_burst(20)]);
    assert_eq!(Extended::Weekly.quotas(), [Quota::per_week(1_000)]);
    let month = Duration::from_secs(30 * 86_400);
    assert_eq!(Extended::Monthly.quotas(), [Quota::per_period(3_000, month)]);
    assert_eq!(Extended::ALL.len(), 4);
    assert_eq!(Extended::default_tier().map(Extended::name), Some("legacy"));

    let tiers = RateTier::builder().tiers::<Plan>().build();
    assert_eq!(tiers.default_tier().as_deref(), Some("free"));
    let limiter = TierLimitLayer::new(tiers).identifier_fn(|headers| {
        let user = headers.get("x-user")?.to_str().ok()?;
        Some(TierIdentity::new(user, Plan::Pro))
    });
    let _app: Router = Router::new()
        .route("/health", get(health))
        .route("/export", get(export))
        .route("/search", post(search))
        .route("/echo", post(echo::<App>))
        .layer(limiter)
        .with_state(App { greeting: "hello" });
}
