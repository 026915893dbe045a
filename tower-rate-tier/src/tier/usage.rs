//! Usage of a tier's units from a program: [`RateTier::record`],
//! [`RateTier::reserve`] and [`RateTier::settle`]. A handler behind the
//! layer uses [`TierUsage`](crate::TierUsage), which calls the same.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use tower_rate_tier::{Quota, RateTier, clock::FakeClock};
//!
//! let clock = FakeClock::new();
//! let tiers = RateTier::builder()
//!     .tier("free", Quota::per_minute(20))
//!     .tier_unit("free", "tokens", Quota::per_minute(1_000))
//!     .clock(clock.clone())
//!     .build();
//! // reserve an estimate, then settle what was used: 300 of 800 come back
//! tiers.reserve("ada", "free", "tokens", 800).await.unwrap().unwrap();
//! tiers.settle("ada", "free", "tokens", 800, 500).await.unwrap();
//! // usage known only afterwards: 1,200 more, beyond the 500 left (a debt
//! // of 700 tokens, within the bound of one burst)
//! tiers.record("ada", "free", "tokens", 1_200).await.unwrap();
//! // the next request waits until the debt is repaid and a token is back
//! let refused = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
//! assert_eq!(refused.retry_after, Duration::from_millis(42_060));
//! # }
//! ```

use super::{CheckError, CheckResult, RateTier, TierEntry, UnitBands, UserId, check_result};

use crate::storage::{Amount, Decide, Decision, DecisionSource};
use crate::throttle::Throttle;

impl RateTier {
    /// Charges `n` units of `unit` that `user` of `tier` used, whatever is
    /// left: beyond it the unit goes into debt, of at most one burst of its
    /// smallest band (usage beyond that bound is forgiven, and logged). The
    /// tier's next requests are refused while the unit is in debt. A record
    /// of 0 changes nothing. An unknown tier or unit is an error, and so is
    /// a storage failure (nothing recorded).
    pub async fn record(&self, user: &str, tier: &str, unit: &str, n: u32) -> Result<(), CheckError> {
        let user = UserId::new(user).ok_or(CheckError::InvalidUserId)?;
        let table = self.inner.table.load();
        let entry = table
            .find(tier)
            .ok_or_else(|| CheckError::UnknownTier(tier.to_owned()))?;
        let bands = unit_bands(entry, unit)?;
        if n == 0 {
            // nothing to charge; the unit must still be one of the tier's
            return Ok(());
        }
        let decide = self.start_on(user, entry, bands, Amount::Force(n))?;
        let decision = match decide.into_ready() {
            Ok(decision) => decision?,
            Err(pending) => {
                // Waiting (Redis): hold the tier, not the table's guard.
                let entry = entry.clone();
                drop(table);
                let decision = pending.await?;
                if let Some(bands) = entry.unit(unit) {
                    self.inner.forgiven.report(&entry, bands, &decision);
                }
                return Ok(());
            }
        };
        self.inner.forgiven.report(entry, bands, &decision);
        Ok(())
    }

    /// Takes `n` units of `unit` from `user` of `tier` up front, when they
    /// fit in every band of the unit: `Ok(Ok(_))` when taken, `Ok(Err(_))`
    /// when refused (nothing taken; the refusal reports the unit's band),
    /// as [`RateTier::check`] answers. Settle it with [`RateTier::settle`]
    /// once the usage is known. `n` above the smallest burst of the unit
    /// could never fit: [`CheckError::CostExceedsLimit`].
    ///
    /// Through a [`Fallback`](crate::storage::Fallback) answering locally,
    /// `n` above the local share is taken in part (every band of the unit
    /// takes its smallest local band): the [`forgiven`] of the unit's band
    /// states is what was not taken, and what to settle is `n` less that
    /// ([`TierUsage`](crate::TierUsage) does this for you).
    ///
    /// [`forgiven`]: crate::storage::BandState::forgiven
    pub async fn reserve(&self, user: &str, tier: &str, unit: &str, n: u32) -> CheckResult {
        let entry = self.unit_tier(tier, unit)?;
        let user = UserId::new(user).ok_or(CheckError::InvalidUserId)?;
        // (a reservation of 0 is a peek of the unit: its state)
        check_result(
            &entry,
            self.start_usage(user, &entry, unit, Amount::Charge(n), None)?
                .await,
        )
    }

    /// Settles a reservation of `reserved` units of `unit` once `used` is
    /// known: gives back the unused part, or charges what exceeds it as
    /// [`RateTier::record`] does. The unused part goes back where the
    /// storage decides now, as [`RateTier::refund`] does;
    /// [`RateTier::settle_decided`] gives it back where the reservation was
    /// decided, as the layer's [`TierUsage`](crate::TierUsage) does.
    pub async fn settle(
        &self,
        user: &str,
        tier: &str,
        unit: &str,
        reserved: u32,
        used: u32,
    ) -> Result<(), CheckError> {
        self.settle_where(user, tier, unit, reserved, used, None).await
    }

    /// [`RateTier::settle`], giving the unused part back where the
    /// reservation was decided: `decided_by` is the
    /// [`source`](crate::RateLimitInfo::source) of what
    /// [`RateTier::reserve`] answered (see [`RateTier::refund_decided`]).
    pub async fn settle_decided(
        &self,
        user: &str,
        tier: &str,
        unit: &str,
        reserved: u32,
        used: u32,
        decided_by: DecisionSource,
    ) -> Result<(), CheckError> {
        self.settle_where(user, tier, unit, reserved, used, Some(decided_by))
            .await
    }

    async fn settle_where(
        &self,
        user: &str,
        tier: &str,
        unit: &str,
        reserved: u32,
        used: u32,
        decided_by: Option<DecisionSource>,
    ) -> Result<(), CheckError> {
        let entry = self.unit_tier(tier, unit)?;
        let user = UserId::new(user).ok_or(CheckError::InvalidUserId)?;
        let amount = settlement(reserved, used);
        if !moves_nothing(amount) {
            self.start_usage(user, &entry, unit, amount, decided_by)?.await?;
        }
        Ok(())
    }

    /// The tier named `tier` now, when it has the unit `unit`.
    fn unit_tier(&self, tier: &str, unit: &str) -> Result<std::sync::Arc<TierEntry>, CheckError> {
        let entry = self
            .resolve(tier)
            .ok_or_else(|| CheckError::UnknownTier(tier.to_owned()))?;
        unit_bands(&entry, unit)?;
        Ok(entry)
    }

    /// Starts doing `amount` to the bands of `unit` of `user` in `tier`; a
    /// refund gives back what a decision of `decided_by` reserved (see
    /// [`TierScope::refund`](crate::storage::TierScope::refund)), or where
    /// the storage decides now when no decision is known (`None`).
    /// A charge above the unit's smallest burst could never fit, and an
    /// unknown unit is refused. (An amount that moves nothing is its
    /// callers' to skip: see [`moves_nothing`].)
    pub(crate) fn start_usage(
        &self,
        user: UserId<'_>,
        tier: &TierEntry,
        unit: &str,
        amount: Amount,
        decided_by: Option<DecisionSource>,
    ) -> Result<Decide, CheckError> {
        let bands = unit_bands(tier, unit)?;
        if let Amount::Refund(_) = amount {
            // given back where the reservation was decided
            let op = tier.on_unit(bands, amount);
            return Ok(self.refund_op(user, tier, op, decided_by));
        }
        self.start_on(user, tier, bands, amount)
    }

    /// [`RateTier::start_usage`] on the bands of a unit already found.
    fn start_on(
        &self,
        user: UserId<'_>,
        tier: &TierEntry,
        bands: &UnitBands,
        amount: Amount,
    ) -> Result<Decide, CheckError> {
        if let Amount::Charge(n) = amount
            && n > bands.max
        {
            return Err(CheckError::CostExceedsLimit {
                tier: tier.name.to_string(),
                cost: n,
                limit: bands.max,
            });
        }
        let op = tier.on_unit(bands, amount);
        Ok(tier
            .scope
            .decide(user.as_str(), &tier.decided, op, &self.inner.clock))
    }
}

/// The warning of usage a program's record forgave: at most one per 10 s
/// per limiter, with the number of records not written since.
#[derive(Debug, Default)]
pub(crate) struct ForgivenWarning(Throttle);

impl ForgivenWarning {
    /// Logs the usage of the unit of `bands` a decision of `tier` forgave,
    /// if any.
    #[inline]
    fn report(&self, tier: &TierEntry, bands: &UnitBands, decision: &Decision) {
        let forgiven = forgiven(bands, decision);
        if forgiven > 0 {
            self.warn(tier, bands, forgiven, decision.now);
        }
    }

    /// Logs that `forgiven` units of the unit of `bands` were forgiven at
    /// `now`, at most once per 10 s.
    #[cold]
    fn warn(&self, tier: &TierEntry, bands: &UnitBands, forgiven: u32, now: crate::clock::Nanos) {
        if let Some(skipped) = self.0.due(now / 1_000_000) {
            let unit = bands.unit.as_str();
            tracing::warn!(target: "tower_rate_tier", tier = %tier.name, unit, forgiven, skipped, "usage beyond the unit's debt bound was forgiven");
        }
    }
}

/// The bands of `unit` of `tier`, or the error naming both.
#[inline]
fn unit_bands<'a>(tier: &'a TierEntry, unit: &str) -> Result<&'a UnitBands, CheckError> {
    tier.unit(unit).ok_or_else(|| CheckError::UnknownUnit {
        tier: tier.name.to_string(),
        unit: unit.to_owned(),
    })
}

/// Whether `amount` changes nothing (a forced charge or a refund of 0):
/// nothing to ask the storage.
pub(crate) fn moves_nothing(amount: Amount) -> bool {
    matches!(amount, Amount::Force(0) | Amount::Refund(0))
}

/// What settles a reservation of `reserved` units once `used` is known.
pub(crate) fn settlement(reserved: u32, used: u32) -> Amount {
    match used.checked_sub(reserved) {
        Some(more) => Amount::Force(more),
        None => Amount::Refund(reserved - used),
    }
}

/// The units of the unit of `bands` a decision forgave (the most any of
/// its bands did).
pub(crate) fn forgiven(bands: &UnitBands, decision: &Decision) -> u32 {
    decision
        .bands
        .get(bands.range())
        .map_or(0, |states| states.iter().map(|s| s.forgiven).max().unwrap_or(0))
}

impl UnitBands {
    /// Where the unit's bands stand in [`TierEntry::decided`].
    pub(crate) fn range(&self) -> std::ops::Range<usize> {
        self.at..self.at + self.bands.len()
    }
}
