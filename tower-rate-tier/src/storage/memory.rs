//! In-process storage on [`DashMap`].

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use smallvec::SmallVec;

use super::{
    BandStates, Decision, MAX_BANDS, PreparedScope, Storage, StorageError, StorageErrorKind, StorageKey,
};
use crate::clock::{Clock, Nanos, SystemClock};
use crate::gcra;
use crate::quota::Quota;

type Hasher = foldhash::fast::RandomState;
/// A user id; the namespace and tier are those of the [`Scope`] holding it.
type Key = Box<str>;

const SHARDS: usize = 64;
const DEFAULT_MAX_KEYS: usize = 1_000_000;
const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(60);
/// At the key cap, an inline sweep of expired keys runs at most this often
/// (in the storage clock's time).
const INLINE_SWEEP_EVERY_NS: u64 = 1_000_000_000;

/// GCRA state in this process's memory.
///
/// * One map per tier of each limiter (namespace and tier), keyed by user id,
///   holding one TAT per band, updated atomically per key under a DashMap
///   shard lock; a multi-band decision locks its one entry, so it is all or
///   nothing.
/// * The hot path neither allocates (only a user seen for the first time is)
///   nor formats a key nor boxes a future: a `RateTier` resolves each tier's
///   map once ([`Storage::prepare`]) and calls the synchronous
///   [`Storage::check_prepared_now`].
/// * Expired keys are removed by a background task every
///   [`gc_interval`](MemoryStorageBuilder::gc_interval) (default 60 s). The
///   task starts with the first check made inside a tokio runtime (so building
///   outside one never panics), sweeps on tokio's blocking pool one shard at a
///   time (a check waits at most for one of 64 shards), and stops when the
///   storage is dropped. [`MemoryStorage::sweep`] runs one pass by hand.
/// * At most [`max_keys`](MemoryStorageBuilder::max_keys) keys (default
///   1,000,000) are tracked. When a new key arrives at the cap, expired keys
///   are reclaimed first (an inline sweep, at most once per second); if the
///   storage is still full the new key is refused with a
///   [`StorageErrorKind::Full`] error, which the layer answers according to
///   its `OnStorageError` policy. Tracked keys are never evicted, so a flood of
///   new identities cannot reset anybody's quota. Under the default
///   `OnStorageError::Allow` the refused newcomers are let through uncounted
///   while the storage is full; deployments exposed to identity floods choose
///   `OnStorageError::Deny` (503 for newcomers) or a larger cap (see
///   `RELIABILITY.md` for measured bytes per key).
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
    /// Tells this storage's scopes from those of another.
    id: u64,
    scopes: RwLock<Vec<Arc<Scope>>>,
    len: AtomicUsize,
    max_keys: usize,
    gc_interval: Duration,
    clock: OnceLock<Arc<dyn Clock>>,
    /// `clock` is the [`SystemClock`], read without a dynamic call.
    system_clock: AtomicBool,
    gc_running: AtomicBool,
    last_inline_sweep: AtomicU64,
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

    /// The clock of decisions and garbage collection. Without one, the
    /// storage uses the clock of the first `RateTier` built with it, or the
    /// [`SystemClock`].
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
        static IDS: AtomicU64 = AtomicU64::new(0);
        MemoryStorage {
            inner: Arc::new(Inner {
                id: IDS.fetch_add(1, Ordering::Relaxed),
                scopes: RwLock::new(Vec::new()),
                len: AtomicUsize::new(0),
                max_keys: self.max_keys,
                gc_interval: self.gc_interval,
                clock,
                system_clock: AtomicBool::new(false),
                gc_running: AtomicBool::new(false),
                last_inline_sweep: AtomicU64::new(0),
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

    /// [`Storage::use_clock`] with the [`SystemClock`]: decides with it
    /// unless the storage already has a clock.
    pub(crate) fn use_system_clock(&self) {
        if self.inner.clock.set(Arc::new(SystemClock)).is_ok() {
            self.inner.system_clock.store(true, Ordering::Relaxed);
        }
    }

    fn check_sync(
        &self,
        scope: Option<&PreparedScope>,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Result<Decision, StorageError> {
        ensure_gc(&self.inner);
        let inner = &*self.inner;
        inner.with_scope(scope, key, |scope| {
            if let [quota] = bands {
                inner.check_single(scope, key.user, quota, cost)
            } else {
                inner.check_multi(scope, key.user, bands, cost)
            }
        })
    }

    fn refund_sync(
        &self,
        scope: Option<&PreparedScope>,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Result<(), StorageError> {
        let inner = &*self.inner;
        // The clock is read under the key's lock, as in a check.
        inner.with_scope(scope, key, |scope| {
            if let [quota] = bands {
                inner.refund_single(scope, key.user, quota, cost);
            } else if let Some(mut tats) = scope.multi.get_mut(key.user) {
                let now = inner.now();
                if tats.len() == bands.len() {
                    for (tat, quota) in tats.iter_mut().zip(bands) {
                        *tat = gcra::refund(Some(*tat), now, quota, cost).unwrap_or(now);
                    }
                }
            }
            Ok(())
        })
    }
}

/// Starts the GC task if it is not running and this thread is inside a tokio
/// runtime.
#[inline]
fn ensure_gc(inner: &Arc<Inner>) {
    if !inner.gc_running.load(Ordering::Relaxed) {
        start_gc(inner);
    }
}

#[cold]
fn start_gc(inner: &Arc<Inner>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if inner.gc_running.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak = Arc::downgrade(inner);
    handle.spawn(gc_loop(weak, inner.gc_interval));
}

/// A memory storage's handle on one single-band tier of one limiter, held by
/// the `RateTier` so that its checks call the storage directly (no dynamic
/// call, no scope lookup).
pub(crate) struct Direct {
    inner: Arc<Inner>,
    scope: Arc<Scope>,
}

impl Direct {
    /// The handle on `namespace`/`tier` of `storage`.
    pub(crate) fn new(storage: &MemoryStorage, namespace: &str, tier: &str) -> Self {
        Direct {
            inner: storage.inner.clone(),
            scope: storage.inner.scope(namespace, tier),
        }
    }

    /// Decides one request of the tier's one band: the band's decision and
    /// the time it was made at.
    #[inline]
    pub(crate) fn check(
        &self,
        user: &str,
        quota: &Quota,
        cost: u32,
    ) -> Result<(gcra::BandDecision, Nanos), StorageError> {
        ensure_gc(&self.inner);
        self.inner.decide_single(&self.scope, user, quota, cost)
    }

    /// Gives `cost` back to `user` in the tier's one band.
    pub(crate) fn refund(&self, user: &str, quota: &Quota, cost: u32) {
        self.inner.refund_single(&self.scope, user, quota, cost);
    }
}

/// The keys of one tier of one limiter.
struct Scope {
    owner: u64,
    namespace: Box<str>,
    tier: Box<str>,
    single: DashMap<Key, Nanos, Hasher>,
    multi: DashMap<Key, Box<[Nanos]>, Hasher>,
}

impl Inner {
    /// The scope of `namespace` and `tier`, created on first use.
    fn scope(&self, namespace: &str, tier: &str) -> Arc<Scope> {
        let find = |scopes: &Vec<Arc<Scope>>| {
            scopes
                .iter()
                .find(|s| *s.namespace == *namespace && *s.tier == *tier)
                .cloned()
        };
        if let Some(scope) = find(&self.scopes.read().unwrap_or_else(PoisonError::into_inner)) {
            return scope;
        }
        let mut scopes = self.scopes.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(scope) = find(&scopes) {
            return scope;
        }
        let scope = Arc::new(Scope {
            owner: self.id,
            namespace: namespace.into(),
            tier: tier.into(),
            single: new_map(),
            multi: new_map(),
        });
        scopes.push(scope.clone());
        scope
    }

    /// Runs `f` on the scope of `key`: the prepared one when it is this
    /// storage's, else looked up by name.
    fn with_scope<R>(
        &self,
        prepared: Option<&PreparedScope>,
        key: StorageKey<'_>,
        f: impl FnOnce(&Scope) -> Result<R, StorageError>,
    ) -> Result<R, StorageError> {
        if let Some(scope) = prepared.and_then(|p| p.downcast_ref::<Scope>()) {
            // A prepared scope is made for its tier's key, by this storage
            // (`owner`) or another one.
            if scope.owner == self.id {
                return f(scope);
            }
        }
        f(&self.scope(key.namespace, key.tier))
    }

    #[inline]
    fn now(&self) -> Nanos {
        if self.system_clock.load(Ordering::Relaxed) {
            return SystemClock.now();
        }
        match self.clock.get() {
            Some(clock) => clock.now(),
            None => SystemClock.now(),
        }
    }

    /// The clock is read while the key's shard lock is held, so that the
    /// decisions of one key see non-decreasing times: a reading taken before
    /// the lock could be older than the key's last decision (its thread was
    /// descheduled in between), and the GCRA's backwards-clock clamp would
    /// then give back what that later decision charged.
    fn check_single(
        &self,
        scope: &Scope,
        user: &str,
        quota: &Quota,
        cost: u32,
    ) -> Result<Decision, StorageError> {
        self.decide_single(scope, user, quota, cost)
            .map(|(d, now)| one_band(d, now))
    }

    /// One band's decision and the time it was made at.
    #[inline]
    fn decide_single(
        &self,
        scope: &Scope,
        user: &str,
        quota: &Quota,
        cost: u32,
    ) -> Result<(gcra::BandDecision, Nanos), StorageError> {
        if let Some(mut tat) = scope.single.get_mut(user) {
            let now = self.now();
            let d = gcra::decide(Some(*tat), now, quota, cost);
            if let Some(new) = d.new_tat {
                *tat = new;
            }
            return Ok((d, now));
        }
        self.insert_single(scope, user, quota, cost)
    }

    /// Gives `cost` back to `user`'s one band, reading the clock under the
    /// key's lock as a check does.
    fn refund_single(&self, scope: &Scope, user: &str, quota: &Quota, cost: u32) {
        if let Some(mut tat) = scope.single.get_mut(user) {
            let now = self.now();
            *tat = gcra::refund(Some(*tat), now, quota, cost).unwrap_or(now);
        }
    }

    /// [`Inner::decide_single`] for a user without a stored state.
    #[cold]
    #[inline(never)]
    fn insert_single(
        &self,
        scope: &Scope,
        user: &str,
        quota: &Quota,
        cost: u32,
    ) -> Result<(gcra::BandDecision, Nanos), StorageError> {
        let now = self.now();
        let d = gcra::decide(None, now, quota, cost);
        if !d.allowed || d.new_tat.is_none() {
            return Ok((d, now));
        }
        self.reserve_slot(now)?;
        match scope.single.entry(Box::from(user)) {
            Entry::Occupied(mut e) => {
                // Another request inserted the key meanwhile: decide again
                // against its state.
                self.len.fetch_sub(1, Ordering::Relaxed);
                let now = self.now();
                let d = gcra::decide(Some(*e.get()), now, quota, cost);
                if let Some(new) = d.new_tat {
                    *e.get_mut() = new;
                }
                Ok((d, now))
            }
            Entry::Vacant(e) => {
                let now = self.now();
                let d = gcra::decide(None, now, quota, cost);
                if let Some(new) = d.new_tat {
                    e.insert(new);
                }
                Ok((d, now))
            }
        }
    }

    /// Like [`Inner::check_single`], with the clock read under the lock.
    fn check_multi(
        &self,
        scope: &Scope,
        user: &str,
        bands: &[Quota],
        cost: u32,
    ) -> Result<Decision, StorageError> {
        if bands.len() > MAX_BANDS {
            return Err(StorageError::new(StorageErrorKind::Other, "too many bands"));
        }
        let apply = |stored: Option<&[Nanos]>, now: Nanos| -> (Decision, Option<Box<[Nanos]>>) {
            let mut tats: SmallVec<[Option<Nanos>; MAX_BANDS]> = SmallVec::new();
            match stored {
                Some(s) if s.len() == bands.len() => tats.extend(s.iter().copied().map(Some)),
                _ => tats.extend(bands.iter().map(|_| None)),
            }
            let (allowed, writes, states) = super::decide_bands(&tats, now, bands, cost);
            // Admitted: the charges; denied: at most the clamps of TATs from a
            // clock that moved backwards.
            let dirty = writes.iter().any(Option::is_some);
            let new = dirty.then(|| {
                writes
                    .iter()
                    .zip(&tats)
                    .map(|(w, old)| w.or(*old).unwrap_or(now))
                    .collect()
            });
            (
                Decision {
                    allowed,
                    now,
                    bands: states,
                },
                new,
            )
        };
        if let Some(mut stored) = scope.multi.get_mut(user) {
            let (decision, new) = apply(Some(&stored), self.now());
            if let Some(new) = new {
                *stored = new;
            }
            return Ok(decision);
        }
        let now = self.now();
        let (decision, new) = apply(None, now);
        if new.is_none() {
            return Ok(decision);
        }
        self.reserve_slot(now)?;
        match scope.multi.entry(Box::from(user)) {
            Entry::Occupied(mut e) => {
                self.len.fetch_sub(1, Ordering::Relaxed);
                let (decision, new) = apply(Some(e.get()), self.now());
                if let Some(new) = new {
                    *e.get_mut() = new;
                }
                Ok(decision)
            }
            Entry::Vacant(e) => {
                let (decision, new) = apply(None, self.now());
                if let Some(new) = new {
                    e.insert(new);
                }
                Ok(decision)
            }
        }
    }

    /// Takes one slot under the key cap, reclaiming expired keys first when
    /// the cap is reached.
    fn reserve_slot(&self, now: Nanos) -> Result<(), StorageError> {
        if self.len.fetch_add(1, Ordering::Relaxed) < self.max_keys {
            return Ok(());
        }
        self.len.fetch_sub(1, Ordering::Relaxed);
        let last = self.last_inline_sweep.load(Ordering::Relaxed);
        // A clock that moved back behind the last sweep makes one due at once
        // (rather than only after the clock has caught up).
        let due = last == 0 || now < last || now - last >= INLINE_SWEEP_EVERY_NS;
        if due
            && self
                .last_inline_sweep
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.sweep();
            if self.len.fetch_add(1, Ordering::Relaxed) < self.max_keys {
                return Ok(());
            }
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        tracing::warn!(
            max_keys = self.max_keys,
            "rate-limit memory storage is full; a new key was refused"
        );
        Err(StorageError::new(
            StorageErrorKind::Full,
            "the memory storage tracks `max_keys` keys; a new key was refused",
        ))
    }

    fn sweep(&self) -> usize {
        let now = self.now();
        let scopes = self.scopes.read().unwrap_or_else(PoisonError::into_inner).clone();
        let mut removed = 0usize;
        for scope in scopes {
            scope.single.retain(|_, tat| {
                let keep = !gcra::is_expired(*tat, now);
                removed += usize::from(!keep);
                keep
            });
            scope.multi.retain(|_, tats| {
                let keep = tats.iter().any(|tat| !gcra::is_expired(*tat, now));
                removed += usize::from(!keep);
                keep
            });
            // Give memory back after a flood has gone: tables mostly empty
            // are shrunk (shard by shard).
            shrink_if_sparse(&scope.single);
            shrink_if_sparse(&scope.multi);
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }
}

fn shrink_if_sparse<V>(map: &DashMap<Key, V, Hasher>) {
    if map.capacity() > 4 * map.len() + 4 * 1024 {
        map.shrink_to_fit();
    }
}

fn new_map<V>() -> DashMap<Key, V, Hasher> {
    DashMap::with_capacity_and_hasher_and_shard_amount(0, Hasher::default(), SHARDS)
}

fn one_band(d: gcra::BandDecision, now: Nanos) -> Decision {
    let mut bands = BandStates::new();
    bands.push(d.state);
    Decision {
        allowed: d.allowed,
        now,
        bands,
    }
}

struct ResetOnDrop(Weak<Inner>);

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.gc_running.store(false, Ordering::Release);
        }
    }
}

async fn gc_loop(weak: Weak<Inner>, every: Duration) {
    // If the runtime shuts down, the next check in another runtime restarts
    // the task.
    let _reset = ResetOnDrop(weak.clone());
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let swept = tokio::task::spawn_blocking(move || inner.sweep()).await;
        if let Ok(n) = swept {
            tracing::trace!(removed = n, "rate-limit memory storage swept expired keys");
        }
    }
}

#[async_trait::async_trait]
impl Storage for MemoryStorage {
    async fn check(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Result<Decision, StorageError> {
        self.check_sync(None, key, bands, cost)
    }

    async fn refund(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Result<(), StorageError> {
        self.refund_sync(None, key, bands, cost)
    }

    fn check_now(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<Decision, StorageError>> {
        Some(self.check_sync(None, key, bands, cost))
    }

    fn refund_now(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<(), StorageError>> {
        Some(self.refund_sync(None, key, bands, cost))
    }

    fn prepare(&self, namespace: &str, tier: &str) -> Option<PreparedScope> {
        Some(PreparedScope::new(self.inner.scope(namespace, tier)))
    }

    fn check_prepared_now(
        &self,
        scope: &PreparedScope,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<Decision, StorageError>> {
        Some(self.check_sync(Some(scope), key, bands, cost))
    }

    fn refund_prepared_now(
        &self,
        scope: &PreparedScope,
        key: StorageKey<'_>,
        bands: &[Quota],
        cost: u32,
    ) -> Option<Result<(), StorageError>> {
        Some(self.refund_sync(Some(scope), key, bands, cost))
    }

    fn decides_now(&self) -> bool {
        true
    }

    fn use_clock(&self, clock: Arc<dyn Clock>) {
        let _ = self.inner.clock.set(clock);
    }
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
