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

    /// The runtime a release to be awaited goes on in: `None` for the
    /// current one.
    fn runtime(&self) -> Option<&tokio::runtime::Handle> {
        None
    }
}

/// The owner of a slot whose acquire was awaited, with the runtime that
/// waited for it (and so has the timer the storage's answers need).
struct Waited {
    owner: Arc<dyn SlotOwner>,
    runtime: tokio::runtime::Handle,
}

impl SlotOwner for Waited {
    /// Starts the release in the context of the runtime that waited: a
    /// storage that sends it on in a task of its own (a `Fallback` giving a
    /// slot back to the primary while it answers locally) sends it there.
    /// A thread whose tokio context is gone (in a thread-local destructor)
    /// can enter no runtime: there the release is started without it.
    fn release_slot(&self, lease: Lease) -> Option<Decide> {
        let _waited = (!context_gone()).then(|| self.runtime.enter());
        self.owner.release_slot(lease)
    }

    fn runtime(&self) -> Option<&tokio::runtime::Handle> {
        Some(&self.runtime)
    }
}

/// The slot of an admitted request.
pub(crate) struct SlotGuard {
    owner: Arc<dyn SlotOwner>,
    lease: Lease,
    #[cfg(feature = "metrics")]
    in_use: Option<metrics::Gauge>,
}

impl SlotGuard {
    pub(crate) fn new(owner: Arc<dyn SlotOwner>, lease: Lease) -> Self {
        SlotGuard {
            owner,
            lease,
            #[cfg(feature = "metrics")]
            in_use: None,
        }
    }

    /// The guard of a slot whose acquire was awaited on the current
    /// runtime: its release is started on it, whatever thread drops the
    /// guard.
    pub(crate) fn waited_here(mut self) -> Self {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let owner = self.owner.clone();
            self.owner = Arc::new(Waited { owner, runtime });
        }
        self
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
    /// memory), else in a task of its own on the runtime that waited for
    /// the slot (for a slot taken at once, the current one), so a drop
    /// never waits. Without a runtime, or when the release fails, the slot
    /// is left to its lease.
    ///
    /// A release to be awaited is polled once here first: a storage sends
    /// its command on the first poll (Redis: into the connection's queue,
    /// which the server reads in order), so a request of the same user
    /// asked after the response ended is decided after the release, and a
    /// client that sends one request after another never meets its own
    /// slot. That poll runs in the context of the runtime that waited for
    /// the slot, not of whatever runtime the drop happens under (one
    /// without a timer, or shut down), where the storage's timeout would
    /// panic.
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(gauge) = &self.in_use {
            gauge.decrement(1.0);
        }
        let Some(release) = self.owner.release_slot(self.lease) else {
            return;
        };
        let Err(mut pending) = release.into_ready() else {
            return;
        };
        let Some(runtime) = self
            .owner
            .runtime()
            .cloned()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
        else {
            return;
        };
        // (where the thread's tokio context is gone, only spawned: a poll
        // outside a runtime's context may need one)
        if !context_gone() {
            let _taken_on = runtime.enter();
            let mut sent = Context::from_waker(std::task::Waker::noop());
            if Pin::new(&mut pending).poll(&mut sent).is_ready() {
                return;
            }
        }
        runtime.spawn(async move {
            let _ = pending.await;
        });
    }
}

/// Whether this thread's tokio context is gone (a thread-local
/// destructor runs): no runtime can be entered here.
fn context_gone() -> bool {
    tokio::runtime::Handle::try_current().is_err_and(|e| e.is_thread_local_destroyed())
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
