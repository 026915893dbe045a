//! The overflow buckets: where the memory storage decides for identities it
//! has no room to track.
//!
//! At the key cap, a new identity gets no bucket of its own. Letting it
//! through uncounted would hand a flood of fresh identities unlimited
//! requests; refusing it would let the flood lock everybody new out. So
//! every such identity of one tier shares one bucket, keyed by namespace and
//! tier (its bands under their [stable names](crate::storage::band_names)),
//! with the tier's quota: the flood as a whole gets one quota, tracked users
//! keep their own exact quotas, and a new user is admitted while the flood
//! leaves room in the shared bucket. There is one overflow bucket per
//! namespace and tier, so their number is set by the configuration, not by
//! clients, and they are not counted against the cap. The GC removes them
//! once expired, like any key.
//!
//! Identities with quotas of their own share their tier's bucket too, each
//! deciding with its own bands: a band is found by its stable name, or else
//! takes the bucket's state at the same position, and a charge never moves
//! a band's time back, so a mix of contracts (bursts of 10 and 11 in turn,
//! say) keeps limiting as one bucket of the most generous of them rather
//! than starting it afresh at each change.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use super::multi::{lookup, store};
use super::{Inner, Tats};
use crate::clock::{Clock, Nanos};
use crate::quota::Quota;
use crate::storage::{Amount, BandName, Decision, DecisionSource, MAX_BANDS, Op, StorageKey};

/// The storage warns of decisions in overflow buckets at most this often (in
/// the deciding clock's time), with the count since its last warning.
const WARN_EVERY_NS: Nanos = 10_000_000_000;

/// Tier names are written to the warning up to this many characters.
const MAX_LOGGED_TIER: usize = 64;

impl Inner {
    /// Decides `op` for `key` in its tier's overflow bucket.
    pub(super) fn decide_overflow(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        clock: &Arc<dyn Clock>,
    ) -> Decision {
        let mut names = [BandName::default(); MAX_BANDS];
        for (slot, name) in names.iter_mut().zip(crate::storage::band_names(bands)) {
            *slot = name;
        }
        let n = bands.len().min(MAX_BANDS);
        let names = &names[..n];
        let shared = scope_key(&key);
        let apply = |stored: &mut Tats| {
            let now = clock.now();
            let mut tats = lookup(stored, names);
            // A band the bucket has no state for by its name (a contract of
            // other bands than the last decision's: identities with their own
            // quotas share the bucket too) takes the state at its position,
            // so no mix of contracts finds the bucket fresh.
            for (i, tat) in tats[..n].iter_mut().enumerate() {
                if tat.is_none() {
                    *tat = stored.get(i).map(|&(_, t)| t);
                }
            }
            let before = tats;
            let decision = crate::storage::decide_bands(&mut tats[..n], now, bands, op);
            // A charge (or requirement, or forced charge) never moves a
            // shared band's time back: the GCRA clamps a time more than a
            // full refill ahead, and a contract with a shorter refill than
            // the last one's would otherwise hand the bucket back to the
            // longer one at each turn. A time stays within the longest
            // refill of the contracts seen. A refunded band moves back.
            if let Op::Charge(_) | Op::Each(_) = op {
                for (i, (tat, before)) in tats[..n].iter_mut().zip(before).enumerate() {
                    if !matches!(op.band(i).0, Amount::Refund(_)) {
                        *tat = (*tat).max(before);
                    }
                }
            }
            *stored = store(names, &tats[..n]);
            decision
        };
        // One lock for every overflow bucket: each is one key, whose
        // decisions would queue on their shard's lock anyway.
        let mut buckets = self.overflow.lock().unwrap_or_else(PoisonError::into_inner);
        let decision = if let Some(stored) = buckets.get_mut(&shared[..]) {
            apply(stored)
        } else {
            apply(buckets.entry(Box::from(&shared[..])).or_default())
        };
        drop(buckets);
        self.warn_overflow(key, decision.now);
        decision.with_source(DecisionSource::Overflow)
    }

    /// Counts a decision in an overflow bucket, and warns at most once per
    /// [`WARN_EVERY_NS`] with the count since the last warning.
    fn warn_overflow(&self, key: StorageKey<'_>, now: Nanos) {
        self.overflowed.fetch_add(1, Ordering::Relaxed);
        let last = self.last_overflow_warning.load(Ordering::Relaxed);
        // A clock that moved back behind the last warning makes one due.
        let due = last == 0 || now < last || now - last >= WARN_EVERY_NS;
        if !due
            || self
                .last_overflow_warning
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let decisions = self.overflowed.swap(0, Ordering::Relaxed);
        tracing::warn!(
            target: "tower_rate_tier",
            max_keys = self.max_keys,
            decisions,
            tier = %key.tier.escape_debug().take(MAX_LOGGED_TIER).collect::<String>(),
            "rate-limit memory storage is full: new identities share their tier's overflow bucket \
             (one quota for all of them); raise `max_keys` if this is not a flood"
        );
    }
}

/// `[len][namespace][len][tier]`, each length two bytes: the key of a
/// namespace's and tier's overflow bucket.
fn scope_key(key: &StorageKey<'_>) -> Vec<u8> {
    let max = usize::from(u16::MAX);
    let ns = &key.namespace.as_bytes()[..key.namespace.len().min(max)];
    let tier = &key.tier.as_bytes()[..key.tier.len().min(max)];
    let mut out = Vec::with_capacity(4 + ns.len() + tier.len());
    out.extend_from_slice(&(ns.len() as u16).to_be_bytes());
    out.extend_from_slice(ns);
    out.extend_from_slice(&(tier.len() as u16).to_be_bytes());
    out.extend_from_slice(tier);
    out
}
