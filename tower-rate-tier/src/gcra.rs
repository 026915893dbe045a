//! The generic cell rate algorithm (GCRA), as pure arithmetic.
//!
//! The state of one band of one key is a single timestamp, the *theoretical
//! arrival time* (TAT): the time at which the band would be full again. With
//! emission interval `I` and burst `B`, the tolerance is `τ = I · B`. A request
//! of cost `c` at time `now` is admitted when
//!
//! ```text
//! max(TAT, now) + c · I − now ≤ τ
//! ```
//!
//! and then moves the TAT to `max(TAT, now) + c · I`. This module never sees a
//! storage or an HTTP request: the storages call [`decide`] and [`refund`]
//! under their own per-key atomicity (through
//! [`decide_bands`](crate::storage::decide_bands)).
//!
//! All intermediate arithmetic is done in `u128`, so no input (nanoseconds
//! near `u64::MAX`, day-long intervals, a cost near `u32::MAX`) can overflow.
//! A stored TAT more than one full refill ahead of `now` (the clock moved
//! backwards, or a foreign writer) is clamped to `now + τ`, and the clamped TAT
//! is written back whatever the outcome (see [`BandDecision::new_tat`]): a
//! clock that moves backwards never locks anyone out for longer than one full
//! refill.

use crate::clock::Nanos;
use crate::quota::Quota;

/// The state of one band after a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BandState {
    /// Cost units that could still be admitted right now.
    pub remaining: u32,
    /// Nanoseconds until the band is full again.
    pub reset_after_ns: u64,
    /// Nanoseconds until the request that was denied would be admitted; 0
    /// when it was admitted.
    pub retry_after_ns: u64,
    /// Nanoseconds until the band has more quota than now (`remaining`
    /// grows by one); 0 when the band is full (or unlimited). Computed with
    /// the quota that decided: a [`Fallback`](crate::storage::Fallback)'s
    /// local decision counts it from its share.
    pub more_after_ns: u64,
}

/// The time until a band with `used` of its tolerance taken has one more
/// unit than now: the part of `used` that is not a whole interval, or a
/// whole interval; 0 when nothing is used (the band is full). Any time unit,
/// as long as both are in it.
#[inline]
pub(crate) fn next_unit_after(used: u64, interval: u64) -> u64 {
    if used == 0 || interval == 0 {
        return 0;
    }
    match used % interval {
        0 => interval,
        part => part,
    }
}

/// The outcome of [`decide`] for one band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BandDecision {
    /// Whether this band admits the request.
    pub(crate) allowed: bool,
    /// The TAT to store, or `None` when nothing needs writing. When the
    /// request is admitted (by every band), the TAT after the charge. When the
    /// stored TAT was more than one full refill ahead of `now` (the clock
    /// moved backwards), the clamped TAT `now + τ`, also for a denied request
    /// or a peek: the reported state does not change, but writing it back is
    /// what bounds the lock-out to one full refill. Otherwise `None` for a
    /// denied request, a peek (cost 0) and an unlimited band.
    pub(crate) new_tat: Option<Nanos>,
    /// The band's state after the decision (after the charge when admitted,
    /// unchanged when denied).
    pub(crate) state: BandState,
}

fn sat_u64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

fn sat_u32(v: u128) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// `n / d` and `n % d` (`d > 0`), in `u64` when both fit: a `u128`
/// division is a library call several times slower, and this is on every
/// check.
#[inline]
fn div_rem(n: u128, d: u128) -> (u128, u128) {
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(n), Ok(d)) => (u128::from(n / d), u128::from(n % d)),
        _ => (n / d, n % d),
    }
}

/// Decides one band: may a request of `cost` pass at `now`, given the stored
/// TAT (`None` for a key never seen or expired)?
///
/// Cost 0 is a peek: always admitted, reports the state, writes nothing.
/// The arithmetic is in `u128`, so that no quota, time or cost overflows;
/// the division runs in `u64` whenever its operands fit.
#[inline]
pub(crate) fn decide(tat: Option<Nanos>, now: Nanos, quota: &Quota, cost: u32) -> BandDecision {
    if quota.is_unlimited() {
        return BandDecision {
            allowed: true,
            new_tat: None,
            state: BandState {
                remaining: u32::MAX,
                reset_after_ns: 0,
                retry_after_ns: 0,
                more_after_ns: 0,
            },
        };
    }
    let interval = u128::from(quota.emission_interval_nanos());
    let tolerance = interval * u128::from(quota.burst());
    let now_w = u128::from(now);
    let ceiling = now_w + tolerance;
    let stored = tat.map_or(now_w, u128::from);
    // Clamp into [now, now + τ]: an expired TAT is a fresh state, a TAT from
    // the future (backwards clock) is at worst an emptied burst, and is
    // written back clamped so that the clamp does not have to be repeated
    // until the clock has caught up.
    let clamped = (stored > ceiling).then(|| sat_u64(ceiling));
    let base = stored.max(now_w).min(ceiling);
    let used = base - now_w;
    let charged = used + interval * u128::from(cost);
    let allowed = charged <= tolerance;
    // The band's use after the decision: with the charge when admitted.
    let after = if allowed { charged } else { used };
    // What is left: whole units, and the part of one that is not free yet.
    let (remaining, part) = div_rem(tolerance - after, interval);
    let more_after = match (after, part) {
        (0, _) => 0,
        (_, 0) => interval,
        (_, part) => interval - part,
    };
    BandDecision {
        allowed,
        new_tat: if allowed && cost > 0 {
            Some(sat_u64(now_w + charged))
        } else {
            clamped
        },
        state: BandState {
            remaining: sat_u32(remaining),
            reset_after_ns: sat_u64(after),
            retry_after_ns: if allowed {
                0
            } else {
                sat_u64(charged - tolerance).max(1)
            },
            more_after_ns: sat_u64(more_after),
        },
    }
}

/// Gives `cost` units back to one band: the TAT after the refund, or `None`
/// when the band is back to a fresh state (nothing to keep). Never goes below
/// a fresh state.
pub(crate) fn refund(tat: Option<Nanos>, now: Nanos, quota: &Quota, cost: u32) -> Option<Nanos> {
    if quota.is_unlimited() {
        return None;
    }
    let tat = u128::from(tat?);
    let now_w = u128::from(now);
    let interval = u128::from(quota.emission_interval_nanos());
    let tolerance = interval * u128::from(quota.burst());
    let base = tat.min(now_w + tolerance);
    let back = base.saturating_sub(interval * u128::from(cost));
    (back > now_w).then(|| sat_u64(back))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// Decides and stores as a storage does: whatever `new_tat` says.
    fn run(q: &Quota, tat: &mut Option<Nanos>, now: Nanos, cost: u32) -> bool {
        let d = decide(*tat, now, q, cost);
        if let Some(t) = d.new_tat {
            *tat = Some(t);
        }
        d.allowed
    }

    #[test]
    fn burst_then_deny_then_exact_refill() {
        let q = Quota::per_minute(10); // one every 6 s
        let mut tat = None;
        let now = 1_000 * S;
        for i in 0..10 {
            let d = decide(tat, now, &q, 1);
            assert!(d.allowed, "request {i}");
            assert_eq!(d.state.remaining, 9 - i);
            tat = d.new_tat;
        }
        let denied = decide(tat, now, &q, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.state.retry_after_ns, 6 * S);
        assert_eq!(denied.state.reset_after_ns, 60 * S);
        // one nanosecond too early
        assert!(!run(&q, &mut tat, now + 6 * S - 1, 1));
        assert!(run(&q, &mut tat, now + 6 * S, 1));
        assert!(!run(&q, &mut tat, now + 6 * S, 1));
    }

    #[test]
    fn more_quota_is_one_interval_away_at_most() {
        let q = Quota::per_minute(5); // one every 12 s
        let mut tat = None;
        for i in 0..5 {
            let d = decide(tat, 0, &q, 1);
            assert!(d.allowed);
            assert_eq!(d.state.more_after_ns, 12 * S, "request {i}");
            tat = d.new_tat;
        }
        // 5 s later, spent: the next unit is 7 s away, the denial as long
        let d = decide(tat, 5 * S, &q, 1);
        assert!(!d.allowed);
        assert_eq!((d.state.more_after_ns, d.state.retry_after_ns), (7 * S, 7 * S));
        // a cost of 3 fits 31 s later
        assert_eq!(decide(tat, 5 * S, &q, 3).state.retry_after_ns, 31 * S);
        // a full band has nothing more to give
        assert_eq!(decide(None, 0, &q, 0).state.more_after_ns, 0);
        assert_eq!(decide(tat, 60 * S, &q, 0).state.more_after_ns, 0);
        // a peek reports the same
        assert_eq!(decide(tat, 5 * S, &q, 0).state.more_after_ns, 7 * S);
    }

    #[test]
    fn cost_n_and_peek() {
        let q = Quota::per_second(10);
        let mut tat = None;
        assert!(run(&q, &mut tat, 0, 7));
        let peek = decide(tat, 0, &q, 0);
        assert!(peek.allowed);
        assert_eq!(peek.new_tat, None);
        assert_eq!(peek.state.remaining, 3);
        assert!(!run(&q, &mut tat, 0, 4));
        assert!(run(&q, &mut tat, 0, 3));
        // peek of an exhausted band is still allowed and reports 0
        assert_eq!(decide(tat, 0, &q, 0).state.remaining, 0);
        assert!(decide(tat, 0, &q, 0).allowed);
    }

    #[test]
    fn cost_above_burst_never_passes() {
        let q = Quota::per_second(5);
        let d = decide(None, 0, &q, 6);
        assert!(!d.allowed);
        assert_eq!(d.state.remaining, 5);
    }

    #[test]
    fn backwards_clock_is_bounded_by_one_refill() {
        let q = Quota::per_second(10);
        let mut tat = None;
        let now = 10_000 * S;
        for _ in 0..10 {
            assert!(run(&q, &mut tat, now, 1));
        }
        // the clock jumps back an hour: still only one full refill away
        let back = now - 3_600 * S;
        let d = decide(tat, back, &q, 1);
        assert!(!d.allowed);
        assert_eq!(d.state.retry_after_ns, S / 10);
        // the denied request writes the clamped TAT back, nothing more
        assert_eq!(d.new_tat, Some(back + S));
        assert!(!run(&q, &mut tat, back, 1));
        assert!(!run(&q, &mut tat, back + S - 1, 10));
        assert!(run(&q, &mut tat, back + S, 10));
        // a peek clamps too
        let mut tat = Some(now + S);
        let peek = decide(tat, back, &q, 0);
        assert_eq!(
            (peek.allowed, peek.new_tat, peek.state.remaining),
            (true, Some(back + S), 0)
        );
        assert!(run(&q, &mut tat, back, 0));
        assert!(run(&q, &mut tat, back + S, 10));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let q = Quota::per_day(1).with_burst(u32::MAX);
        let d = decide(Some(u64::MAX), u64::MAX, &q, u32::MAX);
        assert!(d.allowed);
        assert_eq!(d.new_tat, Some(u64::MAX));
        let d = decide(Some(u64::MAX), u64::MAX - 5, &Quota::per_second(1), u32::MAX);
        assert!(!d.allowed);
        // 5 ns used, u32::MAX seconds asked, 1 s of tolerance
        assert_eq!(d.state.retry_after_ns, 5 + (u64::from(u32::MAX) - 1) * S);
        let q = Quota::per_second(u32::MAX);
        assert!(decide(None, u64::MAX, &q, u32::MAX).allowed);
        // a TAT far in the future is clamped to one refill before refunding
        assert_eq!(refund(Some(u64::MAX), 0, &q, u32::MAX), None);
        assert_eq!(refund(Some(u64::MAX), 0, &q, 1), Some(u64::from(u32::MAX) - 1));
    }

    #[test]
    fn refund_never_below_fresh() {
        let q = Quota::per_second(10);
        let mut tat = None;
        assert!(run(&q, &mut tat, 0, 5));
        let back = refund(tat, 0, &q, 2);
        assert_eq!(decide(back, 0, &q, 0).state.remaining, 7);
        assert_eq!(refund(back, 0, &q, 50), None);
        assert_eq!(refund(None, 0, &q, 1), None);
    }
}
