//! What the macros' expansions name. Not public API: no stability promise.

pub use crate::quota::Quota;
pub use crate::tier::{IntoTierName, TierTable};
pub use core;
