//! Failure domains: where each domain's decisions go (the primary, the
//! local limiter, a probe, a trial) and what a probe's answer changes. The
//! counting of failures and recoveries, which reports switches, is the
//! fallback's own (`Shared::failed`, `Shared::answered`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dashmap::mapref::entry::Entry;

use super::Shared;
use crate::clock::{Clock, Nanos};
use crate::storage::ScopeKey;

/// The state of one failure domain that failed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Domain {
    /// Consecutive failures of the primary; 0 once it answered again.
    pub(super) failures: u32,
    pub(super) epoch: u64,
    /// When the primary last answered after failures (the outage ended).
    pub(super) ended: Nanos,
    /// When the first of the current failures came: an answer to a call
    /// sent before it says nothing of the primary since.
    pub(super) since: Nanos,
    /// Answering locally; the next probe is due then.
    pub(super) probe_at: Option<Nanos>,
    /// When the probe of this spell in flight was sent: no other is sent
    /// meanwhile.
    pub(super) probing: Option<Nanos>,
    /// A probe was answered: the next decision tries the primary.
    pub(super) trial: bool,
}

/// After this many probe intervals, a probe that has not come back no longer
/// holds up the next: the decision then due goes to the primary itself.
const STALE_PROBE: u64 = 10;

/// Where a decision goes, with the epoch of the domain's local state.
pub(super) enum Route {
    Primary,
    Local(u64),
    /// Locally, and a probe of the primary is due.
    Probe(u64),
    /// To the primary, as a trial: any failure is answered locally, and
    /// only a decision the primary makes brings the domain back.
    Trial,
}

impl Shared {
    /// The failure domain of `user` in the tier `at`.
    pub(super) fn domain(&self, at: ScopeKey<'_>, user: &str) -> u64 {
        self.domain_of
            .as_ref()
            .map_or(0, |domain_of| domain_of(at.user(user)))
    }

    /// The spell of `domain`'s local state while it answers locally (it
    /// has switched, whether a probe or a trial is due or not); `None` while
    /// the primary answers it. Changes nothing.
    pub(super) fn local_epoch(&self, domain: u64) -> Option<u64> {
        if self.troubled.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let state = self.domains.get(&domain)?;
        state.probe_at.map(|_| state.epoch)
    }

    /// The spell of `domain`'s local state whenever it has one: it answers
    /// locally, or answered a failure locally before it switched, or an
    /// outage of it ended (its state kept for a new one to continue).
    pub(super) fn known_epoch(&self, domain: u64) -> Option<u64> {
        self.domains.get(&domain).map(|state| state.epoch)
    }

    /// Locally while the domain has switched, except for a probe that is due.
    pub(super) fn route(&self, domain: u64, clock: &Arc<dyn Clock>) -> Route {
        if self.troubled.load(Ordering::Relaxed) == 0 {
            return Route::Primary;
        }
        let Some(mut state) = self.domains.get_mut(&domain) else {
            return Route::Primary;
        };
        let Some(due) = state.probe_at else {
            return Route::Primary;
        };
        if state.trial {
            state.trial = false;
            return Route::Trial;
        }
        let now = clock.now();
        if now < due {
            return Route::Local(state.epoch);
        }
        match state.probing {
            None => {
                state.probe_at = Some(now.saturating_add(self.probe_every));
                state.probing = Some(now);
                Route::Probe(state.epoch)
            }
            // The probe never came back (its task never ran: a runtime
            // that is not driven, or was shut down): this decision is the
            // trial, so the domain cannot stay local for ever.
            Some(sent) if now.saturating_sub(sent) >= self.probe_every.saturating_mul(STALE_PROBE) => {
                state.probe_at = Some(now.saturating_add(self.probe_every));
                Route::Trial
            }
            Some(_) => Route::Local(state.epoch),
        }
    }

    /// A probe of spell `epoch` of `domain` ended; `answered` when the
    /// primary answered it. A probe of an earlier spell changes nothing.
    pub(super) fn probed(&self, domain: u64, epoch: u64, answered: bool) {
        if let Some(mut state) = self.domains.get_mut(&domain) {
            if state.epoch == epoch {
                state.probing = None;
                state.trial |= answered;
            }
        }
    }

    /// A trial was answered by a wrapper of the primary, not by the
    /// primary: the next decision of `domain` is the trial.
    pub(super) fn retry_trial(&self, domain: u64) {
        if let Some(mut state) = self.domains.get_mut(&domain) {
            if state.probe_at.is_some() {
                state.trial = true;
            }
        }
    }

    /// The primary decided for `domain` a call sent at `sent`: its failures
    /// are forgotten, and it is back on the primary if it had switched. The
    /// domain's epoch is kept for an outage that starts again soon. A call
    /// sent before the failures began (answered late, its reply read after
    /// theirs) says nothing of the primary since, and changes nothing.
    pub(super) fn answered(&self, domain: u64, sent: Nanos, now: Nanos) {
        if self.troubled.load(Ordering::Relaxed) == 0 {
            return;
        }
        let Some(mut state) = self.domains.get_mut(&domain) else {
            return;
        };
        if state.failures == 0 || sent < state.since {
            return;
        }
        let was_local = state.probe_at.is_some();
        *state = Domain {
            failures: 0,
            ended: now,
            probe_at: None,
            probing: None,
            trial: false,
            ..*state
        };
        drop(state);
        self.troubled.fetch_sub(1, Ordering::Relaxed);
        if was_local {
            tracing::debug!(domain, "rate-limit storage answers again for this failure domain");
            if self.local_domains.fetch_sub(1, Ordering::Relaxed) == 1 {
                self.report(false);
            }
        }
    }

    /// Counts a failure in `domain` (switching it after enough); the epoch
    /// of its local state. A domain that recovered less than
    /// `continue_within` ago continues its last outage's epoch.
    pub(super) fn failed(&self, domain: u64, now: Nanos) -> u64 {
        let switch_at = now.saturating_add(self.probe_every);
        let (epoch, switched) = match self.domains.entry(domain) {
            Entry::Occupied(mut seen) => {
                let state = seen.get_mut();
                if state.failures == 0 {
                    // A new outage of a domain that recovered.
                    self.troubled.fetch_add(1, Ordering::Relaxed);
                    state.since = now;
                    if now.saturating_sub(state.ended) >= self.continue_within {
                        state.epoch = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
                    }
                }
                state.failures = state.failures.saturating_add(1);
                let switched = state.probe_at.is_none() && state.failures >= self.failures_to_switch;
                if switched {
                    state.probe_at = Some(switch_at);
                }
                (state.epoch, switched)
            }
            Entry::Vacant(new) => {
                self.troubled.fetch_add(1, Ordering::Relaxed);
                let epoch = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
                let switched = self.failures_to_switch <= 1;
                new.insert(Domain {
                    failures: 1,
                    epoch,
                    ended: 0,
                    since: now,
                    probe_at: switched.then_some(switch_at),
                    probing: None,
                    trial: false,
                });
                (epoch, switched)
            }
        };
        if switched {
            tracing::debug!(domain, "rate-limit storage keeps failing for this failure domain");
            if self.local_domains.fetch_add(1, Ordering::Relaxed) == 0 {
                self.report(true);
            }
        }
        epoch
    }
}
