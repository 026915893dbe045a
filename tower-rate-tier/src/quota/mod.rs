//! Quotas: how many requests, how fast, and how many at once.
//!
//! A [`Quota`] is `n` requests per period with a burst (by default `n`). From a
//! fresh state exactly `burst` requests of cost 1 pass at once; after that one
//! more passes every *emission interval* (`period / n`).
//!
//! ```
//! use std::time::Duration;
//! use tower_rate_tier::Quota;
//!
//! let q = Quota::per_minute(10);
//! assert_eq!(q.burst(), 10);
//! assert_eq!(q.emission_interval(), Duration::from_secs(6));
//! assert_eq!(Quota::per_hour(5_000).with_burst(200).burst(), 200);
//! assert!(Quota::unlimited().is_unlimited());
//! assert_eq!(Quota::per_week(7), Quota::per_day(1).with_burst(7));
//! let fortnight = Quota::per_period(14, Duration::from_secs(14 * 86_400));
//! assert_eq!(fortnight.emission_interval(), Duration::from_secs(86_400));
//! ```
//!
//! # Long periods refill continuously
//!
//! The GCRA has no windows that reset: a quota of 3,000 per 30 days admits
//! 3,000 requests at once and then one more every 864 s (30 days / 3,000),
//! so a client that used its burst on the 1st gets requests back through the
//! month rather than all on the 31st. A 30-day quota is not a calendar month;
//! the period is a fixed [`Duration`] (no month lengths, time zones or leap
//! seconds).
//!
//! # Values from configuration
//!
//! The `per_*` constructors are `const fn` and panic on a zero count. For
//! values read at run time, the `try_*` twins ([`Quota::try_per_period`],
//! [`Quota::try_per_hour`], [`Quota::try_with_burst`], ..) return a
//! [`QuotaError`] instead, and also refuse a rate finer than one request per
//! microsecond, which the Redis storage cannot count.
//!
//! # Rounding
//!
//! Time is kept in nanoseconds. A period that does not divide evenly by `n`
//! gives an emission interval rounded *up*, so a quota never admits more than
//! it says: `Quota::per_second(3)` admits one request every 333,333,334 ns.
//! A rate finer than one request per nanosecond (`per_second(n)` with
//! `n > 1_000_000_000`, or a `per_period` as fine) is clamped to one per
//! nanosecond. The Redis storage keeps microseconds and rounds the interval
//! up to a whole microsecond in the same way (at most 1,000,000 requests per
//! second per key there).

use std::time::Duration;

mod checked;
mod unit;

pub use checked::QuotaError;
pub use unit::{CONTENT_BYTES, MAX_UNIT_LEN, Unit, UnitError};

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A rate limit: `n` requests per period, with a burst.
///
/// See the [module documentation](self) for the semantics and the rounding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Quota {
    /// Nanoseconds between two requests at the sustained rate; 0 = unlimited.
    interval_ns: u64,
    /// How many cost units a fresh state admits at once; 0 = unlimited.
    burst: u32,
    /// What it counts: requests, or a named unit's band of a tier.
    unit: Unit,
}

impl Quota {
    const fn per_period_ns(n: u32, period_ns: u64, what: &'static str) -> Quota {
        if n == 0 {
            // `what` names the constructor; const fn panics need a literal.
            let _ = what;
            panic!(
                "a quota needs a non-zero request count (Quota::per_*(0) admits nothing; use a tier that denies instead)"
            );
        }
        let n64 = n as u64;
        // Round up so the quota never over-admits; at least 1 ns.
        let mut interval_ns = period_ns.div_ceil(n64);
        if interval_ns == 0 {
            interval_ns = 1;
        }
        Quota {
            interval_ns,
            burst: n,
            unit: Unit::REQUESTS,
        }
    }

    /// `n` requests per second, burst `n`. Panics if `n` is 0.
    pub const fn per_second(n: u32) -> Quota {
        Quota::per_period_ns(n, NANOS_PER_SEC, "per_second")
    }

    /// `n` requests per minute, burst `n`. Panics if `n` is 0.
    pub const fn per_minute(n: u32) -> Quota {
        Quota::per_period_ns(n, 60 * NANOS_PER_SEC, "per_minute")
    }

    /// `n` requests per hour, burst `n`. Panics if `n` is 0.
    pub const fn per_hour(n: u32) -> Quota {
        Quota::per_period_ns(n, 3_600 * NANOS_PER_SEC, "per_hour")
    }

    /// `n` requests per day, burst `n`. Panics if `n` is 0.
    pub const fn per_day(n: u32) -> Quota {
        Quota::per_period_ns(n, 86_400 * NANOS_PER_SEC, "per_day")
    }

    /// `n` requests per week (7 days), burst `n`. Panics if `n` is 0.
    pub const fn per_week(n: u32) -> Quota {
        Quota::per_period_ns(n, 7 * 86_400 * NANOS_PER_SEC, "per_week")
    }

    /// `n` requests per `period`, burst `n`: any period from a nanosecond to
    /// about 584 years in memory; Redis counts a band's full refill in
    /// microseconds up to 2^51 (about 71 years), and cuts a longer one to
    /// that (it refills sooner, and holds fewer than `n` at once).
    ///
    /// The bucket refills continuously (see the [module documentation](self)):
    /// `Quota::per_period(3_000, Duration::from_secs(30 * 86_400))` admits
    /// 3,000 requests at once and then one more every 864 s, whatever the
    /// calendar says; it is not a quota that resets on the first of the
    /// month.
    ///
    /// Panics if `n` or `period` is zero, or if `period` is longer than
    /// `u64::MAX` nanoseconds. For values read from configuration, use
    /// [`Quota::try_per_period`], which returns these as a [`QuotaError`].
    pub const fn per_period(n: u32, period: Duration) -> Quota {
        match Quota::checked(n, period) {
            Ok(quota) => quota,
            Err(QuotaError::ZeroCount) => panic!(
                "a quota needs a non-zero request count (Quota::per_period(0, ..) admits nothing; use a tier that denies instead)"
            ),
            Err(QuotaError::ZeroPeriod) => {
                panic!("a quota needs a non-zero period (Quota::per_period(n, Duration::ZERO))")
            }
            Err(_) => panic!("a quota's period must fit in u64 nanoseconds (about 584 years)"),
        }
    }

    /// `n` per `period` with the checks every constructor shares; the
    /// interval is clamped to 1 ns like [`Quota::per_second`]'s.
    const fn checked(n: u32, period: Duration) -> Result<Quota, QuotaError> {
        if n == 0 {
            return Err(QuotaError::ZeroCount);
        }
        if period.is_zero() {
            return Err(QuotaError::ZeroPeriod);
        }
        let period_ns = period.as_nanos();
        if period_ns > u64::MAX as u128 {
            return Err(QuotaError::PeriodTooLong { period });
        }
        Ok(Quota::per_period_ns(n, period_ns as u64, "per_period"))
    }

    /// A quota with no limit: requests are never counted or denied, and
    /// responses carry no rate-limit headers.
    pub const fn unlimited() -> Quota {
        Quota {
            interval_ns: 0,
            burst: 0,
            unit: Unit::REQUESTS,
        }
    }

    /// The same sustained rate with another burst. Panics if `burst` is 0.
    /// An unlimited quota stays unlimited.
    ///
    /// Keep a burst's full refill (`burst` emission intervals) within a few
    /// centuries: the memory storage keeps a band's state in `u64`
    /// nanoseconds since the Unix epoch (until the year 2554), and a band
    /// spent further than that saturates there and looks refilled sooner
    /// than it is (one a week with a burst of 100,000, 1,917 years, does);
    /// Redis caps a band's span at 2^51 µs (71 years).
    pub const fn with_burst(self, burst: u32) -> Quota {
        if burst == 0 {
            panic!("a quota needs a non-zero burst (with_burst(0) admits nothing)");
        }
        if self.is_unlimited() {
            return self;
        }
        Quota {
            interval_ns: self.interval_ns,
            burst,
            unit: self.unit,
        }
    }

    /// What the quota counts: [`Unit::REQUESTS`], or the named unit of a
    /// tier's unit band
    /// ([`RateTierBuilder::tier_unit`](crate::RateTierBuilder::tier_unit)).
    pub const fn unit(&self) -> Unit {
        self.unit
    }

    /// The same quota counting `unit`.
    pub const fn in_unit(mut self, unit: Unit) -> Quota {
        self.unit = unit;
        self
    }

    /// Whether this is [`Quota::unlimited`].
    pub const fn is_unlimited(&self) -> bool {
        self.burst == 0
    }

    /// How many cost units a fresh state admits at once (0 when unlimited).
    pub const fn burst(&self) -> u32 {
        self.burst
    }

    /// The time between two requests at the sustained rate (zero when
    /// unlimited).
    pub const fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns)
    }

    /// The emission interval in nanoseconds (0 when unlimited).
    pub const fn emission_interval_nanos(&self) -> u64 {
        self.interval_ns
    }

    /// The time an emptied burst takes to refill completely, in nanoseconds,
    /// saturating at `u64::MAX`.
    pub const fn refill_nanos(&self) -> u64 {
        self.interval_ns.saturating_mul(self.burst as u64)
    }

    /// The IETF `w` parameter: seconds an emptied burst takes to refill,
    /// rounded up, 0 when unlimited.
    ///
    /// Computed in 128 bits, so it stays exact where [`Quota::refill_nanos`]
    /// saturates (a year per request with a burst in the billions). Each
    /// emission interval is rounded up by under a nanosecond (see the
    /// [module documentation](self)), which puts the refill under `burst`
    /// nanoseconds past the window the quota was written with. A whole
    /// second within that reach is taken as the window (when the reach is
    /// under a millionth of it): 3 per second has `w = 1`, not 2, and 7 per
    /// 30 days has `w = 2_592_000`, while a period written 1 ns over a
    /// second is `w = 2`. (A burst spent at once is whole again those few
    /// nanoseconds after `w`.)
    pub const fn window_secs(&self) -> u64 {
        const NANOS: u128 = NANOS_PER_SEC as u128;
        let burst = self.burst as u128;
        let refill = self.interval_ns as u128 * burst;
        let whole = refill / NANOS;
        let rounding_only = refill - whole * NANOS < burst && burst <= whole * 1_000;
        let secs = if rounding_only {
            whole
        } else {
            refill.div_ceil(NANOS)
        };
        if secs > u64::MAX as u128 {
            u64::MAX
        } else {
            secs as u64
        }
    }
}

/// Anything that gives the bands of a tier: one [`Quota`], an array, a slice
/// or a `Vec` of them. Every band must admit a request.
pub trait IntoQuotas {
    /// The bands.
    fn into_quotas(self) -> Vec<Quota>;
}

impl IntoQuotas for Quota {
    fn into_quotas(self) -> Vec<Quota> {
        vec![self]
    }
}

impl<const N: usize> IntoQuotas for [Quota; N] {
    fn into_quotas(self) -> Vec<Quota> {
        self.to_vec()
    }
}

impl IntoQuotas for &[Quota] {
    fn into_quotas(self) -> Vec<Quota> {
        self.to_vec()
    }
}

impl IntoQuotas for Vec<Quota> {
    fn into_quotas(self) -> Vec<Quota> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_round_up() {
        assert_eq!(Quota::per_second(3).emission_interval_nanos(), 333_333_334);
        assert_eq!(Quota::per_minute(10).emission_interval_nanos(), 6 * NANOS_PER_SEC);
        assert_eq!(Quota::per_second(u32::MAX).emission_interval_nanos(), 1);
        assert_eq!(Quota::per_day(1).window_secs(), 86_400);
        assert_eq!(Quota::per_minute(10).window_secs(), 60);
        assert_eq!(Quota::per_hour(5_000).with_burst(200).window_secs(), 144);
        // The intervals' rounding (2 ns in all) adds no second.
        assert_eq!(Quota::per_second(3).window_secs(), 1);
        assert_eq!(Quota::per_hour(7).window_secs(), 3_600);
        // An interval of 1 ns where 0.23 was asked: the refill itself.
        assert_eq!(Quota::per_second(u32::MAX).window_secs(), 5);
        assert_eq!(
            Quota::per_period(1, Duration::from_millis(1_500)).window_secs(),
            2
        );
        // a period written 1 ns over a second: no rounding, rounded up
        assert_eq!(
            Quota::per_period(1, Duration::from_nanos(1_000_000_001)).window_secs(),
            2
        );
    }

    #[test]
    fn equality_and_unlimited() {
        assert_eq!(Quota::per_minute(60).with_burst(1), Quota::per_second(1));
        assert_ne!(Quota::per_minute(60), Quota::per_second(1));
        assert_eq!(Quota::unlimited().with_burst(5), Quota::unlimited());
        assert_eq!(Quota::unlimited().window_secs(), 0);
    }

    #[test]
    #[should_panic(expected = "non-zero request count")]
    fn zero_count_panics() {
        let _ = Quota::per_hour(0);
    }

    #[test]
    #[should_panic(expected = "non-zero burst")]
    fn zero_burst_panics() {
        let _ = Quota::per_hour(1).with_burst(0);
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let q = Quota::per_day(1).with_burst(u32::MAX);
        assert_eq!(q.refill_nanos(), u64::MAX);
        let q = Quota::per_second(u32::MAX).with_burst(u32::MAX);
        assert_eq!(q.refill_nanos(), u32::MAX as u64);
    }

    const DAY: u64 = 86_400;

    fn days(n: u64) -> Duration {
        Duration::from_secs(n * DAY)
    }

    #[test]
    fn any_period() {
        const MONTH: Quota = Quota::per_period(3_000, Duration::from_secs(30 * DAY));
        assert_eq!(MONTH.emission_interval(), Duration::from_secs(864));
        assert_eq!(MONTH.burst(), 3_000);
        assert_eq!(Quota::per_week(7), Quota::per_day(1).with_burst(7));
        assert_eq!(
            Quota::per_period(60, Duration::from_secs(60)),
            Quota::per_minute(60)
        );
        assert_eq!(
            Quota::per_period(3, Duration::from_nanos(2)).emission_interval_nanos(),
            1
        );
    }

    #[test]
    fn long_windows_are_the_period() {
        assert_eq!(Quota::per_period(3_000, days(30)).window_secs(), 2_592_000);
        assert_eq!(Quota::per_period(1, days(365)).window_secs(), 31_536_000);
        assert_eq!(Quota::per_week(10_000).window_secs(), 7 * DAY);
        // 30 days / 7 rounds the interval up by under a nanosecond: the
        // refill is 5 ns over 30 days, and the window is still 30 days.
        let q = Quota::per_period(7, days(30));
        assert_eq!(q.emission_interval_nanos(), 370_285_714_285_715);
        assert_eq!(q.window_secs(), 2_592_000);
        // A year per request with the largest burst: past u64 nanoseconds.
        let q = Quota::per_period(1, days(365)).with_burst(u32::MAX);
        assert_eq!(q.refill_nanos(), u64::MAX);
        assert_eq!(q.window_secs(), 31_536_000 * u32::MAX as u64);
    }

    #[test]
    #[should_panic(expected = "non-zero period")]
    fn zero_period_panics() {
        let _ = Quota::per_period(1, Duration::ZERO);
    }

    #[test]
    #[should_panic(expected = "non-zero request count")]
    fn zero_count_per_period_panics() {
        let _ = Quota::per_period(0, days(30));
    }
}
