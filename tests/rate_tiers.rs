//! `#[rate_tiers]` as a user sees it: the enum's tables, parsing, display,
//! and the limiter built from it.

use std::collections::HashSet;
use std::time::Duration;

use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{ParseTierError, Quota, RateTier, TierTable, rate_tiers};

/// The plans of the API contract.
#[rate_tiers]
#[derive(PartialOrd, Ord)]
pub enum Plan {
    /// Anonymous and free users.
    #[tier(per_hour = 100, default)]
    Free,
    /// Paying users.
    #[tier(per_hour = 5_000, burst = 200)]
    Pro,
    /// Teams, under a name of their own.
    #[tier(per_minute = 600, name = "team-plus")]
    TeamPlus,
    /// Two bands: a short burst limit and a daily cap.
    #[tier(per_second = 5, per_day = 10_000)]
    Startup,
    /// No limit.
    #[tier(unlimited)]
    Enterprise,
}

/// A table with no default, a variant configured away, and a user derive
/// that the macro must not repeat.
#[rate_tiers]
#[derive(Debug, Clone, Copy)]
enum Internal {
    #[tier(per_second = 1)]
    HTTPProbe,
    #[cfg(any())]
    #[tier(per_second = 2)]
    Gone,
    #[tier(per_minute = 3u32)]
    Batch2,
}

/// Limits kept as constants, as a service reads them from its settings
/// module.
mod limits {
    pub(crate) const FREE_PER_HOUR: u32 = 250;
    pub(crate) const TEAM_BURST: u32 = 40;
    pub(crate) const MONTH_SECS: u64 = 30 * 86_400;
}

/// The other ways to write a band: `const` paths, `per_week`, and any period
/// with `count` and `period_secs`.
#[rate_tiers]
enum Configured {
    #[tier(per_hour = limits::FREE_PER_HOUR)]
    Free,
    #[tier(per_minute = 600, burst = limits::TEAM_BURST)]
    Team,
    #[tier(per_week = 10_000)]
    Weekly,
    #[tier(count = 50, period_secs = 900)]
    Quarter,
    #[tier(count = 3_000, period_secs = limits::MONTH_SECS)]
    Monthly,
    // The custom band keeps its place among the others.
    #[tier(per_second = 5, period_secs = 3_600, count = limits::FREE_PER_HOUR, per_day = 2_000)]
    Mixed,
}

/// Units besides requests: each unit attribute opens a band set of its
/// own, while attributes without `unit` merge.
#[rate_tiers]
enum Metered {
    #[tier(per_minute = 20, default)]
    #[tier(unit = "tokens", per_minute = 40_000, per_day = 1_000_000)]
    #[tier(concurrent = 2)]
    #[tier(unit = "content-bytes", per_hour = 104_857_600)]
    Free,
    #[tier(per_minute = 600)]
    #[tier(unit = "tokens", count = limits::FREE_PER_HOUR, period_secs = limits::MONTH_SECS)]
    #[tier(unit = "images_v2", burst = limits::TEAM_BURST, per_second = 2)]
    Team,
    #[tier(per_hour = 1)]
    Trial,
    #[tier(unlimited)]
    #[tier(unit = "tokens", per_minute = 1_000_000)]
    Enterprise,
    #[cfg(any())]
    #[tier(per_hour = 1)]
    #[tier(unit = "tokens", per_hour = 1)]
    Gone,
}

#[test]
fn all_lists_the_tiers_in_declaration_order() {
    assert_eq!(
        Plan::ALL,
        [
            Plan::Free,
            Plan::Pro,
            Plan::TeamPlus,
            Plan::Startup,
            Plan::Enterprise
        ]
    );
    assert_eq!(<Plan as TierTable>::all(), Plan::ALL);
    assert_eq!(Internal::ALL, [Internal::HTTPProbe, Internal::Batch2]);
}

#[test]
fn names_are_snake_case_unless_given() {
    let names: Vec<&str> = Plan::ALL.iter().map(|plan| plan.name()).collect();
    assert_eq!(names, ["free", "pro", "team-plus", "startup", "enterprise"]);
    assert_eq!(Internal::HTTPProbe.name(), "http_probe");
    assert_eq!(Internal::Batch2.name(), "batch2");
    assert_eq!(Plan::TeamPlus.tier_name(), "team-plus");
    // `name` and `quotas` are `const fn`.
    const PRO: &str = Plan::Pro.name();
    assert_eq!(PRO, "pro");
}

#[test]
fn quotas_are_the_configured_bands() {
    assert_eq!(Plan::Free.quotas(), [Quota::per_hour(100)]);
    assert_eq!(Plan::Pro.quotas(), [Quota::per_hour(5_000).with_burst(200)]);
    assert_eq!(Plan::TeamPlus.quotas(), [Quota::per_minute(600)]);
    assert_eq!(
        Plan::Startup.quotas(),
        [Quota::per_second(5), Quota::per_day(10_000)]
    );
    assert_eq!(Plan::Enterprise.quotas(), [Quota::unlimited()]);
    assert_eq!(Internal::Batch2.tier_quotas(), [Quota::per_minute(3)]);
    const PRO: &[Quota] = Plan::Pro.quotas();
    assert_eq!(PRO[0].burst(), 200);
}

#[test]
fn consts_weeks_and_any_period_give_the_same_quotas_as_the_constructors() {
    assert_eq!(Configured::Free.quotas(), [Quota::per_hour(250)]);
    assert_eq!(Configured::Team.quotas(), [Quota::per_minute(600).with_burst(40)]);
    assert_eq!(Configured::Weekly.quotas(), [Quota::per_week(10_000)]);
    assert_eq!(
        Configured::Quarter.quotas(),
        [Quota::per_period(50, Duration::from_secs(900))]
    );
    let month = Duration::from_secs(30 * 86_400);
    assert_eq!(Configured::Monthly.quotas(), [Quota::per_period(3_000, month)]);
    assert_eq!(
        Configured::Mixed.quotas(),
        [Quota::per_second(5), Quota::per_hour(250), Quota::per_day(2_000)]
    );
    // What the headers advertise: the period, in seconds.
    let windows: Vec<u64> = Configured::ALL
        .iter()
        .map(|t| t.quotas()[0].window_secs())
        .collect();
    assert_eq!(windows, [3_600, 4, 604_800, 900, 2_592_000, 1]);
}

#[tokio::test]
async fn a_thirty_day_tier_refills_continuously() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .tiers::<Configured>()
        .clock(clock.clone())
        .build();
    for _ in 0..3_000 {
        assert!(tiers.check("ada", "monthly", 1).await.unwrap().is_ok());
    }
    let denied = tiers.check("ada", "monthly", 1).await.unwrap().unwrap_err();
    // 30 days / 3,000: one more request every 864 s, not on the 31st.
    assert_eq!(denied.retry_after, Duration::from_secs(864));
    clock.advance(Duration::from_secs(864));
    assert!(tiers.check("ada", "monthly", 1).await.unwrap().is_ok());
    assert!(tiers.check("ada", "monthly", 1).await.unwrap().is_err());
}

#[test]
fn unit_attributes_give_each_unit_its_bands_in_attribute_order() {
    assert_eq!(
        Metered::Free.tier_units(),
        [
            (
                "tokens",
                &[Quota::per_minute(40_000), Quota::per_day(1_000_000)][..]
            ),
            ("content-bytes", &[Quota::per_hour(104_857_600)][..]),
        ]
    );
    let month = Duration::from_secs(30 * 86_400);
    assert_eq!(
        Metered::Team.tier_units(),
        [
            ("tokens", &[Quota::per_period(250, month)][..]),
            ("images_v2", &[Quota::per_second(2).with_burst(40)][..]),
        ]
    );
    assert_eq!(Metered::Trial.tier_units(), []);
    // An unlimited tier may limit its units.
    assert_eq!(Metered::Enterprise.quotas(), [Quota::unlimited()]);
    assert_eq!(
        Metered::Enterprise.tier_units(),
        [("tokens", &[Quota::per_minute(1_000_000)][..])]
    );
    // The request attributes merged, and the units are none of their bands.
    assert_eq!(Metered::Free.quotas(), [Quota::per_minute(20)]);
    assert_eq!(Metered::Free.tier_concurrency(), Some(2));
    assert_eq!(Metered::default_tier(), Some(Metered::Free));
    assert_eq!(Metered::ALL.len(), 4);
}

#[test]
fn a_table_without_unit_attributes_has_no_units() {
    for &plan in Plan::ALL {
        assert_eq!(plan.tier_units(), [], "{plan}");
    }
}

#[test]
fn parses_names_and_names_the_known_ones_on_error() {
    for &plan in Plan::ALL {
        assert_eq!(plan.name().parse::<Plan>(), Ok(plan));
    }
    assert_eq!("team-plus".parse::<Plan>(), Ok(Plan::TeamPlus));
    // The variant's own snake case is not a name when `name` is given.
    let error: ParseTierError = "team_plus".parse::<Plan>().unwrap_err();
    assert_eq!(error.name(), "team_plus");
    assert_eq!(
        error.known(),
        ["free", "pro", "team-plus", "startup", "enterprise"]
    );
    assert_eq!(
        error.to_string(),
        "unknown tier `team_plus` (known tiers: `free`, `pro`, `team-plus`, `startup`, `enterprise`)"
    );
    // Case matters, like in the limiter.
    assert!("Pro".parse::<Plan>().is_err());
    // A variant configured away is not known.
    assert_eq!(
        "gone".parse::<Internal>().unwrap_err().known(),
        ["http_probe", "batch2"]
    );
    let boxed: Box<dyn std::error::Error> = Box::new(error);
    assert!(boxed.to_string().starts_with("unknown tier"));
}

#[test]
fn display_is_the_name() {
    assert_eq!(Plan::TeamPlus.to_string(), "team-plus");
    assert_eq!(format!("[{:>6}]", Plan::Pro), "[   pro]");
    assert_eq!(format!("{:?}", Plan::Pro), "Pro");
}

#[test]
fn derives_what_a_tier_table_needs() {
    let set: HashSet<Plan> = Plan::ALL.iter().copied().collect();
    assert_eq!(set.len(), 5);
    assert!(Plan::Free < Plan::Enterprise);
    assert_eq!(Internal::HTTPProbe, Internal::HTTPProbe);
}

#[test]
fn the_default_tier_is_the_marked_one() {
    assert_eq!(Plan::default_tier(), Some(Plan::Free));
    assert_eq!(Internal::default_tier(), None);
}

#[tokio::test]
async fn the_builder_takes_every_tier_and_the_default() {
    let tiers = RateTier::builder()
        .tiers::<Plan>()
        .clock(FakeClock::new())
        .build();
    let names = tiers.tier_names();
    assert_eq!(names.len(), 5);
    for &plan in Plan::ALL {
        assert!(names.iter().any(|n| n == plan.name()), "{plan} missing");
        assert_eq!(tiers.quotas(plan.name()).as_deref(), Some(plan.quotas()));
    }
    assert_eq!(tiers.default_tier().as_deref(), Some("free"));

    // Pro: a burst of 200, then denied.
    for _ in 0..200 {
        assert!(tiers.check("ada", Plan::Pro.name(), 1).await.unwrap().is_ok());
    }
    let denied = tiers.check("ada", "pro", 1).await.unwrap().unwrap_err();
    assert_eq!(denied.limit, 200);
    // 5_000 per hour: one more every 720 ms.
    assert_eq!(denied.retry_after.as_millis(), 720);

    // A table without a default leaves the builder's own.
    let tiers = RateTier::builder().tiers::<Internal>().build();
    assert_eq!(tiers.default_tier().as_deref(), None);
}

/// `#[tier(.., shadow)]` dark-launches one plan: decided, never refused.
#[tokio::test]
async fn a_shadow_tier_from_the_enum_is_never_refused() {
    #[rate_tiers]
    enum Launch {
        #[tier(per_minute = 1, default)]
        Free,
        #[tier(per_minute = 1, shadow)]
        Beta,
    }
    assert!(Launch::Beta.tier_shadow() && !Launch::Free.tier_shadow());
    let tiers = RateTier::builder()
        .tiers::<Launch>()
        .clock(FakeClock::new())
        .build();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(
            tower_rate_tier::TierLimitLayer::new(tiers)
                .identifier_fn(tower_rate_tier_tests::reply::header_identity),
        );
    let status = |tier: &'static str| {
        let app = app.clone();
        async move {
            let req = http::Request::get("/")
                .header("x-user", "ada")
                .header("x-tier", tier);
            tower_rate_tier_tests::reply::send(&app, req.body(axum::body::Body::empty()).unwrap())
                .await
                .status
                .as_u16()
        }
    };
    assert_eq!([status("free").await, status("free").await], [200, 429]);
    assert_eq!([status("beta").await, status("beta").await], [200, 200]);
}

/// An identity made from an enum value finds its tier wherever the table
/// has it: after tiers added before the enum's, after a removal that moves
/// the enum's tiers, and after its `tier` field was changed to another name.
#[tokio::test]
async fn a_typed_identity_finds_its_tier_wherever_the_table_has_it() {
    let tiers = RateTier::builder()
        .tier("legacy", Quota::per_hour(1))
        .tier("beta", Quota::per_hour(2))
        .tiers::<Plan>()
        .clock(FakeClock::new())
        .build();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(tower_rate_tier::TierLimitLayer::new(tiers.clone()).identifier_fn(
            |headers: &http::HeaderMap| {
                let user = headers.get("x-user")?.to_str().ok()?;
                let mut identity = tower_rate_tier::TierIdentity::new(user, Plan::Pro);
                if user.starts_with("renamed") {
                    identity.tier = "team-plus".into();
                }
                Some(identity)
            },
        ));
    let policy = |user: &'static str| {
        let app = app.clone();
        async move {
            let req = http::Request::get("/").header("x-user", user);
            let reply =
                tower_rate_tier_tests::reply::send(&app, req.body(axum::body::Body::empty()).unwrap()).await;
            assert_eq!(reply.status, http::StatusCode::OK);
            reply.header("ratelimit-policy").map(str::to_owned)
        }
    };
    let pro = Some(r#""pro";q=200;w=144"#.to_owned());
    let team = Some(r#""team-plus";q=600;w=60"#.to_owned());
    assert_eq!(policy("ada").await, pro);
    assert_eq!(policy("renamed-ada").await, team);
    assert!(tiers.remove_tier("legacy"));
    assert_eq!(policy("bob").await, pro);
    assert_eq!(policy("renamed-bob").await, team);
    // the tier replaced under the same name, now from a string
    tiers.set_tier("pro", Quota::per_hour(6)).unwrap();
    assert_eq!(policy("carol").await, Some(r#""pro";q=6;w=3600"#.to_owned()));
}
