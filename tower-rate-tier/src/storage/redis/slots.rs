//! Concurrency limits in Redis: the slots of a key are a sorted set of
//! lease ids scored by the time each lease ends, under the key's hash tag
//! (`{prefix}:{<hash>}:slots`, in the hash slot of its rate bands), taken and
//! given back by `slots.lua` in a script call of its own.
//!
//! Every instance sharing the server shares the count. A lease that has
//! passed is a free slot (the script drops passed leases before it counts),
//! so the slots of an instance that died come back after the lease; the set
//! expires with its newest lease. An [`Op::Acquire`] takes a slot first and
//! then charges the rate bands as any charge is (batched when batching is
//! on, on a Cluster with the queue of the key's primary); when a band denies, or the charge fails, the slot is given back
//! before the answer. So a concurrency tier costs Redis two round trips per
//! request, and a third for the release when the response is over.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::{Cmd, Value};

use super::Inner;
use super::error::{Attempt, redis_error, timeout_error};
use super::keys::KeyBuf;
use super::script::{CallArgs, Script};
use crate::clock::Nanos;
use crate::quota::Quota;
use crate::storage::{
    BandStates, Decide, Decision, Lease, Op, SlotState, StorageError, StorageErrorKind, StorageKey,
};

/// `slots.lua`.
pub(super) const SLOTS: &str = include_str!("slots.lua");

/// Lease ids of one storage: distinct within it, and random across
/// processes (a keyed hash of a counter under a key drawn at start), so
/// instances sharing a server never take one another's ids.
pub(super) struct LeaseIds {
    key: RandomState,
    next: AtomicU64,
}

impl LeaseIds {
    pub(super) fn new() -> Self {
        LeaseIds {
            key: RandomState::new(),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> Lease {
        Lease(self.key.hash_one(self.next.fetch_add(1, Ordering::Relaxed)))
    }
}

/// The arguments of one `slots.lua` call.
struct SlotArgs {
    key: KeyBuf,
    /// `a`cquire or `r`elease.
    mode: &'static str,
    now: Option<u64>,
    lease: Lease,
    limit: u32,
    lease_us: u64,
}

impl CallArgs for SlotArgs {
    fn key_count(&self) -> usize {
        1
    }

    fn size(&self) -> usize {
        self.key.len() + 64
    }

    fn push(&self, cmd: &mut Cmd) {
        cmd.arg(1).arg(&self.key[..]).arg(self.mode);
        match self.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(self.lease.0).arg(self.limit).arg(self.lease_us);
    }
}

/// Starts `op` (an [`Op::Acquire`] or [`Op::Release`]) on `key`.
pub(super) fn send(inner: &Arc<Inner>, key: StorageKey<'_>, bands: &[Quota], op: Op) -> Decide {
    let now = inner.clock.as_ref().map(|clock| clock.now() / 1_000);
    let mut slot_key = inner.keys.base_key(key);
    slot_key.extend_from_slice(b"slots");
    let inner = inner.clone();
    match op {
        Op::Acquire { cost, slots } => {
            let lease = inner.leases.next();
            let args = SlotArgs {
                key: slot_key,
                mode: "a",
                now,
                lease,
                limit: slots.limit,
                lease_us: (slots.lease_nanos() / 1_000).max(1),
            };
            let unlimited = bands.iter().any(Quota::is_unlimited);
            let charge = (!unlimited).then(|| inner.args(key, bands, Op::Charge(cost)));
            Decide::pending(async move {
                let (taken, in_use, at) = call(&inner, &args).await?;
                let mut state = SlotState {
                    limit: slots.limit,
                    in_use,
                    lease: taken.then_some(lease),
                    refused: !taken,
                };
                let Some(charge) = charge.filter(|_| taken) else {
                    return Ok(Decision::new(taken, at, BandStates::new()).with_slots(state));
                };
                let decided = inner.submit(charge).await;
                match decided {
                    Ok(decision) if decision.allowed => Ok(decision.with_slots(state)),
                    other => {
                        // not admitted: the slot goes back before the answer
                        let release = SlotArgs { mode: "r", ..args };
                        let after = call(&inner, &release).await.map(|(_, n, _)| n);
                        state.in_use = after.unwrap_or(state.in_use.saturating_sub(1));
                        state.lease = None;
                        other.map(|d| d.with_slots(state))
                    }
                }
            })
        }
        Op::Release(lease) => {
            let args = SlotArgs {
                key: slot_key,
                mode: "r",
                now,
                lease,
                limit: 0,
                lease_us: 0,
            };
            Decide::pending(async move {
                let (_, in_use, at) = call(&inner, &args).await?;
                let state = SlotState {
                    limit: 0,
                    in_use,
                    lease: None,
                    refused: false,
                };
                Ok(Decision::new(true, at, BandStates::new()).with_slots(state))
            })
        }
        Op::Charge(_) | Op::Refund(_) => Decide::ready(Err(StorageError::new(
            StorageErrorKind::Other,
            "not an operation on slots",
        ))),
    }
}

/// One `slots.lua` call within the timeout: whether a slot was taken, the
/// slots in use after, and the server's time.
async fn call(inner: &Inner, args: &SlotArgs) -> Result<(bool, u32, Nanos), StorageError> {
    let attempt = Attempt::Slot;
    let reply = tokio::time::timeout(
        inner.timeout,
        inner.slots_script.call(&inner.conn, args, attempt, None),
    )
    .await;
    let value = match reply {
        Err(_) => return Err(timeout_error(attempt, inner.timeout)),
        Ok(Err((attempt, e))) => return Err(redis_error(attempt, e)),
        Ok(Ok(value)) => value,
    };
    let bad = || {
        StorageError::new(
            StorageErrorKind::Other,
            "Redis answered the slots script with a malformed reply",
        )
    };
    let Value::Array(items) = value else {
        return Err(bad());
    };
    let [Value::Int(taken), Value::Int(in_use), Value::Int(now)] = items.as_slice() else {
        return Err(bad());
    };
    let in_use = u32::try_from(*in_use).unwrap_or(u32::MAX);
    let now = u64::try_from(*now).unwrap_or(0).saturating_mul(1_000);
    Ok((*taken == 1, in_use, now))
}

/// A new script handle for `slots.lua`.
pub(super) fn script() -> Script {
    Script::new(SLOTS)
}
