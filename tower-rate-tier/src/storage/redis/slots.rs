//! Concurrency limits in Redis: the slots of a key are a sorted set of
//! lease ids scored by the time each lease ends, under the key's hash tag
//! (`{prefix}:{<hash>}:slots`, in the hash slot of its rate bands), taken
//! and given back by `slots.lua`.
//!
//! Every instance sharing the server shares the count. A lease that has
//! passed is a free slot (the script drops passed leases before it counts),
//! so the slots of an instance that died come back after the lease; the set
//! expires with its newest lease.
//!
//! An [`Op::Acquire`] is one atomic script call, one round trip: at one
//! server time, the script counts the slots in use and, when one is free,
//! decides the rate bands with `redis.lua`'s own code (`SLOTS` in
//! `script.rs`), then takes the slot only when every band admits. A
//! refusal by the slot limit charges nothing, a refusal by a band takes no
//! slot (nothing about the slots is written, so no other call ever sees
//! one taken for a request the bands refuse), and a failure of the bands'
//! decision takes none either. Every key of the call is under the
//! identity's hash tag, so on a Redis Cluster it is a single-slot call to
//! the key's primary.
//!
//! An acquire is not batched: each is a script call of its own, sent at
//! once, with the retries of any single call (`Inner::query`), whether
//! batching is on or not. So a tier with a concurrency limit does not share
//! calls with other decisions (the deny cache still answers a spent user's
//! acquires in process). An [`Op::Release`] is a second call, when the
//! response is over. A call that timed out on our side may still have
//! taken its slot, which then counts until its lease passes.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::{Cmd, Value};

use super::Inner;
use super::error::Attempt;
use super::keys::KeyBuf;
use super::script::{Args, CallArgs, SLOTS, Script, bad_reply, decode};
use crate::quota::Quota;
use crate::storage::{Decide, Decision, Lease, Op, SlotState, StorageError, StorageErrorKind, StorageKey};

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
    /// The rate bands an acquire charges (their keys and spans), if any.
    bands: Option<Args>,
}

impl SlotArgs {
    /// The spans of the bands the call decides.
    fn spans(&self) -> &[[u64; 3]] {
        self.bands.as_ref().map_or(&[], |bands| &bands.spans[..])
    }
}

impl CallArgs for SlotArgs {
    fn key_count(&self) -> usize {
        1 + self.bands.as_ref().map_or(0, |bands| bands.keys.len())
    }

    fn size(&self) -> usize {
        let bands = self.bands.as_ref().map_or(0, |bands| {
            bands.keys.iter().map(|k| k.len()).sum::<usize>()
                + 60 * bands.spans.len()
                + 24 * bands.amounts.len()
        });
        self.key.len() + 64 + bands
    }

    fn push(&self, cmd: &mut Cmd) {
        cmd.arg(self.key_count()).arg(&self.key[..]);
        if let Some(bands) = &self.bands {
            for key in &bands.keys {
                cmd.arg(&key[..]);
            }
        }
        cmd.arg(self.mode);
        match self.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(self.lease.0).arg(self.limit).arg(self.lease_us);
        for span in self.spans() {
            cmd.arg(span[0]).arg(span[1]).arg(span[2]);
        }
        // an admission with an amount per band (a tier with units)
        for (kind, debt) in self.bands.iter().flat_map(|bands| &bands.amounts) {
            cmd.arg(*kind).arg(*debt);
        }
    }
}

/// Starts `op` (an [`Op::Acquire`] or [`Op::Release`]) on `key`.
pub(super) fn send(inner: &Arc<Inner>, key: StorageKey<'_>, bands: &[Quota], op: Op) -> Decide {
    let now = inner.clock.as_ref().map(|clock| clock.now() / 1_000);
    let mut slot_key = inner.keys.base_key(key);
    slot_key.extend_from_slice(b"slots");
    let inner = inner.clone();
    match op {
        Op::Acquire { slots, .. } | Op::AcquireEach { slots, .. } => {
            let lease = inner.leases.next();
            // a tier without a rate limit has no band to charge
            let unlimited = bands.iter().any(Quota::is_unlimited);
            let args = SlotArgs {
                key: slot_key,
                mode: "a",
                now,
                lease,
                limit: slots.limit,
                lease_us: (slots.lease_nanos() / 1_000).max(1),
                bands: (!unlimited).then(|| Args::new(&inner.keys, key, bands, op.on_bands(), now)),
            };
            Decide::pending(async move {
                let (slot, in_use, decision) = match call(&inner, &args, Attempt::Acquire).await {
                    Ok(answer) => answer,
                    Err(error) => {
                        release_unanswered(&inner, &args, &error);
                        return Err(error);
                    }
                };
                let state = SlotState {
                    limit: slots.limit,
                    in_use,
                    lease: (slot == Slot::Taken).then_some(lease),
                    refused: slot == Slot::Full,
                };
                Ok(decision.with_slots(state))
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
                bands: None,
            };
            Decide::pending(async move {
                let (_, in_use, decision) = call(&inner, &args, Attempt::Release).await?;
                let state = SlotState {
                    limit: 0,
                    in_use,
                    lease: None,
                    refused: false,
                };
                Ok(decision.with_slots(state))
            })
        }
        Op::Charge(_) | Op::Refund(_) | Op::Each(_) => Decide::ready(Err(StorageError::new(
            StorageErrorKind::Other,
            "not an operation on slots",
        ))),
    }
}

/// After an acquire that got no answer (`error`: a timeout, a connection
/// lost) and so may still run (a stalled server carries it out later):
/// gives its lease back, in a task of its own, a few times over a few
/// seconds until a release is answered. The lease id is the client's, so
/// the release removes the slot if the acquire took it and is nothing if
/// it never ran; sent on the same connection after the acquire, it runs
/// after it. Without it the slot would be held for its whole lease, the
/// user refused with nothing in flight. A release that never gets through
/// leaves the slot to its lease.
fn release_unanswered(inner: &Arc<Inner>, acquire: &SlotArgs, error: &StorageError) {
    if !matches!(
        error.kind(),
        StorageErrorKind::Timeout | StorageErrorKind::Unavailable
    ) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let release = SlotArgs {
        key: acquire.key.clone(),
        mode: "r",
        now: acquire.now,
        lease: acquire.lease,
        limit: 0,
        lease_us: 0,
        bands: None,
    };
    let inner = inner.clone();
    runtime.spawn(async move {
        for attempt in 0..5u32 {
            if call(&inner, &release, Attempt::Release).await.is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
        }
    });
}

/// What a `slots.lua` call did with the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Taken (an acquire) or given back (a release).
    Taken,
    /// None was free: no band was charged.
    Full,
    /// A band denied: no slot was taken.
    Denied,
}

/// One `slots.lua` call within the timeout: what it did with the slot, the
/// slots in use after, and the decision of the bands (with no band state
/// when it decided none).
async fn call(
    inner: &Inner,
    args: &SlotArgs,
    attempt: Attempt,
) -> Result<(Slot, u32, Decision), StorageError> {
    let value = inner.query(&inner.slots_script, args, attempt).await?;
    let Value::Array(items) = value else {
        return Err(bad_reply());
    };
    let Ok([Value::Int(slot), Value::Int(in_use), decision]) = <[Value; 3]>::try_from(items) else {
        return Err(bad_reply());
    };
    let (slot, spans) = match slot {
        1 => (Slot::Taken, args.spans()),
        // the bands' answer to a requirement (whether they would refuse too)
        0 => (Slot::Full, args.spans()),
        -1 => (Slot::Denied, args.spans()),
        _ => return Err(bad_reply()),
    };
    let decision = decode(decision, spans)?;
    if decision.allowed != (slot == Slot::Taken) {
        return Err(bad_reply());
    }
    Ok((slot, u32::try_from(in_use).unwrap_or(u32::MAX), decision))
}

/// A new script handle for `slots.lua` (after the scripts it runs).
pub(super) fn script() -> Script {
    Script::new(SLOTS)
}
