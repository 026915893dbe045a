//! In-process storage on [`DashMap`](dashmap::DashMap).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::mapref::entry::Entry;

use super::{
    BandName, Decide, Decision, DecisionSource, MAX_BANDS, Op, ScopeKey, Storage, StorageError,
    StorageErrorKind, StorageKey, TierScope,
};
use crate::clock::{Clock, Nanos};
use crate::quota::Quota;

mod gc;
mod multi;
mod overflow;
mod scope;
mod slots;
#[cfg(test)]
mod tests;

use gc::KeylessRefund;
use scope::{Scope, Scopes};

type Hasher = foldhash::fast::RandomState;

/// A multi-band key's state: the TAT of each band, under the band's stable
/// name.
type Tats = Box<[(BandName, Nanos)]>;

const DEFAULT_MAX_KEYS: usize = 1_000_000;
const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(60);

/// The time kept for a band at a fresh state: before any clock's now, so
/// that it stays fresh when the clock goes back (and expired for the GC).
const FRESH: Nanos = 0;

/// GCRA state in this process's memory.
///
/// * One scope per tier of each limiter (namespace): maps keyed by user id,
///   updated atomically per key under a DashMap shard lock. A user of one
///   band holds one TAT; a user of several bands holds one TAT per band
///   under the band's [stable name](super::band_names), all decided under
///   the key's one lock (all or nothing). A one-band tier keeps its users'
///   state across any change of its quota; a band of a tier of several
///   keeps it across a change that keeps its refill window; a tier that
///   goes from one band to several, or back, starts afresh. Customers with
///   quotas of their own keep them in their own entries of their tier's
///   scope: contracts cost what keys cost, whatever their number.
/// * A decision neither allocates (only a user seen for the first time is
///   inserted) nor boxes a future: [`Storage::decide`] answers at once.
/// * Decisions use the limiter's clock, passed with every call.
/// * Concurrency limits ([`Op::Acquire`]): a user's slots in flight are a
///   set of leases in its tier's scope, made with its first request in
///   flight and kept, empty, until a sweep (which also removes a set whose
///   leases all passed). Past `max_keys` sets a release removes the set it
///   empties, so the sets are bounded by the cap or by the requests in
///   flight. An identity decided in the overflow bucket still has slots of
///   its own (the bucket shares the rate, never the slots).
/// * Expired keys are removed by a background task every
///   [`gc_interval`](MemoryStorageBuilder::gc_interval) (default 60 s). The
///   task starts with the first decision made inside a tokio runtime (so
///   building outside one never panics), sweeps on tokio's blocking pool one
///   shard at a time (a decision waits at most for one of 64 shards), and
///   ends as soon as the storage is dropped. It reads the storage's own
///   [clock](MemoryStorageBuilder::clock), or else the clock of the first
///   decision. [`MemoryStorage::sweep`] runs one pass by hand.
/// * At most [`max_keys`](MemoryStorageBuilder::max_keys) keys (default
///   1,000,000) are tracked. When a new key arrives at the cap, expired keys
///   are reclaimed first (an inline sweep of every key, on the deciding
///   thread, at most once per second: about 18 ms at a million keys); if the
///   storage is still full, the new identity is decided in its tier's
///   **overflow bucket**: one bucket per namespace and tier, shared by every
///   identity that has no room of its own, with the tier's quota. Nobody
///   passes uncounted: a flood of new identities gets one quota between
///   them, tracked keys are never evicted (nobody's quota is reset), and a
///   new user is admitted while the flood leaves room in the shared bucket.
///   A key lives until its bands are full again: a user idle longer comes
///   back as a new identity.
///   Such decisions report [`DecisionSource::Overflow`] (the layer emits
///   [`RateLimitEvent::Overflow`](crate::RateLimitEvent::Overflow)), and the
///   storage logs a warning at most once per 10 s with their count. While
///   the storage is full, a decision of an identity without a key of its
///   own that keeps nothing of a fresh state is made in the overflow bucket
///   too when it requires a unit (a tier whose only bands are a unit's is
///   refused while the shared bucket is in debt); a peek answers from a
///   fresh state. A refund goes where the units were charged, as the layer
///   and [`TierUsage`](crate::TierUsage) tell it (the `decided_by` of
///   [`TierScope::refund`]): what the overflow bucket charged goes back to
///   it, even once the identity has a key of its own, and what a key
///   charged goes back to the user's key, or nowhere while the user has
///   none (a key made anew since is given it: see the README on
///   reservations held longer than a refill). A refund that does not say
///   (a program's [`RateTier::refund`](crate::RateTier::refund) or
///   [`RateTier::settle`](crate::RateTier::settle)) goes to the user's key,
///   or, for an identity without one while the storage is full, to the
///   overflow bucket.
/// * The cap counts keys, not bytes. A key holds the user id (at most
///   [`MAX_USER_ID_LEN`](crate::tier::MAX_USER_ID_LEN), 256 bytes, through
///   [`RateTier`](crate::RateTier)) and a TAT, in a table slot of its
///   scope. Measured live heap per key at 1,000,000 keys (one-band tier
///   `free`): about 70 bytes with 12-byte ids and 310 with 256-byte ids (see
///   RELIABILITY.md). So the default cap holds at most about **320 MB** of
///   keys (75 MB of short ones), plus up to about 50 MB while a flood
///   refills the tables after a sweep (they may double once); size
///   `max_keys` by the memory you can give it. A tier with a concurrency
///   limit keeps besides, for each user with a slot taken since the last
///   sweep, a slot set with its own copy of the id (about 110 bytes each
///   with 14-byte ids, measured at 20,000 users); past `max_keys` sets,
///   only those of requests in flight are kept. The GC's sweep removes the
///   sets whose leases all passed and shrinks their table.
///
/// Clones share one map.
///
/// ```
/// use tower_rate_tier::storage::MemoryStorage;
///
/// let storage = MemoryStorage::builder().max_keys(10_000).build();
/// assert_eq!(storage.len(), 0);
/// ```
#[derive(Clone)]
pub struct MemoryStorage {
    inner: Arc<Inner>,
}

struct Inner {
    scopes: Scopes,
    /// The overflow bucket of each namespace and tier (not counted in `len`).
    overflow: std::sync::Mutex<std::collections::HashMap<Box<[u8]>, Tats, Hasher>>,
    /// Decisions in overflow buckets since the last warning of them.
    overflowed: AtomicU64,
    last_overflow_warning: AtomicU64,
    len: AtomicUsize,
    max_keys: usize,
    gc_interval: Duration,
    /// The clock of garbage collection.
    clock: OnceLock<Arc<dyn Clock>>,
    gc_running: AtomicBool,
    /// Dropped with the storage: ends its GC task at once.
    gc_stop: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    last_inline_sweep: AtomicU64,
    /// The next lease id of a slot, counted from a random start: ids are
    /// unique within the storage, and another storage's (a fallback's
    /// primary and its local limiter, both in memory) are not this one's,
    /// so a release of a lease it never gave finds nothing here.
    next_lease: AtomicU64,
    /// How many users' slot sets are kept (see `slots.rs`).
    slot_sets: AtomicUsize,
}

/// Configures a [`MemoryStorage`].
#[derive(Debug, Clone)]
pub struct MemoryStorageBuilder {
    max_keys: usize,
    gc_interval: Duration,
    clock: Option<Arc<dyn Clock>>,
}

impl Default for MemoryStorageBuilder {
    fn default() -> Self {
        MemoryStorageBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            gc_interval: DEFAULT_GC_INTERVAL,
            clock: None,
        }
    }
}

impl MemoryStorageBuilder {
    /// The most keys tracked at once (default 1,000,000). A key is one user in
    /// one tier of one limiter.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How often the background task removes expired keys (default 60 s;
    /// at least 10 ms).
    pub fn gc_interval(mut self, every: Duration) -> Self {
        self.gc_interval = every.max(Duration::from_millis(10));
        self
    }

    /// The clock of garbage collection. Without one, the storage collects
    /// with the clock of its first decision (the limiter's). Decisions always
    /// use the limiter's clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The storage.
    pub fn build(self) -> MemoryStorage {
        let clock = OnceLock::new();
        if let Some(c) = self.clock {
            let _ = clock.set(c);
        }
        MemoryStorage {
            inner: Arc::new(Inner {
                scopes: Scopes::default(),
                overflow: std::sync::Mutex::default(),
                overflowed: AtomicU64::new(0),
                last_overflow_warning: AtomicU64::new(0),
                len: AtomicUsize::new(0),
                max_keys: self.max_keys,
                gc_interval: self.gc_interval,
                clock,
                gc_running: AtomicBool::new(false),
                gc_stop: std::sync::Mutex::new(None),
                last_inline_sweep: AtomicU64::new(0),
                next_lease: AtomicU64::new(std::hash::BuildHasher::hash_one(
                    &std::hash::RandomState::new(),
                    0u8,
                )),
                slot_sets: AtomicUsize::new(0),
            }),
        }
    }
}

impl Default for MemoryStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStorage {
    /// A storage with the defaults (1,000,000 keys, GC every 60 s).
    pub fn new() -> Self {
        MemoryStorageBuilder::default().build()
    }

    /// Configures a storage.
    pub fn builder() -> MemoryStorageBuilder {
        MemoryStorageBuilder::default()
    }

    /// How many keys are tracked now.
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Relaxed)
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every expired key now; returns how many were removed.
    pub fn sweep(&self) -> usize {
        self.inner.sweep()
    }

    /// How many scopes (namespace, tier) hold keys.
    #[cfg(test)]
    pub(crate) fn scope_count(&self) -> usize {
        self.inner.scopes.all().len()
    }
}

impl Storage for MemoryStorage {
    #[inline]
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let result = self.inner.scopes.with(
            &key,
            |scope| self.inner.decide(scope, key.user, bands, op, clock),
            |retired| self.inner.forget(retired),
        );
        Decide::ready(result)
    }

    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        Some(Arc::new(MemoryScope {
            scope: self.inner.scopes.get(at.namespace, at.tier),
            inner: self.inner.clone(),
        }))
    }
}

/// A tier prepared in a [`MemoryStorage`]: its maps, held.
struct MemoryScope {
    inner: Arc<Inner>,
    scope: Arc<Scope>,
}

impl TierScope for MemoryScope {
    #[inline]
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        Decide::ready(self.inner.decide(&self.scope, user, bands, op, clock))
    }

    /// What the tier's overflow bucket charged goes back to it, whether or
    /// not the user has a key of its own now; what the user's own key
    /// charged, to that key, and nowhere when it has none (its state is
    /// fresh: an expired key, or one the storage had no room for); any
    /// other refund as a decision gives it back.
    fn refund(
        &self,
        user: &str,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        let (inner, scope) = (&self.inner, &self.scope);
        Decide::ready(match decided_by {
            DecisionSource::Overflow => {
                refund_fits(bands, op).map(|()| inner.decide_overflow(scope.key(user), bands, op, clock))
            }
            DecisionSource::Storage => inner.decide_as(scope, user, bands, op, clock, KeylessRefund::Nowhere),
            _ => inner.decide(scope, user, bands, op, clock),
        })
    }

    /// Given back at once, under the user's slot set's lock.
    fn release(&self, user: &str, _: &[Quota], lease: super::Lease, _: &Arc<dyn Clock>) -> Option<Decide> {
        self.inner.release_slot(&self.scope, user, lease);
        None
    }
}

impl fmt::Debug for MemoryScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryScope")
            .field("tier", &self.scope.key("").tier)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Carries out `op` for `user` in `scope`.
    #[inline]
    fn decide(
        self: &Arc<Self>,
        scope: &Scope,
        user: &str,
        bands: &[Quota],
        op: Op,
        clock: &Arc<dyn Clock>,
    ) -> Result<Decision, StorageError> {
        self.decide_as(scope, user, bands, op, clock, KeylessRefund::ToOverflow)
    }

    /// [`Inner::decide`], a refund for an identity without a key of its own
    /// in a full storage going where `refund` says.
    #[inline]
    fn decide_as(
        self: &Arc<Self>,
        scope: &Scope,
        user: &str,
        bands: &[Quota],
        op: Op,
        clock: &Arc<dyn Clock>,
        refund: KeylessRefund,
    ) -> Result<Decision, StorageError> {
        self.ensure_gc(clock);
        match op {
            Op::Acquire { slots, .. } | Op::AcquireEach { slots, .. } => {
                return self.acquire(scope, user, bands, op.on_bands(), slots, clock);
            }
            Op::Release(lease) => return Ok(self.release(scope, user, lease, clock)),
            Op::Each(amounts) if amounts.len() != bands.len() => {
                return Err(StorageError::new(
                    StorageErrorKind::Other,
                    "an `Op::Each` needs one amount per band",
                ));
            }
            Op::Charge(_) | Op::Refund(_) | Op::Each(_) => {}
        }
        match bands {
            [quota] => self.decide_one(scope, user, quota, op, clock, refund),
            _ if bands.len() <= MAX_BANDS => self.decide_many(scope, user, bands, op, clock, refund),
            _ => Err(StorageError::new(
                StorageErrorKind::Other,
                "a decision needs 1 to MAX_BANDS bands",
            )),
        }
    }

    /// A tier of one band. The clock is read while the key's shard lock is
    /// held, so that the decisions of one key see non-decreasing times: a
    /// reading taken before the lock could be older than the key's last
    /// decision (its thread was descheduled in between), and the GCRA's
    /// backwards-clock clamp would then give back what that later decision
    /// charged.
    #[inline]
    fn decide_one(
        &self,
        scope: &Scope,
        user: &str,
        quota: &Quota,
        op: Op,
        clock: &Arc<dyn Clock>,
        refund: KeylessRefund,
    ) -> Result<Decision, StorageError> {
        let bands = std::slice::from_ref(quota);
        if !scope.holds_single(quota) {
            return self.decide_many(scope, user, bands, op, clock, refund);
        }
        if let Some(mut stored) = scope.single.get_mut(user) {
            let now = clock.now();
            let mut tat = [Some(*stored)];
            let decision = super::decide_bands(&mut tat, now, bands, op);
            *stored = tat[0].unwrap_or(FRESH);
            return Ok(decision);
        }
        self.insert_one(scope, user, bands, op, clock, refund)
    }

    /// [`Inner::decide_one`] for a user without a stored state.
    #[cold]
    #[inline(never)]
    fn insert_one(
        &self,
        scope: &Scope,
        user: &str,
        bands: &[Quota],
        op: Op,
        clock: &Arc<dyn Clock>,
        refund: KeylessRefund,
    ) -> Result<Decision, StorageError> {
        let now = clock.now();
        let mut tat = [None];
        let decision = super::decide_bands(&mut tat, now, bands, op);
        let keeps = tat[0].is_some();
        if !keeps || !self.reserve_slot(now) {
            if scope.multi.contains_key(user) {
                // The user's bands are kept under their names (its band had
                // another window than `single` when it was first seen): its
                // state is there.
                return self.decide_many(scope, user, bands, op, clock, refund);
            }
            if keeps || self.keyless_in_overflow(op, refund) {
                // (no room for the key)
                return Ok(self.decide_overflow(scope.key(user), bands, op, clock));
            }
            // Denied, a peek, or a refund: nothing to keep.
            return Ok(decision);
        }
        // The key goes into the one-band map while its entry in the map of
        // several bands is held (vacant): a decision of several bands moves
        // the one-band state under that lock, so it never finds the key
        // missing here and then sees it made beside its own (the user's
        // band counted twice).
        let several = scope.multi.entry(Box::from(user));
        if let Entry::Occupied(_) = several {
            drop(several);
            self.len.fetch_sub(1, Ordering::Relaxed);
            return self.decide_many(scope, user, bands, op, clock, refund);
        }
        match scope.single.entry(Box::from(user)) {
            Entry::Occupied(mut e) => {
                // Another request inserted the key meanwhile: decide again
                // against its state.
                self.len.fetch_sub(1, Ordering::Relaxed);
                let now = clock.now();
                let mut tat = [Some(*e.get())];
                let decision = super::decide_bands(&mut tat, now, bands, op);
                *e.get_mut() = tat[0].unwrap_or(FRESH);
                Ok(decision)
            }
            Entry::Vacant(e) => {
                let now = clock.now();
                let mut tat = [None];
                let decision = super::decide_bands(&mut tat, now, bands, op);
                e.insert(tat[0].unwrap_or(FRESH));
                Ok(decision)
            }
        }
    }
}

/// Whether a refund of `op` can be given back in `bands` (checked here for
/// the overflow bucket; a decision checks its own).
fn refund_fits(bands: &[Quota], op: Op) -> Result<(), StorageError> {
    let fits = match op {
        Op::Each(amounts) => amounts.len() == bands.len(),
        _ => true,
    };
    if !fits || bands.is_empty() || bands.len() > MAX_BANDS {
        return Err(StorageError::new(
            StorageErrorKind::Other,
            "a refund needs 1 to MAX_BANDS bands, and one amount per band",
        ));
    }
    Ok(())
}

impl fmt::Debug for MemoryStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStorage")
            .field("len", &self.len())
            .field("max_keys", &self.inner.max_keys)
            .field("gc_interval", &self.inner.gc_interval)
            .finish_non_exhaustive()
    }
}
