//! The memory storage's scopes: the keys of one tier of one limiter, keyed
//! by user id alone. Their number is set by the configuration (a namespace
//! and a tier name each), never by the quotas of customers: a customer's
//! own bands are kept in its own entry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use dashmap::DashMap;

use super::{Hasher, Tats};
use crate::clock::Nanos;
use crate::storage::{LeaseSet, StorageKey};

const SHARDS: usize = 64;

/// The keys of one tier of one limiter.
pub(super) struct Scope {
    namespace: Box<str>,
    tier: Box<str>,
    /// The refill window (ms, plus 1; 0: none yet) of the one band whose
    /// state `single` holds: the first one-band window a decision brought
    /// since `single` was last empty (the tier's own band, in practice).
    single_window: AtomicU64,
    /// One TAT per user, of the band of `single_window`.
    pub(super) single: DashMap<Box<str>, Nanos, Hasher>,
    /// One TAT per band per user under the bands' names: a decision of
    /// several bands, or of one band with another window (a customer's own
    /// quota, or the tier's band after a change of its window).
    pub(super) multi: DashMap<Box<str>, Tats, Hasher>,
    /// The slots in flight of each user holding one (a tier with a
    /// concurrency limit): see `slots.rs`.
    pub(super) slots: DashMap<Box<str>, LeaseSet, Hasher>,
}

impl Scope {
    #[inline]
    fn is(&self, namespace: &str, tier: &str) -> bool {
        *self.tier == *tier && *self.namespace == *namespace
    }

    /// The storage key of `user` in this scope.
    pub(super) fn key<'a>(&'a self, user: &'a str) -> StorageKey<'a> {
        StorageKey {
            namespace: &self.namespace,
            tier: &self.tier,
            user,
        }
    }

    /// Whether the state of a one-band decision of refill window `window_ms`
    /// lives in `single` (else in `multi`, under its name).
    #[inline]
    pub(super) fn holds_single(&self, window_ms: u64) -> bool {
        let tag = window_ms.saturating_add(1);
        match self.single_window.load(Ordering::Relaxed) {
            0 => match self
                .single_window
                .compare_exchange(0, tag, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => true,
                Err(claimed) => claimed == tag,
            },
            claimed => claimed == tag,
        }
    }

    /// After a sweep left `single` empty: the next one-band window claims
    /// it. (A decision racing the sweep may have just stored a time of the
    /// old window, which the new one then reads as its own: a time the new
    /// band clamps to at most one refill ahead, so the user gets no more
    /// than a fresh state would give.)
    pub(super) fn release_single_if_empty(&self) {
        if self.single.is_empty() {
            self.single_window.store(0, Ordering::Relaxed);
        }
    }
}

/// How many scopes a storage finds in its first, fixed list.
const FIRST: usize = 16;

/// Every scope of a storage. Scopes are only ever added, never removed, so
/// a decision that names its scope finds it with plain loads: no lock, no
/// reference count. A tier prepared by
/// [`Storage::prepare`](crate::storage::Storage::prepare) holds its scope and
/// finds nothing.
/// The first [`FIRST`] scopes (every limiter with a handful of tiers) sit in
/// a fixed list of once-set slots, filled in order; any more in an
/// append-only list.
#[derive(Default)]
pub(super) struct Scopes {
    first: [OnceLock<Arc<Scope>>; FIRST],
    more: boxcar::Vec<Arc<Scope>>,
    /// One adder at a time, so that a scope is never added twice.
    adding: Mutex<()>,
}

impl Scopes {
    /// Runs `f` on the scope of `key`, made on first use.
    #[inline]
    pub(super) fn with<R>(&self, key: &StorageKey<'_>, f: impl FnOnce(&Scope) -> R) -> R {
        match self.find(key.namespace, key.tier) {
            Some(scope) => f(scope),
            None => f(self.add(key.namespace, key.tier)),
        }
    }

    /// The scope of `tier` in `namespace`, made on first use: what a
    /// prepared tier holds.
    pub(super) fn get(&self, namespace: &str, tier: &str) -> Arc<Scope> {
        match self.find(namespace, tier) {
            Some(scope) => scope.clone(),
            None => self.add(namespace, tier).clone(),
        }
    }

    #[inline]
    fn find(&self, namespace: &str, tier: &str) -> Option<&Arc<Scope>> {
        for slot in &self.first {
            match slot.get() {
                Some(scope) if scope.is(namespace, tier) => return Some(scope),
                Some(_) => {}
                None => return None,
            }
        }
        self.more
            .iter()
            .map(|(_, scope)| scope)
            .find(|s| s.is(namespace, tier))
    }

    #[cold]
    fn add(&self, namespace: &str, tier: &str) -> &Arc<Scope> {
        let _adding = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scope) = self.find(namespace, tier) {
            return scope;
        }
        let scope = Arc::new(Scope {
            namespace: namespace.into(),
            tier: tier.into(),
            single_window: AtomicU64::new(0),
            single: new_map(),
            multi: new_map(),
            slots: new_map(),
        });
        match self.first.iter().find(|slot| slot.get().is_none()) {
            Some(slot) => slot.get_or_init(|| scope),
            None => &self.more[self.more.push(scope)],
        }
    }

    /// Every scope, for a sweep.
    pub(super) fn all(&self) -> impl Iterator<Item = &Scope> {
        let first = self.first.iter().map_while(OnceLock::get);
        first
            .chain(self.more.iter().map(|(_, scope)| scope))
            .map(|scope| &**scope)
    }
}

fn new_map<V>() -> DashMap<Box<str>, V, Hasher> {
    DashMap::with_capacity_and_hasher_and_shard_amount(0, Hasher::default(), SHARDS)
}
