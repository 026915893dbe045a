//! [`SlotGuard`]: the slot of a tier's concurrency limit that one admitted
//! request holds, given back when the guard is dropped to its
//! [`SlotOwner`] (the request's charge, which knows the user and tier it
//! was taken under). [`Acquiring`]: a slot being taken, which a request
//! that goes away before the storage answers gives back all the same.
//!
//! The guard travels with the request: in the response future until the
//! inner service answers, then in the response body until it ends. So the
//! slot is given back when the body ends or is dropped, when the response
//! future is dropped (the client went away, a timeout layer gave up, the
//! handler panicked and the task unwound), or when the inner service fails.
//! [`Releasing`]: a slot being given back, which a body that ends awaits
//! before it tells its end.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::storage::{Decide, Decision, Lease, StorageError};

/// What gives a slot back: the user and tier it was taken under.
pub(crate) trait SlotOwner: Send + Sync {
    /// Starts giving back the slot of `lease`: `None` when it was given
    /// back at once.
    fn release_slot(&self, lease: Lease) -> Option<Decide>;
}

/// The slot of an admitted request.
pub(crate) struct SlotGuard {
    /// `None` once the slot is given back.
    owner: Option<Arc<dyn SlotOwner>>,
    lease: Lease,
    #[cfg(feature = "metrics")]
    in_use: Option<metrics::Gauge>,
}

impl SlotGuard {
    pub(crate) fn new(owner: Arc<dyn SlotOwner>, lease: Lease) -> Self {
        SlotGuard {
            owner: Some(owner),
            lease,
            #[cfg(feature = "metrics")]
            in_use: None,
        }
    }

    /// Gives the slot back now: `None` when it is back already (a storage
    /// that answers at once, in memory), else the storage's answer to
    /// await (see [`Releasing`]).
    pub(crate) fn give_back(mut self) -> Option<Releasing> {
        self.start_release().map(|pending| Releasing(Some(pending)))
    }

    /// Starts giving the slot back, once: the storage's answer when it has
    /// to be awaited.
    fn start_release(&mut self) -> Option<Decide> {
        let owner = self.owner.take()?;
        #[cfg(feature = "metrics")]
        if let Some(gauge) = &self.in_use {
            gauge.decrement(1.0);
        }
        owner.release_slot(self.lease)?.into_ready().err()
    }

    /// Counts the slot in `gauge` while it is held.
    #[cfg(feature = "metrics")]
    pub(crate) fn counted(mut self, gauge: Option<metrics::Gauge>) -> Self {
        if let Some(gauge) = &gauge {
            gauge.increment(1.0);
        }
        self.in_use = gauge;
        self
    }
}

impl Drop for SlotGuard {
    /// Gives the slot back: at once for a storage that answers at once (in
    /// memory), else in a task of its own, so a drop never waits. Outside a
    /// tokio runtime, or when the release fails, the slot is left to its
    /// lease.
    fn drop(&mut self) {
        if let Some(pending) = self.start_release() {
            drop(Releasing(Some(pending)));
        }
    }
}

/// A slot being given back, the storage's answer awaited (Redis): a body
/// that ends tells its end once the slot is back, so that a client's next
/// request never finds it still taken. Dropped before the answer, it is
/// awaited in a task of its own (outside a tokio runtime, the slot is left
/// to its lease); a failed release is left to the lease.
pub(crate) struct Releasing(Option<Decide>);

impl Future for Releasing {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(pending) = self.0.as_mut() {
            let _ = std::task::ready!(Pin::new(pending).poll(cx));
            self.0 = None;
        }
        Poll::Ready(())
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        let Some(pending) = self.0.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = pending.await;
            });
        }
    }
}

impl fmt::Debug for Releasing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Releasing").field(&self.0.is_some()).finish()
    }
}

impl fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotGuard")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// Gives back the slot of a lease taken for a request that went away.
pub(crate) type Release = Box<dyn FnOnce(Lease) -> Option<Decide> + Send>;

/// The storage's answer to an acquire that has to be awaited (Redis). The
/// storage takes the slot whether anyone still waits for the answer or
/// not: when the request goes away first (its future dropped: the client
/// left, a timeout layer gave up), the answer is awaited in a task of its
/// own and the slot it took, if any, given back with `release`. Outside a
/// tokio runtime the slot is left to its lease.
pub(crate) struct Acquiring {
    pending: Option<Decide>,
    /// `None` for a decision that takes no slot.
    release: Option<Release>,
}

impl Acquiring {
    pub(crate) fn new(pending: Decide, release: Option<Release>) -> Self {
        Acquiring {
            pending: Some(pending),
            release,
        }
    }
}

impl Future for Acquiring {
    type Output = Result<Decision, StorageError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(pending) = self.pending.as_mut() else {
            panic!("an acquire was polled after it completed");
        };
        let answer = std::task::ready!(Pin::new(pending).poll(cx));
        self.pending = None;
        Poll::Ready(answer)
    }
}

impl Drop for Acquiring {
    fn drop(&mut self) {
        let (Some(pending), Some(release)) = (self.pending.take(), self.release.take()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let Ok(decision) = pending.await else {
                return;
            };
            if let Some(lease) = decision.slots.and_then(|s| s.lease) {
                if let Some(release) = release(lease) {
                    let _ = release.await;
                }
            }
        });
    }
}
