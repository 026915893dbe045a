//! The GCRA, through `RateTier::check` on `MemoryStorage` with a `FakeClock`,
//! against reference models with exact integer arithmetic.
//!
//! 1. A token bucket per band, with tokens kept as `tokens × I` nanoseconds
//!    (`I` the quota's effective emission interval), capacity `burst × I`,
//!    refilled by elapsed nanoseconds, admitting a cost `c` when it holds
//!    `c × I`. Checked in both directions: the GCRA admits exactly what the
//!    model admits, reports `remaining = floor(tokens)` and the exact reset and
//!    retry times, and a request denied by one band consumes nothing anywhere.
//! 2. The nominal rate, as an exact rational (`n` per period, burst `b`):
//!    everything the GCRA admitted conforms to it, so rounding the interval
//!    never over-admits.
//!
//! 2,000 cases of up to 64 requests each, over 1 to 3 bands.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::MemoryStorage;
use tower_rate_tier::{CheckError, Quota, RateTier};

const CASES: u32 = 2_000;
const SEC: u64 = 1_000_000_000;

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a check on MemoryStorage did not complete at once"),
    }
}

/// A quota and what it nominally says: `n` per `period_ns`, burst `burst`.
#[derive(Debug, Clone, Copy)]
struct Spec {
    quota: Quota,
    n: u32,
    period_ns: u64,
    burst: u32,
}

fn spec() -> impl Strategy<Value = Spec> {
    let n = prop_oneof![
        4 => 1u32..=12,
        2 => Just(3u32),
        2 => Just(7u32),
        1 => 13u32..=1_000,
        // finer than one per nanosecond: clamped to 1 ns
        1 => Just(3_000_000_000u32),
    ];
    let burst = prop_oneof![2 => Just(None), 1 => (1u32..=25).prop_map(Some)];
    (0..4usize, n, burst).prop_map(|(period, n, burst)| {
        let (quota, period_ns) = match period {
            0 => (Quota::per_second(n), SEC),
            1 => (Quota::per_minute(n), 60 * SEC),
            2 => (Quota::per_hour(n), 3_600 * SEC),
            _ => (Quota::per_day(n), 86_400 * SEC),
        };
        // Keep costs meaningful: a huge default burst gets an explicit one.
        let burst = burst.or((n > 1_000).then_some(40));
        let quota = burst.map_or(quota, |b| quota.with_burst(b));
        Spec {
            quota,
            n,
            period_ns,
            burst: quota.burst(),
        }
    })
}

/// One request: how far the clock moves first, and what it costs.
#[derive(Debug, Clone, Copy)]
struct Op {
    wait: Wait,
    cost: CostPick,
}

#[derive(Debug, Clone, Copy)]
enum Wait {
    None,
    Nanos(u64),
    /// A fraction of one band's full refill, `parts / 1024`.
    OfRefill {
        band: usize,
        parts: u64,
    },
    /// Exactly `k` intervals of one band, minus `short` ns.
    Intervals {
        band: usize,
        k: u64,
        short: u64,
    },
}

#[derive(Debug, Clone, Copy)]
enum CostPick {
    /// `raw % (max_cost + 1)`: within what can pass.
    Within(u32),
    /// Above the smallest burst.
    Above(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let wait = prop_oneof![
        3 => Just(Wait::None),
        2 => (0u64..2_000).prop_map(Wait::Nanos),
        4 => (0usize..3, 0u64..=2_048).prop_map(|(band, parts)| Wait::OfRefill { band, parts }),
        3 => (0usize..3, 0u64..=3, 0u64..=1).prop_map(|(band, k, short)| Wait::Intervals { band, k, short }),
    ];
    let cost = prop_oneof![
        12 => any::<u32>().prop_map(CostPick::Within),
        1 => (1u32..=3).prop_map(CostPick::Above),
    ];
    (wait, cost).prop_map(|(wait, cost)| Op { wait, cost })
}

/// Band `k`'s token bucket, in nanoseconds of `tokens × I`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    interval: u128,
    capacity: u128,
    level: u128,
}

impl Bucket {
    fn new(q: &Quota) -> Self {
        let interval = u128::from(q.emission_interval_nanos());
        let capacity = interval * u128::from(q.burst());
        Bucket {
            interval,
            capacity,
            level: capacity,
        }
    }
    fn refill(&mut self, ns: u64) {
        self.level = (self.level + u128::from(ns)).min(self.capacity);
    }
    fn admits(&self, cost: u32) -> bool {
        self.level >= u128::from(cost) * self.interval
    }
    fn remaining(&self) -> u32 {
        u32::try_from(self.level / self.interval).unwrap()
    }
    fn reset_after_ns(&self) -> u64 {
        u64::try_from(self.capacity - self.level).unwrap()
    }
    /// Until the bucket holds one more whole token (0 when full).
    fn next_token_ns(&self) -> u64 {
        if self.level == self.capacity {
            return 0;
        }
        u64::try_from(self.interval - self.level % self.interval).unwrap()
    }
    fn retry_after_ns(&self, cost: u32) -> u64 {
        u64::try_from((u128::from(cost) * self.interval).saturating_sub(self.level)).unwrap()
    }
}

/// The nominal rate exactly: level in units of `tokens × period`, refilled
/// `n` per nanosecond, capacity `burst × period`.
#[derive(Debug, Clone, Copy)]
struct Nominal {
    n: u128,
    period: u128,
    capacity: u128,
    level: u128,
}

impl Nominal {
    fn new(s: &Spec) -> Self {
        let period = u128::from(s.period_ns);
        let capacity = u128::from(s.burst) * period;
        Nominal {
            n: u128::from(s.n),
            period,
            capacity,
            level: capacity,
        }
    }
    fn refill(&mut self, ns: u64) {
        self.level = (self.level + u128::from(ns) * self.n).min(self.capacity);
    }
    /// Takes `cost`; false if the nominal rate does not allow it.
    fn take(&mut self, cost: u32) -> bool {
        let need = u128::from(cost) * self.period;
        if self.level < need {
            return false;
        }
        self.level -= need;
        true
    }
}

fn wait_ns(wait: Wait, specs: &[Spec]) -> u64 {
    match wait {
        Wait::None => 0,
        Wait::Nanos(ns) => ns,
        Wait::OfRefill { band, parts } => {
            let q = specs[band % specs.len()].quota;
            u64::try_from(u128::from(q.refill_nanos()) * u128::from(parts) / 1024).unwrap()
        }
        Wait::Intervals { band, k, short } => {
            let q = specs[band % specs.len()].quota;
            (q.emission_interval_nanos() * k).saturating_sub(short)
        }
    }
}

fn run_case(specs: &[Spec], ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = FakeClock::new();
    let quotas: Vec<Quota> = specs.iter().map(|s| s.quota).collect();
    let t = RateTier::builder()
        .tier("t", quotas.clone())
        .clock(clock.clone())
        .storage(MemoryStorage::new())
        .build();
    let max_cost = specs.iter().map(|s| s.burst).min().unwrap();
    let mut model: Vec<Bucket> = quotas.iter().map(Bucket::new).collect();
    let mut nominal: Vec<Nominal> = specs.iter().map(Nominal::new).collect();

    for (step, op) in ops.iter().enumerate() {
        let ns = wait_ns(op.wait, specs);
        clock.advance(Duration::from_nanos(ns));
        model.iter_mut().for_each(|b| b.refill(ns));
        nominal.iter_mut().for_each(|b| b.refill(ns));
        let cost = match op.cost {
            CostPick::Within(raw) => raw % (max_cost + 1),
            CostPick::Above(extra) => max_cost + extra,
        };

        let got = ready(t.check("user", "t", cost));
        if cost > max_cost {
            match got {
                Err(CheckError::CostExceedsLimit { cost: c, limit, .. }) => {
                    prop_assert_eq!((c, limit), (cost, max_cost));
                }
                other => prop_assert!(
                    false,
                    "step {}: cost {} above the burst gave {:?}",
                    step,
                    cost,
                    other
                ),
            }
            continue;
        }
        let model_admits = model.iter().all(|b| b.admits(cost));
        let got = got.map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
        prop_assert_eq!(
            got.is_ok(),
            model_admits,
            "step {}: cost {} at +{} ns: GCRA {:?}, model {:?}",
            step,
            cost,
            ns,
            got,
            model
        );
        if model_admits {
            for b in &mut model {
                b.level -= u128::from(cost) * b.interval;
            }
            for (k, nom) in nominal.iter_mut().enumerate() {
                prop_assert!(
                    nom.take(cost),
                    "step {}: band {} admitted cost {} beyond the nominal rate of {:?}",
                    step,
                    k,
                    cost,
                    specs[k]
                );
            }
        }

        // Every band's reported state is the model's, after the charge (or
        // unchanged when denied: nothing was consumed anywhere).
        let (bands, remaining, reset_after, limit) = match &got {
            Ok(info) => (
                info.bands().collect::<Vec<_>>(),
                info.remaining,
                info.reset_after,
                info.limit,
            ),
            Err(l) => (l.bands().collect::<Vec<_>>(), l.remaining, l.reset_after, l.limit),
        };
        prop_assert_eq!(bands.len(), model.len());
        for (k, ((q, state), b)) in bands.iter().zip(&model).enumerate() {
            prop_assert_eq!(*q, quotas[k]);
            prop_assert_eq!(
                state.remaining,
                b.remaining(),
                "step {} band {} remaining",
                step,
                k
            );
            prop_assert_eq!(
                state.reset_after_ns,
                b.reset_after_ns(),
                "step {} band {} reset",
                step,
                k
            );
            prop_assert_eq!(
                state.more_after_ns,
                b.next_token_ns(),
                "step {} band {} more quota after",
                step,
                k
            );
            let retry = if model_admits || b.admits(cost) {
                0
            } else {
                b.retry_after_ns(cost)
            };
            prop_assert_eq!(state.retry_after_ns, retry, "step {} band {} retry", step, k);
        }
        // The reported band: closest to denying (admitted), or the one that
        // denies longest (denied).
        let reported: Vec<usize> = if model_admits {
            let min = model.iter().map(Bucket::remaining).min().unwrap();
            let at_min = |b: &&Bucket| b.remaining() == min;
            let max_reset = model
                .iter()
                .filter(at_min)
                .map(Bucket::reset_after_ns)
                .max()
                .unwrap();
            (0..model.len())
                .filter(|&k| model[k].remaining() == min && model[k].reset_after_ns() == max_reset)
                .collect()
        } else {
            let retry = |b: &Bucket| if b.admits(cost) { 0 } else { b.retry_after_ns(cost) };
            let max = model.iter().map(retry).max().unwrap();
            prop_assert_eq!(got.as_ref().unwrap_err().retry_after, Duration::from_nanos(max));
            (0..model.len()).filter(|&k| retry(&model[k]) == max).collect()
        };
        prop_assert!(
            reported.iter().any(|&k| {
                let b = &model[k];
                (limit, remaining, reset_after)
                    == (
                        quotas[k].burst(),
                        b.remaining(),
                        Duration::from_nanos(b.reset_after_ns()),
                    )
            }),
            "step {}: reported ({}, {}, {:?}) is not one of bands {:?}",
            step,
            limit,
            remaining,
            reset_after,
            reported
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn gcra_matches_the_token_bucket_model_and_never_exceeds_the_nominal_rate(
        specs in prop::collection::vec(spec(), 1..=3),
        ops in prop::collection::vec(op(), 1..=64),
    ) {
        run_case(&specs, &ops)?;
    }
}

/// The model and the nominal-rate check do catch an over-admitting limiter:
/// a quota whose interval were rounded down would be refused by them.
#[test]
fn the_nominal_model_refuses_over_admission() {
    let s = Spec {
        quota: Quota::per_second(3),
        n: 3,
        period_ns: SEC,
        burst: 3,
    };
    let mut nominal = Nominal::new(&s);
    assert!(nominal.take(3));
    // 333,333,333 ns (rounded down) is not enough for one more at 3/s ...
    nominal.refill(333_333_333);
    assert!(!nominal.take(1));
    // ... the rounded-up interval is.
    nominal.refill(1);
    assert!(nominal.take(1));
}

// ---------------------------------------------------------------------------
// 3. Amounts per band with debt (`storage::Op::Each`), through
//    `MemoryStorage`, against a token bucket whose level may go below zero
//    down to `-debt × I` (the band's debt bound) and only by a forced
//    charge.

use std::sync::Arc;
use tower_rate_tier::clock::Clock;
use tower_rate_tier::storage::{Amount, Amounts, Op as StorageOp, Storage, StorageKey};

/// A band's bucket with debt: `level` in nanoseconds of `tokens × I`,
/// between `-floor` and `capacity`.
#[derive(Debug, Clone, Copy)]
struct DebtBucket {
    interval: i128,
    capacity: i128,
    floor: i128,
    level: i128,
}

impl DebtBucket {
    fn new(q: &Quota, debt: u32) -> Self {
        let interval = i128::from(q.emission_interval_nanos());
        let capacity = interval * i128::from(q.burst());
        DebtBucket {
            interval,
            capacity,
            floor: interval * i128::from(debt),
            level: capacity,
        }
    }

    fn refill(&mut self, ns: u64) {
        self.level = (self.level + i128::from(ns)).min(self.capacity);
    }

    /// Whether `amount` is admitted here.
    fn admits(&self, amount: Amount) -> bool {
        match amount {
            Amount::Charge(0) => true,
            Amount::Charge(n) => self.level >= self.interval * i128::from(n),
            Amount::Require => self.level >= self.interval,
            _ => true,
        }
    }

    /// Applies an admitted `amount`; the units forgiven.
    fn apply(&mut self, amount: Amount) -> u32 {
        match amount {
            Amount::Charge(n) => self.level -= self.interval * i128::from(n),
            Amount::Refund(n) => self.level = (self.level + self.interval * i128::from(n)).min(self.capacity),
            Amount::Force(n) => {
                let wanted = self.level - self.interval * i128::from(n);
                self.level = wanted.max(-self.floor);
                return u32::try_from((self.level - wanted) / self.interval).unwrap();
            }
            _ => {}
        }
        0
    }

    fn remaining(&self) -> u32 {
        u32::try_from(self.level.max(0) / self.interval).unwrap()
    }

    fn debt_ns(&self) -> u64 {
        u64::try_from((-self.level).max(0)).unwrap()
    }
}

fn amount() -> impl Strategy<Value = Amount> {
    prop_oneof![
        3 => (0u32..4).prop_map(Amount::Charge),
        3 => Just(Amount::Require),
        3 => (0u32..60).prop_map(Amount::Force),
        1 => (0u32..20).prop_map(Amount::Refund),
    ]
}

/// Bands with their debt bounds, and steps: a wait, then one amount per band.
type DebtCase = (Vec<(Spec, u32)>, Vec<(u64, Vec<Amount>)>);

fn debt_case() -> impl Strategy<Value = DebtCase> {
    prop::collection::vec((spec(), 0u32..30), 1..=3).prop_flat_map(|bands| {
        let n = bands.len();
        let refill = bands
            .iter()
            .map(|(s, _)| s.quota.refill_nanos())
            .max()
            .unwrap_or(1);
        let step = (
            prop_oneof![2 => Just(0u64), 3 => 0..=refill / 4],
            prop::collection::vec(amount(), n),
        );
        (Just(bands), prop::collection::vec(step, 1..48))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES / 2))]

    /// Every decision is all or nothing, admitted exactly when every charge
    /// fits and every requirement holds, a debt never goes beyond its bound
    /// nor is wiped by a later decision, and each band reports the model's
    /// remaining units, debt and forgiven units.
    #[test]
    fn amounts_per_band_match_a_token_bucket_with_bounded_debt((bands, steps) in debt_case()) {
        let clock = FakeClock::new();
        let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let storage = MemoryStorage::new();
        let quotas: Vec<Quota> = bands.iter().map(|(s, _)| s.quota).collect();
        let mut model: Vec<DebtBucket> = bands.iter().map(|(s, d)| DebtBucket::new(&s.quota, *d)).collect();
        let key = StorageKey { namespace: "", tier: "units", user: "u" };
        for (wait, amounts) in &steps {
            clock.advance(Duration::from_nanos(*wait));
            model.iter_mut().for_each(|b| b.refill(*wait));
            let mut each = Amounts::new();
            for (amount, (_, debt)) in amounts.iter().zip(&bands) {
                each = each.with_debt(*amount, *debt);
            }
            let d = ready(storage.decide(key, &quotas, StorageOp::Each(each), &dyn_clock)).unwrap();
            let admits = model.iter().zip(amounts).all(|(b, a)| b.admits(*a));
            prop_assert_eq!(d.allowed, admits, "{:?}", amounts);
            for (i, (bucket, amount)) in model.iter_mut().zip(amounts).enumerate() {
                let forgiven = if admits { bucket.apply(*amount) } else { 0 };
                let state = d.bands[i];
                prop_assert_eq!(state.remaining, bucket.remaining(), "band {}", i);
                prop_assert_eq!(state.debt_ns, bucket.debt_ns(), "band {}", i);
                prop_assert_eq!(state.forgiven, forgiven, "band {}", i);
                prop_assert_eq!(
                    u128::try_from(bucket.capacity - bucket.level).unwrap(),
                    u128::from(state.reset_after_ns),
                    "band {}", i
                );
            }
        }
    }
}
