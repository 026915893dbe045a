//! A request's charge: what the limiter charged at the edge, and how a
//! route-level declaration settles the difference.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use http::{Method, Response};
use smallvec::SmallVec;

use super::Source;
use super::learned::{Learned, RouteKey};
pub(crate) use super::outcome::Outcome;
use super::parts::Parts;
use crate::body::Refusal;
use crate::headers::RateLimitHeaders;
use crate::identity::OwnQuotas;
use crate::refusal::Refusals;
use crate::response::{apply_admitted_fields, apply_limited_fields};
use crate::storage::DecisionSource;
use crate::tier::{
    Begun, CheckError, RateLimitInfo, RateTier, TierEntry, User, check_result, refund_requests,
};

/// What a limiter's charges need of it: its tiers, how it refuses, and the
/// route costs it learned.
#[derive(Clone)]
pub(crate) struct Ledger {
    pub(crate) tiers: RateTier,
    pub(crate) refusals: Refusals,
    pub(crate) learned: Arc<Learned>,
    /// Statuses of the inner service's answers whose charge is given back.
    pub(crate) refund_on: Option<Arc<RefundOn>>,
    /// Which rate-limit fields admitted responses carry.
    pub(crate) headers: RateLimitHeaders,
    /// Every would-be refusal is let through (shadow mode).
    pub(crate) shadow: bool,
}

impl Ledger {
    /// Whether a would-be refusal in `tier` is let through.
    pub(crate) fn shadowed(&self, tier: &TierEntry) -> bool {
        self.shadow || tier.shadow
    }

    /// `tier` with an identity's own quotas (built once per `with_quotas`
    /// value); a part a tier could not have is ignored alone (a throttled
    /// warning says so). The units it counts are known to the limiter from
    /// then on: a handler's reservation of one is no typo for the tier's
    /// other users.
    pub(crate) fn own_entry(&self, tier: Arc<TierEntry>, own: &OwnQuotas) -> Arc<TierEntry> {
        let entry = own.entry(&tier, |error| self.refusals.own_quotas_ignored(&tier.name, error));
        if !entry.units.is_empty() {
            self.tiers.learn_units(&entry);
        }
        entry
    }
}

pub(crate) type RefundOn = dyn Fn(http::StatusCode) -> bool + Send + Sync;

#[derive(Debug)]
pub(crate) struct ChargeState {
    /// The units charged, by who charged them: a refund gives each part
    /// back where it was charged (see [`Parts`]).
    pub(super) charged: Parts,
    source: Source,
    outcome: Outcome,
    /// The limiter priced the request from what it learned of the route.
    learned: bool,
    /// The strongest route-level declaration seen, whatever came of it.
    declared: Option<(u32, Source)>,
    /// Units reserved and not yet settled, per unit (by its id, unique
    /// among a tier's units), by who reserved them; empty, it allocates
    /// nothing.
    pub(super) reserved: Vec<(u32, Parts)>,
    /// The refusals of reservations of the request that consume nothing
    /// (429 for want of quota, 503 for a failed storage), in any limiter,
    /// the last [`MAX_NOTED_REFUSALS`](super::usage::MAX_NOTED_REFUSALS)
    /// of them: a gRPC answer that is one of them answers it (see
    /// [`NotedRefusal::answered_by`](super::usage::NotedRefusal::answered_by)).
    /// Boxed, as the rare case: a charge that has none is a pointer larger
    /// (a charge is moved whole into its `Arc`; a `Vec` here cost an
    /// admitted request 46 instructions of copying).
    pub(super) usage_refusals: Option<Box<super::usage::NotedRefusals>>,
}

impl ChargeState {
    /// `charged` units charged at the limiter, set by `source`; `learned`
    /// when priced from what the limiter learned of the route.
    pub(crate) fn new(charged: u32, source: Source, outcome: Outcome, learned: bool) -> Self {
        let decided_by = match &outcome {
            Outcome::Admitted(decision) => decision.source,
            _ => DecisionSource::Storage,
        };
        ChargeState {
            charged: Parts::by(charged, decided_by),
            source,
            outcome,
            learned,
            declared: None,
            reserved: Vec::new(),
            usage_refusals: None,
        }
    }
}

impl ChargeState {
    /// Adds `units` charged by a decision of `decided_by`.
    fn add(&mut self, units: u32, decided_by: DecisionSource) {
        self.charged.add(Parts::by(units, decided_by));
    }

    /// Takes `units` (at most what is charged) off the charge.
    fn take(&mut self, units: u32) -> Parts {
        self.charged.take(units)
    }

    /// Puts back what [`ChargeState::take`] took (a refund that failed).
    fn put_back(&mut self, parts: Parts) {
        self.charged.add(parts);
    }
}

/// The limiter's handle on one request's charge, shared with route-level
/// cost declarations through the request extensions.
pub(crate) struct Charge {
    pub(super) ledger: Arc<Ledger>,
    pub(super) user: User,
    pub(super) tier: Arc<TierEntry>,
    route: Option<(Method, RouteKey)>,
    state: Mutex<ChargeState>,
}

/// The charges of every limiter a request has passed (several when limiters
/// are stacked), in the request extensions: `None` for a limiter whose price
/// is final (an unlimited tier, a request let through uncounted), which a
/// route-level declaration leaves alone.
#[derive(Clone, Default)]
pub(crate) struct Charges(pub(crate) SmallVec<[Option<Arc<Charge>>; 2]>);

impl crate::slot::SlotOwner for Charge {
    /// Gives back the slot of `lease`, taken under this charge's user and
    /// tier.
    fn release_slot(&self, lease: crate::storage::Lease) -> Option<crate::storage::Decide> {
        self.ledger.tiers.release(self.user.id(), &self.tier, lease)
    }
}

impl Charge {
    #[inline]
    pub(crate) fn new(
        ledger: Arc<Ledger>,
        user: User,
        tier: Arc<TierEntry>,
        route: Option<(Method, RouteKey)>,
        state: ChargeState,
    ) -> Self {
        Charge {
            ledger,
            user,
            tier,
            route,
            state: Mutex::new(state),
        }
    }

    /// The name of the tier charged.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn tier_name(&self) -> &str {
        &self.tier.name
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ChargeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called by the limiter on the way out: adds the headers of the final
    /// state, and learns the route's declared cost (or that a route that
    /// answered successfully declares none). `true` when the response is a
    /// gRPC answer that is the refusal of a reservation of the request for
    /// want of quota (see [`NotedRefusal::answered_by`]), which it marks.
    #[inline]
    pub(crate) fn finish<B>(&self, response: &mut Response<B>) -> bool {
        let mut state = self.lock();
        // a gRPC answer that is a refusal of a reservation of the request
        // is marked one here
        #[cfg(feature = "grpc")]
        let for_quota = state
            .usage_refusals
            .iter()
            .flat_map(|noted| noted.0.iter())
            .find_map(|noted| noted.answered_by(response))
            == Some(true);
        #[cfg(not(feature = "grpc"))]
        let for_quota = false;
        if response.extensions().get::<Refusal>().is_some() {
            // Refused: it consumes nothing here, and the refusal keeps its
            // own headers. When this limiter's own settlement of a
            // declaration refused it, the declaration ran and the route's
            // price is known (provisionally: a declaration after it may not
            // have run), so a cost above a tier's burst is answered 403 at
            // the limiter from then on, to every user, even one whose quota
            // is spent. A refusal from further in says nothing of the
            // route's price.
            let charged = state.take(u32::MAX);
            let own = matches!(state.outcome, Outcome::Refused)
                .then_some(state.declared)
                .flatten();
            drop(state);
            self.give_back_now(charged);
            if let (Some((method, path)), Some((cost, source))) = (&self.route, own) {
                self.ledger.learned.set(method, path, cost, source, true);
            }
            return for_quota;
        }
        let refund = self
            .ledger
            .refund_on
            .as_ref()
            .is_some_and(|refund_on| refund_on(response.status()));
        if refund && state.charged.total() > 0 {
            // The inner service's answer is one the layer was told to give
            // the charge back for.
            let charged = state.charged.total();
            if let Outcome::Admitted(decision) = &mut state.outcome {
                refund_requests(&mut decision.bands, &self.tier, charged);
            }
            self.give_back_now(state.take(charged));
        }
        let which = self.ledger.headers;
        match &state.outcome {
            Outcome::Admitted(decision) => {
                apply_admitted_fields(response.headers_mut(), &self.tier, decision, which)
            }
            Outcome::Shadowed(limited) => apply_limited_fields(response.headers_mut(), limited, which),
            Outcome::Refused | Outcome::Bypass => {}
        }
        let Some((method, path)) = &self.route else {
            return false;
        };
        // A method the route has no handler for: axum's 405 (or a 501) comes
        // from a fallback that the route's layers wrap too, so a declaration
        // may have run for a method the route does not serve.
        if matches!(
            response.status(),
            http::StatusCode::METHOD_NOT_ALLOWED | http::StatusCode::NOT_IMPLEMENTED
        ) {
            return false;
        }
        let learned = &self.ledger.learned;
        match state.declared {
            // Learned also from refused requests, so that a cost above the
            // burst is answered 403 at once next time.
            Some((cost, source)) => {
                let provisional = matches!(state.outcome, Outcome::Refused);
                learned.set(method, path, cost, source, provisional)
            }
            None if state.source == Source::Default && !state.learned && response.status().is_success() => {
                learned.set(method, path, 1, Source::Default, false)
            }
            None => {}
        }
        false
    }

    /// Records `declared` (by `source`) and says whether the charge already
    /// matches it: `None` when it does (nothing to ask the storage), else
    /// the units charged so far.
    pub(super) fn note(&self, declared: u32, source: Source) -> Option<u32> {
        let mut state = self.lock();
        if state.declared.is_none_or(|(_, s)| s <= source) {
            state.declared = Some((declared, source));
        }
        if source < state.source {
            return None;
        }
        if state.charged.total() == declared {
            state.source = source;
            return None;
        }
        Some(state.charged.total())
    }

    /// Brings the charge from `charged` to `declared`, as declared by
    /// `source`. `Err` is the refusal to answer with; nothing is then
    /// consumed.
    pub(super) async fn settle(
        &self,
        charged: u32,
        declared: u32,
        source: Source,
    ) -> Result<(), Response<Bytes>> {
        let tiers = &self.ledger.tiers;
        if declared < charged {
            let excess = charged - declared;
            let parts = self.lock().take(excess);
            let mut given = Ok(());
            for (units, decided_by) in parts.each() {
                let back = tiers.give_back(self.user.id(), &self.tier, units, Some(decided_by));
                given = given.and(back.await);
            }
            let mut state = self.lock();
            match given {
                Ok(()) => {
                    state.source = source;
                    if let Outcome::Admitted(decision) = &mut state.outcome {
                        refund_requests(&mut decision.bands, &self.tier, excess);
                    }
                }
                // Over-charged rather than under-charged; still admitted.
                Err(e) => {
                    state.put_back(parts);
                    self.ledger.refusals.refund_failed(&e);
                }
            }
            return Ok(());
        }
        match self.charge(declared - charged).await {
            Ok(Ok(info)) => {
                self.admitted(declared, source, info);
                Ok(())
            }
            Err(CheckError::Storage(error)) => self.storage_failed(&error, charged).await,
            Ok(Err(_)) | Err(_) => {
                // Give the pre-charge back and decide the whole cost afresh, so
                // that the answer and its headers are exact.
                self.give_back(charged).await;
                match self.charge(declared).await {
                    Ok(Ok(info)) => {
                        self.admitted(declared, source, info);
                        Ok(())
                    }
                    Ok(Err(mut limited)) if self.ledger.shadowed(&self.tier) => {
                        // Let through, consuming nothing.
                        self.ledger
                            .refusals
                            .shadow_limited(self.user.as_str(), declared, &limited);
                        let mut state = self.lock();
                        state.source = Source::Edge;
                        limited.detail.slots = limited.detail.slots.or(state.outcome.slots());
                        state.outcome = Outcome::Shadowed(limited);
                        Ok(())
                    }
                    Ok(Err(limited)) => {
                        self.refuse();
                        Err(self
                            .ledger
                            .refusals
                            .limited(self.user.as_str(), declared, &limited))
                    }
                    Err(error @ CheckError::CostExceedsLimit { .. }) if self.ledger.shadowed(&self.tier) => {
                        let _ = self.ledger.refusals.check_failed(
                            self.user.as_str(),
                            &self.tier.name,
                            declared,
                            &error,
                        );
                        let mut state = self.lock();
                        state.source = Source::Edge;
                        state.outcome = Outcome::Bypass;
                        Ok(())
                    }
                    Err(CheckError::Storage(error)) => self.storage_failed(&error, 0).await,
                    Err(error) => {
                        self.refuse();
                        Err(self.ledger.refusals.check_failed(
                            self.user.as_str(),
                            &self.tier.name,
                            declared,
                            &error,
                        ))
                    }
                }
            }
        }
    }

    async fn charge(&self, cost: u32) -> crate::tier::CheckResult {
        match self.ledger.tiers.begin(self.user.id(), &self.tier, cost, false) {
            Begun::Asked(decide) => check_result(&self.tier, decide.await),
            Begun::Unlimited => self.ledger.tiers.unlimited(&self.tier),
            Begun::Failed(error) => Err(error),
        }
    }

    /// Gives `parts` back from the response's way out, each where it was
    /// charged: at once when the storage decides at once, else in a task of
    /// its own.
    fn give_back_now(&self, parts: Parts) {
        for (units, decided_by) in parts.each() {
            self.give_back_part_now(units, decided_by);
        }
    }

    fn give_back_part_now(&self, units: u32, decided_by: DecisionSource) {
        let refund = self
            .ledger
            .tiers
            .start_refund(self.user.id(), &self.tier, units, Some(decided_by));
        let Some(refund) = refund else {
            return;
        };
        match refund.into_ready() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.ledger.refusals.refund_failed(&e),
            Err(pending) => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let ledger = self.ledger.clone();
                    runtime.spawn(async move {
                        if let Err(e) = pending.await {
                            ledger.refusals.refund_failed(&e);
                        }
                    });
                }
                Err(_) => self
                    .ledger
                    .refusals
                    .refund_failed(&"skipped: the storage waits and no tokio runtime runs here"),
            },
        }
    }

    /// Takes `units` off the charge and gives them back, each part where
    /// it was charged.
    pub(super) async fn give_back(&self, units: u32) {
        let parts = self.lock().take(units);
        for (units, decided_by) in parts.each() {
            let tiers = &self.ledger.tiers;
            if let Err(e) = tiers
                .give_back(self.user.id(), &self.tier, units, Some(decided_by))
                .await
            {
                self.ledger.refusals.refund_failed(&e);
            }
        }
    }

    /// The charge brought to `charged` by `info`'s decision, as declared by
    /// `source`.
    fn admitted(&self, charged: u32, source: Source, info: RateLimitInfo) {
        let mut state = self.lock();
        let more = charged.saturating_sub(state.charged.total());
        state.add(more, info.source());
        state.source = source;
        let mut decision = info.into_decision();
        // a settlement decides the bands alone: the slot the request holds
        // is the admission's
        decision.slots = decision.slots.or(state.outcome.slots());
        state.outcome = Outcome::Admitted(decision);
    }

    async fn storage_failed(
        &self,
        error: &crate::storage::StorageError,
        charged: u32,
    ) -> Result<(), Response<Bytes>> {
        match self
            .ledger
            .refusals
            .storage_failed(self.user.as_str(), &self.tier.name, error)
        {
            None => {
                let mut state = self.lock();
                state.source = Source::Edge;
                state.outcome = Outcome::Bypass;
                Ok(())
            }
            Some(refusal) => {
                if charged > 0 {
                    self.give_back(charged).await;
                }
                self.refuse();
                Err(refusal)
            }
        }
    }

    fn refuse(&self) {
        let mut state = self.lock();
        state.take(u32::MAX);
        state.source = Source::Edge;
        state.outcome = Outcome::Refused;
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Charge")
            .field("user", &self.ledger.refusals.pseudonyms.of(self.user.as_str()))
            .field("state", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Charges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}
