//! Answering locally: the local limiter with the instance's share of each
//! quota, and what a decision needs to be answered there later.

use std::sync::Arc;
use std::time::Duration;

use arrayvec::ArrayVec;
use smallvec::SmallVec;

use super::Shared;
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{
    Decision, DecisionSource, MAX_BANDS, Op, Slots, Storage, StorageError, StorageErrorKind, StorageKey,
};

impl Shared {
    /// [`Shared::answer_locally`] for a decision the primary failed.
    pub(super) fn answer_call(&self, call: &Call, epoch: u64) -> Result<Decision, StorageError> {
        self.answer_locally(call.key(), &call.bands, call.op, &call.clock, epoch)
    }

    /// The local limiter's decision, with every band scaled to the share,
    /// in the state of spell `epoch`.
    pub(super) fn answer_locally(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        clock: &Arc<dyn Clock>,
        epoch: u64,
    ) -> Result<Decision, StorageError> {
        let mut scaled = ArrayVec::<Quota, MAX_BANDS>::new();
        for quota in bands {
            scaled.try_push(scale(quota, self.share)).map_err(|_| {
                StorageError::new(StorageErrorKind::Other, "a decision needs 1 to MAX_BANDS bands")
            })?;
        }
        // The spell's state under keys of its own (the epoch before the
        // user id), in the storage's scope of the tier: a new spell starts
        // afresh, and the sweep removes an old spell's keys.
        let mut user = String::with_capacity(21 + key.user.len());
        user.push_str(itoa::Buffer::new().format(epoch));
        user.push(':');
        user.push_str(key.user);
        let local_key = StorageKey { user: &user, ..key };
        let op = match op {
            Op::Acquire { cost, slots } => Op::Acquire {
                cost,
                slots: scale_slots(slots, self.share),
            },
            op => op,
        };
        match self.local.decide(local_key, &scaled, op, clock).into_ready() {
            Ok(decided) => decided.map(|d| d.with_source(DecisionSource::Fallback)),
            Err(_) => Err(StorageError::new(
                StorageErrorKind::Other,
                "the local fallback limiter did not decide at once",
            )),
        }
    }
}

/// `quota` scaled to `share`: see [Scaling](super#scaling).
pub(super) fn scale(quota: &Quota, share: f64) -> Quota {
    if quota.is_unlimited() || share >= 1.0 {
        return *quota;
    }
    // `as` saturates: a burst or an interval too large to scale stays
    // within its type.
    let burst = ((f64::from(quota.burst()) * share).ceil() as u32).max(1);
    let interval = ((quota.emission_interval_nanos() as f64 / share).ceil() as u64).max(1);
    Quota::per_period(1, Duration::from_nanos(interval)).with_burst(burst)
}

/// A concurrency limit scaled to `share`: `ceil(limit × share)`, at least 1
/// (two instances with 3 slots between them get 2 each).
pub(super) fn scale_slots(slots: Slots, share: f64) -> Slots {
    if share >= 1.0 {
        return slots;
    }
    let limit = ((f64::from(slots.limit) * share).ceil() as u32).max(1);
    Slots { limit, ..slots }
}

/// What answering a failed decision locally needs, owned (the primary's
/// answer may come later).
pub(super) struct Call {
    /// namespace, tier and user, one after the other.
    text: SmallVec<[u8; 96]>,
    namespace: usize,
    tier: usize,
    bands: ArrayVec<Quota, MAX_BANDS>,
    op: Op,
    clock: Arc<dyn Clock>,
}

impl Call {
    pub(super) fn new(key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Self {
        let mut text = SmallVec::new();
        for part in [key.namespace, key.tier, key.user] {
            text.extend_from_slice(part.as_bytes());
        }
        Call {
            text,
            namespace: key.namespace.len(),
            tier: key.tier.len(),
            bands: bands.iter().take(MAX_BANDS).copied().collect(),
            op,
            clock: clock.clone(),
        }
    }

    /// The time now on the decision's clock.
    pub(super) fn now(&self) -> crate::clock::Nanos {
        self.clock.now()
    }

    pub(super) fn key(&self) -> StorageKey<'_> {
        let (namespace, rest) = self.text.split_at(self.namespace);
        let (tier, user) = rest.split_at(self.tier);
        // Each part was a `&str`, cut at its own boundaries.
        let text = |bytes| std::str::from_utf8(bytes).unwrap_or_default();
        StorageKey {
            namespace: text(namespace),
            tier: text(tier),
            user: text(user),
        }
    }
}
