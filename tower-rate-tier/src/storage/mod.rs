//! Where GCRA state lives.
//!
//! A [`Storage`] has one method, [`Storage::decide`]: it carries out one
//! [`Op`] (charge `n`, peek, refund `n`, or an amount per band) on the bands
//! of one key, atomically,
//! and answers with a [`Decision`]. A charge either admits the request in
//! every band and charges every band, or writes nothing. The call receives the
//! limiter's clock: a storage that runs the GCRA in process decides with it
//! (so a [`FakeClock`](crate::clock::FakeClock) given to the
//! [`RateTier`](crate::RateTier) builder reaches a wrapped [`MemoryStorage`]);
//! Redis ignores it and uses its server's time.
//!
//! The answer is a [`Decide`]: either already decided (the in-memory storage:
//! no future, no allocation) or a future (Redis). Storages wrap storages by
//! calling the inner one's `decide` and passing its answer on, or mapping it.
//!
//! A tier with a concurrency limit asks for [`Op::Acquire`] (take one of the
//! key's slots and charge its bands, in one decision) and later
//! [`Op::Release`] (give the slot back): see [`slots`]. A storage that wraps
//! another passes them on like any operation; one that counts no slots
//! answers an `Acquire` as a charge ([`decide_bands`] does), and the limiter
//! then treats a tier with a concurrency limit as a storage failure rather
//! than letting it pass uncounted.
//!
//! A decision with an amount per band is an [`Op::Each`] (see [`amount`]):
//! charge the request bands, require at least one unit and no debt in
//! others, force a charge into a bounded debt, refund, all in one atomic
//! decision. [`decide_bands`] carries it out for a storage that keeps its
//! own state; a wrapper passes it on like any operation.
//!
//! [`MemoryStorage`] is the default. The Redis storage (feature `redis`,
//! `RedisStorage`) shares one quota between many processes.
//!
//! # Writing a storage
//!
//! A wrapper that counts decisions around any storage, and the limiter using
//! it. A storage that keeps its own state decides with [`decide_bands`], the
//! GCRA over one key's stored times.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use tower_rate_tier::clock::Clock;
//! use tower_rate_tier::storage::{Decide, DecisionSource, MemoryStorage, Op, Storage, StorageKey};
//! use tower_rate_tier::{Quota, RateTier};
//!
//! #[derive(Debug, Clone)]
//! struct Counting<S> {
//!     inner: S,
//!     decisions: Arc<AtomicU64>,
//! }
//!
//! impl<S: Storage> Storage for Counting<S> {
//!     fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
//!         self.decisions.fetch_add(1, Ordering::Relaxed);
//!         self.inner.decide(key, bands, op, clock)
//!     }
//!
//!     // Passed on, so that a `Fallback` inside (through a `DenyCache` too)
//!     // gives each refund back where its charge was made.
//!     fn refund(
//!         &self,
//!         key: StorageKey<'_>,
//!         bands: &[Quota],
//!         op: Op,
//!         decided_by: DecisionSource,
//!         clock: &Arc<dyn Clock>,
//!     ) -> Decide {
//!         self.decisions.fetch_add(1, Ordering::Relaxed);
//!         self.inner.refund(key, bands, op, decided_by, clock)
//!     }
//! }
//!
//! let storage = Counting { inner: MemoryStorage::new(), decisions: Arc::default() };
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).storage(storage.clone()).build();
//! tiers.check("ada", "free", 1).await.unwrap().unwrap();
//! tiers.check("ada", "free", 1).await.unwrap().unwrap();
//! assert_eq!(storage.decisions.load(Ordering::Relaxed), 2);
//! # }
//! ```
//!
//! A wrapper passes on every method it does not change: `decide`,
//! [`Storage::refund`] (a refund, with where its charge was decided) and
//! [`Storage::prepare`]. The example leaves `prepare` to its default, so its
//! tiers are decided by name through it; a wrapper that prepares the tiers
//! of the storage it wraps hands out a [`TierScope`] that passes on each of
//! its methods in the same way.
//!
//! A storage that must wait returns [`Decide::pending`] with a future that
//! owns what it needs (copies of the key and bands, a clone of a connection
//! handle); one that decides at once returns [`Decide::ready`]. The limiter
//! adds no time limit of its own: a storage that waits bounds its own
//! futures (the Redis storage has a timeout), or a request waits as long as
//! its storage does.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::clock::{Clock, Nanos};
use crate::quota::Quota;

pub mod amount;
mod band;
mod decide;
pub mod deny_cache;
mod error;
pub mod fallback;
mod memory;
mod pointers;
#[cfg(feature = "redis")]
pub mod redis;
pub mod scope;
pub mod slots;

pub use self::amount::{Amount, Amounts};
pub(crate) use self::band::window_ms;
pub use self::band::{BandName, band_names};
pub use self::decide::decide_bands;
pub use self::deny_cache::DenyCache;
pub use self::error::{StorageError, StorageErrorKind};
pub use self::fallback::{Fallback, FallbackBuilder};
#[cfg(feature = "redis")]
pub use self::redis::{RedisStorage, RedisStorageBuilder};
pub use crate::gcra::BandState;
pub use memory::{MemoryStorage, MemoryStorageBuilder};
pub use scope::{ScopeKey, TierScope};
pub use slots::{Lease, LeaseSet, SlotState, Slots};

/// The most bands one decision may have: a tier's request bands and the
/// bands of its units together. Per-band states travel inline for one band
/// (no allocation per check).
pub const MAX_BANDS: usize = 8;

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

/// What a decision does to the bands of one key.
///
/// New operations may be added: a storage that wraps another passes on
/// what it does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Admit and charge `n` units in every band, or charge nothing when any
    /// band denies. `Charge(0)` is a peek.
    Charge(u32),
    /// Give `n` units back to every band (never below a fresh state).
    Refund(u32),
    /// Take one of the key's `slots` (a request in flight) and charge
    /// `cost` in every band, in one decision: when no slot is free nothing
    /// is charged, and when a band denies no slot is taken. The
    /// answer's [`Decision::slots`] says which; see [`slots`].
    Acquire {
        /// The units charged in every band.
        cost: u32,
        /// The concurrency limit.
        slots: Slots,
    },
    /// [`Op::Acquire`] with an [`Amount`] per band in place of one cost in
    /// every band (a tier with units: charge the request bands, require
    /// the unit bands), in one decision.
    AcquireEach {
        /// What the admission asks of each band.
        amounts: Amounts,
        /// The concurrency limit.
        slots: Slots,
    },
    /// Give back the slot of a [`Lease`] an [`Op::Acquire`] took; no band
    /// changes (the answer's band states may be empty).
    Release(Lease),
    /// An [`Amount`] per band, in the bands' order, each with the debt its
    /// band may be in: charge some bands, only require others, force or
    /// refund others, in one decision. Admitted when every
    /// [`Amount::Charge`] fits and every [`Amount::Require`] holds (a
    /// [`Amount::Force`] never refuses); when refused, nothing is written
    /// (bar the clamps) and no band is forced or refunded. See [`amount`].
    Each(Amounts),
}

impl Op {
    /// The units the operation moves in every band; 0 for an
    /// [`Op::Each`], whose bands each move their own ([`Op::band`]).
    pub fn units(self) -> u32 {
        match self {
            Op::Charge(n) | Op::Refund(n) | Op::Acquire { cost: n, .. } => n,
            Op::Release(_) | Op::Each(_) | Op::AcquireEach { .. } => 0,
        }
    }

    /// What the operation does to band `i`, and the debt that band may be
    /// in (0 but for an [`Op::Each`]'s bands given a debt bound).
    #[inline]
    pub fn band(&self, i: usize) -> (Amount, u32) {
        match *self {
            Op::Charge(n) | Op::Acquire { cost: n, .. } => (Amount::Charge(n), 0),
            Op::Refund(n) => (Amount::Refund(n), 0),
            Op::Release(_) => (Amount::Charge(0), 0),
            Op::Each(ref amounts) | Op::AcquireEach { ref amounts, .. } => amounts.get(i),
        }
    }

    /// Whether the first `n` bands would refuse the operation, asked
    /// without changing them: each band that charges or requires is
    /// required (one unit, with its debt bound: a band in debt or spent
    /// refuses), any other peeked. Writes nothing but the clamps. A
    /// storage that counts slots asks it of the bands of an
    /// [`Op::Acquire`] it refuses for want of a slot, so that the refusal
    /// waits for a band that refuses too.
    pub(crate) fn requirement(&self, n: usize) -> Op {
        let mut amounts = Amounts::new();
        for i in 0..n.min(MAX_BANDS) {
            let (amount, debt) = self.band(i);
            let asked = match amount {
                Amount::Charge(1..) | Amount::Require => Amount::Require,
                _ => Amount::Charge(0),
            };
            amounts.push(asked, debt);
        }
        Op::Each(amounts)
    }

    /// A peek at the same bands: [`Op::Charge`]`(0)`, or for an
    /// [`Op::Each`] each band peeked with its debt bound (so that a band in
    /// debt is not clamped back).
    pub fn peek(self) -> Op {
        match self {
            Op::Each(amounts) | Op::AcquireEach { amounts, .. } => Op::Each(amounts.peek()),
            _ => Op::Charge(0),
        }
    }

    /// The operation on the bands alone: an [`Op::Acquire`] is an
    /// [`Op::Charge`] of its cost, an [`Op::Release`] a peek.
    pub fn on_bands(self) -> Op {
        match self {
            Op::Acquire { cost, .. } => Op::Charge(cost),
            Op::AcquireEach { amounts, .. } => Op::Each(amounts),
            Op::Release(_) => Op::Charge(0),
            op => op,
        }
    }
}

/// Where a [`Decision`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DecisionSource {
    /// The storage the limiter was built with.
    #[default]
    Storage,
    /// The storage had no room for the key (the memory storage at its key
    /// cap): decided in the bucket its tier shares between every identity
    /// without room of its own, with the tier's quota.
    Overflow,
    /// A [`DenyCache`] in process, repeating a denial the storage made for
    /// the same key, without asking it.
    DenyCache,
    /// A [`Fallback`]'s local limiter, with its share of the quota, while
    /// the primary storage fails.
    Fallback,
}

/// The states of every band after a decision, in the tier's band order.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct BandStates(smallvec::SmallVec<[BandState; 2]>);

impl BandStates {
    /// No states.
    pub fn new() -> Self {
        BandStates::default()
    }

    /// Appends the next band's state.
    pub fn push(&mut self, state: BandState) {
        self.0.push(state);
    }
}

impl From<BandState> for BandStates {
    /// The state of a one-band tier (inline: no allocation).
    fn from(state: BandState) -> Self {
        let mut states = smallvec::SmallVec::new();
        states.push(state);
        BandStates(states)
    }
}

impl std::ops::Deref for BandStates {
    type Target = [BandState];

    fn deref(&self) -> &[BandState] {
        &self.0
    }
}

impl std::ops::DerefMut for BandStates {
    fn deref_mut(&mut self) -> &mut [BandState] {
        &mut self.0
    }
}

impl FromIterator<BandState> for BandStates {
    fn from_iter<I: IntoIterator<Item = BandState>>(iter: I) -> Self {
        BandStates(iter.into_iter().collect())
    }
}

impl fmt::Debug for BandStates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The outcome of one atomic decision over all bands of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether every band admitted the operation (a refund always is).
    pub allowed: bool,
    /// The storage's time of the decision, in nanoseconds since the Unix
    /// epoch.
    pub now: Nanos,
    /// Each band's state after the decision. A refund may leave it empty.
    pub bands: BandStates,
    /// Who decided.
    pub source: DecisionSource,
    /// The key's slots after an [`Op::Acquire`] or [`Op::Release`];
    /// `None` for other operations, or from a storage that does not count
    /// requests in flight.
    pub slots: Option<SlotState>,
}

impl Decision {
    /// A decision made by the storage itself.
    pub fn new(allowed: bool, now: Nanos, bands: BandStates) -> Self {
        Decision {
            allowed,
            now,
            bands,
            source: DecisionSource::Storage,
            slots: None,
        }
    }

    /// The same decision with the key's slots after it.
    pub fn with_slots(mut self, slots: SlotState) -> Self {
        self.slots = Some(slots);
        self
    }

    /// The same decision, reported as made by `source`.
    pub fn with_source(mut self, source: DecisionSource) -> Self {
        self.source = source;
        self
    }
}

type Pending = Pin<Box<dyn Future<Output = Result<Decision, StorageError>> + Send>>;

/// A storage's answer: decided already, or a future.
///
/// It is a future itself, so `storage.decide(..).await` works whatever the
/// storage; [`Decide::into_ready`] takes an answer that needs no waiting
/// without polling. A pending answer owns what it needs (it borrows nothing
/// from the call), so the limiter can keep it and await it in a task of its
/// own.
pub struct Decide(Answer);

enum Answer {
    Ready(Option<Result<Decision, StorageError>>),
    Pending(Pending),
}

impl Decide {
    /// Decided already.
    #[inline]
    pub fn ready(result: Result<Decision, StorageError>) -> Self {
        Decide(Answer::Ready(Some(result)))
    }

    /// Decided when `future` completes.
    pub fn pending<F>(future: F) -> Self
    where
        F: Future<Output = Result<Decision, StorageError>> + Send + 'static,
    {
        Decide(Answer::Pending(Box::pin(future)))
    }

    /// The answer, if it needs no waiting; else the `Decide` back.
    #[inline]
    pub fn into_ready(self) -> Result<Result<Decision, StorageError>, Decide> {
        match self.0 {
            Answer::Ready(Some(result)) => Ok(result),
            other => Err(Decide(other)),
        }
    }

    /// Applies `f` to the answer, now or when it arrives.
    pub fn map<F>(self, f: F) -> Decide
    where
        F: FnOnce(Result<Decision, StorageError>) -> Result<Decision, StorageError> + Send + 'static,
    {
        match self.into_ready() {
            Ok(result) => Decide::ready(f(result)),
            Err(pending) => Decide::pending(async move { f(pending.await) }),
        }
    }
}

impl Future for Decide {
    type Output = Result<Decision, StorageError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Answer::Ready(result) => match result.take() {
                Some(result) => Poll::Ready(result),
                None => panic!("a storage's `Decide` was polled after it completed"),
            },
            Answer::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for Decide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Answer::Ready(result) => f.debug_tuple("Ready").field(result).finish(),
            Answer::Pending(_) => f.write_str("Pending"),
        }
    }
}

/// A backend holding GCRA state. See the [module documentation](self).
///
/// Object safe: a [`RateTier`](crate::RateTier) holds its storage as
/// `Arc<dyn Storage>`.
pub trait Storage: Send + Sync + fmt::Debug + 'static {
    /// Carries out `op` on every band of `key` (`bands` in the tier's order,
    /// 1 to [`MAX_BANDS`]), atomically. `clock` is the limiter's clock, for
    /// storages that keep time in process.
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide;

    /// This storage's state of the tier `at`, found once (when the tier
    /// table is built) so that its decisions look nothing up: see
    /// [`scope`]. `None` (the default) decides the tier through
    /// [`decide`](Storage::decide) with its names.
    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        let _ = at;
        None
    }

    /// Carries out `op`, which gives back (some of) what an earlier
    /// decision of `key` charged, made by `decided_by`
    /// ([`Decision::source`]): see [`TierScope::refund`], which this is for
    /// a tier decided by name. By default, as [`decide`](Storage::decide)
    /// does. A wrapper passes it on to the storage it wraps (as it does
    /// [`prepare`](Storage::prepare)): a [`Fallback`] inside needs
    /// `decided_by` to give a charge back where it was made.
    fn refund(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        let _ = decided_by;
        self.decide(key, bands, op, clock)
    }
}
