//! The extractor `#[tier_cost(N)]` expansions add to a handler.

use super::Source;
use super::charge::Charges;
use super::settlement::Settlement;

/// What `#[tier_cost(N)]` adds to a handler: an extractor that settles the
/// cost `N` before the handler runs. Not public API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct TierCostGuard<const N: u32>;

impl<S: Send + Sync, const N: u32> axum::extract::FromRequestParts<S> for TierCostGuard<N> {
    type Rejection = axum::response::Response;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let settlement = Settlement::of(parts.extensions.get::<Charges>(), N, Source::Handler);
        match settlement.run(N, Source::Handler).await {
            Ok(()) => Ok(TierCostGuard),
            Err(refusal) => {
                let mut refusal = refusal.map(axum::body::Body::from);
                crate::body::mark_refusal(&mut refusal);
                Err(refusal)
            }
        }
    }
}
