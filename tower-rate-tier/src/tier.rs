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

use std::any::Any;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::clock::{Clock, Nanos, SystemClock};
use crate::gcra::{BandDecision, BandState};
use crate::quota::{IntoQuotas, Quota};
use crate::storage::{
    BandStates, Decision, Direct, MAX_BANDS, MemoryStorage, PreparedScope, Storage, StorageError, StorageKey,
};

/// Up to this many tiers, a name is looked up by comparing, not hashing.
const LINEAR_LOOKUP_MAX_TIERS: usize = 8;

/// The longest user id [`RateTier::check`] accepts, in bytes.
pub const MAX_USER_ID_LEN: usize = 1024;

/// What to do with a request whose client could not be identified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissing {
    /// Limit it with the default tier's quota (keyed by the peer address when
    /// the layer knows it); 403 when there is no default tier.
    #[default]
    UseDefault,
    /// Let it through without counting it.
    Allow,
    /// Answer with this status.
    Deny(StatusCode),
}

/// A table of tiers, as `#[rate_tiers]` generates it for an enum.
///
/// [`RateTierBuilder::tiers`] adds every tier of a table (and its default
/// tier), and [`TierIdentity::new`](crate::TierIdentity::new) accepts a
/// table's values as tier names.
pub trait TierTable: Copy + Send + Sync + 'static {
    /// Every tier, in declaration order.
    fn all() -> &'static [Self];
    /// This tier's name.
    fn tier_name(self) -> &'static str;
    /// This tier's bands (empty for an unlimited tier is not allowed: an
    /// unlimited tier is `[Quota::unlimited()]`).
    fn tier_quotas(self) -> &'static [Quota];
    /// The default tier, if the table names one.
    fn default_tier() -> Option<Self>;
}

/// Anything that names a tier: `&str`, `String`, or a [`TierTable`] value.
pub trait IntoTierName {
    /// The name.
    fn into_tier_name(self) -> Cow<'static, str>;
}

impl IntoTierName for &str {
    fn into_tier_name(self) -> Cow<'static, str> {
        Cow::Owned(self.to_owned())
    }
}

impl IntoTierName for String {
    fn into_tier_name(self) -> Cow<'static, str> {
        Cow::Owned(self)
    }
}

impl IntoTierName for &String {
    fn into_tier_name(self) -> Cow<'static, str> {
        Cow::Owned(self.clone())
    }
}

impl IntoTierName for Cow<'static, str> {
    fn into_tier_name(self) -> Cow<'static, str> {
        self
    }
}

impl<T: TierTable> IntoTierName for T {
    fn into_tier_name(self) -> Cow<'static, str> {
        Cow::Borrowed(self.tier_name())
    }
}

/// A request was admitted: the state after the charge.
#[derive(Clone, PartialEq, Eq)]
pub struct RateLimitInfo {
    /// The burst of the band closest to denying (`u32::MAX` when unlimited).
    pub limit: u32,
    /// Cost units that band could still admit now.
    pub remaining: u32,
    /// Time until that band is full again.
    pub reset_after: Duration,
    pub(crate) detail: Detail,
}

/// A request was denied; nothing was charged.
#[derive(Clone, PartialEq, Eq)]
pub struct RateLimited {
    /// The burst of the band that denied.
    pub limit: u32,
    /// Cost units that band could still admit now (fewer than the cost).
    pub remaining: u32,
    /// Time until the same request would be admitted.
    pub retry_after: Duration,
    /// Time until the band that denied is full again.
    pub reset_after: Duration,
    pub(crate) detail: Detail,
}

/// What both outcomes carry for the response headers.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Detail {
    pub(crate) tier: &'static TierEntry,
    pub(crate) now: Nanos,
    pub(crate) bands: BandStates,
}

impl Detail {
    /// The tier's name.
    fn tier(&self) -> &str {
        &self.tier.name
    }
}

macro_rules! outcome_accessors {
    ($ty:ty) => {
        impl $ty {
            /// The tier's name.
            pub fn tier(&self) -> &str {
                self.detail.tier()
            }

            /// Whether the tier is unlimited (no rate-limit headers).
            pub fn is_unlimited(&self) -> bool {
                self.detail.tier.unlimited
            }

            /// Every band of the tier with its state, in the tier's order.
            pub fn bands(&self) -> impl Iterator<Item = (Quota, BandState)> + '_ {
                self.detail
                    .tier
                    .bands
                    .iter()
                    .copied()
                    .zip(self.detail.bands.iter().copied())
            }

            /// The storage's time of the decision, in nanoseconds since the
            /// Unix epoch.
            pub fn decided_at(&self) -> Nanos {
                self.detail.now
            }

            /// When the reported band is full again, in Unix seconds
            /// (rounded up): the `X-RateLimit-Reset` value.
            pub fn reset_at_unix_secs(&self) -> u64 {
                let at = u128::from(self.detail.now) + self.reset_after.as_nanos();
                u64::try_from(at.div_ceil(1_000_000_000)).unwrap_or(u64::MAX)
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut d = f.debug_struct(stringify!($ty));
                d.field("tier", &self.tier());
                d.field("limit", &self.limit);
                d.field("remaining", &self.remaining);
                d.field("reset_after", &self.reset_after);
                d.finish_non_exhaustive()
            }
        }
    };
}

outcome_accessors!(RateLimitInfo);
outcome_accessors!(RateLimited);

impl RateLimitInfo {
    /// The state after `units` were given back (same instant): what a refund
    /// of the storage did to every band.
    pub(crate) fn refunded(&mut self, units: u32) {
        if self.detail.tier.unlimited {
            return;
        }
        let mut bands = self.detail.bands.clone();
        for (state, quota) in bands.iter_mut().zip(self.detail.tier.bands.iter()) {
            let interval = u128::from(quota.emission_interval_nanos());
            let tolerance = interval * u128::from(quota.burst());
            let used = u128::from(state.reset_after_ns).saturating_sub(interval * u128::from(units));
            state.reset_after_ns = u64::try_from(used).unwrap_or(u64::MAX);
            state.remaining = u32::try_from((tolerance - used.min(tolerance)) / interval).unwrap_or(u32::MAX);
        }
        let decision = Decision {
            allowed: true,
            now: self.detail.now,
            bands,
        };
        if let Ok(info) = outcome(self.detail.tier, decision) {
            *self = info;
        }
    }
}

impl RateLimited {
    /// `Retry-After` in whole seconds, rounded up, never 0.
    pub fn retry_after_secs(&self) -> u64 {
        let nanos = self.retry_after.as_nanos();
        u64::try_from(nanos.div_ceil(1_000_000_000))
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// Why a check could not be decided.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum CheckError {
    /// The tier name is not configured.
    UnknownTier(String),
    /// The storage failed.
    Storage(StorageError),
    /// The cost exceeds the tier's burst (of its smallest band): the request
    /// could never pass. Nothing was charged.
    CostExceedsLimit {
        /// The tier.
        tier: String,
        /// The cost asked for.
        cost: u32,
        /// The most a request of this tier may cost.
        limit: u32,
    },
    /// The user id is empty or longer than [`MAX_USER_ID_LEN`] bytes.
    InvalidUserId,
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::UnknownTier(t) => write!(f, "unknown tier `{t}`"),
            CheckError::Storage(e) => e.fmt(f),
            CheckError::CostExceedsLimit { tier, cost, limit } => write!(
                f,
                "a request costing {cost} can never pass tier `{tier}`, whose burst is {limit}"
            ),
            CheckError::InvalidUserId => {
                write!(f, "the user id is empty or longer than {MAX_USER_ID_LEN} bytes")
            }
        }
    }
}

impl std::error::Error for CheckError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckError::Storage(e) => Some(e),
            _ => None,
        }
    }
}

impl From<StorageError> for CheckError {
    fn from(e: StorageError) -> Self {
        CheckError::Storage(e)
    }
}

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
    /// A tier has more than [`MAX_BANDS`] bands.
    TooManyBands(String),
    /// A tier name or the namespace is empty or longer than 255 bytes.
    InvalidName(String),
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
            BuildError::TooManyBands(t) => write!(f, "tier `{t}` has more than {MAX_BANDS} bands"),
            BuildError::InvalidName(t) => {
                write!(
                    f,
                    "`{t}` is not a valid tier name or namespace (1 to 255 bytes; the namespace may be empty)"
                )
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// The one copy of a tier definition: every `RateTier` built with the same
/// name and bands shares it, for the life of the process. Results then point
/// at their tier without a reference count on the hot path (and a cached
/// header value keyed by a tier's address is never served to another tier).
/// Memory grows only with the distinct (name, bands) pairs ever configured,
/// about a hundred bytes each.
fn intern(entry: TierEntry) -> &'static TierEntry {
    type Table = HashMap<(Box<str>, Box<[Quota]>), &'static TierEntry, foldhash::fast::RandomState>;
    static TABLE: std::sync::OnceLock<std::sync::Mutex<Table>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(Default::default);
    let mut table = table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = (entry.name.clone(), entry.bands.clone());
    table.entry(key).or_insert_with(|| Box::leak(Box::new(entry)))
}

/// One configured tier.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TierEntry {
    pub(crate) name: Box<str>,
    pub(crate) bands: Box<[Quota]>,
    /// The largest cost that can ever pass (the smallest burst).
    pub(crate) max_cost: u32,
    pub(crate) unlimited: bool,
    /// The `RateLimit-Policy` header value, rendered once.
    pub(crate) policy_header: Option<http::HeaderValue>,
}

/// An index into a [`RateTier`]'s tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TierId(pub(crate) usize);

/// Named tiers, their quotas and the storage that counts them.
///
/// Cheap to clone; clones share state. See the [module docs](self).
#[derive(Clone)]
pub struct RateTier {
    inner: Arc<TierConfig>,
}

struct TierConfig {
    tiers: Box<[&'static TierEntry]>,
    /// The storage's handles on each tier's keys (same order as `tiers`),
    /// for the tiers without a direct handle.
    prepared: Box<[Option<PreparedScope>]>,
    /// Direct handles on a [`MemoryStorage`]'s single-band tiers (same order
    /// as `tiers`): the hot path of the default storage, without a dynamic
    /// call.
    direct: Box<[Option<Direct>]>,
    by_name: HashMap<Box<str>, usize, foldhash::fast::RandomState>,
    default_tier: Option<usize>,
    on_missing: OnMissing,
    storage: Arc<dyn Storage>,
    clock: Arc<dyn Clock>,
    namespace: Box<str>,
}

/// The outcome of [`RateTier::check`].
pub type CheckResult = Result<Result<RateLimitInfo, RateLimited>, CheckError>;

impl RateTier {
    /// Starts a configuration.
    pub fn builder() -> RateTierBuilder {
        RateTierBuilder::default()
    }

    /// Charges `cost` to `user` in `tier`: `Ok(Ok(info))` when admitted,
    /// `Ok(Err(limited))` when denied (nothing charged), `Err(_)` when the
    /// check could not be decided. Cost 0 reports the state and charges
    /// nothing. An unlimited tier never touches the storage.
    pub async fn check(&self, user: &str, tier: &str, cost: u32) -> CheckResult {
        let id = self
            .resolve(tier)
            .ok_or_else(|| CheckError::UnknownTier(tier.to_owned()))?;
        // The synchronous path first, outside any nested future: its result
        // is then moved once, not once per future layer.
        if let Some(done) = self.check_now(user, id, cost) {
            return done;
        }
        self.check_id(user, id, cost).await
    }

    /// Gives `cost` back to `user` in `tier` (never below a fresh state).
    pub async fn refund(&self, user: &str, tier: &str, cost: u32) -> Result<(), CheckError> {
        let id = self
            .resolve(tier)
            .ok_or_else(|| CheckError::UnknownTier(tier.to_owned()))?;
        match self.refund_now(user, id, cost) {
            Some(done) => done,
            None => {
                let entry = self.inner.tiers[id.0];
                let key = self.key(user, entry);
                Ok(self.inner.storage.refund(key, &entry.bands, cost).await?)
            }
        }
    }

    /// The configured tier names, in the order they were added.
    pub fn tier_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.inner.tiers.iter().map(|t| &*t.name)
    }

    /// The bands of a tier.
    pub fn quotas(&self, tier: &str) -> Option<&[Quota]> {
        self.resolve(tier).map(|id| &*self.inner.tiers[id.0].bands)
    }

    /// The default tier's name.
    pub fn default_tier(&self) -> Option<&str> {
        self.inner.default_tier.map(|i| &*self.inner.tiers[i].name)
    }

    /// The policy for unidentified clients.
    pub fn on_missing(&self) -> OnMissing {
        self.inner.on_missing
    }

    /// The key namespace of this configuration.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The configuration's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Whether the storage decides without waiting (see
    /// [`Storage::decides_now`]).
    pub(crate) fn decides_now(&self) -> bool {
        self.inner.storage.decides_now()
    }

    #[inline]
    pub(crate) fn resolve(&self, tier: &str) -> Option<TierId> {
        // A few names compare faster than they hash.
        let tiers = &self.inner.tiers;
        if tiers.len() <= LINEAR_LOOKUP_MAX_TIERS {
            return tiers.iter().position(|t| same_name(&t.name, tier)).map(TierId);
        }
        self.inner.by_name.get(tier).copied().map(TierId)
    }

    pub(crate) fn default_id(&self) -> Option<TierId> {
        self.inner.default_tier.map(TierId)
    }

    pub(crate) fn entry(&self, id: TierId) -> &'static TierEntry {
        self.inner.tiers[id.0]
    }

    fn key<'a>(&'a self, user: &'a str, entry: &'a TierEntry) -> StorageKey<'a> {
        StorageKey {
            namespace: &self.inner.namespace,
            tier: &entry.name,
            user,
        }
    }

    /// Everything decided before the storage is asked: `Err` when the check
    /// is already answered.
    #[inline]
    fn precheck(&self, user: &str, id: TierId, cost: u32) -> Result<&'static TierEntry, CheckResult> {
        let entry = self.inner.tiers[id.0];
        if entry.unlimited || user.is_empty() || user.len() > MAX_USER_ID_LEN || cost > entry.max_cost {
            return Err(self.answer_early(entry, user, cost));
        }
        Ok(entry)
    }

    /// The outcome of a check that [`RateTier::precheck`] answers.
    #[cold]
    #[inline(never)]
    fn answer_early(&self, entry: &'static TierEntry, user: &str, cost: u32) -> CheckResult {
        if entry.unlimited {
            return Ok(Ok(unlimited_info(entry, self.inner.clock.now())));
        }
        if user.is_empty() || user.len() > MAX_USER_ID_LEN {
            return Err(CheckError::InvalidUserId);
        }
        Err(CheckError::CostExceedsLimit {
            tier: entry.name.to_string(),
            cost,
            limit: entry.max_cost,
        })
    }

    /// Decides without waiting where the storage can; `None`: use
    /// [`RateTier::check_id`].
    pub(crate) fn check_now(&self, user: &str, id: TierId, cost: u32) -> Option<CheckResult> {
        let entry = match self.precheck(user, id, cost) {
            Ok(entry) => entry,
            Err(done) => return Some(done),
        };
        if let Some(direct) = &self.inner.direct[id.0] {
            return Some(match direct.check(user, &entry.bands[0], cost) {
                Ok((d, now)) => Ok(single_outcome(entry, d, now)),
                Err(e) => Err(CheckError::Storage(e)),
            });
        }
        let key = self.key(user, entry);
        let storage = &self.inner.storage;
        let decision = match &self.inner.prepared[id.0] {
            Some(scope) => storage.check_prepared_now(scope, key, &entry.bands, cost)?,
            None => storage.check_now(key, &entry.bands, cost)?,
        };
        Some(decision.map(|d| outcome(entry, d)).map_err(CheckError::Storage))
    }

    pub(crate) async fn check_id(&self, user: &str, id: TierId, cost: u32) -> CheckResult {
        if let Some(done) = self.check_now(user, id, cost) {
            return done;
        }
        let entry = match self.precheck(user, id, cost) {
            Ok(entry) => entry,
            Err(done) => return done,
        };
        let decision = self
            .inner
            .storage
            .check(self.key(user, entry), &entry.bands, cost)
            .await?;
        Ok(outcome(entry, decision))
    }

    pub(crate) fn refund_now(&self, user: &str, id: TierId, cost: u32) -> Option<Result<(), CheckError>> {
        let entry = self.inner.tiers[id.0];
        if entry.unlimited || cost == 0 {
            return Some(Ok(()));
        }
        if let Some(direct) = &self.inner.direct[id.0] {
            direct.refund(user, &entry.bands[0], cost);
            return Some(Ok(()));
        }
        let key = self.key(user, entry);
        let storage = &self.inner.storage;
        let done = match &self.inner.prepared[id.0] {
            Some(scope) => storage.refund_prepared_now(scope, key, &entry.bands, cost)?,
            None => storage.refund_now(key, &entry.bands, cost)?,
        };
        Some(done.map_err(CheckError::Storage))
    }

    pub(crate) async fn refund_id(&self, user: &str, id: TierId, cost: u32) -> Result<(), CheckError> {
        if let Some(done) = self.refund_now(user, id, cost) {
            return done;
        }
        let entry = self.inner.tiers[id.0];
        Ok(self
            .inner
            .storage
            .refund(self.key(user, entry), &entry.bands, cost)
            .await?)
    }
}

/// `a == b` for tier names, inline: most are a few bytes, for which a call to
/// `memcmp` costs more than the comparison.
#[inline]
fn same_name(a: &str, b: &str) -> bool {
    fn word<const N: usize>(s: &[u8]) -> [u8; N] {
        s.try_into().unwrap_or([0; N])
    }
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    // Two overlapping words cover names of 4 to 16 bytes.
    match n {
        4..=8 => word::<4>(&a[..4]) == word::<4>(&b[..4]) && word::<4>(&a[n - 4..]) == word::<4>(&b[n - 4..]),
        9..=16 => {
            word::<8>(&a[..8]) == word::<8>(&b[..8]) && word::<8>(&a[n - 8..]) == word::<8>(&b[n - 8..])
        }
        _ => a == b,
    }
}

fn unlimited_info(entry: &'static TierEntry, now: Nanos) -> RateLimitInfo {
    RateLimitInfo {
        limit: u32::MAX,
        remaining: u32::MAX,
        reset_after: Duration::ZERO,
        detail: Detail {
            tier: entry,
            now,
            bands: BandStates::new(),
        },
    }
}

/// [`outcome`] for a tier of one band.
#[inline]
fn single_outcome(
    entry: &'static TierEntry,
    d: BandDecision,
    now: Nanos,
) -> Result<RateLimitInfo, RateLimited> {
    let mut bands = BandStates::new();
    bands.push(d.state);
    let detail = Detail {
        tier: entry,
        now,
        bands,
    };
    reported(d.allowed, entry.bands[0].burst(), d.state, detail)
}

/// Turns a storage decision into the public outcome, reporting the band
/// closest to denying (admitted) or the band that denies longest (denied).
fn outcome(entry: &'static TierEntry, d: Decision) -> Result<RateLimitInfo, RateLimited> {
    let pick = if d.allowed {
        d.bands.iter().enumerate().min_by(|(_, a), (_, b)| {
            a.remaining
                .cmp(&b.remaining)
                .then(b.reset_after_ns.cmp(&a.reset_after_ns))
        })
    } else {
        d.bands.iter().enumerate().max_by_key(|(_, s)| s.retry_after_ns)
    };
    let (index, state) = pick.map(|(i, s)| (i, *s)).unwrap_or_default();
    let limit = entry.bands.get(index).map_or(0, Quota::burst);
    let detail = Detail {
        tier: entry,
        now: d.now,
        bands: d.bands,
    };
    reported(d.allowed, limit, state, detail)
}

/// The public outcome of a decision, with `state` (of a band whose burst is
/// `limit`) as the reported band.
#[inline]
fn reported(
    allowed: bool,
    limit: u32,
    state: BandState,
    detail: Detail,
) -> Result<RateLimitInfo, RateLimited> {
    let reset_after = Duration::from_nanos(state.reset_after_ns);
    if allowed {
        Ok(RateLimitInfo {
            limit,
            remaining: state.remaining,
            reset_after,
            detail,
        })
    } else {
        Err(RateLimited {
            limit,
            remaining: state.remaining,
            retry_after: Duration::from_nanos(state.retry_after_ns),
            reset_after,
            detail,
        })
    }
}

impl fmt::Debug for RateTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tiers: Vec<(&str, &[Quota])> = self.inner.tiers.iter().map(|t| (&*t.name, &*t.bands)).collect();
        f.debug_struct("RateTier")
            .field("tiers", &tiers)
            .field("default_tier", &self.default_tier())
            .field("on_missing", &self.inner.on_missing)
            .field("namespace", &self.inner.namespace)
            .field("storage", &self.inner.storage)
            .field("clock", &self.inner.clock)
            .finish()
    }
}

/// Configures a [`RateTier`]; see [`RateTier::builder`].
#[derive(Default)]
pub struct RateTierBuilder {
    tiers: Vec<(Cow<'static, str>, Vec<Quota>)>,
    default_tier: Option<Cow<'static, str>>,
    on_missing: OnMissing,
    clock: Option<Arc<dyn Clock>>,
    storage: Option<Arc<dyn Storage>>,
    /// The storage, when it is a [`MemoryStorage`] (checked directly).
    memory: Option<MemoryStorage>,
    namespace: String,
}

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
            self = self.tier(tier.tier_name(), tier.tier_quotas());
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

    /// The clock (default [`SystemClock`]); it is also handed to the storage
    /// (the in-memory storage decides and collects garbage with it).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The storage (default: a new [`MemoryStorage`]).
    pub fn storage(mut self, storage: impl Storage) -> Self {
        self.memory = (&storage as &dyn Any).downcast_ref::<MemoryStorage>().cloned();
        self.storage = Some(Arc::new(storage));
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
        let mut by_name = HashMap::with_hasher(foldhash::fast::RandomState::default());
        let mut tiers = Vec::with_capacity(self.tiers.len());
        for (index, (name, bands)) in self.tiers.into_iter().enumerate() {
            if name.is_empty() || name.len() > 255 {
                return Err(BuildError::InvalidName(name.into_owned()));
            }
            if bands.is_empty() {
                return Err(BuildError::NoBands(name.into_owned()));
            }
            if bands.len() > MAX_BANDS {
                return Err(BuildError::TooManyBands(name.into_owned()));
            }
            let unlimited = bands.iter().filter(|q| q.is_unlimited()).count();
            if unlimited > 0 && unlimited < bands.len() {
                return Err(BuildError::UnlimitedWithBands(name.into_owned()));
            }
            let unlimited = unlimited > 0;
            let bands: Box<[Quota]> = if unlimited {
                Box::new([Quota::unlimited()])
            } else {
                bands.into()
            };
            let max_cost = if unlimited {
                u32::MAX
            } else {
                bands.iter().map(Quota::burst).min().unwrap_or(0)
            };
            if by_name.insert(Box::<str>::from(&*name), index).is_some() {
                return Err(BuildError::DuplicateTier(name.into_owned()));
            }
            tiers.push(intern(TierEntry {
                policy_header: crate::response::policy_value(&name, &bands),
                name: name.into(),
                bands,
                max_cost,
                unlimited,
            }));
        }
        let default_tier = match self.default_tier {
            None => None,
            Some(name) => Some(
                by_name
                    .get(&*name)
                    .copied()
                    .ok_or_else(|| BuildError::UnknownDefaultTier(name.into_owned()))?,
            ),
        };
        let system_clock = self.clock.is_none();
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        // Calibrates the process clock now rather than on the first request.
        let _ = clock.now();
        let (storage, memory): (Arc<dyn Storage>, _) = match self.storage {
            Some(storage) => (storage, self.memory),
            None => {
                let memory = MemoryStorage::new();
                (Arc::new(memory.clone()), Some(memory))
            }
        };
        match &memory {
            // The storage then reads the clock without a dynamic call.
            Some(memory) if system_clock => memory.use_system_clock(),
            _ => storage.use_clock(clock.clone()),
        }
        let namespace: Box<str> = self.namespace.into();
        let direct: Box<[Option<Direct>]> = tiers
            .iter()
            .map(|t| {
                let memory = memory.as_ref().filter(|_| t.bands.len() == 1 && !t.unlimited)?;
                Some(Direct::new(memory, &namespace, &t.name))
            })
            .collect();
        // The storage's own handles, for the tiers not checked directly.
        let prepared = tiers
            .iter()
            .zip(&direct)
            .map(|(t, direct)| match direct {
                Some(_) => None,
                None => storage.prepare(&namespace, &t.name),
            })
            .collect();
        Ok(RateTier {
            inner: Arc::new(TierConfig {
                prepared,
                direct,
                tiers: tiers.into(),
                by_name,
                default_tier,
                on_missing: self.on_missing,
                storage,
                clock,
                namespace,
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
