//! [`DenyCache`]: denials kept in process, so that a client hammering a
//! spent quota costs no round trip.
//!
//! After the wrapped storage denies a key, the cache keeps the state of the
//! key's bands as the storage reported it, anchored at the local instant the
//! request was *sent* (read from the limiter's clock). The storage decided at
//! some instant after that, so every band's stored time lies at or after the
//! anchored one: the cached state is a lower bound of the storage's, however
//! far apart the two clocks are. A later request for the key is denied
//! locally when that lower bound already denies its cost; otherwise it goes
//! to the storage, as it would without the cache. So the cache
//!
//! * never admits anything (admissions always come from the storage), hence
//!   never admits over the quota;
//! * never denies a request the storage would admit: a denial of cost 40
//!   does not deny a request of cost 1 the band still has room for, and a
//!   key is freed as soon as the anchored state has refilled, which is no
//!   later than the storage's;
//! * answers with the band states and `Retry-After` the storage would give
//!   at that instant (as a [`Decision`] whose source is
//!   [`DecisionSource::DenyCache`]).
//!
//! One exception to the lower bound: a refund. A refund through this cache
//! drops the key's entry when it is sent and when it is answered, and no
//! answer in flight meanwhile is kept (it may describe the state before the
//! refund); a refund made by another instance is not seen, and the entry
//! keeps denying until it expires (at most until the band is full again,
//! the longest `Retry-After` the storage itself gave). So is a storage that
//! lost its state (Redis restarted without persistence).
//!
//! Memory is bounded: entries expire when their bands are full again, and
//! never later than two full refills of a band (one for the band, one for
//! a debt of a burst; a storage's answer beyond that, a bug, is not kept
//! longer; an entry that expires early only asks the storage sooner). An
//! expired entry is removed when next looked up, and by a sweep when the
//! cache is full), and at most [`DenyCache::with_capacity`] keys (default
//! [`DEFAULT_CAPACITY`]) are kept; a denial that finds the cache full after
//! a sweep is simply not cached. Only decisions the storage itself made are
//! kept ([`DecisionSource::Storage`]), never a fallback's.
//!
//! An amount per band ([`Op::Each`]) is answered from the cache only when
//! the entry denies it with each band's debt bound (a requirement on a band
//! in debt, a charge that does not fit); one that forces or refunds a band
//! always reaches the storage, and a refund drops the key's entry.
//!
//! Concurrency limits: a refusal for want of a free slot is never kept (a
//! slot comes free when a request ends, which no time in the cache tells),
//! and a release always reaches the storage. A request that would take a
//! slot is refused from the cache when its rate is known spent, taking no
//! slot.
//!
//! A tier prepared in the cache ([`Storage::prepare`]) holds the wrapped
//! storage's scope of the tier (or decides it by name when that storage
//! prepares none), the cache, and the tier's part of every key's name:
//! its decisions look nothing up but the key's entry. The prepared tier and
//! a decision by name ([`Storage::decide`]) share one cache and answer
//! alike.
//!
//! The Redis storage has this cache built in (on by default; see
//! `RedisStorageBuilder::deny_cache`). Around another storage:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tower_rate_tier::storage::{DenyCache, MemoryStorage};
//! use tower_rate_tier::{Quota, RateTier};
//!
//! let storage = DenyCache::new(MemoryStorage::new());
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(1)).storage(storage.clone()).build();
//! assert!(tiers.check("ada", "free", 1).await.unwrap().is_ok());
//! assert_eq!(storage.len(), 0);
//! let denied = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
//! assert_eq!(storage.len(), 1); // the next denial of "ada" is answered here
//! assert_eq!(denied.retry_after_secs(), 60);
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use arrayvec::ArrayVec;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry as MapEntry;
use smallvec::SmallVec;

use super::{
    Amount, BandName, Decide, Decision, DecisionSource, MAX_BANDS, Op, ScopeKey, Storage, StorageKey,
    TierScope, band_names, decide_bands,
};
use crate::clock::{Clock, Nanos};
use crate::quota::Quota;

mod refunds;
mod scope;

use refunds::{Refunds, refund};
use scope::DenyScope;

/// The default number of keys a deny cache keeps.
pub const DEFAULT_CAPACITY: usize = 65_536;

/// How often a full cache sweeps out expired entries, at most.
const SWEEP_EVERY: Nanos = 1_000_000_000;

/// A storage that answers repeated denials itself; see the
/// [module documentation](self).
///
/// Cheap to clone; clones share one cache and one wrapped storage.
pub struct DenyCache<S> {
    /// Shared with the tiers prepared here that the wrapped storage decides
    /// by name.
    inner: Arc<S>,
    table: Arc<DenyTable>,
}

impl<S> Clone for DenyCache<S> {
    fn clone(&self) -> Self {
        DenyCache {
            inner: self.inner.clone(),
            table: self.table.clone(),
        }
    }
}

impl<S: Storage> DenyCache<S> {
    /// Caches the denials of `inner`, for up to [`DEFAULT_CAPACITY`] keys.
    pub fn new(inner: S) -> Self {
        Self::with_capacity(inner, DEFAULT_CAPACITY)
    }

    /// Caches the denials of `inner`, for up to `capacity` keys.
    pub fn with_capacity(inner: S, capacity: usize) -> Self {
        DenyCache {
            inner: Arc::new(inner),
            table: Arc::new(DenyTable::new(capacity)),
        }
    }

    /// How many keys have an entry now (expired ones included until they
    /// are swept).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The wrapped storage.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Storage> Storage for DenyCache<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.table.guard(encode(key), bands, op, clock.now(), || {
            self.inner.decide(key, bands, op, clock)
        })
    }

    /// Counted as any refund here, and passed on with where its charge was
    /// decided.
    fn refund(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        self.table.guard(encode(key), bands, op, clock.now(), || {
            self.inner.refund(key, bands, op, decided_by, clock)
        })
    }

    /// The tier in the wrapped storage (its own scope, or its decisions by
    /// name), behind this cache.
    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        let inner: Arc<dyn Storage> = self.inner.clone();
        Some(Arc::new(DenyScope {
            inner: super::scope::prepare(&inner, at),
            table: self.table.clone(),
            prefix: tier_prefix(at),
        }))
    }
}

impl<S: fmt::Debug> fmt::Debug for DenyCache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCache")
            .field("inner", &self.inner)
            .field("keys", &self.table.len())
            .field("capacity", &self.table.capacity)
            .finish()
    }
}

type Hasher = foldhash::fast::RandomState;

/// A key's name in the cache: `[len][namespace][len][tier][user]`, each
/// length two bytes.
pub(crate) type KeyBuf = SmallVec<[u8; 64]>;

/// The entries of one cache.
pub(crate) struct DenyTable {
    map: DashMap<Box<[u8]>, Entry, Hasher>,
    len: AtomicUsize,
    capacity: usize,
    last_sweep: AtomicU64,
    /// Refunds sent or answered, so that no answer from before one is kept.
    refunds: Refunds,
}

/// One key's bands as the storage last reported them.
#[derive(Clone, Copy)]
struct Entry {
    names: [Option<BandName>; MAX_BANDS],
    /// Each band's time of being full again, on the local clock (a lower
    /// bound); `None` for a full or unlimited band.
    tats: [Option<Nanos>; MAX_BANDS],
    /// The local instant the request was sent.
    sent_at: Nanos,
    /// The storage's time of its decision.
    decided_at: Nanos,
    /// When every band is full again (at most two full refills of a band
    /// after it was sent): the entry is useless from then on.
    expires: Nanos,
}

impl DenyTable {
    pub(crate) fn new(capacity: usize) -> Self {
        DenyTable {
            map: DashMap::with_hasher(Hasher::default()),
            len: AtomicUsize::new(0),
            capacity,
            last_sweep: AtomicU64::new(0),
            refunds: Refunds::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Answers `op` on the key named `name` (see [`encode`]) from the cache
    /// when it denies it (at local time `now`); else `forward` asks the
    /// storage, whose answer updates the cache.
    pub(crate) fn guard(
        self: &Arc<Self>,
        name: KeyBuf,
        bands: &[Quota],
        op: Op,
        now: Nanos,
        forward: impl FnOnce() -> Decide,
    ) -> Decide {
        match op {
            // A rate the cache knows spent refuses a request that would
            // take a slot too (it takes none).
            Op::Charge(cost) | Op::Acquire { cost, .. } if cost > 0 => {
                if let Some(denied) = self.check(&name, bands, Op::Charge(cost), now) {
                    return Decide::ready(Ok(denied));
                }
            }
            Op::Charge(_) | Op::Acquire { .. } => {}
            Op::Release(_) => return forward(),
            Op::Refund(_) => return refund(self, name, forward),
            // Not one amount per band: the storage's error to give.
            Op::Each(amounts) if amounts.len() != bands.len() => return forward(),
            // Refunded bands: forgotten as a refund is.
            Op::Each(amounts) if amounts.iter().any(|(a, _)| matches!(a, Amount::Refund(_))) => {
                return refund(self, name, forward);
            }
            // A forced charge always reaches the storage (its answer
            // refreshes the key's entry, if it has one).
            Op::Each(amounts) if amounts.moves_regardless() => {}
            // A reservation of a unit (a charge of a band that may be in
            // debt) too: another instance's settlement gives units back
            // that this cache never sees, so a cached denial of it could
            // outlive the spent state by a refill.
            Op::Each(amounts)
                if amounts
                    .iter()
                    .any(|(amount, debt)| debt > 0 && matches!(amount, Amount::Charge(n) if n > 0)) => {}
            // Charges and requirements, each band with its debt bound: the
            // entry's lower bound of the state denies only what the storage
            // would deny (a requirement on a band in debt, a charge that
            // does not fit).
            Op::Each(_) => {
                if let Some(denied) = self.check(&name, bands, op, now) {
                    return Decide::ready(Ok(denied));
                }
            }
            // An admission that takes a slot: refused when its bands would
            // be (it takes none then).
            Op::AcquireEach { amounts, .. } if amounts.len() == bands.len() => {
                if let Some(denied) = self.check(&name, bands, op.on_bands(), now) {
                    return Decide::ready(Ok(denied));
                }
            }
            Op::AcquireEach { .. } => return forward(),
        }
        let Ok(kept) = ArrayVec::<Quota, MAX_BANDS>::try_from(bands) else {
            return forward();
        };
        let table = self.clone();
        let seen = self.refunds.seen(&name);
        forward().map(move |decided| {
            if let Ok(decision) = &decided {
                table.record(name, &kept, now, decision, seen);
            }
            decided
        })
    }

    /// The cached denial of `op` (a charge, or charges and requirements) on
    /// `key` at `now`, if the entry denies it.
    fn check(&self, name: &[u8], bands: &[Quota], op: Op, now: Nanos) -> Option<Decision> {
        let entry = *self.map.get(name)?;
        if now >= entry.expires {
            self.forget_expired(name, now);
            return None;
        }
        if !same_bands(&entry, bands) {
            return None;
        }
        // A clock that went back since the request was sent: the state the
        // storage reported is still a lower bound.
        let now = now.max(entry.sent_at);
        let mut tats = entry.tats;
        let decision = decide_bands(&mut tats[..bands.len()], now, bands, op);
        if decision.allowed {
            return None;
        }
        let at = entry.decided_at.saturating_add(now - entry.sent_at);
        Some(Decision::new(false, at, decision.bands).with_source(DecisionSource::DenyCache))
    }

    /// Keeps what the storage answered for a request sent at `sent_at`: a
    /// denial always (room permitting), anything else only to refresh an
    /// entry the key has; nothing when a refund of the key's bucket was sent
    /// or answered since `seen` (see [`refunds`]).
    fn record(
        &self,
        name: KeyBuf,
        bands: &[Quota],
        sent_at: Nanos,
        decision: &Decision,
        seen: refunds::Seen,
    ) {
        // A refusal for want of a slot is never kept: a slot comes free
        // when a request ends, which no time in the cache can tell.
        let by_slots = decision.slots.is_some_and(|s| s.refused);
        if by_slots || decision.source != DecisionSource::Storage || decision.bands.len() != bands.len() {
            return;
        }
        let mut entry = Entry {
            names: [None; MAX_BANDS],
            tats: [None; MAX_BANDS],
            sent_at,
            decided_at: decision.now,
            expires: sent_at,
        };
        for (i, ((quota, state), band)) in bands
            .iter()
            .zip(decision.bands.iter())
            .zip(band_names(bands))
            .enumerate()
        {
            entry.names[i] = Some(band);
            if !quota.is_unlimited() && state.reset_after_ns > 0 {
                let tat = sent_at.saturating_add(state.reset_after_ns);
                entry.tats[i] = Some(tat);
                let full_by = sent_at.saturating_add(state.reset_after_ns.min(longest_reset(quota)));
                entry.expires = entry.expires.max(full_by);
            }
        }
        // Checked under the entry's lock: a refund counts before it drops
        // the entry (which takes the lock), so it either sees this write or
        // this write sees its count.
        let fresh = || self.refunds.unchanged(seen);
        if let Some(mut kept) = self.map.get_mut(&name[..]) {
            if kept.sent_at <= sent_at && fresh() {
                *kept = entry;
            }
            return;
        }
        if decision.allowed || entry.expires == sent_at || !self.room(sent_at) {
            return;
        }
        match self.map.entry(name.to_vec().into_boxed_slice()) {
            MapEntry::Vacant(vacant) if fresh() => {
                vacant.insert(entry);
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            MapEntry::Occupied(mut kept) if kept.get().sent_at <= sent_at && fresh() => {
                kept.insert(entry);
            }
            _ => {}
        }
    }

    /// Whether a new key fits, after sweeping out expired entries when the
    /// cache is full (at most once a second).
    fn room(&self, now: Nanos) -> bool {
        if self.len() < self.capacity {
            return true;
        }
        let last = self.last_sweep.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= SWEEP_EVERY;
        if due
            && self
                .last_sweep
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let mut removed = 0;
            self.map.retain(|_, entry| {
                let keep = entry.expires > now;
                removed += usize::from(!keep);
                keep
            });
            self.len.fetch_sub(removed, Ordering::Relaxed);
        }
        self.len() < self.capacity
    }

    fn forget(&self, name: &[u8]) {
        if self.map.remove(name).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn forget_expired(&self, name: &[u8], now: Nanos) {
        if self
            .map
            .remove_if(name, |_, entry| entry.expires <= now)
            .is_some()
        {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// How long an entry may last for a band of `quota`: a full refill, and as
/// long again for a debt of one burst (the layer's bound for a unit). An
/// entry whose band would take longer (a larger debt bound, or a custom
/// storage's bug such as `u64::MAX`) expires then all the same: one bad
/// answer never keeps a key's entry for good, and an entry that expires
/// early only asks the storage sooner.
fn longest_reset(quota: &Quota) -> u64 {
    quota.refill_nanos().saturating_mul(2)
}

fn same_bands(entry: &Entry, bands: &[Quota]) -> bool {
    bands.len() <= MAX_BANDS
        && entry.names[bands.len()..].iter().all(Option::is_none)
        && entry
            .names
            .iter()
            .zip(band_names(bands))
            .all(|(kept, name)| *kept == Some(name))
}

/// The name of `key` in the cache.
pub(crate) fn encode(key: StorageKey<'_>) -> KeyBuf {
    let mut out = KeyBuf::new();
    push_tier(&mut out, key.namespace, key.tier, key.user.len());
    out.extend_from_slice(key.user.as_bytes());
    out
}

/// The part of its keys' names a tier sets, for a prepared tier.
fn tier_prefix(at: ScopeKey<'_>) -> KeyBuf {
    let mut out = KeyBuf::new();
    push_tier(&mut out, at.namespace, at.tier, 0);
    out
}

/// Appends `[len][namespace][len][tier]` (each length two bytes), with room
/// for `more` bytes.
fn push_tier(out: &mut KeyBuf, namespace: &str, tier: &str, more: usize) {
    let ns = namespace.len().min(usize::from(u16::MAX));
    let tier_len = tier.len().min(usize::from(u16::MAX));
    out.reserve(4 + ns + tier_len + more);
    out.extend_from_slice(&(ns as u16).to_be_bytes());
    out.extend_from_slice(&namespace.as_bytes()[..ns]);
    out.extend_from_slice(&(tier_len as u16).to_be_bytes());
    out.extend_from_slice(&tier.as_bytes()[..tier_len]);
}

#[cfg(test)]
mod tests;
