//! Prepared tiers: [`TierScope`], a storage's state of one tier, found once
//! when the tier table is built rather than on every decision.
//!
//! A [`RateTier`](crate::RateTier) asks its storage to
//! [`prepare`](super::Storage::prepare) each tier when its table is built
//! (at `build()`, and again at each
//! [`set_tier`](crate::RateTier::set_tier)); the tier entry holds the
//! scope, and every decision of the tier is one call on it: no lookup by
//! name. A storage that prepares nothing (the default, and the usual shape
//! of a custom storage) is decided through [`Storage::decide`] with the
//! tier's names.
//!
//! A storage prepares a tier from what it keeps for it:
//!
//! * [`MemoryStorage`](super::MemoryStorage) hands out its maps of the tier
//!   (a tier set again with the same name finds the same maps, so users
//!   keep their state across changes);
//! * the wrappers prepare the tier in the storage they wrap (or, when that
//!   one prepares none, decide it there by name) and add their own part:
//!   [`DenyCache`](super::DenyCache) its cache and the tier's part of its
//!   keys' names, [`Fallback`](super::Fallback) the local limiter's scope of
//!   the tier and the tier's names for its failure domains. So
//!   `Fallback<DenyCache<MemoryStorage>>` decides a prepared tier without a
//!   lookup by name at any level. What a wrapper keeps (the cache's
//!   entries, the fallback's outages and local state) serves its prepared
//!   tiers and its decisions by name alike;
//! * the Redis storage prepares nothing: its decisions go by name, and a
//!   wrapper around it prepares its own part only.
//!
//! A prepared tier and a decision by name meet the same state:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::sync::Arc;
//! use tower_rate_tier::Quota;
//! use tower_rate_tier::clock::{Clock, FakeClock};
//! use tower_rate_tier::storage::{MemoryStorage, Op, ScopeKey, Storage, StorageKey};
//!
//! let storage = MemoryStorage::new();
//! let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
//! let bands = [Quota::per_minute(1)];
//! let free = storage.prepare(ScopeKey { namespace: "", tier: "free" }).expect("memory prepares");
//! assert!(free.decide("ada", &bands, Op::Charge(1), &clock).await.unwrap().allowed);
//! let by_name = StorageKey { namespace: "", tier: "free", user: "ada" };
//! assert!(!storage.decide(by_name, &bands, Op::Charge(1), &clock).await.unwrap().allowed);
//! # }
//! ```

use std::fmt;
use std::sync::Arc;

use super::{Decide, DecisionSource, Lease, Op, Storage, StorageKey};
use crate::clock::Clock;
use crate::quota::Quota;

/// Which tier a scope is prepared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScopeKey<'a> {
    /// Separates limiters sharing one storage (empty by default).
    pub namespace: &'a str,
    /// The tier's name.
    pub tier: &'a str,
}

impl<'a> ScopeKey<'a> {
    /// The storage key of `user` in this tier.
    pub fn user(self, user: &'a str) -> StorageKey<'a> {
        StorageKey {
            namespace: self.namespace,
            tier: self.tier,
            user,
        }
    }
}

/// A storage's state of one tier: decides for the tier's users without
/// looking the tier up. See the [module documentation](self).
pub trait TierScope: Send + Sync + fmt::Debug + 'static {
    /// Carries out `op` on every band of `user` in this tier, atomically, as
    /// [`Storage::decide`] does for the key of `user` in this tier.
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide;

    /// Gives back the slot of `lease` that `user` took in this tier
    /// ([`Op::Release`] over the tier's `bands`). `None` when the slot was
    /// given back at once with nothing to tell; else the storage's answer,
    /// which may have to be awaited. By default, [`decide`](TierScope::decide)
    /// carries out the release; a scope that wraps another passes it on.
    fn release(&self, user: &str, bands: &[Quota], lease: Lease, clock: &Arc<dyn Clock>) -> Option<Decide> {
        Some(self.decide(user, bands, Op::Release(lease), clock))
    }

    /// Carries out `op`, which gives back (some of) what an earlier decision
    /// of `user` charged, made by `decided_by` ([`Decision::source`]): a
    /// storage that decided it elsewhere gives it back there. By default,
    /// as [`decide`](TierScope::decide) does; a
    /// [`Fallback`](super::Fallback) gives back what its local limiter
    /// charged to that limiter's state while the key's domain has one (an
    /// outage that ended keeps it for the next), and never to the primary
    /// (which never charged it). A scope that wraps another passes it on with `decided_by`: the
    /// default would give it back where the wrapped scope decides now.
    ///
    /// [`Decision::source`]: super::Decision::source
    fn refund(
        &self,
        user: &str,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        let _ = decided_by;
        self.decide(user, bands, op, clock)
    }
}

/// The scope of a tier whose storage prepares none: each decision goes to
/// [`Storage::decide`] with the tier's names.
pub(crate) struct ByName {
    storage: Arc<dyn Storage>,
    namespace: Box<str>,
    tier: Box<str>,
}

impl ByName {
    pub(crate) fn new(storage: Arc<dyn Storage>, at: ScopeKey<'_>) -> Self {
        ByName {
            storage,
            namespace: at.namespace.into(),
            tier: at.tier.into(),
        }
    }
}

impl TierScope for ByName {
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let key = StorageKey {
            namespace: &self.namespace,
            tier: &self.tier,
            user,
        };
        self.storage.decide(key, bands, op, clock)
    }

    fn refund(
        &self,
        user: &str,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        let key = StorageKey {
            namespace: &self.namespace,
            tier: &self.tier,
            user,
        };
        self.storage.refund(key, bands, op, decided_by, clock)
    }
}

impl fmt::Debug for ByName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByName")
            .field("namespace", &self.namespace)
            .field("tier", &self.tier)
            .finish_non_exhaustive()
    }
}

/// The scope of `at` in `storage`: the one it prepares, else [`ByName`].
pub(crate) fn prepare(storage: &Arc<dyn Storage>, at: ScopeKey<'_>) -> Arc<dyn TierScope> {
    match storage.prepare(at) {
        Some(scope) => scope,
        None => Arc::new(ByName::new(storage.clone(), at)),
    }
}
