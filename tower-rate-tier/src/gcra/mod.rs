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
//! storage or an HTTP request: the storages call [`decide`], [`require`],
//! [`force`] and [`refund`] under their own per-key atomicity (through
//! [`decide_bands`](crate::storage::decide_bands)).
//!
//! The arithmetic runs in `u64` when the furthest time a decision can reach
//! (`now + I · (B + d + c)`, with the debt bound `d` below) fits in it, and
//! otherwise in `u128`, so no input (nanoseconds near `u64::MAX`, day-long
//! intervals, a cost near `u32::MAX`) can overflow; both run the same code.
//! A stored TAT more than one full refill ahead of `now` (the clock moved
//! backwards, or a foreign writer) is clamped to `now + τ`, and the clamped TAT
//! is written back whatever the outcome (see [`BandDecision::new_tat`]): a
//! clock that moves backwards never locks anyone out for longer than one full
//! refill.
//!
//! # Debt
//!
//! A band may be allowed `d` units of *debt*: its TAT may then lie up to
//! `d · I` beyond `now + τ`, and only a [`force`] puts it there (a charge
//! taken whatever is left, such as usage recorded after the fact). Every
//! function takes the band's debt bound `d` (0 for a band that is never in
//! debt) and clamps at `now + τ + d · I` instead of `now + τ`, so a band in
//! debt stays in debt until it is repaid at the band's rate. While in debt a
//! band has no unit to give: a charge or a [`require`] is refused until the
//! TAT is back within `now + τ − c · I`.

use crate::clock::Nanos;
use crate::quota::Quota;

/// The state of one band after a decision.
///
/// Built by the storages; outside this crate a value starts from
/// `BandState::default()` (the fields are public, the struct is
/// `#[non_exhaustive]` so that it can grow).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct BandState {
    /// Cost units that could still be admitted right now; 0 while the band
    /// is in debt.
    pub remaining: u32,
    /// Nanoseconds until the band is full again (beyond one full refill
    /// while the band is in debt).
    pub reset_after_ns: u64,
    /// Nanoseconds until the request that was denied would be admitted; 0
    /// when it was admitted.
    pub retry_after_ns: u64,
    /// Nanoseconds until the band has more quota than now (`remaining`
    /// grows by one; for a band in debt, until it has one unit again); 0
    /// when the band is full (or unlimited). Computed with the quota that
    /// decided: a [`Fallback`](crate::storage::Fallback)'s local decision
    /// counts it from its share.
    pub more_after_ns: u64,
    /// Nanoseconds the band is in debt: how far its TAT lies beyond a full
    /// refill from now (`reset_after_ns` minus the tolerance); 0 when it is
    /// not in debt. Only a forced charge
    /// ([`Amount::Force`](crate::storage::Amount::Force)) puts a band there.
    pub debt_ns: u64,
    /// Whole units of a forced charge that the band's debt bound did not
    /// take (forgiven, for the caller to report); 0 for any other amount, or
    /// when the whole charge was taken. For a unit's reservation admitted by
    /// a [`Fallback`](crate::storage::Fallback)'s local limiter, the units
    /// its share could not take (every band of the unit took the unit's
    /// smallest local burst): settle what was taken.
    pub forgiven: u32,
}

/// The time until a band with `used` of its tolerance taken has one more
/// unit than now: the part of `used` that is not a whole interval, or a
/// whole interval; 0 when nothing is used (the band is full). Any time unit,
/// as long as both are in it. Not for a band in debt (`used` beyond the
/// tolerance): that one has a unit again after its debt and one interval.
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
    /// stored TAT was beyond the band's bound (`now + τ`, plus its debt
    /// bound; the clock moved backwards), the clamped TAT, also for a denied
    /// request or a peek: the reported state does not change, but writing it
    /// back is what bounds the lock-out to one full refill (plus the debt).
    /// Otherwise `None` for a denied request, a peek (cost 0), a
    /// requirement and an unlimited band.
    pub(crate) new_tat: Option<Nanos>,
    /// The band's state after the decision (after the charge when admitted,
    /// unchanged when denied).
    pub(crate) state: BandState,
}

/// The integer the GCRA computes in: `u64` when every time a band's
/// decision can reach fits in it (every quota, time and cost a limiter
/// meets in practice), else `u128`, in which nothing overflows. One
/// algorithm ([`band_in`]) for both.
trait Width:
    Copy
    + Ord
    + From<u32>
    + From<u64>
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
{
    const ZERO: Self;
    /// `self / d` and `self % d` (`d > 0`).
    fn div_rem(self, d: Self) -> (Self, Self);
    fn sat_u64(self) -> u64;
    fn sat_u32(self) -> u32;
    fn saturating_sub(self, other: Self) -> Self;
}

impl Width for u64 {
    const ZERO: Self = 0;
    #[inline]
    fn div_rem(self, d: Self) -> (Self, Self) {
        (self / d, self % d)
    }
    #[inline]
    fn sat_u64(self) -> u64 {
        self
    }
    #[inline]
    fn sat_u32(self) -> u32 {
        u32::try_from(self).unwrap_or(u32::MAX)
    }
    #[inline]
    fn saturating_sub(self, other: Self) -> Self {
        u64::saturating_sub(self, other)
    }
}

impl Width for u128 {
    const ZERO: Self = 0;
    /// In `u64` when both fit: a `u128` division is a library call several
    /// times slower.
    #[inline]
    fn div_rem(self, d: Self) -> (Self, Self) {
        match (u64::try_from(self), u64::try_from(d)) {
            (Ok(n), Ok(d)) => (u128::from(n / d), u128::from(n % d)),
            _ => (self / d, self % d),
        }
    }
    #[inline]
    fn sat_u64(self) -> u64 {
        u64::try_from(self).unwrap_or(u64::MAX)
    }
    #[inline]
    fn sat_u32(self) -> u32 {
        u32::try_from(self).unwrap_or(u32::MAX)
    }
    #[inline]
    fn saturating_sub(self, other: Self) -> Self {
        u128::saturating_sub(self, other)
    }
}

/// What one band is asked for.
#[derive(Debug, Clone, Copy)]
enum Take {
    /// Admit when `n` units fit, and take them.
    Charge(u32),
    /// Admit when one unit fits; take nothing.
    Require,
    /// Take `n` units whatever is left, up to the debt bound; always admit.
    Force(u32),
}

/// An unlimited band's answer: always admitted, nothing stored.
const UNLIMITED: BandDecision = BandDecision {
    allowed: true,
    new_tat: None,
    state: BandState {
        remaining: u32::MAX,
        reset_after_ns: 0,
        retry_after_ns: 0,
        more_after_ns: 0,
        debt_ns: 0,
        forgiven: 0,
    },
};

/// Decides one band: may a request of `cost` pass at `now`, given the stored
/// TAT (`None` for a key never seen or expired)? The band is never in debt
/// (see [`decide_within`]).
///
/// Cost 0 is a peek: always admitted, reports the state, writes nothing.
/// No quota, time or cost overflows (see the [module docs](self)).
#[inline]
pub(crate) fn decide(tat: Option<Nanos>, now: Nanos, quota: &Quota, cost: u32) -> BandDecision {
    decide_within(tat, now, quota, cost, 0)
}

/// [`decide`] for a band allowed `debt` units of debt: its TAT is clamped at
/// `now + τ + debt · I`, so a band in debt stays in debt (and denies any
/// cost above 0 until it is repaid).
#[inline]
pub(crate) fn decide_within(
    tat: Option<Nanos>,
    now: Nanos,
    quota: &Quota,
    cost: u32,
    debt: u32,
) -> BandDecision {
    band(tat, now, quota, Take::Charge(cost), debt)
}

/// Whether the band has at least one unit (and so is not in debt), without
/// taking it: admitted as a charge of 1 would be, writing at most the clamp.
#[inline]
pub(crate) fn require(tat: Option<Nanos>, now: Nanos, quota: &Quota, debt: u32) -> BandDecision {
    band(tat, now, quota, Take::Require, debt)
}

/// Takes `units` whatever is left: the TAT becomes
/// `min(max(TAT, now) + units · I, now + τ + debt · I)`. Always admitted;
/// the whole units the bound did not take are the state's `forgiven`.
#[inline]
pub(crate) fn force(tat: Option<Nanos>, now: Nanos, quota: &Quota, units: u32, debt: u32) -> BandDecision {
    band(tat, now, quota, Take::Force(units), debt)
}

#[inline]
fn band(tat: Option<Nanos>, now: Nanos, quota: &Quota, take: Take, debt: u32) -> BandDecision {
    if quota.is_unlimited() {
        return UNLIMITED;
    }
    if fits_u64(now, quota, take, debt) {
        band_in::<u64>(tat, now, quota, take, debt)
    } else {
        band_in::<u128>(tat, now, quota, take, debt)
    }
}

/// Whether the furthest time a decision of `take` on a band allowed `debt`
/// units of debt can reach fits in `u64`: now, the band's bound (tolerance
/// and debt), and the amount asked beyond it. Every value [`band_in`]
/// computes is at most that time.
#[inline]
fn fits_u64(now: Nanos, quota: &Quota, take: Take, debt: u32) -> bool {
    let asked = match take {
        Take::Charge(n) | Take::Force(n) => n.max(1),
        Take::Require => 1,
    };
    let units = u64::from(quota.burst()) + u64::from(debt) + u64::from(asked);
    quota
        .emission_interval_nanos()
        .checked_mul(units)
        .and_then(|span| span.checked_add(now))
        .is_some()
}

/// [`band`] in the integer `W`, in which every time it reaches fits.
#[inline]
fn band_in<W: Width>(tat: Option<Nanos>, now: Nanos, quota: &Quota, take: Take, debt: u32) -> BandDecision {
    let interval = W::from(quota.emission_interval_nanos());
    let tolerance = interval * W::from(quota.burst());
    // The most of the band a TAT may use: the tolerance, and the debt.
    let bound = tolerance + interval * W::from(debt);
    let now_w = W::from(now);
    let ceiling = now_w + bound;
    let stored = tat.map_or(now_w, W::from);
    // Clamp into [now, now + bound]: an expired TAT is a fresh state, a TAT
    // from the future (backwards clock) is at worst an emptied burst (and
    // the allowed debt), and is written back clamped so that the clamp does
    // not have to be repeated until the clock has caught up.
    let clamped = (stored > ceiling).then(|| ceiling.sat_u64());
    let base = stored.max(now_w).min(ceiling);
    let used = base - now_w;
    // whether admitted, the use after, the wait of a denial, the units forgiven
    let (allowed, after, retry, forgiven) = match take {
        Take::Charge(cost) => {
            let charged = used + interval * W::from(cost);
            // a peek always admits, a band in debt included
            if charged <= tolerance || cost == 0 {
                (true, charged, W::ZERO, 0)
            } else {
                (false, used, charged - tolerance, 0)
            }
        }
        Take::Require => {
            let wanted = used + interval;
            if wanted <= tolerance {
                (true, used, W::ZERO, 0)
            } else {
                (false, used, wanted - tolerance, 0)
            }
        }
        Take::Force(units) => {
            let wanted = used + interval * W::from(units);
            if wanted <= bound {
                (true, wanted, W::ZERO, 0)
            } else {
                (
                    true,
                    bound,
                    W::ZERO,
                    (wanted - bound).div_rem(interval).0.sat_u32(),
                )
            }
        }
    };
    let new_tat = if after > used {
        Some((now_w + after).sat_u64())
    } else {
        clamped
    };
    // What is left: whole units, and the part of one that is not free yet.
    let (remaining, more_after) = if after > tolerance {
        (W::ZERO, after - tolerance + interval)
    } else {
        let (remaining, part) = (tolerance - after).div_rem(interval);
        let more_after = if after == W::ZERO {
            W::ZERO
        } else if part == W::ZERO {
            interval
        } else {
            interval - part
        };
        (remaining, more_after)
    };
    BandDecision {
        allowed,
        new_tat,
        state: BandState {
            remaining: remaining.sat_u32(),
            reset_after_ns: after.sat_u64(),
            retry_after_ns: if allowed { 0 } else { retry.sat_u64().max(1) },
            more_after_ns: more_after.sat_u64(),
            debt_ns: after.saturating_sub(tolerance).sat_u64(),
            forgiven,
        },
    }
}

/// Gives `cost` units back to one band allowed `debt` units of debt: the
/// TAT after the refund, or `None` when the band is back to a fresh state
/// (nothing to keep). Never goes below a fresh state.
pub(crate) fn refund(tat: Option<Nanos>, now: Nanos, quota: &Quota, cost: u32, debt: u32) -> Option<Nanos> {
    if quota.is_unlimited() {
        return None;
    }
    let tat = u128::from(tat?);
    let now_w = u128::from(now);
    let interval = u128::from(quota.emission_interval_nanos());
    let bound = interval * (u128::from(quota.burst()) + u128::from(debt));
    let base = tat.min(now_w + bound);
    let back = base.saturating_sub(interval * u128::from(cost));
    (back > now_w).then(|| back.sat_u64())
}

#[cfg(test)]
mod tests;
