//! The memory storage's scopes: the keys of one band (or one multi-band
//! tier) of one tier of one limiter, keyed by user id alone.

use std::sync::{Mutex, OnceLock, PoisonError};

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
    #[inline]
    fn is(&self, key: &StorageKey<'_>, band: Option<BandName>) -> bool {
        self.band == band && same_name(&self.tier, key.tier) && same_name(&self.namespace, key.namespace)
    }
}

/// How many scopes a storage finds in its first, fixed list.
const FIRST: usize = 16;

/// Every scope of a storage. Scopes are only ever added, never removed, so
/// a decision finds its scope with plain loads: no lock, no reference count.
/// The first [`FIRST`] scopes (every limiter with a handful of tiers) sit in
/// a fixed list of once-set slots, filled in order; any more in an
/// append-only list.
#[derive(Default)]
pub(super) struct Scopes {
    first: [OnceLock<Scope>; FIRST],
    more: boxcar::Vec<Scope>,
    /// One adder at a time, so that a scope is never added twice.
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
        match self.find(key, band) {
            Some(scope) => f(scope),
            None => f(self.add(key, band)),
        }
    }

    #[inline]
    fn find(&self, key: &StorageKey<'_>, band: Option<BandName>) -> Option<&Scope> {
        for slot in &self.first {
            match slot.get() {
                Some(scope) if scope.is(key, band) => return Some(scope),
                Some(_) => {}
                None => return None,
            }
        }
        self.more.iter().map(|(_, scope)| scope).find(|s| s.is(key, band))
    }

    #[cold]
    fn add(&self, key: &StorageKey<'_>, band: Option<BandName>) -> &Scope {
        let _adding = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scope) = self.find(key, band) {
            return scope;
        }
        let scope = Scope {
            namespace: key.namespace.into(),
            tier: key.tier.into(),
            band,
            single: new_map(),
            multi: new_map(),
        };
        match self.first.iter().find(|slot| slot.get().is_none()) {
            Some(slot) => slot.get_or_init(|| scope),
            None => &self.more[self.more.push(scope)],
        }
    }

    /// Every scope, for a sweep.
    pub(super) fn all(&self) -> impl Iterator<Item = &Scope> {
        let first = self.first.iter().map_while(OnceLock::get);
        first.chain(self.more.iter().map(|(_, scope)| scope))
    }
}

fn new_map<V>() -> DashMap<Box<str>, V, Hasher> {
    DashMap::with_capacity_and_hasher_and_shard_amount(0, Hasher::default(), SHARDS)
}
