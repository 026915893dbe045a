//! [`Outcome`]: what a request's charge ended as, for the fields of its
//! response.

use crate::storage::Decision;
use crate::tier::RateLimited;

/// What a charge ended as.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Admitted: headers from the storage's decision as it stands (the
    /// general outcome, [`RateLimitInfo`](crate::RateLimitInfo), is never built for them).
    Admitted(Decision),
    /// Would have been refused, let through by shadow mode: headers of this
    /// state, without `Retry-After`.
    Shadowed(RateLimited),
    /// Refused; the response carries its own headers.
    Refused,
    /// Let through uncounted (policy): no headers.
    Bypass,
}

impl Outcome {
    /// The slot state its fields report, for a tier with a concurrency
    /// limit.
    pub(super) fn slots(&self) -> Option<crate::storage::SlotState> {
        match self {
            Outcome::Admitted(decision) => decision.slots,
            Outcome::Shadowed(limited) => limited.detail.slots,
            Outcome::Refused | Outcome::Bypass => None,
        }
    }
}
