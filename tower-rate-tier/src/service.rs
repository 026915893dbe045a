//! [`TierLimitService`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, Response, StatusCode};
use tower_service::Service;

use crate::cost::{Charge, ChargeState, Charges, InScope, Outcome, Scope, Source, TierCost};
use crate::future::ResponseFuture;
use crate::identity::{ANONYMOUS_PREFIX, TierIdentity};
use crate::layer::{Identify, OnUnknownTier, RateLimitEvent, Shared};
use crate::response;
use crate::tier::{CheckError, CheckResult, MAX_USER_ID_LEN, OnMissing, TierId};

/// The service of [`TierLimitLayer`](crate::TierLimitLayer).
#[derive(Clone)]
pub struct TierLimitService<S> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared>,
}

impl<S> TierLimitService<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        TierLimitService { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for TierLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierLimitService")
            .field("inner", &self.inner)
            .field("tiers", &self.shared.tiers)
            .finish_non_exhaustive()
    }
}

/// What the limiter decided about a request.
pub(crate) enum Admission {
    /// Call the inner service; the charge adds headers on the way out.
    Pass(Option<Arc<Charge>>),
    /// Answer without calling the inner service.
    Refuse(Response<Bytes>),
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for TierLimitService<S>
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
        let shared = &*self.shared;
        if shared.tiers.decides_now() && !matches!(shared.identify, Identify::Async(_)) {
            // Everything completes at once: decide inline, box nothing.
            if shared.cost_fn.is_none() && !matches!(shared.identify, Identify::Parts(_)) {
                // Only the headers and extensions are read: in place,
                // without splitting the request.
                let mut req = req;
                let identity = shared.identify_headers(req.headers());
                let admission = self.shared.admit_now(&mut req, identity);
                return self.pass_or_refuse(admission, req);
            }
            let (mut parts, body) = req.into_parts();
            let identity = shared.identify_now(&parts).flatten();
            let admission = self.shared.admit_now(&mut parts, identity);
            return self.pass_or_refuse(admission, Request::from_parts(parts, body));
        }
        let (mut parts, body) = req.into_parts();
        // The identifier or the storage waits: the inner service is called
        // later, so take the one that was polled ready and leave a clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        ResponseFuture::boxed(Box::pin(async move {
            let identity = shared.identify(&parts).await;
            match shared.admit(&mut parts, identity).await {
                Admission::Pass(charge) => {
                    let future = {
                        let _scope = Scope::enter(charge.as_ref());
                        inner.call(Request::from_parts(parts, body))
                    };
                    let mut response = InScope::new(future, charge.clone()).await?;
                    if let Some(charge) = charge {
                        charge.finish(&mut response);
                    }
                    Ok(response)
                }
                Admission::Refuse(response) => Ok(response.map(ResB::from)),
            }
        }))
    }
}

impl<S> TierLimitService<S> {
    /// Calls the inner service for an admitted request, or answers.
    fn pass_or_refuse<ReqB, ResB>(
        &mut self,
        admission: Admission,
        req: Request<ReqB>,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
        ResB: From<Bytes>,
    {
        match admission {
            Admission::Pass(charge) => {
                let future = {
                    let _scope = Scope::enter(charge.as_ref());
                    self.inner.call(req)
                };
                ResponseFuture::inner(future, charge)
            }
            Admission::Refuse(response) => ResponseFuture::refuse(response.map(ResB::from)),
        }
    }
}

/// The parts of a request head the limiter reads and writes: [`Parts`], or a
/// whole [`Request`] read in place (no split, no move of the head).
pub(crate) trait Head {
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    fn method(&self) -> &Method;
    fn headers(&self) -> &HeaderMap;
    fn extensions(&self) -> &Extensions;
    fn extensions_mut(&mut self) -> &mut Extensions;
    /// The head as `Parts`, for the user's functions of `&Parts`.
    fn parts(&self) -> Option<&Parts>;
}

impl Head for Parts {
    fn method(&self) -> &Method {
        &self.method
    }
    fn headers(&self) -> &HeaderMap {
        &self.headers
    }
    fn extensions(&self) -> &Extensions {
        &self.extensions
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.extensions
    }
    fn parts(&self) -> Option<&Parts> {
        Some(self)
    }
}

impl<B> Head for Request<B> {
    fn method(&self) -> &Method {
        self.method()
    }
    fn headers(&self) -> &HeaderMap {
        self.headers()
    }
    fn extensions(&self) -> &Extensions {
        self.extensions()
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        self.extensions_mut()
    }
    fn parts(&self) -> Option<&Parts> {
        None
    }
}

/// Who pays how much, before the storage is asked.
pub(crate) struct Bill {
    user: String,
    tier: TierId,
    cost: u32,
    source: Source,
    priced: Priced,
}

/// Where the limiter's price of a request comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Priced {
    /// Not from what it learned of the route.
    Fresh,
    /// From the route's learned cost.
    Learned,
    /// From a cost learned from a refused request, whose later declarations
    /// may not have run: the route is learned again.
    Provisional,
}

impl Shared {
    /// The identity, when the identifier answers without waiting.
    fn identify_now(&self, parts: &Parts) -> Option<Option<TierIdentity>> {
        match &self.identify {
            Identify::Nobody => Some(None),
            Identify::Headers(f) => Some(f(&parts.headers)),
            Identify::Parts(f) => Some(f(parts)),
            Identify::Async(_) => None,
        }
    }

    /// The identity from the headers alone (no identifier, or a function of
    /// the headers).
    fn identify_headers(&self, headers: &HeaderMap) -> Option<TierIdentity> {
        match &self.identify {
            Identify::Headers(f) => f(headers),
            _ => None,
        }
    }

    pub(crate) async fn identify(&self, parts: &Parts) -> Option<TierIdentity> {
        match &self.identify {
            Identify::Async(identifier) => identifier.identify_parts(parts).await,
            _ => self.identify_now(parts).flatten(),
        }
    }

    /// Resolves the identity to a user and tier (or an answer), prices the
    /// request, and charges it.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        parts: &mut Parts,
        identity: Option<TierIdentity>,
    ) -> Admission {
        let bill = match self.bill(parts, identity) {
            Ok(bill) => bill,
            Err(admission) => return admission,
        };
        let result = self.tiers.check_id(&bill.user, bill.tier, bill.cost).await;
        self.conclude(parts, bill, result)
    }

    /// [`Shared::admit`] on a storage that decides without waiting.
    pub(crate) fn admit_now(
        self: &Arc<Self>,
        head: &mut impl Head,
        identity: Option<TierIdentity>,
    ) -> Admission {
        let bill = match self.bill(head, identity) {
            Ok(bill) => bill,
            Err(admission) => return admission,
        };
        let result = match self.tiers.check_now(&bill.user, bill.tier, bill.cost) {
            Some(result) => result,
            // A storage that answers its async check at once without a
            // `check_now` (as before: the future polled once).
            None => match crate::cost::now_or_never(self.tiers.check_id(&bill.user, bill.tier, bill.cost)) {
                Some(result) => result,
                None => return Admission::Refuse(crate::cost::internal_error()),
            },
        };
        self.conclude(head, bill, result)
    }

    /// Who pays how much, or the answer when the request is not charged.
    fn bill(
        self: &Arc<Self>,
        head: &mut impl Head,
        identity: Option<TierIdentity>,
    ) -> Result<Bill, Admission> {
        // Ids starting with the anonymous prefix are refused, so that no
        // identifier can hand a client another address's bucket.
        let identity = identity.filter(|i| {
            !i.user_id.is_empty()
                && i.user_id.len() <= MAX_USER_ID_LEN
                && !i.user_id.starts_with(ANONYMOUS_PREFIX)
        });
        let (user, tier) = match identity {
            Some(identity) => match self.tiers.resolve(&identity.tier) {
                Some(id) => (identity.user_id, id),
                None => {
                    let id = self.unknown_tier(head, &identity)?;
                    (identity.user_id, id)
                }
            },
            None => self.unidentified(head)?,
        };
        let (cost, source, priced) = self.edge_cost(head);
        Ok(Bill {
            user,
            tier,
            cost,
            source,
            priced,
        })
    }

    /// The admission of a charged request, from the storage's answer.
    fn conclude(self: &Arc<Self>, head: &mut impl Head, bill: Bill, result: CheckResult) -> Admission {
        let Bill {
            user,
            tier,
            cost,
            source,
            priced,
        } = bill;
        let learned = priced != Priced::Fresh;
        let declares_nothing = learned && source == Source::Default;
        match result {
            Ok(Ok(info)) => {
                // A route whose cost is learned needs no more learning: a
                // declaration that still runs there is settled, not learned
                // (so a declaration behind a condition never re-prices the
                // requests that skip it).
                let route = if priced == Priced::Learned {
                    None
                } else {
                    self.route_key(head)
                };
                let outcome = if info.is_unlimited() {
                    Outcome::Bypass
                } else {
                    Outcome::Admitted(info)
                };
                let source = if matches!(outcome, Outcome::Bypass) {
                    Source::Edge
                } else {
                    source
                };
                let charge = Arc::new(Charge::new(
                    self.clone(),
                    user,
                    tier,
                    route,
                    ChargeState::new(cost, source, outcome, learned),
                ));
                if !declares_nothing {
                    // Route-level declarations find the charge in the
                    // extensions even across a task boundary; routes known
                    // to declare nothing still see it in the thread's scope.
                    self.attach(head, &charge);
                }
                Admission::Pass(Some(charge))
            }
            Ok(Err(limited)) => Admission::Refuse(self.limited(&user, cost, &limited)),
            Err(CheckError::Storage(error)) => {
                match self.storage_failed(&user, &self.tiers.entry(tier).name, &error) {
                    None => self.bypass(head, user, tier),
                    Some(refusal) => Admission::Refuse(refusal),
                }
            }
            Err(error) => Admission::Refuse(self.check_failed(&user, tier, cost, &error)),
        }
    }

    /// Lets a request through uncounted, still marking it as seen by a
    /// limiter (so route-level costs do not fail closed).
    fn bypass(self: &Arc<Self>, head: &mut impl Head, user: String, tier: TierId) -> Admission {
        let charge = Arc::new(Charge::new(self.clone(), user, tier, None, ChargeState::bypass()));
        self.attach(head, &charge);
        Admission::Pass(Some(charge))
    }

    fn attach(&self, head: &mut impl Head, charge: &Arc<Charge>) {
        let extensions = head.extensions_mut();
        match extensions.get_mut::<Charges>() {
            Some(charges) => charges.0.push(charge.clone()),
            None => {
                let mut charges = Charges::default();
                charges.0.push(charge.clone());
                extensions.insert(charges);
            }
        }
    }

    /// The cost known before the route runs, who set it, and whether it
    /// was learned from earlier requests to the route.
    fn edge_cost(&self, head: &impl Head) -> (u32, Source, Priced) {
        // `call` reads the head in place only without a cost function.
        debug_assert!(self.cost_fn.is_none() || head.parts().is_some());
        let extensions = head.extensions();
        if let Some(TierCost(cost)) = extensions.get::<TierCost>() {
            return (*cost, Source::Edge, Priced::Fresh);
        }
        if let Some(cost) = self.cost_fn.as_ref().and_then(|f| f(head.parts()?)) {
            return (cost, Source::Edge, Priced::Fresh);
        }
        #[cfg(feature = "axum")]
        if let Some(path) = extensions.get::<axum::extract::MatchedPath>() {
            if let Some((cost, source, provisional)) = self.learned.get(head.method(), path) {
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
    fn route_key(&self, head: &impl Head) -> Option<(http::Method, crate::cost::RouteKey)> {
        let path = head.extensions().get::<axum::extract::MatchedPath>()?;
        Some((head.method().clone(), path.clone()))
    }

    #[cfg(not(feature = "axum"))]
    fn route_key(&self, _head: &impl Head) -> Option<(http::Method, crate::cost::RouteKey)> {
        None
    }

    fn unknown_tier(
        self: &Arc<Self>,
        head: &mut impl Head,
        identity: &TierIdentity,
    ) -> Result<TierId, Admission> {
        let (user, tier) = (&*identity.user_id, &*identity.tier);
        tracing::warn!(target: "tower_rate_tier", user, tier, policy = ?self.on_unknown_tier, "unknown tier");
        self.event(&RateLimitEvent::UnknownTier { user, tier });
        match self.on_unknown_tier {
            OnUnknownTier::UseDefault => self.tiers.default_id().ok_or_else(|| {
                Admission::Refuse(response::problem(
                    StatusCode::FORBIDDEN,
                    "the client's tier is not configured and there is no default tier",
                    serde_json::Value::Null,
                ))
            }),
            OnUnknownTier::Deny(status) => Err(Admission::Refuse(response::problem(
                status,
                "the client's tier is not configured",
                serde_json::Value::Null,
            ))),
            OnUnknownTier::Allow => Err(Admission::Pass(self.pass_uncounted(head))),
        }
    }

    fn unidentified(self: &Arc<Self>, head: &mut impl Head) -> Result<(String, TierId), Admission> {
        tracing::debug!(target: "tower_rate_tier", policy = ?self.tiers.on_missing(), "client not identified");
        self.event(&RateLimitEvent::Unidentified);
        match self.tiers.on_missing() {
            OnMissing::UseDefault => match self.tiers.default_id() {
                Some(id) => {
                    let user = self.client_addrs.anonymous_key(head.headers(), head.extensions());
                    Ok((user, id))
                }
                None => Err(Admission::Refuse(response::problem(
                    StatusCode::FORBIDDEN,
                    "the client is not identified and there is no default tier",
                    serde_json::Value::Null,
                ))),
            },
            OnMissing::Allow => Err(Admission::Pass(self.pass_uncounted(head))),
            OnMissing::Deny(status) => Err(Admission::Refuse(response::problem(
                status,
                "the client is not identified",
                serde_json::Value::Null,
            ))),
        }
    }

    /// A request let through uncounted by policy: marked as seen by the
    /// limiter, so that route-level costs do not fail closed.
    fn pass_uncounted(self: &Arc<Self>, head: &mut impl Head) -> Option<Arc<Charge>> {
        let tier = self.tiers.default_id().unwrap_or(TierId(0));
        let charge = Charge::new(self.clone(), String::new(), tier, None, ChargeState::bypass());
        let charge = Arc::new(charge);
        self.attach(head, &charge);
        Some(charge)
    }
}
