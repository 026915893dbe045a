//! The memory storage's scopes: the keys of one tier of one limiter, keyed
//! by user id alone. Their number is set by the configuration (a namespace
//! and a tier name each), never by the quotas of customers: a customer's
//! own bands are kept in its own entry.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use dashmap::DashMap;

use super::{Hasher, Tats};
use crate::clock::Nanos;
use crate::storage::{Decision, DecisionSource, LeaseSet, StorageError, StorageKey};

const SHARDS: usize = 64;

/// The keys of one tier of one limiter.
pub(super) struct Scope {
    namespace: Box<str>,
    tier: Box<str>,
    /// A sweep is retiring it (set before the sweep looks whether it is
    /// empty; cleared when it is not, kept once it is retired).
    retiring: AtomicBool,
    /// The refill window (ms, plus 1; 0: none yet) of the one request band
    /// whose state `single` holds: the first one-band window a decision brought
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

    /// Whether the state of a one-band decision of `quota` lives in
    /// `single` (else in `multi`, under its name). Only a request band's
    /// does: `single` is labelled by a window alone, and a unit's band of
    /// the same window is another band (its name has its unit).
    #[inline]
    pub(super) fn holds_single(&self, quota: &crate::quota::Quota) -> bool {
        if !quota.unit().is_requests() {
            return false;
        }
        let tag = crate::storage::window_ms(quota).saturating_add(1);
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

    /// The name of the request band whose times `single` holds, if one
    /// claimed it.
    pub(super) fn single_name(&self) -> Option<crate::storage::BandName> {
        match self.single_window.load(Ordering::Relaxed) {
            0 => None,
            tag => Some(crate::storage::BandName {
                window_ms: tag - 1,
                ..Default::default()
            }),
        }
    }

    /// Marks it retired when it holds no key and no slot set; whether it
    /// was. A decision by name that wrote into it after the look sees the
    /// mark (see [`Scopes::kept`]).
    fn retire_if_empty(&self) -> bool {
        self.retiring.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let empty = self.single.is_empty() && self.multi.is_empty() && self.slots.is_empty();
        if !empty {
            self.retiring.store(false, Ordering::Relaxed);
        }
        empty
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

/// Every scope of a storage: a list replaced whole when a scope is added or
/// retired, read without a lock.
///
/// A tier prepared by [`Storage::prepare`](crate::storage::Storage::prepare)
/// holds its scope, and its decisions find nothing; a decision that names
/// its tier (a storage wrapping this one that prepares nothing) finds the
/// scope in the list. A sweep retires the empty scopes no prepared tier
/// holds, so tiers removed or renamed at run time leave nothing behind,
/// whether they were prepared or named; a decision by name that meets its
/// scope retired makes it anew.
#[derive(Default)]
pub(super) struct Scopes {
    list: ArcSwap<Vec<Arc<Scope>>>,
    /// One changer of the list at a time, so that a scope is never added
    /// twice, and never retired while it is handed out.
    changing: Mutex<()>,
}

impl Scopes {
    /// Decides in the scope of `key` (made on first use). A sweep may
    /// retire the scope while `decide` runs in it: what it wrote there is
    /// then read by no one, so `forget` drops it and the decision is made
    /// again in the scope made anew (a decision of the overflow bucket,
    /// or an error, wrote nothing there and stands).
    #[inline]
    pub(super) fn with(
        &self,
        key: &StorageKey<'_>,
        decide: impl Fn(&Scope) -> Result<Decision, StorageError>,
        forget: impl Fn(&Scope),
    ) -> Result<Decision, StorageError> {
        let stands = |scope: &Scope, result: &Result<Decision, StorageError>| {
            let elsewhere = result
                .as_ref()
                .is_ok_and(|d| d.source == DecisionSource::Overflow);
            if result.is_err() || elsewhere || self.kept(scope) {
                return true;
            }
            forget(scope);
            false
        };
        if let Some(scope) = find(&self.list.load(), key.namespace, key.tier) {
            let result = decide(scope);
            if stands(scope, &result) {
                return result;
            }
        }
        loop {
            let scope = self.get(key.namespace, key.tier);
            let result = decide(&scope);
            if stands(&scope, &result) {
                return result;
            }
        }
    }

    /// Whether what a decision just wrote into `scope` stands: the scope
    /// is still in the list. A sweep marks a scope before it looks whether
    /// it is empty, and the two fences make sure that either the sweep saw
    /// the write (and keeps the scope) or the decision sees the mark; the
    /// sweep's verdict is final under the lock.
    fn kept(&self, scope: &Scope) -> bool {
        fence(Ordering::SeqCst);
        if !scope.retiring.load(Ordering::Relaxed) {
            return true;
        }
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        find(&self.list.load(), &scope.namespace, &scope.tier).is_some_and(|s| std::ptr::eq(&**s, scope))
    }

    /// The scope of `tier` in `namespace`, made on first use.
    pub(super) fn get(&self, namespace: &str, tier: &str) -> Arc<Scope> {
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let list = self.list.load();
        if let Some(scope) = find(&list, namespace, tier) {
            return scope.clone();
        }
        let scope = Arc::new(Scope {
            namespace: namespace.into(),
            tier: tier.into(),
            retiring: AtomicBool::new(false),
            single_window: AtomicU64::new(0),
            single: new_map(),
            multi: new_map(),
            slots: new_map(),
        });
        let mut next = Vec::clone(&list);
        next.push(scope.clone());
        self.list.store(Arc::new(next));
        scope
    }

    /// Every scope, for a sweep.
    pub(super) fn all(&self) -> Arc<Vec<Arc<Scope>>> {
        self.list.load_full()
    }

    /// Removes the empty scopes that no prepared tier holds; how many.
    pub(super) fn retire_unused(&self) -> usize {
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let list = self.list.load_full();
        let retired: Vec<bool> = list
            .iter()
            // held by the list alone (no prepared tier holds it)
            .map(|scope| Arc::strong_count(scope) == 1 && scope.retire_if_empty())
            .collect();
        let count = retired.iter().filter(|&&r| r).count();
        if count > 0 {
            let kept = list.iter().zip(&retired).filter(|(_, r)| !**r);
            self.list.store(Arc::new(kept.map(|(s, _)| s.clone()).collect()));
        }
        count
    }
}

fn find<'a>(list: &'a [Arc<Scope>], namespace: &str, tier: &str) -> Option<&'a Arc<Scope>> {
    list.iter().find(|scope| scope.is(namespace, tier))
}

fn new_map<V>() -> DashMap<Box<str>, V, Hasher> {
    DashMap::with_capacity_and_hasher_and_shard_amount(0, Hasher::default(), SHARDS)
}
