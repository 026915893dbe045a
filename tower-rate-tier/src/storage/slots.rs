//! Concurrency limits in storage: a count of requests in flight per key,
//! each held under a lease.
//!
//! [`Op::Acquire`](super::Op::Acquire) takes one of a key's slots and
//! charges its rate bands in one decision: when no slot is free, no band is
//! charged; when a band denies, no slot is taken (nobody sees it taken,
//! even for a moment: the memory and Redis storages decide both at once,
//! under the key's lock or in one script). The answer
//! carries a [`SlotState`] whose [`Lease`] names the slot taken;
//! [`Op::Release`](super::Op::Release) gives it back. A slot whose lease has
//! passed counts as free, so a slot a process never gave back (it died, or a
//! release failed) returns by itself.

use std::time::Duration;

use crate::clock::Nanos;

/// A concurrency limit as a decision asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slots {
    /// At most this many slots of one key in use at once.
    pub limit: u32,
    /// How long a slot taken now counts as in use unless given back sooner.
    pub lease: Duration,
}

impl Slots {
    /// The lease in nanoseconds (at least 1).
    pub fn lease_nanos(&self) -> Nanos {
        u64::try_from(self.lease.as_nanos()).unwrap_or(u64::MAX).max(1)
    }
}

/// The slot one request holds: what [`Op::Release`](super::Op::Release)
/// gives back. Unique within the storage that issued it, and unlike
/// another storage's: a release reaches both a
/// [`Fallback`](super::Fallback)'s primary and its local limiter, and a
/// lease one never gave must be nothing to it. The memory and Redis
/// storages draw their ids from a random start or key; a storage of your
/// own that counts its ids starts from a random number too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease(pub u64);

/// A key's slots after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotState {
    /// The limit.
    pub limit: u32,
    /// Slots in use after the decision (this request's included when it
    /// took one).
    pub in_use: u32,
    /// The slot this request took; `None` when it took none. After an
    /// [`Op::Release`](super::Op::Release): the lease given back, when this
    /// storage held it (a storage may leave it `None`; the `Fallback` then
    /// gives the slot back to its primary too).
    pub lease: Option<Lease>,
    /// Whether the decision was refused for want of a free slot (then no
    /// band was charged, and the decision's band states may be empty).
    pub refused: bool,
}

impl SlotState {
    /// Slots free after the decision.
    pub fn free(&self) -> u32 {
        self.limit.saturating_sub(self.in_use)
    }
}

/// The slots of one key in a storage that keeps them in process: the
/// expiry of each lease, by lease id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseSet(smallvec::SmallVec<[(u64, Nanos); 2]>);

impl LeaseSet {
    /// Takes a slot under `id` at `now` when one is free (leases past their
    /// expiry are dropped first); the state after.
    pub fn acquire(&mut self, id: u64, now: Nanos, slots: &Slots) -> SlotState {
        self.expire(now);
        let in_use = self.in_use();
        if in_use >= slots.limit {
            return SlotState {
                limit: slots.limit,
                in_use,
                lease: None,
                refused: true,
            };
        }
        self.0.push((id, now.saturating_add(slots.lease_nanos())));
        SlotState {
            limit: slots.limit,
            in_use: in_use + 1,
            lease: Some(Lease(id)),
            refused: false,
        }
    }

    /// Gives `lease` back; whether it was held.
    pub fn release(&mut self, lease: Lease) -> bool {
        let before = self.0.len();
        self.0.retain(|(id, _)| *id != lease.0);
        self.0.len() != before
    }

    /// Drops the leases past their expiry at `now`.
    pub fn expire(&mut self, now: Nanos) {
        self.0.retain(|(_, until)| *until > now);
    }

    /// Slots held (expired leases included until [`expire`](Self::expire)).
    pub fn in_use(&self) -> u32 {
        u32::try_from(self.0.len()).unwrap_or(u32::MAX)
    }

    /// Whether no lease is held at `now`.
    pub fn is_free_at(&self, now: Nanos) -> bool {
        self.0.iter().all(|(_, until)| *until <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_released_and_expire() {
        let slots = Slots {
            limit: 2,
            lease: Duration::from_secs(10),
        };
        let mut set = LeaseSet::default();
        assert_eq!(set.acquire(1, 0, &slots).lease, Some(Lease(1)));
        assert_eq!(set.acquire(2, 0, &slots).in_use, 2);
        let refused = set.acquire(3, 0, &slots);
        assert!(refused.refused && refused.lease.is_none());
        assert!(set.release(Lease(1)));
        assert!(!set.release(Lease(1)));
        assert_eq!(set.acquire(3, 1, &slots).free(), 0);
        // both leases pass: the slots come back
        assert!(!set.is_free_at(10_000_000_000));
        assert!(set.is_free_at(10_000_000_001));
        assert_eq!(set.acquire(4, 10_000_000_001, &slots).in_use, 1);
    }
}
