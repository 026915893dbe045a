//! Admission: who is calling, which tier, what the request costs, and what
//! the storage says.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, StatusCode};

use super::layer::{Identify, Shared};
use crate::cost::{Charge, ChargeState, Charges, Outcome, RouteKey, Source, TierCost};
use crate::event::RateLimitEvent;
use crate::identity::{ANONYMOUS_PREFIX, OwnQuotas, TierIdentity};
use crate::policy::{OnMissing, OnUnknownTier};
use crate::problem::problem;
use crate::refusal::Refusals;
use crate::slot::SlotGuard;
use crate::storage::{Decide, DecisionSource, StorageError, StorageErrorKind};
use crate::tier::{CheckError, CheckResult, MAX_USER_ID_LEN, TierEntry, conclude};

/// The key `ClientAddrs::anonymous_key` gives an unidentified client
/// without a peer address (`limit/tests.rs` checks the two agree).
const NO_ADDRESS_KEY: &str = "\0anonymous";

/// What the limiter decided about a request.
pub(crate) enum Admission {
    /// Call the inner service; the charge adds headers on the way out, and
    /// the request holds its slot (a tier with a concurrency limit) until
    /// its response is over.
    Pass(Option<Arc<Charge>>, Option<SlotGuard>),
    /// Answer without calling the inner service.
    Refuse(http::Response<bytes::Bytes>),
}

/// `tier` with an identity's own bands (built once per `with_quotas` value),
/// or `tier` itself when they are not bands a tier could have (a throttled
/// warning says so).
fn own_quotas(tier: Arc<TierEntry>, own: &OwnQuotas, refusals: &Refusals) -> Arc<TierEntry> {
    match own.entry(&tier) {
        Ok(entry) => entry,
        Err(error) => {
            refusals.own_quotas_ignored(&tier.name, &error);
            tier
        }
    }
}

/// Puts a charge where route-level declarations find it: the request
/// extensions, after those of limiters that ran before.
fn attach(head: &mut impl Head, charge: &Arc<Charge>) {
    let charges = head.extensions_mut().get_or_insert_default::<Charges>();
    charges.0.push(charge.clone());
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
    pub(crate) tier: Arc<TierEntry>,
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
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Provisional,
}

impl Shared {
    /// The identity, when the identifier answers without waiting (`None`
    /// for an identifier that waits). A function of the whole head needs
    /// `head` to be [`Parts`].
    pub(crate) fn identify_now(&self, head: &impl Head) -> Option<Option<TierIdentity>> {
        match &self.identify {
            Identify::Nobody => Some(None),
            Identify::Headers(f) => Some(f(head.headers())),
            Identify::Parts(f) => head.parts().map(|parts| f(parts)),
            Identify::Async(_) => None,
        }
    }

    /// Whether the limiter reads more of a request than its headers and
    /// extensions (the request is then split into [`Parts`]).
    pub(crate) fn reads_parts(&self) -> bool {
        matches!(self.identify, Identify::Parts(_)) || self.cost_fn.is_some()
    }

    /// The identity, waiting for the identifier if it must.
    pub(crate) async fn identify(&self, parts: &Parts) -> Option<TierIdentity> {
        match &self.identify {
            Identify::Async(identifier) => identifier.identify_parts(parts).await,
            _ => self.identify_now(parts).flatten(),
        }
    }

    /// Asks the storage to decide the bill: the outcome, or the storage's
    /// answer to wait for.
    pub(crate) fn decide(&self, bill: &Bill) -> Result<CheckResult, Decide> {
        match self.ledger.tiers.begin(&bill.user, &bill.tier, bill.cost, true) {
            Err(answered) => Ok(answered),
            Ok(decide) => decide.into_ready().map(|decision| conclude(&bill.tier, decision)),
        }
    }

    /// Who pays how much, or the answer when the request is not charged.
    pub(crate) fn bill(
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
            Some(identity) => {
                let tier = match self
                    .ledger
                    .tiers
                    .resolve_hinted(&identity.tier, identity.tier_hint())
                {
                    Some(tier) => tier,
                    None => self.unknown_tier(head, &identity)?,
                };
                let tier = match identity.own_quotas() {
                    Some(own) => own_quotas(tier, own, &self.ledger.refusals),
                    None => tier,
                };
                (identity.user_id, tier)
            }
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
    pub(crate) fn conclude(
        self: &Arc<Self>,
        head: &mut impl Head,
        bill: Bill,
        result: CheckResult,
    ) -> Admission {
        let Bill {
            user,
            tier,
            cost,
            source,
            priced,
        } = bill;
        let learned = priced != Priced::Fresh;
        let result = match result {
            Ok(Ok(info)) if tier.concurrency.is_some() && info.slots().and_then(|s| s.lease).is_none() => {
                Err(CheckError::Storage(StorageError::new(
                    StorageErrorKind::Other,
                    "the storage admitted a request of a tier with a concurrency limit without taking a slot: \
                     it does not count requests in flight (`Op::Acquire`)",
                )))
            }
            other => other,
        };
        #[cfg(feature = "metrics")]
        if let Some(counters) = &self.metrics {
            let shadowed = self.ledger.shadowed(&tier);
            counters.check(
                &tier.name,
                &result,
                self.ledger.refusals.on_storage_error,
                shadowed,
            );
        }
        if let Ok(decided) = &result {
            let source = decided.as_ref().map_or_else(|l| l.source(), |i| i.source());
            if source == DecisionSource::Overflow {
                self.ledger.refusals.overflow(&user, &tier.name);
            }
            if !tier.unlimited {
                self.ledger.refusals.decided_by(source);
            }
        }
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
                let lease = info.slots().and_then(|s| s.lease);
                // an unlimited tier with a concurrency limit reports its slots
                let (outcome, source) = if info.is_unlimited() && lease.is_none() {
                    (Outcome::Bypass, Source::Edge)
                } else {
                    (Outcome::Admitted(info), source)
                };
                let state = ChargeState::new(cost, source, outcome, learned);
                let charge = Arc::new(Charge::new(self.ledger.clone(), user, tier, route, state));
                attach(head, &charge);
                let slot = lease.map(|lease| self.slot(&charge, lease));
                Admission::Pass(Some(charge), slot)
            }
            Ok(Err(limited)) if self.ledger.shadowed(&tier) => {
                // Shadow mode: reported, let through, nothing consumed.
                self.ledger.refusals.shadow_limited(&user, cost, &limited);
                let state = ChargeState::new(0, Source::Edge, Outcome::Shadowed(limited), learned);
                let charge = Arc::new(Charge::new(self.ledger.clone(), user, tier, None, state));
                attach(head, &charge);
                Admission::Pass(Some(charge), None)
            }
            Ok(Err(limited)) => Admission::Refuse(self.ledger.refusals.limited(&user, cost, &limited)),
            Err(error @ CheckError::CostExceedsLimit { .. }) if self.ledger.shadowed(&tier) => {
                let _ = self.ledger.refusals.check_failed(&user, &tier.name, cost, &error);
                self.bypass(head, user, tier)
            }
            Err(CheckError::Storage(error)) => {
                match self.ledger.refusals.storage_failed(&user, &tier.name, &error) {
                    None => self.bypass(head, user, tier),
                    Some(refusal) => Admission::Refuse(refusal),
                }
            }
            Err(error) => {
                Admission::Refuse(self.ledger.refusals.check_failed(&user, &tier.name, cost, &error))
            }
        }
    }

    /// Lets a request through uncounted, still marking it as seen by a
    /// limiter (so route-level costs do not fail closed).
    fn bypass(self: &Arc<Self>, head: &mut impl Head, user: String, tier: Arc<TierEntry>) -> Admission {
        let charge = Arc::new(Charge::new(
            self.ledger.clone(),
            user,
            tier,
            None,
            ChargeState::bypass(),
        ));
        attach(head, &charge);
        Admission::Pass(Some(charge), None)
    }

    /// The guard of the slot `lease` an admitted request took, counted in
    /// its tier's gauge of slots in use.
    fn slot(&self, charge: &Arc<Charge>, lease: crate::storage::Lease) -> SlotGuard {
        let guard = SlotGuard::new(charge.clone(), lease);
        #[cfg(feature = "metrics")]
        let guard = guard.counted(self.metrics.as_ref().map(|m| m.slots_in_use(charge.tier_name())));
        guard
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
            if let Some((cost, source, provisional)) = self.ledger.learned.get(head.method(), path) {
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
    fn route_key(&self, head: &impl Head) -> Option<(http::Method, RouteKey)> {
        let path = head.extensions().get::<axum::extract::MatchedPath>()?;
        Some((head.method().clone(), path.clone()))
    }

    #[cfg(not(feature = "axum"))]
    fn route_key(&self, _head: &impl Head) -> Option<(http::Method, RouteKey)> {
        None
    }

    fn unknown_tier(
        self: &Arc<Self>,
        head: &mut impl Head,
        identity: &TierIdentity,
    ) -> Result<Arc<TierEntry>, Admission> {
        self.ledger
            .refusals
            .unknown_tier(&identity.user_id, &identity.tier, &self.on_unknown_tier);
        #[cfg(feature = "metrics")]
        if let Some(counters) = &self.metrics {
            counters.unknown_tier(self.on_unknown_tier, self.ledger.tiers.default_entry().is_some());
        }
        match self.on_unknown_tier {
            OnUnknownTier::UseDefault => self.ledger.tiers.default_entry().ok_or_else(|| {
                Admission::Refuse(problem(
                    StatusCode::FORBIDDEN,
                    "the client's tier is not configured and there is no default tier",
                    serde_json::Value::Null,
                ))
            }),
            OnUnknownTier::Deny(status) => Err(Admission::Refuse(problem(
                status,
                "the client's tier is not configured",
                serde_json::Value::Null,
            ))),
            OnUnknownTier::Allow => Err(Admission::Pass(self.pass_uncounted(head), None)),
        }
    }

    fn unidentified(self: &Arc<Self>, head: &mut impl Head) -> Result<(String, Arc<TierEntry>), Admission> {
        let tiers = &self.ledger.tiers;
        tracing::debug!(target: "tower_rate_tier", policy = ?tiers.on_missing(), "client not identified");
        self.ledger.refusals.event(&RateLimitEvent::Unidentified);
        #[cfg(feature = "metrics")]
        if let Some(counters) = &self.metrics {
            counters.unidentified(tiers.on_missing(), tiers.default_entry().is_some());
        }
        match tiers.on_missing() {
            OnMissing::UseDefault => match tiers.default_entry() {
                Some(tier) => {
                    let user = self.client_addrs.anonymous_key(head.headers(), head.extensions());
                    if user == NO_ADDRESS_KEY {
                        self.warn_no_address();
                    }
                    Ok((user, tier))
                }
                None => Err(Admission::Refuse(problem(
                    StatusCode::FORBIDDEN,
                    "the client is not identified and there is no default tier",
                    serde_json::Value::Null,
                ))),
            },
            OnMissing::Allow => Err(Admission::Pass(self.pass_uncounted(head), None)),
            OnMissing::Deny(status) => Err(Admission::Refuse(problem(
                status,
                "the client is not identified",
                serde_json::Value::Null,
            ))),
        }
    }

    /// Logs, once per layer, that an anonymous client had no address: all
    /// such clients share one bucket, which one of them can spend for all.
    fn warn_no_address(&self) {
        let warned = &self.warned_no_address;
        if !warned.load(Ordering::Relaxed) && !warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "tower_rate_tier",
                "an unidentified client has no peer address, so every such client shares one bucket of the \
                 default tier; serve axum with `into_make_service_with_connect_info::<SocketAddr>()`, or \
                 insert a `PeerAddr` extension per connection (logged once per layer)"
            );
        }
    }

    /// A request let through uncounted by policy: marked as seen by the
    /// limiter, so that route-level costs do not fail closed.
    fn pass_uncounted(self: &Arc<Self>, head: &mut impl Head) -> Option<Arc<Charge>> {
        let tiers = &self.ledger.tiers;
        let tier = tiers.default_entry().or_else(|| tiers.first_entry())?;
        let charge = Charge::new(
            self.ledger.clone(),
            String::new(),
            tier,
            None,
            ChargeState::bypass(),
        );
        let charge = Arc::new(charge);
        attach(head, &charge);
        Some(charge)
    }
}
