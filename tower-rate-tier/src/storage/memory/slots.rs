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

use dashmap::mapref::entry::Entry;
use dashmap::mapref::one::RefMut;

use super::Inner;
use super::scope::Scope;
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{BandStates, Decision, Lease, LeaseSet, Op, SlotState, Slots, StorageError};

impl Inner {
    /// Takes a slot of `user` and carries out `op` on its bands (none for an
    /// unlimited tier), as one decision: the user's slot set stays locked
    /// while the bands decide, so a slot is taken only when every band
    /// admits, and a refusal by either takes and charges nothing.
    pub(super) fn acquire(
        self: &Arc<Self>,
        scope: &Scope,
        user: &str,
        bands: &[Quota],
        op: Op,
        slots: Slots,
        clock: &Arc<dyn Clock>,
    ) -> Result<Decision, StorageError> {
        let id = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let mut set = match scope.slots.get_mut(user) {
            Some(set) => set,
            None => self.new_set(scope, user),
        };
        // Fewer leases than the limit leave a slot free whatever has
        // expired: the rate decision then reads the time. Only a set at its
        // limit needs the time first, to let passed leases go.
        if set.in_use() >= slots.limit {
            let now = clock.now();
            set.expire(now);
            let in_use = set.in_use();
            if in_use >= slots.limit {
                // Nothing charged. The bands only say whether they would
                // refuse too (see `Op::requirement`), so that the refusal
                // waits for them as well.
                let counted = !bands.is_empty() && !bands.iter().any(Quota::is_unlimited);
                let bands_say = counted
                    .then(|| {
                        self.decide(scope, user, bands, op.requirement(bands.len()), clock)
                            .ok()
                    })
                    .flatten();
                let state = SlotState {
                    limit: slots.limit,
                    in_use,
                    lease: None,
                    refused: true,
                };
                let states = bands_say.map(|d| d.bands).unwrap_or_default();
                return Ok(Decision::new(false, now, states).with_slots(state));
            }
        }
        if bands.is_empty() || bands.iter().any(Quota::is_unlimited) {
            let now = clock.now();
            return Ok(Decision::new(true, now, BandStates::new()).with_slots(set.acquire(id, now, &slots)));
        }
        // The rate state's lock is taken inside this one, never the other
        // way round (an inline sweep at the key cap leaves slot sets alone).
        let decision = match self.decide(scope, user, bands, op, clock) {
            Ok(decision) => decision,
            Err(error) => {
                // the leases passed count no more (the clock was not read
                // for a set below its limit)
                set.expire(clock.now());
                let in_use = set.in_use();
                drop(set);
                self.forget_if_empty(scope, user, in_use);
                return Err(error);
            }
        };
        if decision.allowed {
            let state = set.acquire(id, decision.now, &slots);
            return Ok(decision.with_slots(state));
        }
        set.expire(decision.now);
        let in_use = set.in_use();
        drop(set);
        // refused by the rate: a set this left empty goes as a release's does
        self.forget_if_empty(scope, user, in_use);
        let state = SlotState {
            limit: slots.limit,
            in_use,
            lease: None,
            refused: false,
        };
        Ok(decision.with_slots(state))
    }

    /// After a decision that took no slot: removes the user's set when it
    /// is empty and the sets are past the key cap, as a release does.
    fn forget_if_empty(&self, scope: &Scope, user: &str, in_use: u32) {
        if in_use == 0 && self.slot_sets.load(Ordering::Relaxed) > self.max_keys {
            self.remove_empty_set(scope, user);
        }
    }

    /// Gives `lease` of `key` back.
    pub(super) fn release(
        &self,
        scope: &Scope,
        user: &str,
        lease: Lease,
        clock: &Arc<dyn Clock>,
    ) -> Decision {
        let (held, in_use) = self.release_slot(scope, user, lease);
        let state = SlotState {
            limit: 0,
            in_use,
            lease: held.then_some(lease),
            refused: false,
        };
        Decision::new(true, clock.now(), BandStates::new()).with_slots(state)
    }

    /// The set of a user without one, made (and locked).
    #[cold]
    #[inline(never)]
    fn new_set<'a>(&self, scope: &'a Scope, user: &str) -> RefMut<'a, Box<str>, LeaseSet> {
        match scope.slots.entry(Box::from(user)) {
            Entry::Occupied(e) => e.into_ref(),
            Entry::Vacant(e) => {
                self.slot_sets.fetch_add(1, Ordering::Relaxed);
                e.insert(LeaseSet::default())
            }
        }
    }

    /// Gives `lease` back; whether it was held, and the slots still in
    /// use. The set stays for the next request, unless the sets are past
    /// the key cap.
    pub(super) fn release_slot(&self, scope: &Scope, user: &str, lease: Lease) -> (bool, u32) {
        let (held, in_use) = match scope.slots.get_mut(user) {
            Some(mut set) => (set.release(lease), set.in_use()),
            None => return (false, 0),
        };
        self.forget_if_empty(scope, user, in_use);
        (held, in_use)
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
