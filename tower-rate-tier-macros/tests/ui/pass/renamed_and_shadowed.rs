//! The runtime is a dependency named `trt`, and the user's crate shadows
//! every name a careless expansion would use: the expansions name only
//! `::core` and `::trt::__private`.
#![no_implicit_prelude]
#![allow(dead_code, non_camel_case_types)]

extern crate std as the_std;

mod core {}
mod std {}
mod tower_rate_tier {}
mod axum {}
struct Quota;
struct TierTable;
struct ParseTierError;
struct TierCostGuard;
struct Option;
struct Result;
struct str;
trait Clone {}
trait Copy {}
trait Debug {}

#[::trt::rate_tiers]
enum Plan {
    #[tier(per_hour = 100)]
    Free,
    // Variants may be named like what the expansion uses.
    #[tier(per_hour = 5_000, name = "pro")]
    Some,
    #[tier(unlimited, default)]
    #[tier(unit = "tokens", per_minute = 1_000)]
    None,
    #[cfg(any())]
    #[tier(per_hour = 1)]
    Ok,
}

#[::trt::tier_cost(2)]
async fn ping() -> &'static ::core::primitive::str {
    "pong"
}

#[::trt::tier_cost(3)]
async fn echo(body: ::the_std::string::String) -> ::the_std::string::String {
    body
}

fn main() {
    use the_std::{assert, assert_eq};
    assert_eq!(Plan::ALL, [Plan::Free, Plan::Some, Plan::None]);
    assert_eq!(Plan::Some.name(), "pro");
    assert_eq!(Plan::Some.quotas(), [::trt::Quota::per_hour(5_000)]);
    assert_eq!(
        <Plan as ::trt::TierTable>::default_tier(),
        ::core::option::Option::Some(Plan::None)
    );
    assert_eq!("none".parse::<Plan>(), ::core::result::Result::Ok(Plan::None));
    assert!("ok".parse::<Plan>().is_err());
    assert_eq!(
        <Plan as ::trt::TierTable>::tier_units(Plan::None),
        [("tokens", &[::trt::Quota::per_minute(1_000)][..])]
    );

    let _app: ::axum::Router = ::axum::Router::new()
        .route("/ping", ::axum::routing::get(ping))
        .route("/echo", ::axum::routing::post(echo));
}
