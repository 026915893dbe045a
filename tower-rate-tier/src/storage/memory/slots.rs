//! The memory storage's concurrency limits: each user's slots in flight, in
//! its tier's scope, beside its rate state.
//!
//! A user's [`LeaseSet`] is made by its first request in flight and kept,
//! empty, after its last one's release (so a returning user takes a slot
//! without an allocation), until the next sweep removes it with the expired
//! keys; a set whose leases all passed (a slot never given back) goes the
//! same way. Sets are bounded like keys: past
//! [`max_keys`](super::MemoryStorageBuilder::max_keys) sets, a release
//! removes the set it empties at once, so the sets left number the requests
//! in flight. A new identity the key cap decides in its tier's overflow
//! bucket still has slots of its own: the bucket shares the rate, never the
//! slots.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Inner;
use super::scope::Scope;
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{BandStates, Decision, Lease, LeaseSet, Op, SlotState, Slots, StorageError};

impl Inner {
    /// Takes a slot of `key`, then charges `cost` in its bands (none for an
    /// unlimited tier); a band that denies gives the slot back at once.
    pub(super) fn acquire(
        self: &Arc<Self>,
        scope: &Scope,
        user: &str,
        bands: &[Quota],
        cost: u32,
        slots: Slots,
        clock: &Arc<dyn Clock>,
    ) -> Result<Decision, StorageError> {
        let id = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let now = clock.now();
        let state = match scope.slots.get_mut(user) {
            Some(mut set) => set.acquire(id, now, &slots),
            None => self.new_set(scope, user, id, now, &slots),
        };
        if state.refused {
            // nothing charged
            return Ok(Decision::new(false, now, BandStates::new()).with_slots(state));
        }
        if bands.is_empty() || bands.iter().any(Quota::is_unlimited) {
            return Ok(Decision::new(true, now, BandStates::new()).with_slots(state));
        }
        let decision = match self.decide(scope, user, bands, Op::Charge(cost), clock) {
            Ok(decision) => decision,
            Err(error) => {
                self.release_slot(scope, user, Lease(id));
                return Err(error);
            }
        };
        if decision.allowed {
            return Ok(decision.with_slots(state));
        }
        let in_use = self.release_slot(scope, user, Lease(id));
        let state = SlotState {
            in_use,
            lease: None,
            ..state
        };
        Ok(decision.with_slots(state))
    }

    /// Gives `lease` of `key` back.
    pub(super) fn release(
        &self,
        scope: &Scope,
        user: &str,
        lease: Lease,
        clock: &Arc<dyn Clock>,
    ) -> Decision {
        let in_use = self.release_slot(scope, user, lease);
        let state = SlotState {
            limit: 0,
            in_use,
            lease: None,
            refused: false,
        };
        Decision::new(true, clock.now(), BandStates::new()).with_slots(state)
    }

    /// The first slot of a user without a set.
    #[cold]
    #[inline(never)]
    fn new_set(
        &self,
        scope: &Scope,
        user: &str,
        id: u64,
        now: crate::clock::Nanos,
        slots: &Slots,
    ) -> SlotState {
        match scope.slots.entry(Box::from(user)) {
            dashmap::mapref::entry::Entry::Occupied(mut e) => e.get_mut().acquire(id, now, slots),
            dashmap::mapref::entry::Entry::Vacant(e) => {
                self.slot_sets.fetch_add(1, Ordering::Relaxed);
                e.insert(LeaseSet::default()).acquire(id, now, slots)
            }
        }
    }

    /// Gives `lease` back; the slots still in use. The set stays for the
    /// next request, unless the sets are past the key cap.
    fn release_slot(&self, scope: &Scope, user: &str, lease: Lease) -> u32 {
        let in_use = match scope.slots.get_mut(user) {
            Some(mut set) => {
                set.release(lease);
                set.in_use()
            }
            None => return 0,
        };
        if in_use == 0 && self.slot_sets.load(Ordering::Relaxed) > self.max_keys {
            self.remove_empty_set(scope, user);
        }
        in_use
    }

    #[cold]
    fn remove_empty_set(&self, scope: &Scope, user: &str) {
        if scope.slots.remove_if(user, |_, set| set.in_use() == 0).is_some() {
            self.slot_sets.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Drops the passed leases of every set of `map`, and the sets left empty;
/// how many sets were removed.
pub(super) fn sweep(
    map: &dashmap::DashMap<Box<str>, LeaseSet, super::Hasher>,
    now: crate::clock::Nanos,
) -> usize {
    let mut removed = 0;
    map.retain(|_, set| {
        set.expire(now);
        let keep = set.in_use() > 0;
        removed += usize::from(!keep);
        keep
    });
    removed
}
