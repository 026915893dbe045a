//! [`TierLimitService`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower_service::Service;

use crate::cost::{Charge, ChargeState, Charges, InScope, Outcome, Scope, Source, TierCost, now_or_never};
use crate::future::ResponseFuture;
use crate::identity::{TierIdentity, client_ip};
use crate::layer::{Identify, OnUnknownTier, RateLimitEvent, Shared};
use crate::response;
use crate::tier::{CheckError, MAX_USER_ID_LEN, OnMissing, TierId};

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

/// Keys of unidentified clients start with a NUL, which no valid identity
/// does: anonymous buckets never share the key space of user ids.
const ANONYMOUS_PREFIX: &str = "\0";

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
        let (mut parts, body) = req.into_parts();
        if self.shared.tiers.decides_now() {
            if let Some(identity) = self.shared.identify_now(&parts) {
                // Everything completes at once: decide inline, box nothing.
                return match now_or_never(self.shared.admit(&mut parts, identity)) {
                    Some(Admission::Pass(charge)) => {
                        let future = {
                            let _scope = Scope::enter(charge.as_ref());
                            self.inner.call(Request::from_parts(parts, body))
                        };
                        ResponseFuture::inner(future, charge)
                    }
                    Some(Admission::Refuse(response)) => ResponseFuture::refuse(response.map(ResB::from)),
                    None => ResponseFuture::refuse(crate::cost::internal_error().map(ResB::from)),
                };
            }
        }
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
                None => match self.unknown_tier(parts, &identity) {
                    Ok(id) => (identity.user_id, id),
                    Err(admission) => return admission,
                },
            },
            None => match self.unidentified(parts) {
                Ok(pair) => pair,
                Err(admission) => return admission,
            },
        };
        let (cost, source, learned) = self.edge_cost(parts);
        let declares_nothing = learned && source == Source::Default;
        match self.tiers.check_id(&user, tier, cost).await {
            Ok(Ok(info)) => {
                let route = self.route_key(parts);
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
                    self.attach(parts, &charge);
                }
                Admission::Pass(Some(charge))
            }
            Ok(Err(limited)) => Admission::Refuse(self.limited(&user, cost, &limited)),
            Err(CheckError::Storage(error)) => {
                match self.storage_failed(&user, &self.tiers.entry(tier).name, &error) {
                    None => self.bypass(parts, user, tier),
                    Some(refusal) => Admission::Refuse(refusal),
                }
            }
            Err(error) => Admission::Refuse(self.check_failed(&user, tier, cost, &error)),
        }
    }

    /// Lets a request through uncounted, still marking it as seen by a
    /// limiter (so route-level costs do not fail closed).
    fn bypass(self: &Arc<Self>, parts: &mut Parts, user: String, tier: TierId) -> Admission {
        let charge = Arc::new(Charge::new(self.clone(), user, tier, None, ChargeState::bypass()));
        self.attach(parts, &charge);
        Admission::Pass(Some(charge))
    }

    fn attach(&self, parts: &mut Parts, charge: &Arc<Charge>) {
        match parts.extensions.get_mut::<Charges>() {
            Some(charges) => charges.0.push(charge.clone()),
            None => {
                let mut charges = Charges::default();
                charges.0.push(charge.clone());
                parts.extensions.insert(charges);
            }
        }
    }

    /// The cost known before the route runs, who set it, and whether it
    /// was learned from earlier requests to the route.
    fn edge_cost(&self, parts: &Parts) -> (u32, Source, bool) {
        if let Some(TierCost(cost)) = parts.extensions.get::<TierCost>() {
            return (*cost, Source::Edge, false);
        }
        if let Some(cost) = self.cost_fn.as_ref().and_then(|f| f(parts)) {
            return (cost, Source::Edge, false);
        }
        #[cfg(feature = "axum")]
        if let Some(path) = parts.extensions.get::<axum::extract::MatchedPath>() {
            if let Some((cost, source)) = self.learned.get(&parts.method, path) {
                return (cost, source, true);
            }
        }
        (1, Source::Default, false)
    }

    #[cfg(feature = "axum")]
    fn route_key(&self, parts: &Parts) -> Option<(http::Method, crate::cost::RouteKey)> {
        let path = parts.extensions.get::<axum::extract::MatchedPath>()?;
        Some((parts.method.clone(), path.clone()))
    }

    #[cfg(not(feature = "axum"))]
    fn route_key(&self, _parts: &Parts) -> Option<(http::Method, crate::cost::RouteKey)> {
        None
    }

    fn unknown_tier(
        self: &Arc<Self>,
        parts: &mut Parts,
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
            OnUnknownTier::Allow => Err(Admission::Pass(self.pass_uncounted(parts))),
        }
    }

    fn unidentified(self: &Arc<Self>, parts: &mut Parts) -> Result<(String, TierId), Admission> {
        tracing::debug!(target: "tower_rate_tier", policy = ?self.tiers.on_missing(), "client not identified");
        self.event(&RateLimitEvent::Unidentified);
        match self.tiers.on_missing() {
            OnMissing::UseDefault => match self.tiers.default_id() {
                Some(id) => {
                    let user = match client_ip(parts, &self.trusted_proxies) {
                        Some(ip) => {
                            let mut user = String::with_capacity(48);
                            user.push_str(ANONYMOUS_PREFIX);
                            user.push_str("ip:");
                            user.push_str(&ip.to_string());
                            user
                        }
                        None => [ANONYMOUS_PREFIX, "anonymous"].concat(),
                    };
                    Ok((user, id))
                }
                None => Err(Admission::Refuse(response::problem(
                    StatusCode::FORBIDDEN,
                    "the client is not identified and there is no default tier",
                    serde_json::Value::Null,
                ))),
            },
            OnMissing::Allow => Err(Admission::Pass(self.pass_uncounted(parts))),
            OnMissing::Deny(status) => Err(Admission::Refuse(response::problem(
                status,
                "the client is not identified",
                serde_json::Value::Null,
            ))),
        }
    }

    /// A request let through uncounted by policy: marked as seen by the
    /// limiter, so that route-level costs do not fail closed.
    fn pass_uncounted(self: &Arc<Self>, parts: &mut Parts) -> Option<Arc<Charge>> {
        let tier = self.tiers.default_id().unwrap_or(TierId(0));
        let charge = Charge::new(self.clone(), String::new(), tier, None, ChargeState::bypass());
        let charge = Arc::new(charge);
        self.attach(parts, &charge);
        Some(charge)
    }
}
