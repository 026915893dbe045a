//! The bill of a request: who pays, in which tier, and the price the
//! limiter knows before the route runs (a `TierCost` extension, the
//! `cost_fn`, the route's learned cost, else 1).

use std::sync::Arc;

use super::config::LayerConfig;
use super::head::Head;
use crate::cost::{RouteKey, Source, TierCost};
use crate::tier::{TierEntry, User};

/// Who pays how much, before the storage is asked.
pub(crate) struct Bill {
    pub(super) user: User,
    pub(crate) tier: Arc<TierEntry>,
    pub(super) cost: u32,
    pub(super) source: Source,
    pub(super) priced: Priced,
}

impl Bill {
    /// Whether the request takes a slot of its tier's concurrency limit:
    /// all do but one priced 0 up front (`cost_fn`, a `TierCost`
    /// extension: a health check), which counts in no limit of requests. A
    /// price learned at 0 is not final (a declaration may top it up) and
    /// takes its slot.
    #[inline]
    pub(super) fn takes_slot(&self) -> bool {
        self.cost > 0 || self.source != Source::Edge
    }
}

/// Where the limiter's price of a request comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Priced {
    /// Not from what it learned of the route.
    Fresh,
    /// From the route's learned cost.
    Learned,
    /// From a cost learned from a refused request, whose later declarations
    /// may not have run: the route is learned again.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Provisional,
}

/// The cost known before the route runs, who set it, and whether it
/// was learned from earlier requests to the route.
#[inline]
pub(super) fn edge_cost(config: &LayerConfig, head: &impl Head) -> (u32, Source, Priced) {
    // `call` reads the head in place only without a cost function.
    debug_assert!(config.cost_fn.is_none() || head.parts().is_some());
    let extensions = head.extensions();
    if let Some(TierCost(cost)) = extensions.get::<TierCost>() {
        return (*cost, Source::Edge, Priced::Fresh);
    }
    if let Some(cost) = config.cost_fn.as_ref().and_then(|f| f(head.parts()?)) {
        return (cost, Source::Edge, Priced::Fresh);
    }
    #[cfg(feature = "axum")]
    if let Some(path) = extensions.get::<axum::extract::MatchedPath>() {
        if let Some((cost, source, provisional)) = config.ledger.learned.get(head.method(), path) {
            let priced = if provisional {
                Priced::Provisional
            } else {
                Priced::Learned
            };
            return (cost, source, priced);
        }
    }
    (1, Source::Default, Priced::Fresh)
}

#[cfg(feature = "axum")]
pub(super) fn route_key(head: &impl Head) -> Option<(http::Method, RouteKey)> {
    let path = head.extensions().get::<axum::extract::MatchedPath>()?;
    Some((head.method().clone(), path.clone()))
}

#[cfg(not(feature = "axum"))]
pub(super) fn route_key(_head: &impl Head) -> Option<(http::Method, RouteKey)> {
    None
}
