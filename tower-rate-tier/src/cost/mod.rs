//! Costs: what a request spends of its quota.
//!
//! A request costs 1 unless something says otherwise. Cost 0 spends nothing
//! (but the request is still refused by a cost-0 route the limiter has never
//! seen if the user's quota is spent; see below). A cost above the tier's
//! burst can never pass and is answered 403 with no `Retry-After`.
//!
//! # Giving a route a cost
//!
//! All of these work under ONE router-wide `Router::new()...layer(limiter)`,
//! and each is charged exactly once:
//!
//! 1. `#[tier_cost(5)]` on an axum handler (feature `macros`);
//! 2. the route layer [`tier_cost(n)`](fn@tier_cost):
//!    `.route("/export", get(export).layer(tier_cost(20)))`;
//! 3. a [`TierCost`] extension inserted by a layer that runs *before* the
//!    limiter (per request);
//! 4. the limiter's [`cost_fn`](crate::TierLimitLayer::cost_fn), a function
//!    of the request head (it sees axum's `MatchedPath`).
//!
//! When several are present, the one known earliest wins: a [`TierCost`]
//! extension, then the cost function (when it returns `Some`), then
//! `#[tier_cost]`, then the route layer, then the default of 1.
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use axum::{Router, body::Body, routing::get};
//! use http::{Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, clock::FakeClock, tier_cost};
//!
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).clock(FakeClock::new()).build();
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route("/search", get(|| async { "results" }).layer(tier_cost(5)))
//!     .layer(TierLimitLayer::new(tiers).identifier_fn(|_| Some(TierIdentity::new("ada", "free"))));
//! let call = |path: &'static str| {
//!     let app = app.clone();
//!     async move {
//!         let response = app.oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
//!         let remaining = response.headers()["x-ratelimit-remaining"].to_str().unwrap().to_owned();
//!         (response.status(), remaining)
//!     }
//! };
//! assert_eq!(call("/").await, (StatusCode::OK, "9".into()));
//! assert_eq!(call("/search").await, (StatusCode::OK, "4".into())); // 5, charged once
//! assert_eq!(call("/search").await, (StatusCode::TOO_MANY_REQUESTS, "4".into())); // costs nothing
//! assert_eq!(call("/").await, (StatusCode::OK, "3".into()));
//! # }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```
//!
//! # How the exact charge works
//!
//! axum runs router-wide layers *outside* route layers, so the limiter
//! decides before a route-level cost is visible. The limiter therefore
//! charges what it knows (the extension, the cost function, the cost it has
//! *learned* for this method and `MatchedPath`, else 1) and leaves a charge
//! handle in the request extensions. The route-level declaration settles the
//! difference: it tops up (and if the top-up is refused, gives back the
//! pre-charge, decides the full cost afresh, and answers 429 if it still does
//! not fit) or refunds the excess. The limiter learns each route's declared
//! cost from the first request that reaches it, so from then on a request
//! costs exactly one storage operation. Only requests the router routes to a
//! handler teach it: a 405 or 501 answer (a route's layers wrap axum's 405
//! fallback too) and a method outside the nine standard ones are priced
//! afresh each time, so method names a client makes up cost no memory.
//!
//! A declaration that runs on only some requests of a route (behind a cache
//! layer that answers the others, say) is still charged exactly where it
//! runs; the requests that skip it pay the route's learned price: 1 when the
//! first request the limiter saw there skipped the declaration, the declared
//! cost when it ran. Price such routes up front with the cost function when
//! that matters.
//!
//! Declarations settle in the order they run, and a route layer runs before
//! the handler's `#[tier_cost]`: a route layer whose cost exceeds the burst
//! answers 403 before the handler's (winning) declaration is seen. Do not
//! stack a route layer above the burst on a handler that declares its own
//! cost.
//!
//! Until a route's cost has been learned (its first request after start, per
//! limiter), the pre-charge of 1 is held for the time between the limiter and
//! the route's declaration: a concurrent request of the same user in that
//! window (microseconds with the in-memory storage, one round trip with Redis)
//! sees one unit less. A cost-0 route the limiter has never seen is
//! pre-charged 1 as well, so a user whose quota is spent gets 429 from it on
//! that first request. Routes that must never be limited (health checks) are
//! best priced up front with [`cost_fn`](crate::TierLimitLayer::cost_fn).
//!
//! A declaration the limiter refuses teaches the route's price too: once any
//! request has reached a route declaring more than a tier's burst (and was
//! answered 403), every later request of that tier to the route is answered
//! 403 by the limiter itself, before the storage is asked, whether the
//! user's quota is spent or not, so a client that honours `Retry-After` is
//! never sent back for a refusal that cannot change. The one request that
//! cannot be told is the same corner as above: a spent user's request to a
//! route no request has reached since the limiter started gets 429 (its
//! pre-charge of 1 does not fit); price such routes up front with the cost
//! function when that matters.
//!
//! A route that declares a cost but is reached without a limiter before it
//! (for instance a route added after `.layer(limiter)`) fails closed: 500
//! with a clear body and an error log line, never unlimited.

mod charge;
#[cfg(feature = "axum")]
pub(crate) mod extract;
mod layer;
mod learned;
mod outcome;
mod parts;
mod settlement;
mod usage;

pub(crate) use charge::{Charge, ChargeState, Charges, Ledger, Outcome};
pub use layer::{TierCostFuture, TierCostLayer, TierCostService, tier_cost};
pub(crate) use learned::RouteKey;
pub(crate) use usage::{NotedRefusal, Refused};

/// A per-request cost, inserted into the request extensions by a layer that
/// runs before the limiter. It overrides every other cost source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TierCost(pub u32);

/// Who set a charge's cost, from weakest to strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Source {
    /// The default of 1.
    Default,
    /// A `tier_cost(n)` route layer.
    RouteLayer,
    /// A `#[tier_cost(n)]` handler.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Handler,
    /// Known at the limiter (extension, cost function) or nothing to settle
    /// (unlimited, let through by policy): final.
    Edge,
}
