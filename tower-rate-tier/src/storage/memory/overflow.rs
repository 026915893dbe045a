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

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use super::{Inner, Tats, lookup, store};
use crate::clock::{Clock, Nanos};
use crate::quota::Quota;
use crate::storage::{BandName, Decision, DecisionSource, MAX_BANDS, Op, StorageKey};

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
        let mut names = [BandName {
            window_ms: 0,
            repeat: 0,
        }; MAX_BANDS];
        for (slot, name) in names.iter_mut().zip(crate::storage::band_names(bands)) {
            *slot = name;
        }
        let n = bands.len().min(MAX_BANDS);
        let names = &names[..n];
        let shared = scope_key(&key);
        let apply = |stored: &mut Tats| {
            let now = clock.now();
            let mut tats = lookup(stored, names);
            let decision = crate::storage::decide_bands(&mut tats[..n], now, bands, op);
            *stored = store(names, &tats[..n], now);
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

/// `[len][namespace][len][tier]`: the key of a namespace's and tier's
/// overflow bucket (names are at most 255 bytes).
fn scope_key(key: &StorageKey<'_>) -> Vec<u8> {
    let ns = &key.namespace.as_bytes()[..key.namespace.len().min(255)];
    let tier = &key.tier.as_bytes()[..key.tier.len().min(255)];
    let mut out = Vec::with_capacity(2 + ns.len() + tier.len());
    out.push(ns.len() as u8);
    out.extend_from_slice(ns);
    out.push(tier.len() as u8);
    out.extend_from_slice(tier);
    out
}
