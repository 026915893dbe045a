//! Admission: who is calling, which tier, what the request costs, and what
//! the storage says.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::request::Parts;
use http::{Method, StatusCode};

use super::bill::{Bill, Priced, edge_cost, route_key};
use super::config::{Identify, LayerConfig};
use super::head::Head;
use crate::cost::{Charge, ChargeState, Charges, Outcome, RouteKey, Source};
use crate::event::RateLimitEvent;
use crate::identity::{ANONYMOUS_PREFIX, TierIdentity};
use crate::policy::{OnMissing, OnUnknownTier};
use crate::problem::problem;
use crate::slot::{Acquiring, Release, SlotGuard};
use crate::storage::{Decision, DecisionSource, StorageError, StorageErrorKind};
use crate::tier::{Begun, CheckError, RateLimitInfo, TierEntry, User, check_result};

/// The key `ClientAddrs::anonymous_key` gives an unidentified client
/// without a peer address (`limit/tests.rs` checks the two agree).
const NO_ADDRESS_KEY: &str = "\0anonymous";

/// What the limiter decided about a request.
pub(crate) enum Admission {
    /// Call the inner service; the charge adds headers on the way out, and
    /// the request holds its slot (a tier with a concurrency limit) until
    /// its response is over.
    Pass(Option<Arc<Charge>>, Option<SlotGuard>),
    /// Refuse for want of quota, without calling the inner service: limiters
    /// further out give their charge back (a refused request consumes
    /// nothing anywhere).
    Refuse(http::Response<bytes::Bytes>),
    /// Answer without calling the inner service, for a reason that is not a
    /// quota (a client not identified, a tier not configured): limiters
    /// further out count the request.
    Answer(http::Response<bytes::Bytes>),
}

/// The request's charge, put where route-level declarations find it: the
/// request extensions, after those of limiters that ran before.
#[inline]
fn attach(
    config: &Arc<LayerConfig>,
    head: &mut impl Head,
    user: User,
    tier: Arc<TierEntry>,
    route: Option<(Method, RouteKey)>,
    state: ChargeState,
) -> Arc<Charge> {
    let charge = Arc::new(Charge::new(config.ledger.clone(), user, tier, route, state));
    let charges = head.extensions_mut().get_or_insert_default::<Charges>();
    charges.0.push(Some(charge.clone()));
    charge
}

/// Marks the request as seen by a limiter whose price is final (an
/// unlimited tier, a request let through uncounted): route-level
/// declarations find it (so they do not fail closed) and change nothing.
/// No charge is made: nothing to settle, no fields to add.
fn mark_final(head: &mut impl Head) {
    let charges = head.extensions_mut().get_or_insert_default::<Charges>();
    charges.0.push(None);
}

/// The identity, when the identifier answers without waiting (`None`
/// for an identifier that waits). A function of the whole head needs
/// `head` to be [`Parts`].
pub(crate) fn identify_now(config: &LayerConfig, head: &impl Head) -> Option<Option<TierIdentity>> {
    match &config.identify {
        Identify::Nobody => Some(None),
        Identify::Headers(f) => Some(f(head.headers())),
        Identify::Parts(f) => head.parts().map(|parts| f(parts)),
        Identify::Async(_) => None,
    }
}

/// Whether the limiter reads more of a request than its headers and
/// extensions (the request is then split into [`Parts`]).
pub(crate) fn reads_parts(config: &LayerConfig) -> bool {
    matches!(config.identify, Identify::Parts(_)) || config.cost_fn.is_some()
}

/// The identity, waiting for the identifier if it must.
pub(crate) async fn identify(config: &LayerConfig, parts: &Parts) -> Option<TierIdentity> {
    match &config.identify {
        Identify::Async(identifier) => identifier.identify_parts(parts).await,
        _ => identify_now(config, parts).flatten(),
    }
}

/// The storage's answer to a bill.
pub(crate) enum Decided {
    /// Known now.
    Now(Answer),
    /// To be awaited (Redis).
    Pending(Acquiring),
}

/// What decided a bill.
pub(crate) enum Answer {
    /// The storage: its decision as it stands (an admission is read as it
    /// is, without building the general outcome).
    Storage(Result<Decision, StorageError>),
    /// The limiter, without asking the storage: the tier counts nothing.
    Unlimited,
    /// The limiter, without asking the storage: a cost no request of the
    /// tier can pay.
    Failed(CheckError),
}

/// Asks the storage to decide the bill.
pub(crate) fn decide(config: &LayerConfig, bill: &Bill) -> Decided {
    match config
        .ledger
        .tiers
        .begin(bill.user.id(), &bill.tier, bill.cost, bill.takes_slot())
    {
        Begun::Unlimited => Decided::Now(Answer::Unlimited),
        Begun::Failed(error) => Decided::Now(Answer::Failed(error)),
        Begun::Asked(decide) => match decide.into_ready() {
            Ok(decision) => Decided::Now(Answer::Storage(decision)),
            Err(pending) => Decided::Pending(Acquiring::new(pending, releaser(config, bill))),
        },
    }
}

/// What gives back the slot a bill's decision took for a request gone
/// before the answer: `None` for a tier without a concurrency limit.
fn releaser(config: &LayerConfig, bill: &Bill) -> Option<Release> {
    bill.tier.concurrency.filter(|_| bill.takes_slot())?;
    let (tiers, user, tier) = (config.ledger.tiers.clone(), bill.user.clone(), bill.tier.clone());
    Some(Box::new(move |lease| tiers.release(user.id(), &tier, lease)))
}

/// Who pays how much, or the answer when the request is not charged.
pub(crate) fn bill(
    config: &Arc<LayerConfig>,
    head: &mut impl Head,
    identity: Option<TierIdentity>,
) -> Result<Bill, Admission> {
    // The user id is checked here, once. Ids starting with the anonymous
    // prefix are refused, so that no identifier can hand a client another
    // address's bucket.
    let checked = identity.and_then(|mut identity| {
        let user = User::new(std::mem::take(&mut identity.user_id))?;
        (!user.as_str().starts_with(ANONYMOUS_PREFIX)).then_some((user, identity))
    });
    let (user, tier) = match checked {
        Some((user, identity)) => {
            let tier = match config
                .ledger
                .tiers
                .resolve_hinted(&identity.tier, identity.tier_hint())
            {
                Some(tier) => tier,
                None => unknown_tier(config, head, &user, &identity)?,
            };
            let tier = match identity.own_quotas() {
                Some(own) => config.ledger.own_entry(tier, own),
                None => tier,
            };
            (user, tier)
        }
        None => unidentified(config, head)?,
    };
    let (cost, source, priced) = edge_cost(config, head);
    Ok(Bill {
        user,
        tier,
        cost,
        source,
        priced,
    })
}

/// The admission of a charged request, from the storage's answer.
pub(crate) fn admission(
    config: &Arc<LayerConfig>,
    head: &mut impl Head,
    bill: Bill,
    answer: Answer,
) -> Admission {
    let took_slot = bill.takes_slot();
    let Bill {
        user,
        tier,
        cost,
        source,
        priced,
    } = bill;
    let learned = priced != Priced::Fresh;
    // An admission stays the storage's decision: its fields are written from
    // it and the tier on the way out. (A refused slot refuses whatever the
    // bands said: a storage may answer so for a tier without bands.)
    let result = match answer {
        Answer::Storage(Ok(decision)) if decision.allowed && !decision.slots.is_some_and(|s| s.refused) => {
            Ok(Ok(decision))
        }
        Answer::Storage(decided) => check_result(&tier, decided).map(|r| r.map(RateLimitInfo::into_decision)),
        Answer::Unlimited => return unlimited(config, head, &tier),
        Answer::Failed(error) => Err(error),
    };
    let result = match result {
        Ok(Ok(decision))
            if tier.concurrency.is_some() && took_slot && decision.slots.and_then(|s| s.lease).is_none() =>
        {
            Err(CheckError::Storage(StorageError::new(
                StorageErrorKind::Other,
                "the storage admitted a request of a tier with a concurrency limit without taking a slot: \
                 it does not count requests in flight (`Op::Acquire`)",
            )))
        }
        other => other,
    };
    #[cfg(feature = "metrics")]
    if let Some(counters) = &config.metrics {
        let shadowed = config.ledger.shadowed(&tier);
        counters.check(
            &tier.name,
            &result,
            config.ledger.refusals.on_storage_error,
            shadowed,
        );
    }
    if let Ok(decided) = &result {
        let source = decided.as_ref().map_or_else(|l| l.source(), |d| d.source);
        if source == DecisionSource::Overflow {
            config.ledger.refusals.overflow(user.as_str(), &tier.name);
        }
        if !tier.unlimited {
            config.ledger.refusals.decided_by(source);
        }
    }
    match result {
        Ok(Ok(decision)) => {
            // A route whose cost is learned needs no more learning: a
            // declaration that still runs there is settled, not learned
            // (so a declaration behind a condition never re-prices the
            // requests that skip it).
            let route = if priced == Priced::Learned {
                None
            } else {
                route_key(head)
            };
            let lease = decision.slots.and_then(|s| s.lease);
            if tier.counts_nothing() && lease.is_none() {
                mark_final(head);
                return Admission::Pass(None, None);
            }
            // an unlimited tier with a concurrency limit reports its slots
            let state = ChargeState::new(cost, source, Outcome::Admitted(decision), learned);
            let charge = attach(config, head, user, tier, route, state);
            let slot = lease.map(|lease| slot(config, &charge, lease));
            Admission::Pass(Some(charge), slot)
        }
        Ok(Err(limited)) if config.ledger.shadowed(&tier) => {
            // Shadow mode: reported, let through, nothing consumed.
            config
                .ledger
                .refusals
                .shadow_limited(user.as_str(), cost, &limited);
            let state = ChargeState::new(0, Source::Edge, Outcome::Shadowed(limited), learned);
            let charge = attach(config, head, user, tier, None, state);
            Admission::Pass(Some(charge), None)
        }
        Ok(Err(limited)) => Admission::Refuse(config.ledger.refusals.limited(user.as_str(), cost, &limited)),
        Err(error @ CheckError::CostExceedsLimit { .. }) if config.ledger.shadowed(&tier) => {
            let _ = config
                .ledger
                .refusals
                .check_failed(user.as_str(), &tier.name, cost, &error);
            bypass(head)
        }
        Err(CheckError::Storage(error)) => {
            match config
                .ledger
                .refusals
                .storage_failed(user.as_str(), &tier.name, &error)
            {
                None => bypass(head),
                Some(refusal) => Admission::Refuse(refusal),
            }
        }
        Err(error) => Admission::Refuse(config.ledger.refusals.check_failed(
            user.as_str(),
            &tier.name,
            cost,
            &error,
        )),
    }
}

/// The admission of a request of a tier that counts nothing: let through,
/// marked as seen by a limiter whose price is final.
fn unlimited(config: &LayerConfig, head: &mut impl Head, tier: &TierEntry) -> Admission {
    #[cfg(feature = "metrics")]
    if let Some(counters) = &config.metrics {
        let shadowed = config.ledger.shadowed(tier);
        let admitted: Result<Result<(), crate::tier::RateLimited>, CheckError> = Ok(Ok(()));
        counters.check(
            &tier.name,
            &admitted,
            config.ledger.refusals.on_storage_error,
            shadowed,
        );
    }
    let _ = (config, tier);
    mark_final(head);
    Admission::Pass(None, None)
}

/// Lets a request through uncounted (by policy, or on a storage error under
/// `OnStorageError::Allow`), still marking it as seen by a limiter, so that
/// route-level costs do not fail closed.
fn bypass(head: &mut impl Head) -> Admission {
    mark_final(head);
    Admission::Pass(None, None)
}

/// The guard of the slot `lease` an admitted request took, counted in
/// its tier's gauge of slots in use.
fn slot(config: &LayerConfig, charge: &Arc<Charge>, lease: crate::storage::Lease) -> SlotGuard {
    let guard = SlotGuard::new(charge.clone(), lease);
    #[cfg(not(feature = "metrics"))]
    let _ = config;
    #[cfg(feature = "metrics")]
    let guard = guard.counted(
        config
            .metrics
            .as_ref()
            .map(|m| m.slots_in_use(charge.tier_name())),
    );
    guard
}

fn unknown_tier(
    config: &Arc<LayerConfig>,
    head: &mut impl Head,
    user: &User,
    identity: &TierIdentity,
) -> Result<Arc<TierEntry>, Admission> {
    config
        .ledger
        .refusals
        .unknown_tier(user.as_str(), &identity.tier, &config.on_unknown_tier);
    #[cfg(feature = "metrics")]
    if let Some(counters) = &config.metrics {
        counters.unknown_tier(
            config.on_unknown_tier,
            config.ledger.tiers.default_entry().is_some(),
        );
    }
    match config.on_unknown_tier {
        OnUnknownTier::UseDefault => config.ledger.tiers.default_entry().ok_or_else(|| {
            Admission::Answer(problem(
                StatusCode::FORBIDDEN,
                "the client's tier is not configured and there is no default tier",
                serde_json::Value::Null,
            ))
        }),
        OnUnknownTier::Deny(status) => Err(Admission::Answer(problem(
            status,
            "the client's tier is not configured",
            serde_json::Value::Null,
        ))),
        OnUnknownTier::Allow => Err(bypass(head)),
    }
}

fn unidentified(
    config: &Arc<LayerConfig>,
    head: &mut impl Head,
) -> Result<(User, Arc<TierEntry>), Admission> {
    let tiers = &config.ledger.tiers;
    tracing::debug!(target: "tower_rate_tier", policy = ?tiers.on_missing(), "client not identified");
    config.ledger.refusals.event(&RateLimitEvent::Unidentified);
    #[cfg(feature = "metrics")]
    if let Some(counters) = &config.metrics {
        counters.unidentified(tiers.on_missing(), tiers.default_entry().is_some());
    }
    match tiers.on_missing() {
        OnMissing::UseDefault => match tiers.default_entry() {
            Some(tier) => {
                let user = config
                    .client_addrs
                    .anonymous_key(head.headers(), head.extensions());
                if user == NO_ADDRESS_KEY {
                    warn_no_address(config);
                }
                // an address key is at most `\0ip:` and an IPv6 prefix
                let user = User::new(user).ok_or_else(|| bypass(head))?;
                Ok((user, tier))
            }
            None => Err(Admission::Answer(problem(
                StatusCode::FORBIDDEN,
                "the client is not identified and there is no default tier",
                serde_json::Value::Null,
            ))),
        },
        OnMissing::Allow => Err(bypass(head)),
        OnMissing::Deny(status) => Err(Admission::Answer(problem(
            status,
            "the client is not identified",
            serde_json::Value::Null,
        ))),
    }
}

/// Logs, once per layer, that an anonymous client had no address: all
/// such clients share one bucket, which one of them can spend for all.
fn warn_no_address(config: &LayerConfig) {
    let warned = &config.warned_no_address;
    if !warned.load(Ordering::Relaxed) && !warned.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            target: "tower_rate_tier",
            "an unidentified client has no peer address, so every such client shares one bucket of the \
             default tier; serve axum with `into_make_service_with_connect_info::<SocketAddr>()`, or \
             insert a `PeerAddr` extension per connection (logged once per layer)"
        );
    }
}

/// A refusal in the request's protocol: gRPC's for gRPC requests (feature
/// `grpc`), else the HTTP one.
pub(crate) fn answer(
    config: &LayerConfig,
    request: &http::HeaderMap,
    refusal: http::Response<bytes::Bytes>,
) -> http::Response<bytes::Bytes> {
    #[cfg(feature = "grpc")]
    let refusal = crate::grpc::refusal(request, refusal, config.grpc_retry_pushback);
    let _ = (config, request);
    refusal
}
