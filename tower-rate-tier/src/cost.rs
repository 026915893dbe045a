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
//! costs exactly one storage operation.
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
//! A route that declares a cost but is reached without a limiter before it
//! (for instance a route added after `.layer(limiter)`) fails closed: 500
//! with a clear body and an error log line, never unlimited.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use smallvec::SmallVec;
use tower_layer::Layer;
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::layer::{RateLimitEvent, Shared};
use crate::response;
use crate::tier::{CheckError, RateLimitInfo, TierId};

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

/// What a charge ended as.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Admitted: headers from this state.
    Admitted(RateLimitInfo),
    /// Refused; the response carries its own headers.
    Refused,
    /// Let through uncounted (policy): no headers.
    Bypass,
}

#[derive(Debug)]
pub(crate) struct ChargeState {
    charged: u32,
    source: Source,
    outcome: Outcome,
    /// The limiter priced the request from what it learned of the route.
    learned: bool,
    /// The strongest route-level declaration seen, whatever came of it.
    declared: Option<(u32, Source)>,
}

/// The limiter's handle on one request's charge, shared with route-level
/// cost declarations through the request extensions.
pub(crate) struct Charge {
    shared: Arc<Shared>,
    user: String,
    tier: TierId,
    route: Option<(Method, RouteKey)>,
    state: Mutex<ChargeState>,
}

#[cfg(feature = "axum")]
pub(crate) type RouteKey = axum::extract::MatchedPath;
#[cfg(not(feature = "axum"))]
pub(crate) type RouteKey = std::convert::Infallible;

#[cfg(feature = "axum")]
fn route_str(key: &RouteKey) -> &str {
    key.as_str()
}
#[cfg(not(feature = "axum"))]
fn route_str(key: &RouteKey) -> &str {
    match *key {}
}

/// The charges of every limiter a request has passed (several when limiters
/// are stacked).
#[derive(Clone, Default)]
pub(crate) struct Charges(pub(crate) SmallVec<[Arc<Charge>; 2]>);

impl ChargeState {
    /// `charged` units charged at the limiter, set by `source`; `learned`
    /// when priced from what the limiter learned of the route.
    pub(crate) fn new(charged: u32, source: Source, outcome: Outcome, learned: bool) -> Self {
        ChargeState {
            charged,
            source,
            outcome,
            learned,
            declared: None,
        }
    }

    /// Let through uncounted: nothing to settle, no headers.
    pub(crate) fn bypass() -> Self {
        ChargeState::new(0, Source::Edge, Outcome::Bypass, false)
    }
}

impl Charge {
    pub(crate) fn new(
        shared: Arc<Shared>,
        user: String,
        tier: TierId,
        route: Option<(Method, RouteKey)>,
        state: ChargeState,
    ) -> Self {
        Charge {
            shared,
            user,
            tier,
            route,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ChargeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called by the limiter on the way out: adds the headers of the final
    /// state, and learns the route's declared cost (or that a route that
    /// answered successfully declares none).
    pub(crate) fn finish<B>(&self, response: &mut Response<B>) {
        let state = self.lock();
        if let Outcome::Admitted(info) = &state.outcome {
            response::apply_info_headers(response.headers_mut(), info);
        }
        let Some((method, path)) = &self.route else {
            return;
        };
        match state.declared {
            // Learned also from refused requests, so that a cost above the
            // burst is answered 403 at once next time.
            Some((cost, source)) => {
                let provisional = matches!(state.outcome, Outcome::Refused);
                self.shared.learned.set(method, path, cost, source, provisional)
            }
            None if state.source == Source::Default && !state.learned && response.status().is_success() => {
                self.shared.learned.set(method, path, 1, Source::Default, false)
            }
            None => {}
        }
    }

    /// Whether settling this charge can run without waiting.
    fn decides_now(&self) -> bool {
        self.shared.tiers.decides_now()
    }

    /// Brings the charge to `declared`, as declared by `source`. `Err` is the
    /// refusal to answer with; nothing is then consumed.
    async fn settle(&self, declared: u32, source: Source) -> Result<(), Response<Bytes>> {
        let charged = {
            let mut state = self.lock();
            if state.declared.is_none_or(|(_, s)| s <= source) {
                state.declared = Some((declared, source));
            }
            if source < state.source {
                return Ok(());
            }
            if state.charged == declared {
                state.source = source;
                return Ok(());
            }
            state.charged
        };
        let tiers = &self.shared.tiers;
        if declared < charged {
            let excess = charged - declared;
            match tiers.refund_id(&self.user, self.tier, excess).await {
                Ok(()) => {
                    let mut state = self.lock();
                    state.charged = declared;
                    state.source = source;
                    if let Outcome::Admitted(info) = &mut state.outcome {
                        info.refunded(excess);
                    }
                }
                // Over-charged rather than under-charged; still admitted.
                Err(e) => tracing::warn!(error = %e, "rate-limit refund failed"),
            }
            return Ok(());
        }
        let extra = declared - charged;
        match tiers.check_id(&self.user, self.tier, extra).await {
            Ok(Ok(info)) => {
                self.admitted(declared, source, info);
                Ok(())
            }
            Err(CheckError::Storage(error)) => self.storage_failed(&error, charged).await,
            Ok(Err(_)) | Err(_) => {
                // Give the pre-charge back and decide the whole cost afresh, so
                // that the answer and its headers are exact.
                if let Err(e) = tiers.refund_id(&self.user, self.tier, charged).await {
                    tracing::warn!(error = %e, "rate-limit refund failed");
                }
                self.lock().charged = 0;
                match tiers.check_id(&self.user, self.tier, declared).await {
                    Ok(Ok(info)) => {
                        self.admitted(declared, source, info);
                        Ok(())
                    }
                    Ok(Err(limited)) => {
                        self.refuse();
                        Err(self.shared.limited(&self.user, declared, &limited))
                    }
                    Err(CheckError::Storage(error)) => self.storage_failed(&error, 0).await,
                    Err(error) => {
                        self.refuse();
                        Err(self.shared.check_failed(&self.user, self.tier, declared, &error))
                    }
                }
            }
        }
    }

    fn admitted(&self, charged: u32, source: Source, info: RateLimitInfo) {
        let mut state = self.lock();
        state.charged = charged;
        state.source = source;
        state.outcome = Outcome::Admitted(info);
    }

    async fn storage_failed(
        &self,
        error: &crate::storage::StorageError,
        charged: u32,
    ) -> Result<(), Response<Bytes>> {
        let tier = &self.shared.tiers.entry(self.tier).name;
        match self.shared.storage_failed(&self.user, tier, error) {
            None => {
                let mut state = self.lock();
                state.source = Source::Edge;
                state.outcome = Outcome::Bypass;
                Ok(())
            }
            Some(refusal) => {
                if charged > 0 {
                    let _ = self.shared.tiers.refund_id(&self.user, self.tier, charged).await;
                }
                self.refuse();
                Err(refusal)
            }
        }
    }

    fn refuse(&self) {
        let mut state = self.lock();
        state.charged = 0;
        state.source = Source::Edge;
        state.outcome = Outcome::Refused;
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Charge")
            .field("user", &self.user)
            .field("state", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Charges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

/// Settles a route-level declaration against every limiter the request
/// passed. A refusal undoes the settlements already made.
pub(crate) async fn settle_all(
    charges: Option<&Charges>,
    declared: u32,
    source: Source,
) -> Result<(), Response<Bytes>> {
    let Some(charges) = charges.filter(|c| !c.0.is_empty()) else {
        return Err(missing_limiter(declared));
    };
    let mut before: SmallVec<[u32; 2]> = SmallVec::new();
    for (i, charge) in charges.0.iter().enumerate() {
        before.push(charge.lock().charged);
        if let Err(refusal) = charge.settle(declared, source).await {
            for (earlier, &was) in charges.0[..i].iter().zip(&before) {
                let now = earlier.lock().charged;
                if now > was {
                    let _ = earlier
                        .shared
                        .tiers
                        .refund_id(&earlier.user, earlier.tier, now - was)
                        .await;
                }
            }
            return Err(refusal);
        }
    }
    Ok(())
}

/// Whether every limiter of the request decides without waiting.
pub(crate) fn all_decide_now(charges: Option<&Charges>) -> bool {
    charges.is_none_or(|c| c.0.iter().all(|c| c.decides_now()))
}

fn missing_limiter(cost: u32) -> Response<Bytes> {
    tracing::error!(
        target: "tower_rate_tier",
        cost,
        "a route declares a rate-limit cost but no TierLimitLayer ran before it; refusing the request \
         (add the limiter with Router::layer after all routes)"
    );
    response::problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "this route declares a rate-limit cost but no rate limiter runs before it; the request was refused",
        serde_json::json!({ "cost": cost }),
    )
}

thread_local! {
    /// The charges of the limiters whose inner service is being called or
    /// polled on this thread, innermost last.
    static SCOPE: std::cell::RefCell<SmallVec<[Arc<Charge>; 2]>> = const { std::cell::RefCell::new(SmallVec::new_const()) };
}

/// While alive, `charge` is visible to route-level cost declarations that
/// run on this thread (inside the limiter's inner service).
pub(crate) struct Scope(bool);

impl Scope {
    pub(crate) fn enter(charge: Option<&Arc<Charge>>) -> Scope {
        let Some(charge) = charge else {
            return Scope(false);
        };
        let entered = SCOPE
            .try_with(|scope| scope.try_borrow_mut().map(|mut s| s.push(charge.clone())).is_ok())
            .unwrap_or(false);
        Scope(entered)
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.0 {
            let _ = SCOPE.try_with(|scope| scope.try_borrow_mut().map(|mut s| s.pop()));
        }
    }
}

pin_project! {
    /// Polls `future` with `charge` in [`Scope`].
    pub(crate) struct InScope<F> {
        #[pin]
        future: F,
        charge: Option<Arc<Charge>>,
    }
}

impl<F> InScope<F> {
    pub(crate) fn new(future: F, charge: Option<Arc<Charge>>) -> Self {
        InScope { future, charge }
    }
}

impl<F: Future> Future for InScope<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _scope = Scope::enter(this.charge.as_ref());
        this.future.poll(cx)
    }
}

/// The charges a route-level declaration settles: those in the request
/// extensions and those of the limiters running it on this thread.
pub(crate) fn current_charges(extensions: &http::Extensions) -> Option<Charges> {
    let mut charges = extensions.get::<Charges>().cloned().unwrap_or_default();
    let _ = SCOPE.try_with(|scope| {
        if let Ok(scope) = scope.try_borrow() {
            for charge in scope.iter() {
                if !charges.0.iter().any(|c| Arc::ptr_eq(c, charge)) {
                    charges.0.push(charge.clone());
                }
            }
        }
    });
    (!charges.0.is_empty()).then_some(charges)
}

/// Polls a future once; for futures that are known to complete at once (the
/// in-memory storage decides without waiting).
pub(crate) fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// The per-route costs a limiter has learned, by `MatchedPath` and method.
type LearnedMap = HashMap<Arc<str>, SmallVec<[(Method, u32, Source, bool); 2]>, foldhash::fast::RandomState>;

#[derive(Default)]
pub(crate) struct Learned {
    map: RwLock<LearnedMap>,
}

const MAX_LEARNED_ROUTES: usize = 4096;

impl Learned {
    /// The learned cost, its source, and whether it is provisional (learned
    /// from a refused request, whose later declarations may not have run).
    pub(crate) fn get(&self, method: &Method, path: &RouteKey) -> Option<(u32, Source, bool)> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let entries = map.get(route_str(path))?;
        entries
            .iter()
            .find(|(m, ..)| m == method)
            .map(|&(_, cost, source, provisional)| (cost, source, provisional))
    }

    fn set(&self, method: &Method, path: &RouteKey, cost: u32, source: Source, provisional: bool) {
        if self.get(method, path) == Some((cost, source, provisional)) {
            return;
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_LEARNED_ROUTES && !map.contains_key(route_str(path)) {
            return;
        }
        let entries = map.entry(Arc::from(route_str(path))).or_default();
        match entries.iter_mut().find(|(m, ..)| m == method) {
            Some(entry) => *entry = (method.clone(), cost, source, provisional),
            None => entries.push((method.clone(), cost, source, provisional)),
        }
    }
}

impl fmt::Debug for Learned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Learned").field("routes", &map.len()).finish()
    }
}

/// A route layer giving every request of the route a cost:
/// `.route("/export", get(export).layer(tier_cost(20)))`.
///
/// It needs a [`TierLimitLayer`](crate::TierLimitLayer) to run before it
/// (router-wide); without one, requests are refused with 500. See the
/// [module docs](self) for how the charge is kept exact.
pub fn tier_cost(cost: u32) -> TierCostLayer {
    TierCostLayer { cost }
}

/// The layer of [`tier_cost`](fn@tier_cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierCostLayer {
    cost: u32,
}

impl<S> Layer<S> for TierCostLayer {
    type Service = TierCostService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TierCostService {
            inner,
            cost: self.cost,
        }
    }
}

/// The service of [`tier_cost`](fn@tier_cost).
#[derive(Debug, Clone)]
pub struct TierCostService<S> {
    inner: S,
    cost: u32,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for TierCostService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: From<Bytes> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let charges = current_charges(req.extensions());
        let cost = self.cost;
        if all_decide_now(charges.as_ref()) {
            let settled = now_or_never(settle_all(charges.as_ref(), cost, Source::RouteLayer));
            return match settled {
                Some(Ok(())) => ResponseFuture::inner(self.inner.call(req), None),
                Some(Err(refusal)) => ResponseFuture::refuse(refusal.map(ResB::from)),
                None => ResponseFuture::refuse(internal_error().map(ResB::from)),
            };
        }
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::boxed(Box::pin(async move {
            let mut inner = inner;
            match settle_all(charges.as_ref(), cost, Source::RouteLayer).await {
                Ok(()) => inner.call(req).await,
                Err(refusal) => Ok(refusal.map(ResB::from)),
            }
        }))
    }
}

pub(crate) fn internal_error() -> Response<Bytes> {
    tracing::error!(target: "tower_rate_tier", "a storage that promised to decide at once did not");
    response::problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the rate limiter could not decide",
        serde_json::Value::Null,
    )
}

/// What `#[tier_cost(N)]` adds to a handler: an extractor that settles the
/// cost `N` before the handler runs. Not public API.
#[cfg(feature = "axum")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct TierCostGuard<const N: u32>;

#[cfg(feature = "axum")]
impl<S: Send + Sync, const N: u32> axum::extract::FromRequestParts<S> for TierCostGuard<N> {
    type Rejection = axum::response::Response;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let charges = current_charges(&parts.extensions);
        match settle_all(charges.as_ref(), N, Source::Handler).await {
            Ok(()) => Ok(TierCostGuard),
            Err(refusal) => Err(refusal.map(axum::body::Body::from)),
        }
    }
}

impl Shared {
    /// The refusal of a request that did not fit (429), with its headers.
    pub(crate) fn limited(&self, user: &str, cost: u32, limited: &crate::RateLimited) -> Response<Bytes> {
        tracing::debug!(target: "tower_rate_tier", user, tier = limited.tier(), cost, retry_after_secs = limited.retry_after_secs(), "rate limited");
        self.event(&RateLimitEvent::Limited { user, cost, limited });
        let mut response = match &self.on_limited {
            Some(hook) => hook(limited),
            None => response::too_many_requests(limited),
        };
        let headers = response.headers_mut();
        if !headers.contains_key(http::header::RETRY_AFTER) {
            response::apply_limited_headers(headers, limited);
        }
        response
    }

    /// A storage failure under [`OnStorageError`](crate::OnStorageError):
    /// `None` lets the request through, `Some` is the 503.
    pub(crate) fn storage_failed(
        &self,
        user: &str,
        tier: &str,
        error: &crate::storage::StorageError,
    ) -> Option<Response<Bytes>> {
        let allowed = self.on_storage_error == crate::OnStorageError::Allow;
        tracing::warn!(target: "tower_rate_tier", user, tier, %error, allowed, "rate-limit storage failed");
        self.event(&RateLimitEvent::StorageError {
            user,
            tier,
            error,
            allowed,
        });
        (!allowed).then(|| {
            response::problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the rate limiter is unavailable; try again shortly",
                serde_json::Value::Null,
            )
        })
    }

    /// A check that failed for another reason than the storage.
    pub(crate) fn check_failed(
        &self,
        user: &str,
        tier: TierId,
        cost: u32,
        error: &CheckError,
    ) -> Response<Bytes> {
        match error {
            CheckError::CostExceedsLimit { tier, cost, limit } => {
                tracing::warn!(target: "tower_rate_tier", user, tier, cost, limit, "request cost exceeds the tier's burst");
                self.event(&RateLimitEvent::CostExceedsLimit {
                    user,
                    tier,
                    cost: *cost,
                    limit: *limit,
                });
                response::cost_exceeds_limit(tier, *cost, *limit)
            }
            other => {
                let tier = &self.tiers.entry(tier).name;
                tracing::warn!(target: "tower_rate_tier", user, tier = &**tier, cost, error = %other, "rate-limit check failed");
                response::problem(
                    StatusCode::BAD_REQUEST,
                    "the request could not be rate-limited",
                    serde_json::Value::Null,
                )
            }
        }
    }

    pub(crate) fn event(&self, event: &RateLimitEvent<'_>) {
        if let Some(f) = &self.on_event {
            f(event);
        }
    }
}
