//! Named tiers and their quotas: [`RateTier`] and its builder.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tower_rate_tier::{Quota, RateTier, clock::FakeClock};
//!
//! let tiers = RateTier::builder()
//!     .tier("free", Quota::per_minute(2))
//!     .tier("pro", [Quota::per_second(5), Quota::per_day(10_000)])
//!     .tier("enterprise", Quota::unlimited())
//!     .default_tier("free")
//!     .clock(FakeClock::new())
//!     .build();
//!
//! assert!(tiers.check("ada", "free", 1).await.unwrap().is_ok());
//! assert!(tiers.check("ada", "free", 1).await.unwrap().is_ok());
//! let denied = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
//! assert_eq!(denied.retry_after.as_secs(), 30);
//! # }
//! ```
//!
//! A `RateTier` holds its storage as `Arc<dyn Storage>`, so one type serves
//! every storage: a function takes a limiter whatever it counts with.
//!
//! ```
//! use tower_rate_tier::{Quota, RateTier, storage::MemoryStorage};
//!
//! fn describe(tiers: &RateTier) -> Vec<String> {
//!     tiers.tier_names()
//! }
//!
//! let default = RateTier::builder().tier("free", Quota::per_minute(2)).build();
//! let own = RateTier::builder().tier("pro", Quota::per_minute(20)).storage(MemoryStorage::new()).build();
//! assert_eq!((describe(&default), describe(&own)), (vec!["free".to_owned()], vec!["pro".to_owned()]));
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::clock::Clock;
use crate::headers::TierHeaders;
use crate::policy::OnMissing;
use crate::quota::Quota;
use crate::storage::{Decide, DecisionSource, Lease, Op, ScopeKey, Slots, Storage, TierScope};

mod builder;
mod live;
mod name;
mod outcome;
mod refunds;
mod table;
mod units;
mod usage;
mod user;

pub use builder::{BuildError, DEFAULT_CONCURRENCY_LEASE, RateTierBuilder};
pub use name::{IntoTierName, ParseTierError, TierTable};
pub use outcome::{CheckError, CheckResult, MAX_USER_ID_LEN, RateLimitInfo, RateLimited};
pub(crate) use outcome::{Detail, Reported, a_band_refuses, outcome, refund_requests, reset_at_unix_secs};
pub use units::MAX_REQUEST_BANDS;
pub(crate) use units::{UnitBands, UnitQuotas};
pub(crate) use usage::{forgiven, moves_nothing, settlement};
pub(crate) use user::{User, UserId};

/// One configured tier, shared by the [`RateTier`] and the outcomes of its
/// checks.
#[derive(Debug)]
pub(crate) struct TierEntry {
    /// The name requests, keys and headers use (the `&'static str` of a
    /// [`TierTable`] when it came from one, so that an identity naming the
    /// tier by a table value is matched by address).
    pub(crate) name: Cow<'static, str>,
    /// The storage's state of the tier, prepared when the table was built.
    pub(crate) scope: Arc<dyn TierScope>,
    /// The storage's state of the tier's identities with quotas of their
    /// own, kept apart from the tier's users: prepared at the first such
    /// identity.
    pub(crate) own_scope: std::sync::OnceLock<Arc<dyn TierScope>>,
    /// What prepared it.
    pub(crate) preparer: Arc<Preparer>,
    /// The request bands.
    pub(crate) bands: Box<[Quota]>,
    /// The bands every decision of the tier is over: the request bands
    /// (none for an unlimited tier with units), then each unit's bands.
    pub(crate) decided: Box<[Quota]>,
    /// The tier's named units, in the order of their bands in `decided`.
    pub(crate) units: Box<[UnitBands]>,
    /// What its decisions with an amount per band start from, built with
    /// its units.
    pub(crate) amounts: units::BandAmounts,
    /// The largest cost that can ever pass (the smallest burst).
    pub(crate) max_cost: u32,
    pub(crate) unlimited: bool,
    /// Its header values that never change.
    pub(crate) headers: TierHeaders,
    /// Would-be refusals are let through (and consume nothing).
    pub(crate) shadow: bool,
    /// At most this many requests of one user in flight at once.
    pub(crate) concurrency: Option<std::num::NonZeroU32>,
}

/// Named tiers, their quotas and the storage that counts them.
///
/// Cheap to clone; clones share state. See the [module docs](self).
#[derive(Clone)]
pub struct RateTier {
    inner: Arc<Config>,
}

struct Config {
    /// The tiers now; replaced whole by [`RateTier::set_tier`] and
    /// [`RateTier::remove_tier`].
    table: ArcSwap<table::Table>,
    on_missing: OnMissing,
    /// The storage and the namespace, which prepare every tier.
    preparer: Arc<Preparer>,
    clock: Arc<dyn Clock>,
    /// How long a slot counts as in use when it is not given back.
    lease: std::time::Duration,
    /// The warning of usage a program's record forgave.
    forgiven: usage::ForgivenWarning,
}

impl RateTier {
    /// Starts a configuration.
    pub fn builder() -> RateTierBuilder {
        RateTierBuilder::default()
    }

    /// Charges `cost` to `user` in `tier`: `Ok(Ok(info))` when admitted,
    /// `Ok(Err(limited))` when denied (nothing charged), `Err(_)` when the
    /// check could not be decided. Cost 0 reports the state and charges
    /// nothing. An unlimited tier never touches the storage. A check is a
    /// rate decision only: the tier's concurrency limit counts the requests
    /// the layer serves, each holding its slot until its response is over.
    pub async fn check(&self, user: &str, tier: &str, cost: u32) -> CheckResult {
        let table = self.inner.table.load();
        let entry = table
            .find(tier)
            .ok_or_else(|| CheckError::UnknownTier(tier.to_owned()))?;
        let Some(user) = UserId::new(user) else {
            return self.invalid_user(entry);
        };
        match self.begin(user, entry, cost, false) {
            Begun::Asked(decide) => match decide.into_ready() {
                Ok(decision) => check_result(entry, decision),
                Err(pending) => {
                    // Waiting (Redis): hold the tier, not the table's guard.
                    let entry = entry.clone();
                    drop(table);
                    check_result(&entry, pending.await)
                }
            },
            Begun::Unlimited => self.unlimited(entry),
            Begun::Failed(error) => Err(error),
        }
    }

    /// The configured tier names now, in the order they were added.
    pub fn tier_names(&self) -> Vec<String> {
        self.inner
            .table
            .load()
            .tiers()
            .iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    /// The bands of a tier now.
    pub fn quotas(&self, tier: &str) -> Option<Vec<Quota>> {
        self.resolve(tier).map(|t| t.bands.to_vec())
    }

    /// The bands of the unit `unit` of a tier now, if the tier has it.
    pub fn unit_quotas(&self, tier: &str, unit: &str) -> Option<Vec<Quota>> {
        let entry = self.resolve(tier)?;
        let unit = entry.unit(unit)?;
        Some(
            unit.bands
                .iter()
                .map(|q| q.in_unit(crate::quota::Unit::REQUESTS))
                .collect(),
        )
    }

    /// The names of a tier's units now, in the order they were added.
    pub fn units(&self, tier: &str) -> Vec<String> {
        self.resolve(tier)
            .map(|t| t.units.iter().map(|u| u.unit.as_str().to_owned()).collect())
            .unwrap_or_default()
    }

    /// The concurrency limit of a tier now (at most this many requests of
    /// one user in flight), if it has one.
    pub fn concurrency(&self, tier: &str) -> Option<u32> {
        self.resolve(tier)?.concurrency.map(std::num::NonZeroU32::get)
    }

    /// How long a slot of a concurrency limit counts as in use when it is
    /// not given back.
    pub fn concurrency_lease(&self) -> std::time::Duration {
        self.inner.lease
    }

    /// The default tier's name.
    pub fn default_tier(&self) -> Option<String> {
        self.default_entry().map(|t| t.name.to_string())
    }

    /// The policy for unidentified clients.
    pub fn on_missing(&self) -> OnMissing {
        self.inner.on_missing
    }

    /// The key namespace of this configuration.
    pub fn namespace(&self) -> &str {
        &self.inner.preparer.namespace
    }

    /// The configuration's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The tier named `tier` now.
    #[inline]
    pub(crate) fn resolve(&self, tier: &str) -> Option<Arc<TierEntry>> {
        self.inner.table.load().find(tier).cloned()
    }

    /// The tier named `tier` now, tried first at position `hint` (see
    /// [`IntoTierName::into_tier_ref`]).
    #[inline]
    pub(crate) fn resolve_hinted(&self, tier: &str, hint: Option<u16>) -> Option<Arc<TierEntry>> {
        self.inner.table.load().find_hinted(tier, hint).cloned()
    }

    /// Whether a tier counts or counted the unit `unit`, now or in an
    /// earlier version of the tiers: a unit the request's tier does not
    /// count is then no typo.
    pub(crate) fn knows_unit(&self, unit: &str) -> bool {
        self.inner.table.load().knows_unit(unit)
    }

    /// Makes the units of `entry` (a customer's own, say) known (see
    /// [`RateTier::knows_unit`]), unless they are.
    pub(crate) fn learn_units(&self, entry: &TierEntry) {
        let known = |table: &table::Table| entry.units.iter().all(|u| table.knows_unit(u.unit.as_str()));
        let table = self.inner.table.load();
        if known(&table) || !table.learns_units() {
            return;
        }
        drop(table);
        self.inner.table.rcu(|table| match known(table) {
            true => table::Table::clone(table),
            false => table.knowing_units_of(entry),
        });
    }

    /// The default tier now.
    pub(crate) fn default_entry(&self) -> Option<Arc<TierEntry>> {
        self.inner.table.load().default_entry().cloned()
    }

    /// Starts charging `cost` to `user` in `tier`: the storage's answer, or
    /// the outcome when it is known without asking (an unlimited tier, a
    /// cost above the burst). With
    /// `slot`, a tier with a concurrency limit also takes one of the user's
    /// slots, in the same decision (the admission carries its lease).
    #[inline]
    pub(crate) fn begin<'a>(
        &'a self,
        user: UserId<'a>,
        tier: &'a Arc<TierEntry>,
        cost: u32,
        slot: bool,
    ) -> Begun {
        let slots = tier.concurrency.filter(|_| slot);
        if slots.is_none() && tier.counts_nothing() {
            return Begun::Unlimited;
        }
        if cost > tier.max_cost {
            return Begun::Failed(cost_exceeds(tier, cost));
        }
        let op = match slots {
            Some(limit) => tier.acquire(
                cost,
                Slots {
                    limit: limit.get(),
                    lease: self.inner.lease,
                },
            ),
            None => tier.admission(cost),
        };
        Begun::Asked(self.decide(user, tier, op))
    }

    /// Gives back the slot of `lease` that `user` took in `tier`: `None`
    /// when it was given back at once (see [`TierScope::release`]).
    pub(crate) fn release(&self, user: UserId<'_>, tier: &TierEntry, lease: Lease) -> Option<Decide> {
        tier.scope
            .release(user.as_str(), &tier.decided, lease, &self.inner.clock)
    }

    /// Gives `cost` back to `user` in `tier`, charged by a decision of
    /// `decided_by` (see [`TierScope::refund`]), or where the storage
    /// decides now when no decision is known (`None`).
    pub(crate) async fn give_back(
        &self,
        user: UserId<'_>,
        tier: &TierEntry,
        cost: u32,
        decided_by: Option<DecisionSource>,
    ) -> Result<(), CheckError> {
        if let Some(refund) = self.start_refund(user, tier, cost, decided_by) {
            refund.await?;
        }
        Ok(())
    }

    /// Starts giving `cost` back to `user` in `tier`, as
    /// [`RateTier::give_back`]; `None` when there is nothing to give back.
    pub(crate) fn start_refund(
        &self,
        user: UserId<'_>,
        tier: &TierEntry,
        cost: u32,
        decided_by: Option<DecisionSource>,
    ) -> Option<Decide> {
        if tier.unlimited || cost == 0 {
            return None;
        }
        Some(self.refund_op(user, tier, tier.refund(cost), decided_by))
    }

    /// Gives back what `op` refunds, where a decision of `decided_by`
    /// charged it, or where the storage decides now (`None`).
    pub(crate) fn refund_op(
        &self,
        user: UserId<'_>,
        tier: &TierEntry,
        op: Op,
        decided_by: Option<DecisionSource>,
    ) -> Decide {
        let clock = &self.inner.clock;
        match decided_by {
            Some(by) => tier.scope.refund(user.as_str(), &tier.decided, op, by, clock),
            None => tier.scope.decide(user.as_str(), &tier.decided, op, clock),
        }
    }

    #[inline]
    fn decide(&self, user: UserId<'_>, tier: &TierEntry, op: Op) -> Decide {
        tier.scope
            .decide(user.as_str(), &tier.decided, op, &self.inner.clock)
    }

    /// What prepares the tiers of this configuration.
    fn preparer(&self) -> &Arc<Preparer> {
        &self.inner.preparer
    }

    /// The outcome of a check of a tier that counts nothing: admitted, now.
    pub(crate) fn unlimited(&self, tier: &Arc<TierEntry>) -> CheckResult {
        Ok(Ok(RateLimitInfo::unlimited(tier, self.inner.clock.now())))
    }
}

impl RateTier {
    /// The answer to a check of a user id the limiter does not count: an
    /// error, but for a tier that counts nothing.
    #[cold]
    fn invalid_user(&self, tier: &Arc<TierEntry>) -> CheckResult {
        if tier.counts_nothing() {
            return self.unlimited(tier);
        }
        Err(CheckError::InvalidUserId)
    }
}

/// A check that has started: [`RateTier::begin`].
pub(crate) enum Begun {
    /// The storage was asked: its answer.
    Asked(Decide),
    /// The tier counts nothing (and no slot is taken): admitted without
    /// asking the storage.
    Unlimited,
    /// Refused without asking the storage: a cost no request of the tier
    /// can pay.
    Failed(CheckError),
}

/// The error of a check of `cost` in `tier`, whose smallest burst is below it.
#[cold]
fn cost_exceeds(tier: &TierEntry, cost: u32) -> CheckError {
    CheckError::CostExceedsLimit {
        tier: tier.name.to_string(),
        cost,
        limit: tier.max_cost,
    }
}

/// What prepares the tiers of one configuration: its storage and namespace.
#[derive(Debug)]
pub(crate) struct Preparer {
    storage: Arc<dyn Storage>,
    namespace: Box<str>,
}

impl Preparer {
    pub(crate) fn new(storage: Arc<dyn Storage>, namespace: &str) -> Arc<Self> {
        Arc::new(Preparer {
            storage,
            namespace: namespace.into(),
        })
    }

    /// The storage's state of the tier `tier`.
    pub(crate) fn scope(&self, tier: &str) -> Arc<dyn TierScope> {
        let at = ScopeKey {
            namespace: &self.namespace,
            tier,
        };
        crate::storage::scope::prepare(&self.storage, at)
    }
}

/// The character (U+001F, the unit separator) that separates a tier's name
/// from the suffix of its own-quota state in the storage: no tier name may
/// hold it.
pub(crate) const OWN_QUOTAS_SEPARATOR: char = '\u{1f}';

impl TierEntry {
    /// The storage's state of this tier's identities with quotas of their
    /// own: a bucket apart from the tier's users, under a storage name no
    /// tier can have (the tier's, then [`OWN_QUOTAS_SEPARATOR`], which tier
    /// names may not hold, and `own`), prepared once per tier.
    pub(crate) fn own_scope(&self) -> &Arc<dyn TierScope> {
        self.own_scope.get_or_init(|| {
            let mut name = String::with_capacity(self.name.len() + 4);
            name.push_str(&self.name);
            name.push(OWN_QUOTAS_SEPARATOR);
            name.push_str("own");
            self.preparer.scope(&name)
        })
    }
}

impl PartialEq for TierEntry {
    /// Entries of one configuration (the storage's state aside).
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.bands == other.bands
            && self.max_cost == other.max_cost
            && self.unlimited == other.unlimited
            && self.headers == other.headers
            && self.shadow == other.shadow
            && self.concurrency == other.concurrency
            && self.units == other.units
    }
}

impl Eq for TierEntry {}

/// The outcome of a check from the storage's answer.
#[inline]
pub(crate) fn check_result(
    tier: &Arc<TierEntry>,
    decision: Result<crate::storage::Decision, crate::storage::StorageError>,
) -> CheckResult {
    Ok(outcome(tier, decision?))
}

impl fmt::Debug for RateTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.inner.table.load();
        let tiers: Vec<(&str, &[Quota])> = table.tiers().iter().map(|t| (&*t.name, &*t.bands)).collect();
        f.debug_struct("RateTier")
            .field("tiers", &tiers)
            .field("default_tier", &self.default_tier())
            .field("on_missing", &self.inner.on_missing)
            .field("namespace", &self.inner.preparer.namespace)
            .field("storage", &self.inner.preparer.storage)
            .field("clock", &self.inner.clock)
            .finish()
    }
}
