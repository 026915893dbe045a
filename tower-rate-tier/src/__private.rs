//! What the macros' expansions name. Not public API: no stability promise.
//!
//! Expansions reach this module as `::tower_rate_tier::__private` (or under
//! the name the user gave the dependency). Inside this crate, a test that
//! uses the macros needs `extern crate self as tower_rate_tier;`.

#[cfg(feature = "axum")]
pub use crate::cost::extract::TierCostGuard;
pub use crate::quota::Quota;
pub use crate::tier::ParseTierError;
pub use crate::tier::{IntoTierName, TierTable};
pub use core;

/// `#[tier_cost]` expansions call it: nothing with the `axum` feature, a
/// clear compile error without it.
pub use crate::__trt_require_axum as require_axum_feature;

#[cfg(feature = "axum")]
#[doc(hidden)]
#[macro_export]
macro_rules! __trt_require_axum {
    () => {};
}

#[cfg(not(feature = "axum"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __trt_require_axum {
    () => {
        ::core::compile_error!(
            "`#[tier_cost]` needs the `axum` feature of tower-rate-tier (enabled by default): \
             `tower-rate-tier = { features = [\"axum\"] }`"
        );
    };
}

/// Without `axum` the guard is a stand-in, so that the expansion's only
/// error is the one of `require_axum_feature!`.
#[cfg(not(feature = "axum"))]
#[derive(Debug)]
pub struct TierCostGuard<const N: u32>(());
