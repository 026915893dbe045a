//! Tiered API rate limiting for [tower] and [axum](https://docs.rs/axum).
//!
//! SaaS APIs limit users by plan (free, pro, enterprise). This crate gives
//! each plan a [`Quota`] (or several bands that must all admit a request),
//! counts requests with the GCRA, keeps state in memory or in Redis, and
//! (in the layer) answers 429 with the standard headers.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tower_rate_tier::{Quota, RateTier};
//!
//! let tiers = RateTier::builder()
//!     .tier("free", Quota::per_minute(10))
//!     .tier("pro", Quota::per_minute(100))
//!     .tier("enterprise", Quota::unlimited())
//!     .default_tier("free")
//!     .build();
//!
//! let info = tiers.check("user-1", "free", 1).await.unwrap().unwrap();
//! assert_eq!((info.limit, info.remaining), (10, 9));
//! # }
//! ```
//!
//! [tower]: https://docs.rs/tower
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(hidden)]
pub mod __private;
pub mod clock;
pub mod gcra;
pub mod quota;
pub mod storage;
pub mod tier;
mod tier_name;

pub use async_trait::async_trait;
pub use quota::{IntoQuotas, Quota};
pub use tier::{
    BuildError, CheckError, CheckResult, IntoTierName, OnMissing, RateLimitInfo, RateLimited, RateTier,
    RateTierBuilder, TierTable,
};
pub use tier_name::ParseTierError;
#[cfg(feature = "macros")]
pub use tower_rate_tier_macros::{rate_tiers, tier_cost};
