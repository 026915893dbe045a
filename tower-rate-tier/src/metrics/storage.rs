//! [`MeteredStorage`]: a storage's operations timed and its failures
//! counted.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use metrics::{Counter, Histogram, SharedString};

use super::{
    DENY_CACHE_HITS_TOTAL, FALLBACK_ACTIVE, STORAGE_DURATION_SECONDS, STORAGE_ERRORS_TOTAL, describe_storage,
};
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{
    Decide, Decision, DecisionSource, Lease, Op, ScopeKey, Storage, StorageError, StorageErrorKind,
    StorageKey, TierScope,
};

/// A [`Storage`] that times every operation of the storage it wraps
/// ([`STORAGE_DURATION_SECONDS`]) and counts its failures by kind
/// ([`STORAGE_ERRORS_TOTAL`]), both labelled `storage` with the name you
/// give. A decision that is ready at once is timed without allocating; one
/// that waits (Redis) is timed until its answer, or until its caller stops
/// waiting for it (an outer timeout: its duration so far, and no error).
///
/// ```
/// use tower_rate_tier::metrics::MeteredStorage;
/// use tower_rate_tier::storage::MemoryStorage;
/// use tower_rate_tier::{Quota, RateTier};
///
/// // with the recorder installed first
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .storage(MeteredStorage::new(MemoryStorage::new(), "memory"))
///     .build();
/// # let _ = tiers;
/// ```
pub struct MeteredStorage<S> {
    inner: S,
    probe: Arc<Probe>,
}

struct Probe {
    duration: Histogram,
    /// By [`kind_index`].
    errors: [Counter; 4],
    deny_cache_hits: Counter,
    fallback_active: metrics::Gauge,
}

fn kind_index(kind: StorageErrorKind) -> usize {
    match kind {
        StorageErrorKind::Timeout => 0,
        StorageErrorKind::Unavailable => 1,
        StorageErrorKind::Full => 2,
        _ => 3,
    }
}

/// What a call is, for the metrics its answer moves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    /// A decision: its source moves the deny cache's hits and the
    /// fallback's gauge.
    Decision,
    /// A refund or a slot given back: timed and its failures counted, its
    /// source none of the above (a refund of a local charge is answered by
    /// the fallback whoever decides now, and a release by the primary too).
    GiveBack,
}

impl Call {
    /// What a call carrying out `op` is.
    fn of(op: Op) -> Call {
        match op {
            Op::Release(_) | Op::Refund(_) => Call::GiveBack,
            _ => Call::Decision,
        }
    }
}

impl Probe {
    fn record(&self, started: Instant, call: Call, result: &Result<Decision, StorageError>) {
        self.duration.record(started.elapsed().as_secs_f64());
        match result {
            Err(error) => self.errors[kind_index(error.kind())].increment(1),
            Ok(_) if call == Call::GiveBack => {}
            Ok(decision) => match decision.source {
                DecisionSource::DenyCache => self.deny_cache_hits.increment(1),
                DecisionSource::Fallback => self.fallback_active.set(1.0),
                DecisionSource::Storage => self.fallback_active.set(0.0),
                _ => {}
            },
        }
    }

    /// `decided`, timed from `started` to its answer.
    fn time(self: &Arc<Self>, started: Instant, call: Call, decided: Decide) -> Decide {
        match decided.into_ready() {
            Ok(result) => {
                self.record(started, call, &result);
                Decide::ready(result)
            }
            Err(pending) => {
                let mut timing = Timing {
                    probe: Some(self.clone()),
                    started,
                };
                Decide::pending(async move {
                    let result = pending.await;
                    if let Some(probe) = timing.probe.take() {
                        probe.record(started, call, &result);
                    }
                    result
                })
            }
        }
    }
}

/// A call that waits, timed until its answer or until its caller stops
/// waiting for it (an outer timeout, a client gone): then its duration so
/// far is recorded, and no error (none was answered).
struct Timing {
    /// Taken once the call is answered.
    probe: Option<Arc<Probe>>,
    started: Instant,
}

impl Drop for Timing {
    fn drop(&mut self) {
        if let Some(probe) = self.probe.take() {
            probe.duration.record(self.started.elapsed().as_secs_f64());
        }
    }
}

impl<S: Storage> MeteredStorage<S> {
    /// Wraps `inner`, naming it `name` in the `storage` label (`"memory"`,
    /// `"redis"`). Registers its handles with the recorder in force.
    pub fn new(inner: S, name: impl Into<SharedString>) -> Self {
        describe_storage();
        let name: SharedString = name.into();
        let errors = ["timeout", "unavailable", "full", "other"]
            .map(|kind| metrics::counter!(STORAGE_ERRORS_TOTAL, "storage" => name.clone(), "kind" => kind));
        let duration = metrics::histogram!(STORAGE_DURATION_SECONDS, "storage" => name.clone());
        let deny_cache_hits = metrics::counter!(DENY_CACHE_HITS_TOTAL, "storage" => name.clone());
        let fallback_active = metrics::gauge!(FALLBACK_ACTIVE, "storage" => name);
        MeteredStorage {
            inner,
            probe: Arc::new(Probe {
                duration,
                errors,
                deny_cache_hits,
                fallback_active,
            }),
        }
    }

    /// The wrapped storage.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Storage> Storage for MeteredStorage<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let started = Instant::now();
        let decided = self.inner.decide(key, bands, op, clock);
        self.probe.time(started, Call::of(op), decided)
    }

    fn refund(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        let started = Instant::now();
        let refunded = self.inner.refund(key, bands, op, decided_by, clock);
        self.probe.time(started, Call::GiveBack, refunded)
    }

    /// The tier in the wrapped storage, when it prepares it, with its calls
    /// timed and counted.
    fn prepare(&self, at: ScopeKey<'_>) -> Option<Arc<dyn TierScope>> {
        let inner = self.inner.prepare(at)?;
        Some(Arc::new(MeteredScope {
            inner,
            probe: self.probe.clone(),
        }))
    }
}

/// A tier prepared in the wrapped storage, its calls timed and counted.
struct MeteredScope {
    inner: Arc<dyn TierScope>,
    probe: Arc<Probe>,
}

impl TierScope for MeteredScope {
    fn decide(&self, user: &str, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let started = Instant::now();
        let decided = self.inner.decide(user, bands, op, clock);
        self.probe.time(started, Call::of(op), decided)
    }

    fn refund(
        &self,
        user: &str,
        bands: &[Quota],
        op: Op,
        decided_by: DecisionSource,
        clock: &Arc<dyn Clock>,
    ) -> Decide {
        let started = Instant::now();
        let refunded = self.inner.refund(user, bands, op, decided_by, clock);
        self.probe.time(started, Call::GiveBack, refunded)
    }

    fn release(&self, user: &str, bands: &[Quota], lease: Lease, clock: &Arc<dyn Clock>) -> Option<Decide> {
        let started = Instant::now();
        let released = self.inner.release(user, bands, lease, clock)?;
        Some(self.probe.time(started, Call::GiveBack, released))
    }
}

impl fmt::Debug for MeteredScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MeteredScope").field(&self.inner).finish()
    }
}

impl<S: fmt::Debug> fmt::Debug for MeteredStorage<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MeteredStorage").field(&self.inner).finish()
    }
}
