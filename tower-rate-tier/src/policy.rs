//! What the limiter does with requests it cannot simply count: clients it
//! cannot identify ([`OnMissing`]), tiers it does not know
//! ([`OnUnknownTier`]) and storage failures ([`OnStorageError`]).

use http::StatusCode;

/// What to do with a request whose client could not be identified; set with
/// [`RateTierBuilder::on_missing`](crate::RateTierBuilder::on_missing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissing {
    /// Limit it with the default tier's quota (keyed by the peer address when
    /// the layer knows it); 403 when there is no default tier.
    #[default]
    UseDefault,
    /// Let it through without counting it.
    Allow,
    /// Answer with this status (limiters further out count the request:
    /// it is no refusal for want of quota).
    Deny(StatusCode),
}

/// What to do when an identifier names a tier the configuration does not
/// have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnUnknownTier {
    /// Limit the user with the default tier's quota, in their own bucket;
    /// 403 when there is no default tier (the default policy).
    #[default]
    UseDefault,
    /// Answer with this status (limiters further out count the request:
    /// it is no refusal for want of quota).
    Deny(StatusCode),
    /// Let the request through uncounted, without rate-limit headers.
    Allow,
}

/// What to do when the storage fails (unreachable, timed out, full).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStorageError {
    /// Fail open: let the request through uncounted, without rate-limit
    /// headers (the default: the limiter never becomes the outage).
    #[default]
    Allow,
    /// Fail closed: answer 503 Service Unavailable.
    Deny,
}
