//! Charges given back by a program: [`RateTier::refund`], which knows no
//! decision and gives back where the storage decides now, and
//! [`RateTier::refund_decided`], which gives back where the check that
//! charged was decided (its [`RateLimitInfo::source`]), as the layer does.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tower_rate_tier::{Quota, RateTier, clock::FakeClock};
//!
//! let tiers = RateTier::builder()
//!     .tier("free", Quota::per_minute(2))
//!     .clock(FakeClock::new())
//!     .build();
//! let info = tiers.check("ada", "free", 1).await.unwrap().unwrap();
//! assert_eq!(info.remaining, 1);
//! // the work failed: give the request back where it was charged
//! tiers.refund_decided("ada", "free", 1, info.source()).await.unwrap();
//! let info = tiers.check("ada", "free", 0).await.unwrap().unwrap();
//! assert_eq!(info.remaining, 2);
//! # }
//! ```

#[cfg(doc)]
use super::RateLimitInfo;
use super::{CheckError, RateTier, UserId};
use crate::storage::DecisionSource;

impl RateTier {
    /// Gives `cost` back to `user` in `tier` (never below a fresh state),
    /// where the storage decides now. Through a
    /// [`Fallback`](crate::storage::Fallback): after an outage, to the
    /// primary, even for what its local limiter charged; in a
    /// [`MemoryStorage`](crate::storage::MemoryStorage) at its key cap, to
    /// the overflow bucket for an identity without a key of its own. When
    /// the check that charged is at hand, [`RateTier::refund_decided`]
    /// gives back where it charged. (The layer gives a request's charge
    /// back where it was decided.)
    pub async fn refund(&self, user: &str, tier: &str, cost: u32) -> Result<(), CheckError> {
        self.refund_where(user, tier, cost, None).await
    }

    /// Gives `cost` back to `user` in `tier` (never below a fresh state),
    /// where the check that charged it was decided: `decided_by` is its
    /// [`RateLimitInfo::source`]. What a
    /// [`Fallback`](crate::storage::Fallback)'s local limiter charged goes
    /// back to it while the key's domain answers locally, and nowhere once
    /// the primary answers again (the primary never charged it); what a
    /// [`MemoryStorage`](crate::storage::MemoryStorage)'s overflow bucket
    /// charged goes back to it, even once the user has a key of its own,
    /// and what the user's key charged, to that key (nowhere once it
    /// expired).
    pub async fn refund_decided(
        &self,
        user: &str,
        tier: &str,
        cost: u32,
        decided_by: DecisionSource,
    ) -> Result<(), CheckError> {
        self.refund_where(user, tier, cost, Some(decided_by)).await
    }

    async fn refund_where(
        &self,
        user: &str,
        tier: &str,
        cost: u32,
        decided_by: Option<DecisionSource>,
    ) -> Result<(), CheckError> {
        let entry = self
            .resolve(tier)
            .ok_or_else(|| CheckError::UnknownTier(tier.to_owned()))?;
        // a user id the limiter never counts has nothing to give back
        let Some(user) = UserId::new(user) else {
            return Ok(());
        };
        self.give_back(user, &entry, cost, decided_by).await
    }
}
