//! Keeping the memory storage bounded: the key cap, sweeps of expired keys,
//! and the background task that runs them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use super::{Inner, Tats};
use crate::clock::{Clock, Nanos, SystemClock};

/// At the key cap, an inline sweep of expired keys runs at most this often
/// (in the storage clock's time).
const INLINE_SWEEP_EVERY_NS: u64 = 1_000_000_000;

impl Inner {
    /// Remembers the clock of garbage collection (the storage's own, or the
    /// first decision's) and starts the GC task if it is not running and
    /// this thread is inside a tokio runtime.
    #[inline]
    pub(super) fn ensure_gc(self: &Arc<Self>, clock: &Arc<dyn Clock>) {
        if !self.gc_running.load(Ordering::Relaxed) {
            self.start_gc(clock);
        }
    }

    #[cold]
    fn start_gc(self: &Arc<Self>, clock: &Arc<dyn Clock>) {
        let _ = self.clock.get_or_init(|| clock.clone());
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.gc_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (stop, stopped) = tokio::sync::oneshot::channel();
        *self.gc_stop.lock().unwrap_or_else(PoisonError::into_inner) = Some(stop);
        handle.spawn(gc_loop(Arc::downgrade(self), self.gc_interval, stopped));
    }

    fn now(&self) -> Nanos {
        match self.clock.get() {
            Some(clock) => clock.now(),
            None => SystemClock.now(),
        }
    }

    /// Whether `op`, for an identity without a key of its own, goes to its
    /// tier's overflow bucket though it keeps nothing of a fresh state: the
    /// storage is full (so the identity's state is the bucket's), and `op`
    /// requires a unit (the answer must see the bucket's debt: a tier whose
    /// only bands are a unit's admits by that alone) or gives units back
    /// as `refund` says. A peek answers from a fresh state.
    pub(super) fn keyless_in_overflow(&self, op: crate::storage::Op, refund: KeylessRefund) -> bool {
        use crate::storage::Amount;
        let to_bucket = |amount| match amount {
            Amount::Require => true,
            Amount::Refund(1..) => refund == KeylessRefund::ToOverflow,
            _ => false,
        };
        let reads = (0..crate::storage::MAX_BANDS).any(|i| to_bucket(op.band(i).0));
        reads && self.len.load(Ordering::Relaxed) >= self.max_keys
    }

    /// Takes one slot under the key cap, reclaiming expired keys first when
    /// the cap is reached; `false` when the storage is still full.
    pub(super) fn reserve_slot(&self, now: Nanos) -> bool {
        if self.len.fetch_add(1, Ordering::Relaxed) < self.max_keys {
            return true;
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
            // Rate keys only: a slot set may be locked by this very thread
            // (an acquire decides its bands with its user's set held).
            self.sweep_at(now, false);
            if self.len.fetch_add(1, Ordering::Relaxed) < self.max_keys {
                return true;
            }
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        false
    }

    pub(super) fn sweep(&self) -> usize {
        self.sweep_at(self.now(), true)
    }

    /// Removes the keys expired at `now`; with `slots`, also the slot
    /// sets whose leases all passed and the scopes nothing refers to.
    fn sweep_at(&self, now: Nanos, slots: bool) -> usize {
        let mut removed = 0usize;
        for scope in self.scopes.all().iter() {
            scope.single.retain(|_, tat| {
                let keep = *tat > now;
                removed += usize::from(!keep);
                keep
            });
            scope.multi.retain(|_, tats: &mut Tats| {
                let keep = tats.iter().any(|&(_, tat)| tat > now);
                removed += usize::from(!keep);
                keep
            });
            if slots {
                let sets = super::slots::sweep(&scope.slots, now);
                self.slot_sets.fetch_sub(sets, Ordering::Relaxed);
                // (not inline: the deciding thread may hold a set's shard)
                shrink_if_sparse(&scope.slots);
            }
            // Give memory back after a flood has gone: tables mostly empty
            // are shrunk.
            shrink_if_sparse(&scope.single);
            shrink_if_sparse(&scope.multi);
            scope.release_single_if_empty();
        }
        if slots {
            self.scopes.retire_unused();
        }
        // Overflow buckets are not counted in `len`.
        self.overflow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, tats| tats.iter().any(|&(_, tat)| tat > now));
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Drops what decisions wrote into a scope a sweep retired under them
    /// (each decides again in the scope made anew), and its count: each
    /// key is counted once, by whichever drop took it.
    pub(super) fn forget(&self, retired: &super::scope::Scope) {
        let mut keys = 0;
        retired.single.retain(|_, _| {
            keys += 1;
            false
        });
        retired.multi.retain(|_, _| {
            keys += 1;
            false
        });
        let mut sets = 0;
        retired.slots.retain(|_, _| {
            sets += 1;
            false
        });
        self.len.fetch_sub(keys, Ordering::Relaxed);
        self.slot_sets.fetch_sub(sets, Ordering::Relaxed);
    }
}

/// Lets the next decision start a GC task again when this one ends (its
/// runtime shut down).
struct ResetOnDrop(Weak<Inner>);

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.gc_running.store(false, Ordering::Release);
        }
    }
}

async fn gc_loop(weak: Weak<Inner>, every: Duration, mut stopped: tokio::sync::oneshot::Receiver<()>) {
    let _reset = ResetOnDrop(weak.clone());
    loop {
        // Woken early only when the storage is dropped (or has started
        // another task).
        if tokio::time::timeout(every, &mut stopped).await.is_ok() {
            return;
        }
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let swept = tokio::task::spawn_blocking(move || inner.sweep()).await;
        if let Ok(n) = swept {
            tracing::trace!(removed = n, "rate-limit memory storage swept expired keys");
        }
    }
}

/// Where a refund for an identity without a key of its own goes while the
/// storage is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeylessRefund {
    /// To its tier's overflow bucket: who charged it is not known (a
    /// program's settlement), and at the cap the bucket most likely did.
    ToOverflow,
    /// Nowhere: the user's own key charged it, and has expired since (its
    /// state is fresh).
    Nowhere,
}

fn shrink_if_sparse<V>(map: &dashmap::DashMap<Box<str>, V, super::Hasher>) {
    if map.capacity() > 4 * map.len() + 4 * 1024 {
        map.shrink_to_fit();
    }
}
