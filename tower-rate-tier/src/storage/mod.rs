//! Where GCRA state lives.
//!
//! A [`Storage`] decides one request for all bands of a tier in one atomic
//! step: either every band admits it and every band is charged, or nothing is
//! written. The backend owns its time source (the in-memory storage reads the
//! [`RateTier`](crate::RateTier)'s clock, Redis its own server clock), so the
//! trait never takes a client-side `now`.
//!
//! [`MemoryStorage`] is the default. The Redis storage (feature `redis`,
//! [`RedisStorage`]) shares one quota between many
//! processes.
//!
//! A storage is addressed by a structured [`StorageKey`] (namespace, tier,
//! user), never a formatted string, so backends choose their own encoding.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrayvec::ArrayVec;

use crate::clock::{Clock, Nanos};
use crate::gcra::BandState;
use crate::quota::Quota;

mod memory;
#[cfg(feature = "redis")]
pub mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{RedisStorage, RedisStorageBuilder};
pub(crate) use memory::Direct;
pub use memory::{MemoryStorage, MemoryStorageBuilder};

/// The most bands one tier may have: one per period a [`Quota`] can name
/// (second, minute, hour, day). Per-band states travel inline (no allocation
/// per check), so this also bounds the size of every decision.
pub const MAX_BANDS: usize = 4;

/// Per-band states of one decision, in the order of the tier's bands (one
/// band inline, as most tiers have).
pub type BandStates = smallvec::SmallVec<[BandState; 1]>;

/// Which bucket a decision is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StorageKey<'a> {
    /// Separates limiters sharing one storage (empty by default).
    pub namespace: &'a str,
    /// The tier's name.
    pub tier: &'a str,
    /// The user's id.
    pub user: &'a str,
}

/// The outcome of one atomic decision over all bands of a tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether every band admitted the request (and was charged).
    pub allowed: bool,
    /// The backend's time of the decision, in nanoseconds since the Unix
    /// epoch.
    pub now: Nanos,
    /// Each band's state after the decision.
    pub bands: BandStates,
}

/// A storage failure: unreachable, timed out, full, or a bad reply.
///
/// Its message says what was attempted; the backend's own error, when there
/// is one, is its [`source`](std::error::Error::source).
#[derive(Debug, Clone)]
pub struct StorageError {
    kind: StorageErrorKind,
    message: Arc<str>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// What kind of failure a [`StorageError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StorageErrorKind {
    /// The backend did not answer within its timeout.
    Timeout,
    /// The backend could not be reached.
    Unavailable,
    /// The storage tracks as many keys as it may; a new key was refused.
    Full,
    /// Anything else (a bad reply, a refused command, ...).
    Other,
}

impl StorageError {
    /// A new error of `kind`.
    pub fn new(kind: StorageErrorKind, message: impl Into<Arc<str>>) -> Self {
        StorageError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A new error of `kind` caused by `source` (the backend's own error,
    /// returned by [`Error::source`](std::error::Error::source)). `message`
    /// says what was attempted; the source's text is not repeated in it.
    pub fn with_source(
        kind: StorageErrorKind,
        message: impl Into<Arc<str>>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StorageError {
            kind,
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> StorageErrorKind {
        self.kind
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            StorageErrorKind::Timeout => "timed out",
            StorageErrorKind::Unavailable => "unavailable",
            StorageErrorKind::Full => "full",
            StorageErrorKind::Other => "failed",
        };
        write!(f, "rate-limit storage {kind}: {}", self.message)
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A storage's handle on the keys of one tier of one limiter, made once when
/// a [`RateTier`](crate::RateTier) is built ([`Storage::prepare`]) so that
/// per-request calls need not look the tier up again. Opaque to everyone but
/// the storage that made it.
#[derive(Clone)]
pub struct PreparedScope(Arc<dyn Any + Send + Sync>);

impl PreparedScope {
    /// Wraps a storage's own handle.
    pub fn new<T: Any + Send + Sync>(handle: Arc<T>) -> Self {
        PreparedScope(handle)
    }

    /// The storage's own handle, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
}

impl fmt::Debug for PreparedScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PreparedScope")
    }
}

/// A backend holding GCRA state.
///
/// Object safe: the runtime holds it as `Arc<dyn Storage>`. Backends that can
/// decide without waiting (the in-memory storage) also implement the `*_now`
/// methods, which the runtime calls first so that no future is boxed per
/// request; the async methods are the general path.
#[async_trait::async_trait]
pub trait Storage: Send + Sync + fmt::Debug + 'static {
    /// Charges `cost` in every band, or in none if any band denies. Cost 0
    /// reports the state and charges nothing.
    async fn check(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Result<Decision, StorageError>;

    /// Gives `cost` back to every band (never below a fresh state).
    async fn refund(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Result<(), StorageError>;

    /// [`Storage::check`] without waiting, where the backend can; `None`
    /// means "use the async method".
    fn check_now(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<Decision, StorageError>> {
        let _ = (key, bands, cost);
        None
    }

    /// [`Storage::refund`] without waiting, where the backend can; `None`
    /// means "use the async method".
    fn refund_now(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<(), StorageError>> {
        let _ = (key, bands, cost);
        None
    }

    /// Resolves the keys of one tier of one limiter ahead of time (called
    /// once per tier when a `RateTier` is built). Backends that gain nothing
    /// from it return `None` (the default).
    fn prepare(&self, namespace: &str, tier: &str) -> Option<PreparedScope> {
        let _ = (namespace, tier);
        None
    }

    /// [`check_now`](Self::check_now) with the handle
    /// [`prepare`](Self::prepare) made for `key`'s namespace and tier.
    fn check_prepared_now(
        &self,
        scope: &PreparedScope,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<Decision, StorageError>> {
        let _ = scope;
        self.check_now(key, bands, cost)
    }

    /// [`refund_now`](Self::refund_now) with the handle
    /// [`prepare`](Self::prepare) made for `key`'s namespace and tier.
    fn refund_prepared_now(
        &self,
        scope: &PreparedScope,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<(), StorageError>> {
        let _ = scope;
        self.refund_now(key, bands, cost)
    }

    /// Whether [`check_now`](Self::check_now) and
    /// [`refund_now`](Self::refund_now) always answer (`Some`). The layer then
    /// decides requests inline, without boxing a future.
    fn decides_now(&self) -> bool {
        false
    }

    /// Called by [`RateTierBuilder::clock`](crate::RateTierBuilder::clock)'s
    /// owner at build time with the tier configuration's clock. Backends that
    /// keep their own time (Redis) ignore it; the in-memory storage uses it for
    /// decisions and garbage collection unless it was given a clock itself.
    fn use_clock(&self, clock: Arc<dyn Clock>) {
        let _ = clock;
    }
}

#[async_trait::async_trait]
impl<S: Storage + ?Sized> Storage for Arc<S> {
    async fn check(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Result<Decision, StorageError> {
        (**self).check(key, bands, cost).await
    }

    async fn refund(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Result<(), StorageError> {
        (**self).refund(key, bands, cost).await
    }

    fn check_now(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<Decision, StorageError>> {
        (**self).check_now(key, bands, cost)
    }

    fn refund_now(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<(), StorageError>> {
        (**self).refund_now(key, bands, cost)
    }

    fn prepare(&self, namespace: &str, tier: &str) -> Option<PreparedScope> {
        (**self).prepare(namespace, tier)
    }

    fn check_prepared_now(
        &self,
        scope: &PreparedScope,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<Decision, StorageError>> {
        (**self).check_prepared_now(scope, key, bands, cost)
    }

    fn refund_prepared_now(
        &self,
        scope: &PreparedScope,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<(), StorageError>> {
        (**self).refund_prepared_now(scope, key, bands, cost)
    }

    fn decides_now(&self) -> bool {
        (**self).decides_now()
    }

    fn use_clock(&self, clock: Arc<dyn Clock>) {
        (**self).use_clock(clock)
    }
}

/// Decides all bands against their stored TATs, all or nothing: whether every
/// band admits, the TAT to write per band (`None`: leave as is), and each
/// band's state. When any band denies, nothing is charged and every band
/// reports its state unchanged; the only writes left are the clamps of TATs
/// more than a full refill ahead (a clock that moved backwards, see
/// [`BandDecision::new_tat`](crate::gcra::BandDecision::new_tat)). Shared by
/// the backends that run the GCRA in process.
pub(crate) fn decide_bands(
    tats: &[Option<Nanos>],
    now: Nanos,
    bands: &[Quota],
    cost: u32,
) -> (bool, ArrayVec<Option<Nanos>, MAX_BANDS>, BandStates) {
    let mut writes = ArrayVec::new();
    let mut states = BandStates::new();
    let mut allowed = true;
    for (tat, quota) in tats.iter().zip(bands) {
        let d = crate::gcra::decide(*tat, now, quota, cost);
        allowed &= d.allowed;
        writes.push(d.new_tat);
        states.push(d.state);
    }
    if !allowed {
        // A band that denied wrote at most its clamp; one that would have
        // admitted reports (and clamps) as a peek.
        for (((state, write), tat), quota) in states.iter_mut().zip(writes.iter_mut()).zip(tats).zip(bands) {
            if state.retry_after_ns == 0 {
                let peek = crate::gcra::decide(*tat, now, quota, 0);
                *state = peek.state;
                *write = peek.new_tat;
            }
        }
    }
    (allowed, writes, states)
}
