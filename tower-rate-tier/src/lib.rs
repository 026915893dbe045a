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
// The outcome types carry every band's state inline (no allocation per
// request), which makes them larger than clippy's default thresholds; the
// nested `Result` shape of `RateTier::check` is the public contract.
#![allow(clippy::result_large_err, clippy::large_enum_variant)]

#[doc(hidden)]
pub mod __private;
#[cfg(feature = "buffered-body")]
pub mod body;
pub mod clock;
pub mod cost;
mod future;
pub mod gcra;
pub mod identity;
mod layer;
pub mod quota;
pub mod response;
mod service;
pub mod storage;
pub mod tier;
mod tier_name;

pub use async_trait::async_trait;
#[cfg(feature = "buffered-body")]
pub use body::{BufferedTierLimitLayer, BufferedTierLimitService};
pub use cost::{TierCost, TierCostLayer, TierCostService, tier_cost};
pub use future::ResponseFuture;
pub use identity::{PeerAddr, TierIdentifier, TierIdentity};
pub use layer::{OnStorageError, OnUnknownTier, RateLimitEvent, TierLimitLayer};
pub use quota::{IntoQuotas, Quota};
pub use service::TierLimitService;
pub use tier::{
    BuildError, CheckError, CheckResult, IntoTierName, OnMissing, RateLimitInfo, RateLimited, RateTier,
    RateTierBuilder, TierTable,
};
pub use tier_name::ParseTierError;
#[cfg(feature = "macros")]
pub use tower_rate_tier_macros::{rate_tiers, tier_cost};
