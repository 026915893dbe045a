//! [`RateLimitEvent`]: what the limiter reports to operators.

use crate::storage::StorageError;
use crate::tier::RateLimited;

/// Something the limiter decided that an operator may want to know; see
/// [`TierLimitLayer::on_event`](crate::TierLimitLayer::on_event). The same events are emitted as `tracing`
/// events (target `tower_rate_tier`).
#[derive(Debug)]
#[non_exhaustive]
pub enum RateLimitEvent<'a> {
    /// A request was refused with 429.
    Limited {
        /// The user.
        user: &'a str,
        /// The cost that did not fit.
        cost: u32,
        /// The state that refused it.
        limited: &'a RateLimited,
    },
    /// A request that would have been refused with 429 was let through:
    /// the layer, or its tier, is in shadow mode. Nothing was consumed.
    ShadowLimited {
        /// The user.
        user: &'a str,
        /// The cost that did not fit.
        cost: u32,
        /// The state that would have refused it.
        limited: &'a RateLimited,
    },
    /// A request cost more than its tier's burst and was refused with 403
    /// (or, in shadow mode, let through).
    CostExceedsLimit {
        /// The user.
        user: &'a str,
        /// The tier.
        tier: &'a str,
        /// The cost.
        cost: u32,
        /// The tier's burst.
        limit: u32,
    },
    /// The storage failed; `allowed` tells what [`OnStorageError`](crate::OnStorageError) made of it.
    StorageError {
        /// The user.
        user: &'a str,
        /// The tier.
        tier: &'a str,
        /// The failure.
        error: &'a StorageError,
        /// Whether the request was let through.
        allowed: bool,
    },
    /// The identifier named a tier that is not configured.
    UnknownTier {
        /// The user.
        user: &'a str,
        /// The unknown tier name.
        tier: &'a str,
    },
    /// The client was not identified (or its user id was empty or too long).
    Unidentified,
    /// A route declares a cost but no limiter ran before it; it was refused
    /// with 500.
    MissingLimiter {
        /// The declared cost.
        cost: u32,
    },
}
