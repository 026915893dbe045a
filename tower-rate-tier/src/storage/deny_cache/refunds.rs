//! Refunds in flight, so that an answer the storage gave before a refund
//! never becomes a key's entry after it.
//!
//! A refund drops the key's entry, but a denial of the same key may be in
//! flight: decided by the storage before the refund (with the state from
//! before it), answered after the entry was dropped. Kept, it would deny
//! the key here for as long as that older state lasts (up to a full refill
//! and its debt) while the storage admits. With usage-based quotas a
//! refund is routine (a reservation settled below its estimate), and so is
//! such a denial (another request of the same user, refused while the
//! reservation held the unit at zero).
//!
//! So refunds are counted per bucket of keys, once when a refund is sent
//! and once when it is answered (or given up), and an answer updates the
//! cache only when its bucket's count did not move while it was in flight.
//! A refund also drops the key's entry again once answered. An answer in
//! flight during a refund of another key of its bucket is not kept either:
//! that costs a round trip later, never a wrong answer. The check and the
//! write happen under the entry's lock, which a refund's drop of the entry
//! also takes after counting, so no answer slips in between.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{DenyTable, KeyBuf};
use crate::storage::Decide;

/// The buckets refunds are counted in.
const BUCKETS: usize = 256;

/// Refunds counted per bucket of keys.
pub(super) struct Refunds {
    counts: Box<[AtomicU64]>,
    hasher: foldhash::fast::RandomState,
}

/// What an answer in flight saw of its key's bucket when it was sent.
#[derive(Clone, Copy)]
pub(super) struct Seen {
    bucket: usize,
    count: u64,
}

impl Refunds {
    pub(super) fn new() -> Self {
        Refunds {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn bucket(&self, name: &[u8]) -> usize {
        (self.hasher.hash_one(name) % BUCKETS as u64) as usize
    }

    /// The count of `name`'s bucket now, for a decision about to be sent.
    pub(super) fn seen(&self, name: &[u8]) -> Seen {
        let bucket = self.bucket(name);
        Seen {
            bucket,
            count: self.counts[bucket].load(Ordering::SeqCst),
        }
    }

    /// Whether no refund of the bucket was sent or answered since `seen`.
    pub(super) fn unchanged(&self, seen: Seen) -> bool {
        self.counts[seen.bucket].load(Ordering::SeqCst) == seen.count
    }

    fn count(&self, name: &[u8]) {
        self.counts[self.bucket(name)].fetch_add(1, Ordering::SeqCst);
    }
}

/// A refund of one key in flight: counted and the key forgotten when it
/// is sent ([`Refunding::start`]) and again when it is answered or given up
/// (dropped).
pub(super) struct Refunding {
    table: Arc<DenyTable>,
    name: KeyBuf,
}

impl Refunding {
    pub(super) fn start(table: &Arc<DenyTable>, name: KeyBuf) -> Self {
        // counted first: an answer that checks the count before this sees
        // its entry dropped below
        table.refunds.count(&name);
        table.forget(&name);
        Refunding {
            table: table.clone(),
            name,
        }
    }
}

impl Drop for Refunding {
    fn drop(&mut self) {
        self.table.refunds.count(&self.name);
        self.table.forget(&self.name);
    }
}

/// A refund of the key named `name`, forwarded by `forward`, counted while
/// it is in flight.
pub(super) fn refund(table: &Arc<DenyTable>, name: KeyBuf, forward: impl FnOnce() -> Decide) -> Decide {
    let refunding = Refunding::start(table, name);
    forward().map(move |decided| {
        drop(refunding);
        decided
    })
}
