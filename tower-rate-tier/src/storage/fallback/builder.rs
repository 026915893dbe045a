//! [`FallbackBuilder`]: the share, when to switch, how often to probe, the
//! failure domains and the switch callback.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

use dashmap::DashMap;

use super::{
    DEFAULT_CONTINUE_WITHIN, DEFAULT_FAILURES_TO_SWITCH, DEFAULT_PROBE_INTERVAL, DomainFn, Fallback, Hasher,
    Shared, SwitchFn,
};
use crate::clock::duration_nanos;
use crate::storage::{MemoryStorage, Storage, StorageKey};

/// Configures a [`Fallback`]; see [`Fallback::builder`].
pub struct FallbackBuilder<S> {
    primary: S,
    share: f64,
    failures_to_switch: u32,
    probe_interval: Duration,
    continue_within: Duration,
    local: Option<MemoryStorage>,
    domains: Option<DomainFn>,
    on_switch: Option<SwitchFn>,
}

impl<S: Storage> FallbackBuilder<S> {
    /// The share of each quota this instance gives while answering locally,
    /// in (0, 1] (default 1): `1 / n` when `n` instances share the quota.
    /// Values out of range are clamped (a share of 0 or less becomes the
    /// smallest one, every band's burst then being 1).
    pub fn share(mut self, share: f64) -> Self {
        self.share = if share.is_nan() {
            1.0
        } else {
            share.clamp(f64::MIN_POSITIVE, 1.0)
        };
        self
    }

    /// The share for `n` instances sharing the quota: `1 / n` (at least 1
    /// instance).
    pub fn instances(self, n: u32) -> Self {
        self.share(1.0 / f64::from(n.max(1)))
    }

    /// How many consecutive failures of the primary switch to answering
    /// locally (default 3, at least 1). Until then, each failed decision is
    /// answered locally after the failure.
    pub fn failures_to_switch(mut self, n: u32) -> Self {
        self.failures_to_switch = n.max(1);
        self
    }

    /// How long to answer locally before the next decision goes to the
    /// primary as a probe (default 1 s, at least 1 ms).
    pub fn probe_interval(mut self, every: Duration) -> Self {
        self.probe_interval = every.max(Duration::from_millis(1));
        self
    }

    /// How soon after the primary answers again a new outage of the same
    /// failure domain continues the last one's local state (default
    /// [`DEFAULT_CONTINUE_WITHIN`], five minutes). A primary that flaps
    /// (fails one call in two under load, or goes down again a minute after a
    /// failover) then cannot hand out a fresh share per flap: a user who spent
    /// its share in one spell finds it spent in the next. An outage that
    /// starts later starts afresh. `Duration::ZERO` starts every outage
    /// afresh.
    pub fn continue_within(mut self, within: Duration) -> Self {
        self.continue_within = within;
        self
    }

    /// The local limiter (default `MemoryStorage::new()`: up to 1,000,000
    /// keys). Its state is never merged into the primary's; an outage that
    /// starts more than [`continue_within`](Self::continue_within) after the
    /// last one ended starts from an empty local state.
    pub fn local(mut self, storage: MemoryStorage) -> Self {
        self.local = Some(storage);
        self
    }

    /// Which failure domain a key belongs to (default: one for all keys).
    /// For a Redis Cluster:
    /// `.domains(move |key| redis.failure_domain(key))` with a clone of the
    /// `RedisStorage`, one domain per hash slot.
    pub fn domains<F>(mut self, domain_of: F) -> Self
    where
        F: Fn(StorageKey<'_>) -> u64 + Send + Sync + 'static,
    {
        self.domains = Some(Arc::new(domain_of));
        self
    }

    /// Called with `true` when decisions start being answered locally
    /// without trying the primary (the first failure domain switches), and
    /// with `false` when every domain is back on the primary. Called on the
    /// task that made the decision that caused the switch: keep it short
    /// (set a gauge, send an event).
    pub fn on_switch<F>(mut self, callback: F) -> Self
    where
        F: Fn(bool) + Send + Sync + 'static,
    {
        self.on_switch = Some(Arc::new(callback));
        self
    }

    pub(super) fn new(primary: S) -> Self {
        FallbackBuilder {
            primary,
            share: 1.0,
            failures_to_switch: DEFAULT_FAILURES_TO_SWITCH,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            continue_within: DEFAULT_CONTINUE_WITHIN,
            local: None,
            domains: None,
            on_switch: None,
        }
    }

    /// The storage.
    pub fn build(self) -> Fallback<S> {
        Fallback {
            primary: Arc::new(self.primary),
            shared: Arc::new(Shared {
                local: self.local.unwrap_or_default(),
                share: self.share,
                failures_to_switch: self.failures_to_switch,
                probe_every: duration_nanos(self.probe_interval),
                continue_within: duration_nanos(self.continue_within),
                domain_of: self.domains,
                domains: DashMap::with_hasher(Hasher::default()),
                troubled: AtomicUsize::new(0),
                local_domains: AtomicUsize::new(0),
                epochs: AtomicU64::new(0),
                on_switch: self.on_switch,
            }),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for FallbackBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackBuilder")
            .field("primary", &self.primary)
            .field("share", &self.share)
            .field("failures_to_switch", &self.failures_to_switch)
            .field("probe_interval", &self.probe_interval)
            .field("continue_within", &self.continue_within)
            .field("domains", &self.domains.is_some())
            .field("on_switch", &self.on_switch.is_some())
            .finish_non_exhaustive()
    }
}
