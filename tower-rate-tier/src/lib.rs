//! Tiered API rate limiting for [tower] and [axum](https://docs.rs/axum).
//!
//! SaaS APIs limit users by plan (free, pro, enterprise). This crate gives
//! each plan a [`Quota`] (or several bands that must all admit a request),
//! counts requests with the GCRA (see [`quota`]), keeps the state in memory or in
//! Redis ([`storage`]), and answers 429 with the standard headers
//! ([`response`]).
//!
//! * [`RateTier`]: the tiers and their quotas, built with
//!   [`RateTier::builder`] or from a `#[rate_tiers]` enum; it decides
//!   ([`RateTier::check`]) and also works without HTTP.
//! * [`TierLimitLayer`]: the tower layer. One router-wide layer identifies the
//!   client ([`identity`]), resolves the tier ([`OnMissing`],
//!   [`OnUnknownTier`], see [`policy`]), charges the request's cost and
//!   refuses what does not fit. Refusals travel in a [`ResponseBody`], so the
//!   inner service's body type is never built by the limiter.
//! * Costs ([`cost`]): [`#[tier_cost(n)]`](macro@tier_cost) on a handler, the
//!   [`tier_cost(n)`](fn@tier_cost) route layer, a [`TierCost`] extension, or
//!   [`TierLimitLayer::cost_fn`]; each is charged exactly once.
//! * Concurrency limits ([`RateTierBuilder::tier_concurrency`]): at most N
//!   requests of one user in flight.
//! * Usage-based quotas ([`RateTierBuilder::tier_unit`]): tokens, bytes or
//!   any unit, reserved and recorded by a handler through [`TierUsage`]
//!   once it knows the usage; `content-bytes` counted from response bodies.
//! * Macros (feature `macros`, default): [`#[rate_tiers]`](macro@rate_tiers)
//!   turns an enum into a tier table, [`#[tier_cost]`](macro@tier_cost) gives
//!   a handler its cost.
//! * gRPC (feature `grpc`): tonic calls are refused as RESOURCE_EXHAUSTED
//!   with RetryInfo and QuotaFailure details; methods are priced by path
//!   ([`grpc`]).
//! * Metrics (feature `metrics`): requests by tier and outcome, storage
//!   latency and errors, through the `metrics` facade
//!   ([`metrics`]).
//! * Tests: [`clock::FakeClock`] moves time by hand.
//!
//! ```
//! # #[cfg(feature = "axum")] {
//! use axum::{Router, routing::get};
//! use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, tier_cost};
//!
//! /// API key -> (account, plan): the server's own records (a database in a
//! /// real service). The plan never comes from what the client sends.
//! fn account_of(api_key: &str) -> Option<(&'static str, &'static str)> {
//!     match api_key {
//!         "key-acme" => Some(("acme", "pro")),
//!         "key-ada" => Some(("ada", "free")),
//!         _ => None, // unidentified: the default tier, keyed by address
//!     }
//! }
//!
//! let tiers = RateTier::builder()
//!     .tier("free", Quota::per_minute(10))
//!     .tier("pro", Quota::per_minute(100))
//!     .tier("enterprise", Quota::unlimited())
//!     .default_tier("free")
//!     .build();
//! assert_eq!(tiers.quotas("pro").as_deref(), Some(&[Quota::per_minute(100)][..]));
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))                               // costs 1
//!     .route("/search", get(|| async { "results" }).layer(tier_cost(5)))  // costs 5
//!     .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(|headers| {
//!         let (account, plan) = account_of(headers.get("x-api-key")?.to_str().ok()?)?;
//!         Some(TierIdentity::new(account, plan))
//!     }));
//! # let _ = app;
//! # }
//! ```
//!
//! The same decision without HTTP:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tower_rate_tier::{Quota, RateTier};
//!
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).build();
//!
//! let info = tiers.check("user-1", "free", 3).await.unwrap().unwrap();
//! assert_eq!((info.limit, info.remaining), (10, 7));
//! let refused = tiers.check("user-1", "free", 8).await.unwrap().unwrap_err();
//! assert_eq!(refused.remaining, 7); // a refused check consumes nothing
//! # }
//! ```
//!
//! The `README.md` at the root of the repository walks through installing
//! (a `path` dependency on your clone, or `git` with the URL you cloned
//! from), identification, policies, headers, Redis and testing; the
//! repository's `examples/` run as they are and check what they print.
//! `MIGRATING.md` there covers moving from the crates.io 0.3 line.
//!
//! [tower]: https://docs.rs/tower
#![cfg_attr(docsrs, feature(doc_cfg))]
// The outcome types carry every band's state inline (no allocation per
// request), which makes them larger than clippy's default thresholds; the
// nested `Result` shape of `RateTier::check` is the public contract.
#![allow(clippy::result_large_err, clippy::large_enum_variant)]

#[doc(hidden)]
pub mod __private;
pub mod body;
pub mod clock;
pub mod cost;
mod event;
mod gcra;
#[cfg(feature = "grpc")]
pub mod grpc;
mod headers;
pub mod identity;
mod limit;
mod meter;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod policy;
mod problem;
pub mod quota;
mod refusal;
pub mod response;
mod slot;
pub mod storage;
mod throttle;
pub mod tier;
mod usage;
#[cfg(test)]
mod warnings_for_tests;

pub use async_trait::async_trait;
pub use body::ResponseBody;
pub use cost::{TierCost, TierCostFuture, TierCostLayer, TierCostService, tier_cost};
pub use event::RateLimitEvent;
pub use headers::RateLimitHeaders;
pub use identity::{IpNet, PeerAddr, ProxyHeader, TierIdentifier, TierIdentity};
#[cfg(feature = "buffered-body")]
pub use limit::{BufferedTierLimitLayer, BufferedTierLimitService};
pub use limit::{ResponseFuture, TierLimitLayer, TierLimitService};
pub use policy::{OnMissing, OnStorageError, OnUnknownTier};
pub use quota::{IntoQuotas, Quota, QuotaError};
pub use tier::{
    BuildError, CheckError, CheckResult, IntoTierName, ParseTierError, RateLimitInfo, RateLimited, RateTier,
    RateTierBuilder, TierTable,
};
#[cfg(feature = "macros")]
pub use tower_rate_tier_macros::{rate_tiers, tier_cost};
pub use usage::{TierRefusal, TierUsage};

/// The README's code blocks, compiled and run as doc tests (they use the
/// default features).
#[cfg(all(doctest, feature = "macros", feature = "axum"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
