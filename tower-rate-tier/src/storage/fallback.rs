//! [`Fallback`]: a local limiter that answers while the primary storage
//! fails, with this instance's share of every quota.
//!
//! * **Every failed decision is answered.** A decision the primary fails
//!   with [`StorageErrorKind::Timeout`], [`StorageErrorKind::Unavailable`]
//!   or [`StorageErrorKind::Full`] is decided by a local [`MemoryStorage`]
//!   instead, with each band scaled to the configured
//!   [share](FallbackBuilder::share) (0.25 when four instances share the
//!   quota; see [Scaling](#scaling)). The Redis storage classes every reply
//!   that means it cannot write (`OOM` of a full server, `READONLY` of a
//!   replica, `BUSY`, `MASTERDOWN`, `CLUSTERDOWN`, `LOADING`) as
//!   unavailable. The layer sees a decision, never the error: no 503 and no
//!   fail-open while the primary is down. Other errors (a refused command,
//!   a bad reply) pass through. The fallback adds no timeout of its own:
//!   the primary must bound its decisions (the Redis storage does, by its
//!   timeout).
//! * **Only the primary's own answers count.** An answer a wrapper of the
//!   primary gave without asking it (a cached denial of the Redis storage's
//!   deny cache, [`DecisionSource::DenyCache`];
//!   the overflow bucket, [`DecisionSource::Overflow`])
//!   says nothing of the primary: it neither ends an outage nor resets the
//!   count of failures, and a probe or trial answered that way has not
//!   reached the primary.
//! * **Switch.** After [`failures_to_switch`](FallbackBuilder::failures_to_switch)
//!   consecutive failures (default 3), decisions are answered locally
//!   without trying the primary, so they cost no timeout.
//! * **Probe and return.** While answering locally, the first decision after
//!   each [`probe_interval`](FallbackBuilder::probe_interval) (default 1 s)
//!   sends the primary a probe in the background: a peek ([`Op::peek`],
//!   which changes nothing) of the same key, in a task of its own, while
//!   the decision itself is answered locally at once; one probe per failure
//!   domain is in flight at a time (a probe that has not come back after 10
//!   intervals, because its task never ran, no longer holds up the next:
//!   the decision then due goes to the primary itself). No request waits
//!   for a primary that is still down. Once a probe is answered, the next
//!   decision goes to the primary as a trial: if the primary decides it,
//!   every later decision goes to the primary again (the local state is
//!   never merged into the primary's); if it fails in any way (a server that
//!   answers reads but refuses writes, say), that decision is answered
//!   locally and the next probe waits for the interval. A service without
//!   traffic sends no probes. Outside a tokio runtime (no task can be
//!   spawned), the decision that makes a probe due is itself the trial
//!   (answered locally after the primary's own timeout, at worst).
//! * **Reported** through `tracing` (a warning when decisions start being
//!   answered locally, an info event when they are all back), through the
//!   [`on_switch`](FallbackBuilder::on_switch) callback, and in every local
//!   decision's source, [`DecisionSource::Fallback`].
//! * **Failure domains.** On a Redis Cluster one dead node must not send
//!   every key to the fallback. [`domains`](FallbackBuilder::domains) tells
//!   the fallback which keys fail together (`RedisStorage::failure_domain`:
//!   the key's hash slot); failures are counted, switches made and probes
//!   sent per domain, so keys on healthy nodes keep using Redis.
//! * **Prepared tiers.** A tier prepared in the fallback
//!   ([`Storage::prepare`], when a [`RateTier`](crate::RateTier) builds its
//!   table) holds the primary's scope of the tier (or decides it in the
//!   primary by name, when the primary prepares none) and the local
//!   limiter's scope of the tier: its decisions, local answers included,
//!   look nothing up by name. They share the failure domains, outages and
//!   local state of the decisions made by name ([`Storage::decide`]).
//!
//! # Scaling
//!
//! Each band of the tier is scaled by the share: its burst is
//! `ceil(burst × share)`, at least 1; its emission interval is
//! `interval / share`, rounded up (the band refills at `share` times the
//! rate). With the share set to 1 / (number of instances), all instances
//! together admit about the full quota while each decides alone (a little
//! more, from the rounding up of the bursts). A request costing more than a
//! scaled burst (but not more than the full one) is charged as the scaled
//! burst: admitted once the share is full, taking it whole, and until then
//! denied with a 429 whose wait comes true, as a spent quota would be; it
//! is never a 403. A refund of such a charge is fitted the same way: a
//! whole refund gives back what was taken, while a partial one (a route's
//! price corrected down) may give back up to the share's burst in the band
//! that took less, and the fields of a refunded response count it so. `X-RateLimit-Limit` still names
//! the configured burst; `Remaining` and the reset count from the share.
//! A concurrency limit is scaled the same way (`ceil(limit × share)` slots,
//! at least 1), and counted apart from the primary's slots; a slot is
//! given back to the local limiter when the key's failure domain has local
//! state and that limiter gave it, and else to the primary. A refund of what
//! the local limiter charged goes to it whenever the domain has local
//! state, and nowhere else. An [`Op::Each`] is decided locally as the
//! same op, its debt bounds scaled as bursts are (`ceil(debt × share)`).
//! The local state of an outage starts empty: during an outage a client
//! gets up to its share, whatever it had used in the primary. An outage
//! that starts within [`continue_within`](FallbackBuilder::continue_within)
//! (default five minutes) after the last one ended in the same failure
//! domain continues the last one's local state, so a primary that flaps
//! cannot hand out a fresh share per flap.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use tower_rate_tier::storage::{Decide, Fallback, MemoryStorage, Op, Storage, StorageError, StorageErrorKind, StorageKey};
//! use tower_rate_tier::{Quota, RateTier, clock::Clock};
//!
//! /// A primary storage that is down.
//! #[derive(Debug)]
//! struct Down;
//! impl Storage for Down {
//!     fn decide(&self, _: StorageKey<'_>, _: &[Quota], _: Op, _: &Arc<dyn Clock>) -> Decide {
//!         Decide::ready(Err(StorageError::new(StorageErrorKind::Unavailable, "down")))
//!     }
//! }
//!
//! let local = Arc::new(AtomicBool::new(false));
//! let seen = local.clone();
//! let storage = Fallback::builder(Down)
//!     .instances(4)
//!     .on_switch(move |answering_locally| seen.store(answering_locally, Ordering::SeqCst))
//!     .build();
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(100)).storage(storage).build();
//! // a quarter of the quota, answered locally
//! for _ in 0..25 {
//!     assert!(tiers.check("ada", "free", 1).await.unwrap().is_ok());
//! }
//! assert!(tiers.check("ada", "free", 1).await.unwrap().is_err());
//! assert!(local.load(Ordering::SeqCst));
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use super::{
    Decide, Decision, DecisionSource, MemoryStorage, Op, ScopeKey, Storage, StorageError, StorageErrorKind,
    StorageKey, TierScope,
};
use crate::clock::{Clock, Nanos};
use crate::quota::Quota;

/// The default number of consecutive failures that switch to the local
/// limiter.
pub const DEFAULT_FAILURES_TO_SWITCH: u32 = 3;

/// The default time between probes of the primary while answering locally.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The default time after an outage ends within which a new one continues
/// its local state: five minutes, longer than a failover with its flaps
/// (Sentinel's default `failover-timeout` is three minutes), so a flapping
/// primary is one outage, not a fresh share per flap.
pub const DEFAULT_CONTINUE_WITHIN: Duration = Duration::from_secs(300);

mod builder;
mod domain;
mod give_back;
mod local;
mod scope;

pub use builder::FallbackBuilder;
use domain::{Domain, Route};
#[cfg(test)]
use local::scale;
use local::{Call, Local};
use scope::FallbackScope;

type DomainFn = Arc<dyn Fn(StorageKey<'_>) -> u64 + Send + Sync>;
type SwitchFn = Arc<dyn Fn(bool) + Send + Sync>;
type Hasher = foldhash::fast::RandomState;

/// A storage that answers from a local limiter while its primary fails; see
/// the [module documentation](self).
///
/// Cheap to clone; clones share one state and one primary.
pub struct Fallback<S> {
    /// Shared with the tiers prepared here that the primary decides by
    /// name.
    primary: Arc<S>,
    shared: Arc<Shared>,
}

impl<S> Clone for Fallback<S> {
    fn clone(&self) -> Self {
        Fallback {
            primary: self.primary.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: Storage> Fallback<S> {
    /// Configures a fallback for `primary`. Set the
    /// [share](FallbackBuilder::share) (or the number of
    /// [instances](FallbackBuilder::instances)): the default, 1, lets every
    /// instance admit the whole quota during an outage.
    pub fn builder(primary: S) -> FallbackBuilder<S> {
        FallbackBuilder::new(primary)
    }

    /// The primary storage.
    pub fn primary(&self) -> &S {
        &self.primary
    }

    /// Whether some decisions are answered locally now without trying the
    /// primary (the switch has been made, in one failure domain at least).
    pub fn is_local(&self) -> bool {
        self.shared.local_domains.load(Ordering::Relaxed) > 0
    }

    /// The share of each quota the local limiter gives.
    pub fn share(&self) -> f64 {
        self.shared.share
    }
}

/// The state every clone shares.
struct Shared {
    local: MemoryStorage,
    share: f64,
    failures_to_switch: u32,
    probe_every: Nanos,
    continue_within: Nanos,
    domain_of: Option<DomainFn>,
    /// The domains that failed: those whose last decision of the primary
    /// failed, and those that recovered (kept for the epoch a new outage
    /// may continue).
    domains: DashMap<u64, Domain, Hasher>,
    /// The domains whose last decision of the primary failed, read without
    /// locking on every decision.
    troubled: AtomicUsize,
    /// Domains answered locally without trying the primary.
    local_domains: AtomicUsize,
    /// Numbers each spell of failures of a domain: the local state of one
    /// spell is never seen by the next.
    epochs: AtomicU64,
    on_switch: Option<SwitchFn>,
}

impl<S: Storage> Storage for Fallback<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let at = ScopeKey {
            namespace: key.namespace,
            tier: key.tier,
        };
        let call = Call {
            user: key.user,
            bands,
            op,
            clock,
        };
        if let Op::Release(lease) = op {
            let released = self.shared.release(at, Local::Named(at), call, lease, |lease| {
                Some(self.primary.decide(key, bands, Op::Release(lease), clock))
            });
            return released.unwrap_or_else(|| give_back::released_now(clock));
        }
        self.shared.decide(at, Local::Named(at), call, |op| {
            self.primary.decide(key, bands, op, clock)
        })
    }

    /// To whoever charged it: the local limiter's charge to it while the
    /// key's domain answers locally (else nowhere), any other to the
    /// primary.
    fn refund(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        let at = ScopeKey {
            namespace: key.namespace,
            tier: key.tier,
        };
        let call = Call {
            user: key.user,
            bands,
            op,
            clock,
        };
        self.shared.refund(at, Local::Named(at), call, decided_by, |op| {
            self.primary.refund(key, bands, op, decided_by, clock)
        })
    }

    /// The tier in the primary (its own scope, or its decisions by name)
    /// and in the local limiter.
    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        let primary: Arc<dyn Storage> = self.primary.clone();
        let primary = super::scope::prepare(&primary, at);
        Some(Arc::new(FallbackScope::new(primary, &self.shared, at)))
    }
}

impl Shared {
    /// Decides `call` of the tier `at`: in the primary (`primary` carries
    /// out an operation there for the call's user) unless the key's failure
    /// domain answers locally, and in the local limiter (where the tier is
    /// `local`) when the primary fails.
    fn decide(
        self: &Arc<Self>,
        at: ScopeKey<'_>,
        local: Local<'_>,
        call: Call<'_>,
        primary: impl Fn(Op) -> Decide,
    ) -> Decide {
        let domain = self.domain(at, call.user);
        let trial = match self.route(domain, call.clock) {
            Route::Primary => false,
            Route::Local(epoch) => return Decide::ready(self.answer_locally(local, call, epoch)),
            Route::Probe(epoch) => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    self.probe(&runtime, domain, epoch, primary(call.op.peek()));
                    return Decide::ready(self.answer_locally(local, call, epoch));
                }
                // Outside a runtime there is no task to probe in: this
                // decision is the probe, as a trial.
                Err(_) => {
                    self.probed(domain, epoch, false);
                    true
                }
            },
            Route::Trial => true,
        };
        let sent = call.clock.now();
        match primary(call.op).into_ready() {
            Ok(decided) => Decide::ready(self.settle(domain, local, call, decided, (sent, trial))),
            Err(pending) => {
                let (local, call) = (local.keep(), call.keep());
                let shared = self.clone();
                Decide::pending(async move {
                    let decided = pending.await;
                    shared.settle(domain, local.local(), call.call(), decided, (sent, trial))
                })
            }
        }
    }

    /// Runs `probe`, the primary's peek at a key, in a task of its own: if
    /// the primary answers it, the next decision of `domain` tries the
    /// primary.
    fn probe(self: &Arc<Self>, runtime: &tokio::runtime::Handle, domain: u64, epoch: u64, probe: Decide) {
        let shared = self.clone();
        let probe = async move {
            let answered = match probe.await {
                Ok(decision) => decision.source == DecisionSource::Storage,
                Err(e) => {
                    tracing::debug!(domain, error = %e, "rate-limit storage probe failed");
                    false
                }
            };
            shared.probed(domain, epoch, answered);
        };
        runtime.spawn(tracing::Instrument::in_current_span(probe));
    }

    /// The primary's answer to a call sent at `sent`, or the local one when
    /// the primary failed (a trial's failure of any kind: the primary is not
    /// back until it decides).
    fn settle(
        &self,
        domain: u64,
        local: Local<'_>,
        call: Call<'_>,
        decided: Result<Decision, StorageError>,
        (sent, trial): (Nanos, bool),
    ) -> Result<Decision, StorageError> {
        match decided {
            Ok(decision) if decision.source == DecisionSource::Storage => {
                self.answered(domain, sent, call.clock.now());
                Ok(decision)
            }
            // A wrapper of the primary answered without asking it (a cached
            // denial, the overflow bucket): it says nothing of the primary,
            // so it neither ends an outage nor resets the failures.
            Ok(decision) => {
                if trial {
                    self.retry_trial(domain);
                }
                Ok(decision)
            }
            Err(e)
                if trial
                    || matches!(
                        e.kind(),
                        StorageErrorKind::Timeout | StorageErrorKind::Unavailable | StorageErrorKind::Full
                    ) =>
            {
                let epoch = self.failed(domain, call.clock.now());
                tracing::debug!(error = %e, "rate-limit storage failed; decided by the local fallback");
                self.answer_locally(local, call, epoch)
            }
            Err(e) => Err(e),
        }
    }

    /// Every domain has switched (`local`), or none any more: logged, and
    /// told to `on_switch`.
    fn report(&self, local: bool) {
        if local {
            tracing::warn!(
                failures = self.failures_to_switch,
                share = self.share,
                "rate-limit storage keeps failing: decisions are answered by the local fallback \
                 with this instance's share of each quota"
            );
        } else {
            tracing::info!("rate-limit storage answers again: decisions go back to it");
        }
        if let Some(callback) = &self.on_switch {
            callback(local);
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Fallback<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("primary", &self.primary)
            .field("share", &self.shared.share)
            .field("failures_to_switch", &self.shared.failures_to_switch)
            .field("probe_interval", &Duration::from_nanos(self.shared.probe_every))
            .field(
                "local_domains",
                &self.shared.local_domains.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
