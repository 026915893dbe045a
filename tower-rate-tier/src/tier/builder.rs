//! [`RateTierBuilder`]: how a [`RateTier`] is configured.

use std::borrow::Cow;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::table::Table;
use super::units::{MAX_REQUEST_BANDS, UnitSpecs};
use super::{Config, IntoTierName, RateTier, TierEntry, TierTable};
use crate::clock::{Clock, SystemClock};
use crate::policy::OnMissing;
use crate::quota::{IntoQuotas, Quota, Unit, UnitError};
use crate::storage::{MAX_BANDS, MemoryStorage, Storage};

/// Why [`RateTierBuilder::try_build`] refused a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// No tier was configured.
    NoTiers,
    /// A tier name was given twice.
    DuplicateTier(String),
    /// The default tier is not one of the tiers.
    UnknownDefaultTier(String),
    /// A tier mixes `Quota::unlimited()` with limited bands.
    UnlimitedWithBands(String),
    /// A tier has no band.
    NoBands(String),
    /// A tier has more than [`MAX_REQUEST_BANDS`] request bands.
    TooManyBands(String),
    /// A tier name or the namespace is empty or longer than 255 bytes, or a
    /// tier name holds the character U+001F (the unit separator, reserved
    /// for the state of identities with quotas of their own).
    InvalidName(String),
    /// A tier given to `shadow_tier` is not configured.
    UnknownShadowTier(String),
    /// A tier given to `tier_concurrency` is not configured.
    UnknownConcurrencyTier(String),
    /// A concurrency limit of 0 (no request could ever pass): for the tier
    /// named.
    ZeroConcurrency(String),
    /// A tier given to `tier_unit` is not configured.
    UnknownUnitTier(String),
    /// A unit's name is not valid or is reserved.
    InvalidUnit {
        /// The tier.
        tier: String,
        /// What is wrong with the name.
        error: UnitError,
    },
    /// A unit of a tier (tier, unit) has no band, or an unlimited one (a
    /// unit that is not limited needs no band).
    InvalidUnitBands(String, String),
    /// A tier (tier, unit) has more than [`MAX_BANDS`] bands with its
    /// units.
    TooManyUnitBands(String, String),
    /// A tier's request bands (tier, unit) hold a quota of a unit
    /// ([`Quota::in_unit`]): a unit's bands are given with
    /// [`RateTierBuilder::tier_unit`].
    UnitInRequestBands(String, String),
    /// A unit given to [`RateTierBuilder::contract_unit`] has a name that
    /// is not valid or is reserved.
    InvalidContractUnit(UnitError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoTiers => write!(
                f,
                "no tiers configured: add at least one with `.tier(name, quota)`"
            ),
            BuildError::DuplicateTier(t) => write!(f, "tier `{t}` is configured more than once"),
            BuildError::UnknownDefaultTier(t) => write!(f, "the default tier `{t}` is not a configured tier"),
            BuildError::UnlimitedWithBands(t) => {
                write!(f, "tier `{t}` mixes `Quota::unlimited()` with limited bands")
            }
            BuildError::NoBands(t) => write!(f, "tier `{t}` has no quota"),
            BuildError::TooManyBands(t) => write!(f, "tier `{t}` has more than {MAX_REQUEST_BANDS} bands"),
            BuildError::UnknownUnitTier(t) => {
                write!(f, "the tier `{t}` given a unit is not a configured tier")
            }
            BuildError::InvalidUnit { tier, error } => write!(f, "tier `{tier}`: {error}"),
            BuildError::InvalidContractUnit(error) => write!(f, "a contract unit: {error}"),
            BuildError::InvalidUnitBands(t, u) => write!(
                f,
                "the unit `{u}` of tier `{t}` needs at least one limited band (`Quota::unlimited()` is not one)"
            ),
            BuildError::UnitInRequestBands(t, u) => write!(
                f,
                "tier `{t}` has a quota of the unit `{u}` among its request bands: give a unit's \
                 bands with `.tier_unit(tier, unit, quotas)`"
            ),
            BuildError::TooManyUnitBands(t, u) => write!(
                f,
                "tier `{t}` has more than {MAX_BANDS} bands with its units (at the unit `{u}`)"
            ),
            BuildError::UnknownShadowTier(t) => write!(f, "the shadowed tier `{t}` is not a configured tier"),
            BuildError::UnknownConcurrencyTier(t) => {
                write!(
                    f,
                    "the tier `{t}` given a concurrency limit is not a configured tier"
                )
            }
            BuildError::ZeroConcurrency(t) => write!(
                f,
                "tier `{t}` has a concurrency limit of 0, which no request could pass: give at least 1"
            ),
            BuildError::InvalidName(t) => {
                write!(
                    f,
                    "`{t}` is not a valid tier name or namespace (1 to 255 bytes; the namespace may be \
                     empty); a tier name may not hold the character U+001F"
                )
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// Configures a [`RateTier`]; see [`RateTier::builder`].
#[derive(Default)]
pub struct RateTierBuilder {
    tiers: Vec<(Cow<'static, str>, Vec<Quota>)>,
    default_tier: Option<Cow<'static, str>>,
    on_missing: OnMissing,
    clock: Option<Arc<dyn Clock>>,
    storage: Option<Arc<dyn Storage>>,
    namespace: String,
    shadowed: Vec<Cow<'static, str>>,
    concurrency: Vec<(Cow<'static, str>, u32)>,
    units: UnitSpecs,
    contract_units: Vec<String>,
    lease: Option<Duration>,
}

/// How long a slot counts as in use when it is not given back
/// (`RateTierBuilder::concurrency_lease`).
pub const DEFAULT_CONCURRENCY_LEASE: Duration = Duration::from_secs(120);

impl RateTierBuilder {
    /// Adds a tier: one [`Quota`], or several bands that must all admit a
    /// request (`[Quota::per_second(5), Quota::per_day(10_000)]`).
    pub fn tier(mut self, name: impl IntoTierName, quotas: impl IntoQuotas) -> Self {
        self.tiers.push((name.into_tier_name(), quotas.into_quotas()));
        self
    }

    /// Adds every tier of a [`TierTable`] (a `#[rate_tiers]` enum) and, if it
    /// names one, its default tier.
    pub fn tiers<T: TierTable>(mut self) -> Self {
        for &tier in T::all() {
            self = self.tier(tier, tier.tier_quotas());
            if tier.tier_shadow() {
                self = self.shadow_tier(tier.tier_name());
            }
            if let Some(n) = tier.tier_concurrency() {
                self = self.tier_concurrency(tier.tier_name(), n);
            }
            for &(unit, quotas) in tier.tier_units() {
                self = self.tier_unit(tier, unit, quotas);
            }
        }
        if let Some(default) = T::default_tier() {
            self.default_tier = Some(Cow::Borrowed(default.tier_name()));
        }
        self
    }

    /// The tier of clients that are not identified (under
    /// [`OnMissing::UseDefault`]) or whose tier is unknown (under the layer's
    /// `OnUnknownTier::UseDefault`).
    pub fn default_tier(mut self, name: impl IntoTierName) -> Self {
        self.default_tier = Some(name.into_tier_name());
        self
    }

    /// The policy for unidentified clients (default
    /// [`OnMissing::UseDefault`]).
    pub fn on_missing(mut self, policy: OnMissing) -> Self {
        self.on_missing = policy;
        self
    }

    /// The clock (default [`SystemClock`]); the storage receives it with
    /// every decision (the in-memory storage decides with it). The Redis
    /// storage decides with its server's time (unless given a
    /// `client_clock`), but its deny cache counts time with this clock: with
    /// a [`FakeClock`](crate::clock::FakeClock) that stands still, a denial
    /// it keeps lasts until the clock is advanced past it. For tests of
    /// Redis in real time, keep the `SystemClock` or turn the deny cache
    /// off.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The storage (default: a new [`MemoryStorage`]).
    pub fn storage(mut self, storage: impl Storage) -> Self {
        self.storage = Some(Arc::new(storage));
        self
    }

    /// Dark-launches `tier`: its requests are decided and reported as usual,
    /// but a would-be refusal (429, or a cost above the burst) is let
    /// through and consumes nothing (see `TierLimitLayer::shadow` for the
    /// whole layer). A name that is not a tier is a build error.
    pub fn shadow_tier(mut self, tier: impl IntoTierName) -> Self {
        self.shadowed.push(tier.into_tier_name());
        self
    }

    /// At most `limit` requests of one user of `tier` in flight at once,
    /// across every route under the layer, besides the tier's rate: a
    /// request over the limit is refused 429 with `Retry-After: 1` and the
    /// `RateLimit-Policy` item `"<tier>.concurrency";q=<limit>;qu="concurrent-requests"`.
    /// A slot is held from admission until the response is over (its body
    /// ended or dropped, the request future dropped, the inner service
    /// failed), at most for the [lease](Self::concurrency_lease). An
    /// unlimited tier may have one. Naming a tier that is not configured,
    /// or a limit of 0, is a build error; a tier named twice keeps the
    /// last limit. [`TierIdentity::with_concurrency`](crate::TierIdentity::with_concurrency)
    /// gives one customer a limit of its own.
    ///
    /// ```
    /// use tower_rate_tier::{BuildError, Quota, RateTier};
    ///
    /// let tiers = RateTier::builder().tier("free", Quota::per_minute(20)).tier_concurrency("free", 2).build();
    /// assert_eq!(tiers.concurrency("free"), Some(2));
    /// let zero = RateTier::builder().tier("free", Quota::per_minute(20)).tier_concurrency("free", 0).try_build();
    /// assert_eq!(zero.unwrap_err(), BuildError::ZeroConcurrency("free".into()));
    /// ```
    pub fn tier_concurrency(mut self, tier: impl IntoTierName, limit: u32) -> Self {
        self.concurrency.push((tier.into_tier_name(), limit));
        self
    }

    /// Bands of a named unit for `tier`, besides its request bands:
    /// `.tier_unit("free", "tokens", [Quota::per_minute(40_000), Quota::per_day(1_000_000)])`
    /// counts tokens in two bands (a `Quota`'s count is in the unit here).
    ///
    /// A request of the tier is admitted when its request bands admit it
    /// and none of its units is exhausted (at zero, or in debt), in one
    /// decision that charges the request bands only. Usage is charged to a
    /// unit when it is known: [`TierUsage`](crate::TierUsage) in a handler,
    /// [`RateTier::record`] in a program; the layer counts the unit
    /// [`"content-bytes"`](crate::quota::CONTENT_BYTES) itself from
    /// response bodies. Usage beyond what is left puts the unit in debt of
    /// at most one burst of its smallest band; the tier's next requests are
    /// refused until it is repaid at the unit's rate.
    ///
    /// A unit's name is a short token (see [`Unit`](crate::quota::Unit));
    /// `requests`, `concurrent-requests` and `concurrency` are reserved. A unit named again
    /// for the same tier replaces its bands. Naming a tier that is not
    /// configured, an invalid name, no band or an unlimited one, or more
    /// than [`MAX_BANDS`] bands in one tier with its units, is a build
    /// error. An unlimited tier may have units.
    ///
    /// ```
    /// use tower_rate_tier::{BuildError, Quota, RateTier};
    ///
    /// let tiers = RateTier::builder()
    ///     .tier("free", Quota::per_minute(20))
    ///     .tier_unit("free", "tokens", [Quota::per_minute(40_000), Quota::per_day(1_000_000)])
    ///     .build();
    /// assert_eq!(tiers.unit_quotas("free", "tokens"), Some(vec![Quota::per_minute(40_000), Quota::per_day(1_000_000)]));
    /// let unknown = RateTier::builder().tier("free", Quota::per_minute(20)).tier_unit("pro", "tokens", Quota::per_minute(1)).try_build();
    /// assert_eq!(unknown.unwrap_err(), BuildError::UnknownUnitTier("pro".into()));
    /// ```
    pub fn tier_unit(mut self, tier: impl IntoTierName, unit: &str, quotas: impl IntoQuotas) -> Self {
        self.units
            .push((tier.into_tier_name(), unit.to_owned(), quotas.into_quotas()));
        self
    }

    /// Makes `unit` known although no tier counts it: a unit that only
    /// customers' own quotas count
    /// ([`TierIdentity::with_unit_quotas`](crate::TierIdentity::with_unit_quotas)).
    ///
    /// A handler's reservation or record of a unit its request's tier does
    /// not count takes nothing when the unit is known, and is the 500 of a
    /// typo when it is not. A unit a tier counts (or counted, before a
    /// change at run time) is known; so is a unit of a customer's own
    /// quotas from that customer's first request on. Name a unit here to
    /// have it known from the start, so that the tier's other users are
    /// served before any such customer is seen (after a restart, say).
    /// An invalid or reserved name is a build error.
    ///
    /// ```
    /// use tower_rate_tier::{BuildError, Quota, RateTier};
    ///
    /// let tiers = RateTier::builder().tier("pro", Quota::per_minute(100)).contract_unit("tokens").try_build();
    /// assert!(tiers.is_ok());
    /// let reserved = RateTier::builder().tier("pro", Quota::per_minute(100)).contract_unit("requests").try_build();
    /// assert!(matches!(reserved.unwrap_err(), BuildError::InvalidContractUnit(_)));
    /// ```
    pub fn contract_unit(mut self, unit: &str) -> Self {
        self.contract_units.push(unit.to_owned());
        self
    }

    /// How long a slot of a concurrency limit counts as in use when it is
    /// not given back (default [`DEFAULT_CONCURRENCY_LEASE`], 2 minutes; at
    /// least 1 ms). A request normally gives its slot back when its response
    /// ends; the lease bounds what a slot that is never given back costs: a
    /// process that died holding slots in a shared storage, a failed
    /// release, a body a stalled connection keeps alive. It also bounds how
    /// long one request is counted: a response still streaming after the
    /// lease no longer holds a slot. The default is longer than the read
    /// timeouts of common proxies (60 s for nginx and many load balancers),
    /// so a request they still serve stays counted, and short enough that a
    /// crashed instance's slots come back within minutes.
    pub fn concurrency_lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease.max(Duration::from_millis(1)));
        self
    }

    /// A key namespace, so that several limiters can share one storage
    /// without sharing quotas (default empty).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Builds the configuration.
    ///
    /// # Panics
    ///
    /// With the message of the [`BuildError`] that
    /// [`try_build`](Self::try_build) would return.
    #[track_caller]
    pub fn build(self) -> RateTier {
        match self.try_build() {
            Ok(tiers) => tiers,
            Err(e) => panic!("invalid rate-tier configuration: {e}"),
        }
    }

    /// Builds the configuration, or says what is wrong with it.
    pub fn try_build(self) -> Result<RateTier, BuildError> {
        if self.tiers.is_empty() {
            return Err(BuildError::NoTiers);
        }
        if self.namespace.len() > 255 {
            return Err(BuildError::InvalidName(self.namespace));
        }
        let storage = self.storage.unwrap_or_else(|| Arc::new(MemoryStorage::new()));
        let preparer = super::Preparer::new(storage, &self.namespace);
        let mut tiers = Vec::with_capacity(self.tiers.len());
        for (name, bands) in self.tiers {
            let mut entry = TierEntry::new(name.clone(), bands, &preparer)?;
            entry.shadow = self.shadowed.contains(&name);
            tiers.push(entry);
        }
        for (name, limit) in self.concurrency {
            let limit =
                NonZeroU32::new(limit).ok_or_else(|| BuildError::ZeroConcurrency(name.to_string()))?;
            let Some(entry) = tiers.iter_mut().find(|t| *t.name == *name) else {
                return Err(BuildError::UnknownConcurrencyTier(name.to_string()));
            };
            *entry = entry.clone().with_concurrency(Some(limit));
        }
        for (name, unit, bands) in self.units {
            let Some(entry) = tiers.iter_mut().find(|t| *t.name == *name) else {
                return Err(BuildError::UnknownUnitTier(name.to_string()));
            };
            *entry = entry.clone().with_unit(&unit, Some(bands))?;
        }
        if let Some(name) = self
            .shadowed
            .iter()
            .find(|s| !tiers.iter().any(|t| *t.name == ***s))
        {
            return Err(BuildError::UnknownShadowTier(name.to_string()));
        }
        let mut table = Table::new(tiers, self.default_tier.as_deref())?;
        for unit in &self.contract_units {
            let unit = Unit::new(unit).map_err(BuildError::InvalidContractUnit)?;
            table.know_unit(unit.as_str());
        }
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        // Calibrates the process clock now rather than on the first request.
        let _ = clock.now();
        Ok(RateTier {
            inner: Arc::new(Config {
                table: ArcSwap::from_pointee(table),
                on_missing: self.on_missing,
                preparer,
                clock,
                lease: self.lease.unwrap_or(DEFAULT_CONCURRENCY_LEASE),
                forgiven: Default::default(),
            }),
        })
    }
}

impl fmt::Debug for RateTierBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateTierBuilder")
            .field("tiers", &self.tiers)
            .field("default_tier", &self.default_tier)
            .field("on_missing", &self.on_missing)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}
