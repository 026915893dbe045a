//! Usage of a unit under load: many tasks on a multi-threaded runtime make
//! requests of one user of a tier with a unit, and record what each
//! admitted request used (recorded after the fact, or reserved and then
//! settled), as an LLM gateway does with tokens.
//!
//! The storage under the limiter is wrapped in an [`Observed`], which keeps
//! what every decision reported of each band: the most debt seen, the units
//! forgiven, and the storage's times. From those and the tasks' own account
//! of what they recorded, the exactness of a unit band follows without any
//! assumption about timing:
//!
//! * **The debt stays within what was in flight.** A request is admitted
//!   only while the unit has a whole unit left (a reservation only when it
//!   fits), and each task has at most one admitted request whose usage is
//!   not yet recorded, of at most [`MOST_PER_REQUEST`] units. From the last
//!   instant the band was out of debt, only those requests can add to it:
//!   its debt never exceeds `tasks × MOST_PER_REQUEST` units, below the
//!   debt bound (one burst of the unit's smallest band, 1,000 here). So no
//!   usage is ever forgiven, and no forced charge is ever cut at the bound.
//! * **What was recorded is what the band took, within the real-time
//!   bound.** Every charge or forced charge moves the band's time of being
//!   full again (TAT) forward by its units (none is cut: see above), a
//!   refund moves it back by at most its units; so the TAT after the run is
//!   at least the first decision's time plus what the tasks recorded. The
//!   TAT is never more than a burst and the band's debt ahead of its
//!   decision's time. Hence, with `span` the storage's time between the
//!   first and last decision seen, `recorded ≤ B + (span + debt) / I`:
//!   never more than the quota's real-time allowance plus the debt, which
//!   is at most one burst.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tower_rate_tier::clock::Clock;
use tower_rate_tier::quota::Unit;
use tower_rate_tier::storage::{Decide, Decision, MAX_BANDS, Op, Storage, StorageKey};
use tower_rate_tier::{Quota, RateTier, RateTierBuilder};

/// The tier of the scenario.
pub const TIER: &str = "llm";
/// Its unit.
pub const UNIT: &str = "tokens";
/// The one user every task makes requests as.
pub const USER: &str = "gateway";
/// The most units one admitted request records (beyond its reservation,
/// when it made one).
pub const MOST_PER_REQUEST: u32 = 15;

/// The requests band: never the one that refuses.
pub const REQUESTS: Quota = Quota::per_minute(1_000_000);
/// The unit's bands for a run on real time: 1,000 a second (one unit a
/// millisecond, so that a run of half a second refills half a burst),
/// 50,000 an hour (one every 72 ms); intervals of whole microseconds, as
/// Redis counts them. The debt bound is the smallest burst, 1,000.
pub const TOKENS: [Quota; 2] = [Quota::per_second(1_000), Quota::per_hour(50_000)];

/// The unit's bands for a run whose clock stands still (a Redis storage
/// with a client clock): a Redis key expires on the server's real clock
/// when its band would be full again, so each unit lasts long enough here
/// (over a minute) that no key expires during a run; the smallest burst
/// is 1,000 too.
pub const SLOW_TOKENS: [Quota; 2] = [Quota::per_day(1_000), Quota::per_week(50_000)];

/// The scenario's tier with the unit's bands `tokens`, on `builder`'s
/// storage and clock.
pub fn tiers(builder: RateTierBuilder, tokens: [Quota; 2]) -> RateTier {
    builder.tier(TIER, REQUESTS).tier_unit(TIER, UNIT, tokens).build()
}

/// Every band of the tier as a decision names them: the requests band,
/// then the unit's bands `tokens` (each counting the unit).
pub fn bands(tokens: [Quota; 2]) -> Vec<Quota> {
    let unit = Unit::new(UNIT).expect("a valid unit name");
    std::iter::once(REQUESTS)
        .chain(tokens.iter().map(|q| q.in_unit(unit)))
        .collect()
}

/// What every decision of a storage reported, per band (in the tier's
/// band order).
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Decisions seen.
    pub decisions: u64,
    /// The storage's earliest and latest decision times.
    pub first_ns: u64,
    /// See `first_ns`.
    pub last_ns: u64,
    /// The most debt each band was reported in.
    pub max_debt_ns: [u64; MAX_BANDS],
    /// The units each band forgave, summed.
    pub forgiven: [u64; MAX_BANDS],
}

impl Seen {
    fn observe(&mut self, decision: &Decision) {
        if self.decisions == 0 || decision.now < self.first_ns {
            self.first_ns = decision.now;
        }
        self.last_ns = self.last_ns.max(decision.now);
        self.decisions += 1;
        for (i, band) in decision.bands.iter().enumerate() {
            self.max_debt_ns[i] = self.max_debt_ns[i].max(band.debt_ns);
            self.forgiven[i] += u64::from(band.forgiven);
        }
    }

    /// The storage's time between the first and the last decision seen.
    pub fn span_ns(&self) -> u64 {
        self.last_ns - self.first_ns
    }

    /// `B + (span + debt) / I` for band `band` of quota `quota`: the most
    /// its decisions can have taken (see the module documentation).
    pub fn bound(&self, band: usize, quota: &Quota) -> u64 {
        let interval = quota.emission_interval_nanos();
        u64::from(quota.burst()) + (self.span_ns() + self.max_debt_ns[band]) / interval
    }
}

/// A storage that passes every decision to `inner` and keeps what the
/// answers reported ([`Seen`]).
#[derive(Debug, Clone)]
pub struct Observed<S> {
    inner: S,
    seen: Arc<Mutex<Seen>>,
}

impl<S> Observed<S> {
    /// Observes `inner`.
    pub fn new(inner: S) -> Self {
        Observed {
            inner,
            seen: Arc::default(),
        }
    }

    /// What was seen so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The observed storage.
    pub fn inner_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Storage> Storage for Observed<S> {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        let seen = self.seen.clone();
        self.inner.decide(key, bands, op, clock).map(move |decided| {
            if let Ok(decision) = &decided {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .observe(decision);
            }
            decided
        })
    }
}

/// What the tasks saw and did.
#[derive(Debug, Default)]
pub struct Usage {
    /// Requests made.
    pub requests: AtomicU64,
    /// Requests admitted.
    pub admitted: AtomicU64,
    /// Requests refused, naming the unit.
    pub refused_by_unit: AtomicU64,
    /// Reservations refused (nothing recorded for those requests).
    pub refused_reservations: AtomicU64,
    /// Units recorded: each record's units, and each settled reservation's
    /// usage (what it reserved, less what came back, plus what it forced).
    pub recorded: AtomicU64,
    /// Failed calls; must stay 0.
    pub errors: AtomicU64,
}

impl Usage {
    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The units request `round` of task `task` uses, 1 to
/// [`MOST_PER_REQUEST`], and what it reserves first (0: no reservation, it
/// records after the fact).
fn usage_of(task: usize, round: usize) -> (u32, u32) {
    let used = 1 + ((task * 7 + round * 13) % MOST_PER_REQUEST as usize) as u32;
    let reserved = if (task + round).is_multiple_of(2) {
        0
    } else {
        1 + ((task * 5 + round * 3) % MOST_PER_REQUEST as usize) as u32
    };
    (used, reserved)
}

/// Runs `tasks` tasks on the current runtime, each making requests until
/// `run_for` has passed and it made `min_rounds`: each request is admitted
/// or refused, and an admitted one records its usage (half of them
/// through a reservation settled afterwards).
pub async fn run(tiers: &RateTier, tasks: usize, run_for: Duration, min_rounds: usize) -> Arc<Usage> {
    let usage = Arc::new(Usage::default());
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
    let deadline = Instant::now() + run_for;
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let (tiers, usage, barrier) = (tiers.clone(), usage.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut round = 0;
            while round < min_rounds || Instant::now() < deadline {
                request(&tiers, &usage, usage_of(task, round)).await;
                round += 1;
                tokio::task::yield_now().await;
            }
        }));
    }
    for handle in handles {
        handle.await.expect("a task panicked");
    }
    usage
}

/// One request: admitted or not, and its usage recorded.
async fn request(tiers: &RateTier, usage: &Usage, (used, reserved): (u32, u32)) {
    let count = |counter: &AtomicU64, n: u32| counter.fetch_add(u64::from(n), Ordering::Relaxed);
    count(&usage.requests, 1);
    match tiers.check(USER, TIER, 1).await {
        Ok(Ok(_)) => count(&usage.admitted, 1),
        Ok(Err(refused)) => {
            let by_unit = refused.violated_policies().any(|p| p.contains(UNIT));
            count(&usage.refused_by_unit, u32::from(by_unit));
            return;
        }
        Err(_) => {
            count(&usage.errors, 1);
            return;
        }
    };
    let recorded = if reserved == 0 {
        tiers.record(USER, TIER, UNIT, used).await
    } else {
        match tiers.reserve(USER, TIER, UNIT, reserved).await {
            Ok(Ok(_)) => tiers.settle(USER, TIER, UNIT, reserved, used).await,
            Ok(Err(_)) => {
                count(&usage.refused_reservations, 1);
                return;
            }
            Err(e) => Err(e),
        }
    };
    match recorded {
        Ok(()) => count(&usage.recorded, used),
        Err(_) => count(&usage.errors, 1),
    };
}
