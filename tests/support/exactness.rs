//! Exactness under load: many tasks on a multi-threaded runtime hammer one
//! shared key and one key of their own with cost-1 checks for a bounded time.
//!
//! Every decision's storage time ([`RateLimitInfo::decided_at`]) is recorded,
//! so the bound of each key is computed from the time span the storage itself
//! saw: with burst `B` and emission interval `I`, GCRA can admit at most
//! `B + floor(span / I)` requests in a span (the `+1` of clock granularity
//! in the issue is not needed with the storage's own times). What it did not
//! admit is still in the bucket at the end (the `remaining` of the last
//! decision) unless the bucket sat full for longer than a full refill, so
//! `admitted + remaining at the end` equals the bound when requests never
//! pause that long.
//!
//! [`RateLimitInfo::decided_at`]: tower_rate_tier::RateLimitInfo::decided_at

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_rate_tier::{Quota, RateTier};

/// The tier every task shares one key of.
pub const SHARED_TIER: &str = "shared";
/// The tier of each task's own key.
pub const OWN_TIER: &str = "own";

/// How hard and how long to hammer.
#[derive(Debug, Clone, Copy)]
pub struct Hammer {
    /// Concurrent tasks.
    pub tasks: usize,
    /// How long each task keeps sending (wall time).
    pub run_for: Duration,
    /// Each task also makes at least this many checks on each of its keys
    /// (so that a slow machine still goes past every quota).
    pub min_attempts: u64,
}

/// What one key saw.
#[derive(Debug, Clone, Default)]
pub struct KeyStats {
    /// The key's user id.
    pub user: String,
    /// Checks made.
    pub attempts: u64,
    /// Checks admitted.
    pub admitted: u64,
    /// The first decision's storage time (ns since the epoch).
    pub first_ns: u64,
    /// The last decision's storage time.
    pub last_ns: u64,
    /// Checks that failed (storage errors); must stay 0.
    pub errors: u64,
    /// `remaining` reported by the last decision (the least of those at
    /// the last time).
    pub last_remaining: u32,
}

impl KeyStats {
    fn record(&mut self, at: u64, admitted: bool, remaining: u32) {
        if self.attempts == 0 || at < self.first_ns {
            self.first_ns = at;
        }
        self.last(at, remaining);
        self.attempts += 1;
        self.admitted += u64::from(admitted);
    }

    fn merge(&mut self, other: &KeyStats) {
        if other.attempts == 0 {
            return;
        }
        if self.attempts == 0 || other.first_ns < self.first_ns {
            self.first_ns = other.first_ns;
        }
        self.last(other.last_ns, other.last_remaining);
        self.attempts += other.attempts;
        self.admitted += other.admitted;
        self.errors += other.errors;
    }

    fn last(&mut self, at: u64, remaining: u32) {
        if at > self.last_ns || self.attempts == 0 {
            (self.last_ns, self.last_remaining) = (at, remaining);
        } else if at == self.last_ns {
            self.last_remaining = self.last_remaining.min(remaining);
        }
    }

    /// The time span of the key's decisions, as the storage saw it.
    pub fn span(&self) -> Duration {
        Duration::from_nanos(self.last_ns - self.first_ns)
    }

    /// `B + floor(span / I)`: the most GCRA may admit in the span, and what
    /// it admits when requests never pause longer than a full refill.
    pub fn bound(&self, quota: &Quota) -> u64 {
        let interval = quota.emission_interval_nanos();
        u64::from(quota.burst()) + (self.last_ns - self.first_ns) / interval
    }
}

/// The outcome of one run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The key all tasks share.
    pub shared: KeyStats,
    /// Each task's own key.
    pub own: Vec<KeyStats>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl Report {
    /// All checks made.
    pub fn total_attempts(&self) -> u64 {
        self.shared.attempts + self.own.iter().map(|k| k.attempts).sum::<u64>()
    }
}

/// The tiers of the scenario on `builder`'s storage and clock: one key
/// shared by all tasks in tier [`SHARED_TIER`], one key per task in tier
/// [`OWN_TIER`].
pub fn tiers(builder: tower_rate_tier::RateTierBuilder, shared: Quota, own: Quota) -> RateTier {
    builder.tier(SHARED_TIER, shared).tier(OWN_TIER, own).build()
}

/// Runs `hammer.tasks` tasks on the current (multi-threaded) runtime, each
/// alternating a cost-1 check of the shared key and of its own key until
/// `run_for` has passed and it made `min_attempts` checks of each.
pub async fn run(tiers: &RateTier, hammer: Hammer) -> Report {
    let started = Instant::now();
    let deadline = started + hammer.run_for;
    let mut handles = Vec::with_capacity(hammer.tasks);
    let barrier = Arc::new(tokio::sync::Barrier::new(hammer.tasks));
    for task in 0..hammer.tasks {
        let tiers = tiers.clone();
        let barrier = barrier.clone();
        handles.push(tokio::spawn(async move {
            let own_user = format!("own-{task}");
            let mut shared = KeyStats {
                user: "shared-user".into(),
                ..KeyStats::default()
            };
            let mut own = KeyStats {
                user: own_user.clone(),
                ..KeyStats::default()
            };
            barrier.wait().await;
            while Instant::now() < deadline || own.attempts < hammer.min_attempts {
                for (user, tier, stats) in [
                    ("shared-user", SHARED_TIER, &mut shared),
                    (own_user.as_str(), OWN_TIER, &mut own),
                ] {
                    match tiers.check(user, tier, 1).await {
                        Ok(Ok(info)) => stats.record(info.decided_at(), true, info.remaining),
                        Ok(Err(limited)) => stats.record(limited.decided_at(), false, limited.remaining),
                        Err(_) => stats.errors += 1,
                    }
                }
                tokio::task::yield_now().await;
            }
            (shared, own)
        }));
    }
    let mut shared = KeyStats {
        user: "shared-user".into(),
        ..KeyStats::default()
    };
    let mut own = Vec::with_capacity(hammer.tasks);
    for handle in handles {
        let (s, o) = handle.await.expect("a hammering task panicked");
        shared.merge(&s);
        own.push(o);
    }
    Report {
        shared,
        own,
        elapsed: started.elapsed(),
    }
}

/// One key of a run with real time.
#[derive(Debug, Clone)]
pub struct Row {
    /// The key's user id.
    pub user: String,
    /// Admitted checks.
    pub admitted: u64,
    /// What was left in the bucket at the last decision.
    pub left: u64,
    /// `B + floor(span / I)`.
    pub bound: u64,
    /// `bound - (admitted + left)`: tokens lost to the bucket sitting full.
    pub shortfall: u64,
}

/// The keys of a run with real time, the shared one first.
pub fn real_time_rows(report: &Report, shared: &Quota, own: &Quota) -> Vec<Row> {
    std::iter::once((&report.shared, shared))
        .chain(report.own.iter().map(|k| (k, own)))
        .map(|(k, q)| {
            let bound = k.bound(q);
            let left = u64::from(k.last_remaining);
            Row {
                user: k.user.clone(),
                admitted: k.admitted,
                left,
                bound,
                shortfall: bound.saturating_sub(k.admitted + left),
            }
        })
        .collect()
}

/// The stated margin of the lower bound: 2% of the bound, at least 2.
///
/// GCRA only loses tokens while a key's bucket is full and nobody asks,
/// which needs a pause longer than a full refill (`B · I`, 500 ms in the
/// scenario); the margin covers a loaded machine descheduling the tasks.
pub fn margin(bound: u64) -> u64 {
    (bound / 50).max(2)
}
