//! What goes back where it was taken, whether the tier was prepared or is
//! decided by name: a refund to whoever charged it, a slot to the limiter
//! that gave it.

use std::sync::Arc;

use super::Shared;
use super::local::{Call, Local};
use crate::clock::Clock;
use crate::storage::{BandStates, Decide, Decision, DecisionSource, Lease, Op, ScopeKey};

impl Shared {
    /// Gives back `call`'s refund of what `decided_by` charged in the tier
    /// `at` (kept locally in `local`; `primary` carries out an operation
    /// in the primary, told who charged it).
    ///
    /// A refund of what the local limiter charged goes to it whenever the
    /// key's domain has local state (it answers locally, answered a failure
    /// locally before it switched, or an outage of it ended: the state a
    /// new outage may continue), and nowhere else: the primary never
    /// charged it, and the local state is never merged into the primary's.
    /// Any other refund
    /// goes to the primary, whether or not the key's domain answers locally
    /// now: the local limiter never charged it (a refund the primary cannot
    /// take is reported as failed, never given to the local limiter).
    pub(super) fn refund(
        &self,
        at: ScopeKey<'_>,
        local: Local<'_>,
        call: Call<'_>,
        decided_by: DecisionSource,
        primary: impl FnOnce(Op) -> Decide,
    ) -> Decide {
        if decided_by != DecisionSource::Fallback {
            return primary(call.op);
        }
        let Some(epoch) = self.known_epoch(self.domain(at, call.user)) else {
            let nothing = Decision::new(true, call.clock.now(), BandStates::new());
            return Decide::ready(Ok(nothing.with_source(DecisionSource::Fallback)));
        };
        Decide::ready(self.answer_locally(local, call, epoch))
    }

    /// Gives back the slot of `lease` that `call`'s user took in the tier
    /// `at`, where it was taken: in the local limiter when the key's domain
    /// has local state (it answers locally, or answered a failure locally
    /// before it switched, or since an outage that ended) and that limiter
    /// held the lease (then nothing of it is in the primary); else in the
    /// primary (`primary` gives it back there; a lease it never gave is
    /// nothing to it).
    ///
    /// While the domain answers locally, the local answer is the answer:
    /// the primary's release of a lease the local limiter did not hold is
    /// sent on its own, its failure left to the lease, and never waited
    /// for nor reported as the release's. Else the primary's answer is (a
    /// release it cannot take is left to the lease).
    pub(super) fn release(
        &self,
        at: ScopeKey<'_>,
        local: Local<'_>,
        call: Call<'_>,
        lease: Lease,
        primary: impl FnOnce(Lease) -> Option<Decide>,
    ) -> Option<Decide> {
        let domain = self.domain(at, call.user);
        if let Some(epoch) = self.known_epoch(domain) {
            let call = Call {
                op: Op::Release(lease),
                ..call
            };
            let released = self.answer_locally(local, call, epoch);
            let held_locally = matches!(&released, Ok(d) if d.slots.is_some_and(|s| s.lease == Some(lease)));
            if held_locally {
                return Some(Decide::ready(released));
            }
            if self.local_epoch(domain).is_some() {
                if let Some(pending) = primary(lease).map(Decide::into_ready).and_then(Result::err)
                    && let Ok(runtime) = tokio::runtime::Handle::try_current()
                {
                    runtime.spawn(async move {
                        let _ = pending.await;
                    });
                }
                return Some(Decide::ready(released));
            }
        }
        primary(lease)
    }
}

/// A release answered at once with nothing to tell.
pub(super) fn released_now(clock: &Arc<dyn Clock>) -> Decide {
    Decide::ready(Ok(Decision::new(true, clock.now(), BandStates::new())))
}
