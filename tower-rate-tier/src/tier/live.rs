//! Changing tiers while requests are served: [`RateTier::set_tier`] and
//! [`RateTier::remove_tier`].
//!
//! A change replaces the table of tiers that every clone of the
//! [`RateTier`] reads (the one inside a running layer included), at once and
//! without a lock on the request path. A request is decided wholly on the
//! version of its tier it started with: its route-level top-ups and refunds
//! use that version too.
//!
//! # What users keep
//!
//! A band's state is kept under its refill window (see
//! [`band_names`](crate::storage::band_names)), in memory and in Redis:
//!
//! * A band whose window stays (`per_hour(100)` raised to `per_hour(200)`,
//!   or lowered to `per_hour(50)`) keeps its state, which is a time: the
//!   moment its burst would be full again. After a **raise**, a user has the
//!   new rate at once (each unit refills in the new, shorter interval) and
//!   gains `(new tolerance - old tolerance) / new interval` units of burst at
//!   once: a user who spent `per_hour(100)` has 0 left at the instant of a
//!   raise to `per_hour(200)` and 1 more every 18 s, where the old quota gave
//!   1 every 36 s. After a **lowering**, nobody waits longer than one refill
//!   of the new quota (a time debt beyond it is cut to it).
//! * A band whose window changes starts afresh: a full burst of the new
//!   quota. So does a band that is added; a band that is removed is
//!   forgotten (its keys expire).
//! * Users of a removed tier are handled as clients naming an unknown tier
//!   (the layer's `OnUnknownTier`).
//!
//! A change acts in this process only: a fleet applies the same change on
//! every instance (for instance each instance reloads the same
//! configuration). Instances that share a Redis storage share the state of
//! the bands whose windows they agree on.

use std::num::NonZeroU32;

use super::table::Table;
use super::{BuildError, RateTier, TierEntry};
use crate::quota::{IntoQuotas, Quota};
use crate::tier::IntoTierName;

impl RateTier {
    /// Adds the tier `name`, or replaces its bands, for every clone of this
    /// `RateTier`. See the [module docs](crate::tier) for what users keep.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use tower_rate_tier::{Quota, RateTier};
    ///
    /// let tiers = RateTier::builder().tier("pro", Quota::per_minute(2)).build();
    /// let layer_copy = tiers.clone();
    /// tiers.set_tier("pro", [Quota::per_minute(10)]).unwrap();
    /// tiers.set_tier("team", Quota::per_minute(50)).unwrap();
    /// assert_eq!(layer_copy.quotas("pro"), Some(vec![Quota::per_minute(10)]));
    /// assert!(layer_copy.check("ada", "team", 1).await.unwrap().is_ok());
    /// # }
    /// ```
    ///
    /// A tier set again keeps its units (their bands and their users'
    /// state), its concurrency limit and its shadow mode;
    /// [`set_tier_unit`](Self::set_tier_unit) changes a unit.
    pub fn set_tier(&self, name: impl IntoTierName, quotas: impl IntoQuotas) -> Result<(), BuildError> {
        let name = name.into_tier_name();
        let mut entry = TierEntry::new(name.clone(), quotas.into_quotas(), self.preparer())?;
        let mut failed = None;
        self.inner.table.rcu(|table| {
            // a shadowed tier stays shadowed; its concurrency limit and its
            // units stay
            let old = table.find(&name);
            entry.shadow = old.is_some_and(|t| t.shadow);
            let mut next = entry.clone().with_concurrency(old.and_then(|t| t.concurrency));
            for unit in old.map_or(&[][..], |t| &t.units) {
                match next.with_unit(unit.unit.as_str(), Some(unit.bands.to_vec())) {
                    Ok(with) => next = with,
                    Err(error) => {
                        failed = Some(error);
                        return Table::clone(table);
                    }
                }
            }
            failed = None;
            table.with(next)
        });
        failed.map_or(Ok(()), Err)
    }

    /// Sets the bands of the unit `unit` of the tier `tier` (`Some`), or
    /// removes the unit (`None`), for every clone of this `RateTier`,
    /// keeping its request bands. A unit whose bands keep their refill
    /// windows keeps its users' state. An unknown tier, or bands the
    /// builder would refuse, is an error, and changes nothing.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, RateTier};
    ///
    /// let tiers = RateTier::builder().tier("free", Quota::per_minute(20)).build();
    /// tiers.set_tier_unit("free", "tokens", Some(vec![Quota::per_minute(40_000)])).unwrap();
    /// tiers.set_tier("free", Quota::per_minute(30)).unwrap(); // keeps the unit
    /// assert_eq!(tiers.units("free"), ["tokens"]);
    /// tiers.set_tier_unit("free", "tokens", None).unwrap();
    /// assert!(tiers.units("free").is_empty());
    /// ```
    pub fn set_tier_unit(
        &self,
        tier: &str,
        unit: &str,
        quotas: Option<Vec<Quota>>,
    ) -> Result<(), BuildError> {
        let mut failed = None;
        let found = self.update_tier(tier, |entry| {
            match entry.clone().with_unit(unit, quotas.clone()) {
                Ok(with) => {
                    failed = None;
                    with
                }
                Err(error) => {
                    failed = Some(error);
                    entry
                }
            }
        });
        match (found, failed) {
            (false, _) => Err(BuildError::UnknownUnitTier(tier.to_owned())),
            (true, Some(error)) => Err(error),
            (true, None) => Ok(()),
        }
    }

    /// Sets (`Some(n)`) or lifts (`None`) the concurrency limit of the tier
    /// `name` for every clone of this `RateTier`, keeping its bands: at most
    /// `n` requests of one user in flight from the next request on
    /// (requests in flight keep the slots they hold). [`set_tier`](Self::set_tier)
    /// keeps a tier's limit; this replaces it. An unknown tier or a limit
    /// of 0 is an error, and changes nothing.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, RateTier};
    ///
    /// let tiers = RateTier::builder().tier("free", Quota::per_minute(20)).tier_concurrency("free", 2).build();
    /// tiers.set_tier("free", Quota::per_minute(30)).unwrap();
    /// assert_eq!(tiers.concurrency("free"), Some(2)); // kept
    /// tiers.set_tier_concurrency("free", Some(4)).unwrap();
    /// assert_eq!(tiers.concurrency("free"), Some(4));
    /// tiers.set_tier_concurrency("free", None).unwrap();
    /// assert_eq!(tiers.concurrency("free"), None);
    /// assert!(tiers.set_tier_concurrency("nope", Some(1)).is_err());
    /// ```
    pub fn set_tier_concurrency(&self, name: &str, limit: Option<u32>) -> Result<(), BuildError> {
        let limit = match limit {
            Some(n) => Some(NonZeroU32::new(n).ok_or_else(|| BuildError::ZeroConcurrency(name.to_owned()))?),
            None => None,
        };
        if self.update_tier(name, |entry| entry.with_concurrency(limit)) {
            Ok(())
        } else {
            Err(BuildError::UnknownConcurrencyTier(name.to_owned()))
        }
    }

    /// Dark-launches (`true`) or enforces (`false`) the tier `name` for every
    /// clone of this `RateTier`, keeping its bands and its users' state:
    /// the step from a shadowed launch to enforcement. `false` when there is
    /// no such tier.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use tower_rate_tier::{Quota, RateTier};
    ///
    /// let tiers = RateTier::builder().tier("beta", Quota::per_minute(1)).shadow_tier("beta").build();
    /// assert!(tiers.set_shadow("beta", false)); // enforced from now on
    /// assert!(!tiers.set_shadow("nope", false));
    /// # }
    /// ```
    pub fn set_shadow(&self, name: &str, shadow: bool) -> bool {
        self.update_tier(name, |mut entry| {
            entry.shadow = shadow;
            entry
        })
    }

    /// Replaces the entry of tier `name` by `change` of a copy of it, for
    /// every clone; `false` when there is no such tier.
    fn update_tier(&self, name: &str, mut change: impl FnMut(TierEntry) -> TierEntry) -> bool {
        let mut found = false;
        self.inner.table.rcu(|table| {
            let Some(tier) = table.find(name) else {
                found = false;
                return Table::clone(table);
            };
            found = true;
            table.with(change(TierEntry::clone(tier)))
        });
        found
    }

    /// Removes the tier `name` for every clone of this `RateTier`: `true`
    /// when it was removed, `false` when there is no such tier or it is the
    /// default tier (which cannot be removed; [`set_tier`](Self::set_tier)
    /// changes it).
    pub fn remove_tier(&self, name: &str) -> bool {
        let mut removed = false;
        self.inner.table.rcu(|table| {
            let next: Option<Table> = table.without(name);
            removed = next.is_some();
            next.unwrap_or_else(|| Table::clone(table))
        });
        removed
    }
}

impl Clone for TierEntry {
    fn clone(&self) -> Self {
        TierEntry {
            name: self.name.clone(),
            scope: self.scope.clone(),
            own_scope: self.own_scope.clone(),
            preparer: self.preparer.clone(),
            bands: self.bands.clone(),
            decided: self.decided.clone(),
            units: self.units.clone(),
            amounts: self.amounts,
            max_cost: self.max_cost,
            unlimited: self.unlimited,
            headers: self.headers.clone(),
            shadow: self.shadow,
            concurrency: self.concurrency,
        }
    }
}
