//! The memory storage's scopes: the keys of one band (or one multi-band
//! tier) of one tier of one limiter, keyed by user id alone.

use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use dashmap::DashMap;

use super::{Hasher, Tats};
use crate::clock::Nanos;
use crate::eq::same_name;
use crate::storage::{BandName, StorageKey};

const SHARDS: usize = 64;

/// The keys of one tier of one limiter: of its one band (`band` set), or of
/// all its bands together (`band` unset).
pub(super) struct Scope {
    namespace: Box<str>,
    tier: Box<str>,
    band: Option<BandName>,
    /// One TAT per user (a one-band tier).
    pub(super) single: DashMap<Box<str>, Nanos, Hasher>,
    /// One TAT per band per user (a tier of several bands).
    pub(super) multi: DashMap<Box<str>, Tats, Hasher>,
}

impl Scope {
    fn is(&self, key: &StorageKey<'_>, band: Option<BandName>) -> bool {
        self.band == band && same_name(&self.tier, key.tier) && same_name(&self.namespace, key.namespace)
    }
}

/// Every scope of a storage. A decision finds its scope among a handful
/// without taking a lock (the list is swapped whole when a scope is added).
#[derive(Default)]
pub(super) struct Scopes {
    list: ArcSwap<Vec<Arc<Scope>>>,
    adding: Mutex<()>,
}

impl Scopes {
    /// Runs `f` on the scope of `key` (and `band`), made on first use.
    #[inline]
    pub(super) fn with<R>(
        &self,
        key: &StorageKey<'_>,
        band: Option<BandName>,
        f: impl FnOnce(&Scope) -> R,
    ) -> R {
        let list = self.list.load();
        match list.iter().find(|s| s.is(key, band)) {
            Some(scope) => f(scope),
            None => f(&self.add(key, band)),
        }
    }

    #[cold]
    fn add(&self, key: &StorageKey<'_>, band: Option<BandName>) -> Arc<Scope> {
        let _adding = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        let list = self.list.load_full();
        if let Some(scope) = list.iter().find(|s| s.is(key, band)) {
            return scope.clone();
        }
        let scope = Arc::new(Scope {
            namespace: key.namespace.into(),
            tier: key.tier.into(),
            band,
            single: new_map(),
            multi: new_map(),
        });
        let mut next = Vec::with_capacity(list.len() + 1);
        next.extend(list.iter().cloned());
        next.push(scope.clone());
        self.list.store(Arc::new(next));
        scope
    }

    /// Every scope, for a sweep.
    pub(super) fn all(&self) -> Arc<Vec<Arc<Scope>>> {
        self.list.load_full()
    }
}

fn new_map<V>() -> DashMap<Box<str>, V, Hasher> {
    DashMap::with_capacity_and_hasher_and_shard_amount(0, Hasher::default(), SHARDS)
}
