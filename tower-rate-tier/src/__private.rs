//! What the macros' expansions name. Not public API: no stability promise.

#[cfg(feature = "axum")]
pub use crate::cost::TierCostGuard;
pub use crate::quota::Quota;
pub use crate::tier::{IntoTierName, TierTable};
pub use core;
