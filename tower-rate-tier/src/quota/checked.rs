//! Constructors for values read at run time: every mistake is a
//! [`QuotaError`], never a panic.

use std::fmt;
use std::time::Duration;

use super::Quota;

/// The finest emission interval the `try_*` constructors accept: the Redis
/// storage counts in microseconds.
const MIN_CHECKED_INTERVAL_NS: u128 = 1_000;

impl Quota {
    /// `n` requests per `period`, burst `n`, or why that is not a quota: a
    /// zero count or period, a period over `u64::MAX` nanoseconds, or an
    /// emission interval (`period / n`) under one microsecond, which the
    /// Redis storage cannot count.
    ///
    /// Meant for values read from configuration; the refill is continuous,
    /// as for [`Quota::per_period`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_rate_tier::{Quota, QuotaError};
    ///
    /// let month = Duration::from_secs(30 * 86_400);
    /// assert_eq!(Quota::try_per_period(3_000, month)?.emission_interval(), Duration::from_secs(864));
    /// assert_eq!(Quota::try_per_period(0, month), Err(QuotaError::ZeroCount));
    /// # Ok::<(), QuotaError>(())
    /// ```
    pub const fn try_per_period(n: u32, period: Duration) -> Result<Quota, QuotaError> {
        match Quota::checked(n, period) {
            // Exact comparison: `period / n` itself, before rounding up.
            Ok(_) if period.as_nanos() < MIN_CHECKED_INTERVAL_NS * n as u128 => {
                Err(QuotaError::IntervalTooShort { count: n, period })
            }
            other => other,
        }
    }

    /// [`Quota::per_second`], or a [`QuotaError`] (see [`Quota::try_per_period`]).
    pub const fn try_per_second(n: u32) -> Result<Quota, QuotaError> {
        Quota::try_per_period(n, Duration::from_secs(1))
    }

    /// [`Quota::per_minute`], or a [`QuotaError`] (see [`Quota::try_per_period`]).
    pub const fn try_per_minute(n: u32) -> Result<Quota, QuotaError> {
        Quota::try_per_period(n, Duration::from_secs(60))
    }

    /// [`Quota::per_hour`], or a [`QuotaError`] (see [`Quota::try_per_period`]).
    pub const fn try_per_hour(n: u32) -> Result<Quota, QuotaError> {
        Quota::try_per_period(n, Duration::from_secs(3_600))
    }

    /// [`Quota::per_day`], or a [`QuotaError`] (see [`Quota::try_per_period`]).
    pub const fn try_per_day(n: u32) -> Result<Quota, QuotaError> {
        Quota::try_per_period(n, Duration::from_secs(86_400))
    }

    /// [`Quota::per_week`], or a [`QuotaError`] (see [`Quota::try_per_period`]).
    pub const fn try_per_week(n: u32) -> Result<Quota, QuotaError> {
        Quota::try_per_period(n, Duration::from_secs(7 * 86_400))
    }

    /// [`Quota::with_burst`], or [`QuotaError::ZeroBurst`] for a zero burst.
    pub const fn try_with_burst(self, burst: u32) -> Result<Quota, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        Ok(self.with_burst(burst))
    }
}

/// Why [`Quota::try_per_period`] (or another `try_*` constructor) refused
/// its values.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum QuotaError {
    /// A request count of 0, which would admit nothing.
    ZeroCount,
    /// A period of zero.
    ZeroPeriod,
    /// A burst of 0 ([`Quota::try_with_burst`]), which would admit nothing.
    ZeroBurst,
    /// `period / count` is under one microsecond, finer than the Redis
    /// storage counts (at most 1,000,000 requests per second per key).
    IntervalTooShort {
        /// The requested count.
        count: u32,
        /// The requested period.
        period: Duration,
    },
    /// A period longer than `u64::MAX` nanoseconds (about 584 years).
    PeriodTooLong {
        /// The requested period.
        period: Duration,
    },
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::ZeroCount => f.write_str("a quota needs a non-zero request count (0 admits nothing)"),
            QuotaError::ZeroPeriod => f.write_str("a quota needs a non-zero period"),
            QuotaError::ZeroBurst => f.write_str("a quota needs a non-zero burst (0 admits nothing)"),
            QuotaError::IntervalTooShort { count, period } => {
                let most = period.as_nanos() / MIN_CHECKED_INTERVAL_NS;
                write!(
                    f,
                    "{count} requests per {period:?} is more than one per microsecond, \
                     the finest rate the Redis storage counts (at most {most} per {period:?})"
                )
            }
            QuotaError::PeriodTooLong { period } => write!(
                f,
                "a quota's period must fit in u64 nanoseconds (about 584 years); got {period:?}"
            ),
        }
    }
}

impl std::error::Error for QuotaError {}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;

    fn days(n: u64) -> Duration {
        Duration::from_secs(n * DAY)
    }

    #[test]
    fn try_constructors_refuse_instead_of_panicking() {
        assert_eq!(Quota::try_per_period(0, days(30)), Err(QuotaError::ZeroCount));
        assert_eq!(Quota::try_per_hour(0), Err(QuotaError::ZeroCount));
        assert_eq!(
            Quota::try_per_period(5, Duration::ZERO),
            Err(QuotaError::ZeroPeriod)
        );
        assert_eq!(
            Quota::try_per_period(0, Duration::ZERO),
            Err(QuotaError::ZeroCount)
        );
        assert_eq!(
            Quota::try_per_period(1, Duration::MAX),
            Err(QuotaError::PeriodTooLong {
                period: Duration::MAX
            })
        );
        assert_eq!(Quota::per_hour(1).try_with_burst(0), Err(QuotaError::ZeroBurst));
        assert_eq!(
            Quota::per_hour(1).try_with_burst(5),
            Ok(Quota::per_hour(1).with_burst(5))
        );
    }

    #[test]
    fn try_constructors_agree_with_the_panicking_ones() {
        const HOUR: Result<Quota, QuotaError> = Quota::try_per_hour(5_000);
        assert_eq!(HOUR, Ok(Quota::per_hour(5_000)));
        assert_eq!(Quota::try_per_second(10), Ok(Quota::per_second(10)));
        assert_eq!(Quota::try_per_minute(10), Ok(Quota::per_minute(10)));
        assert_eq!(Quota::try_per_day(10), Ok(Quota::per_day(10)));
        assert_eq!(Quota::try_per_week(10), Ok(Quota::per_week(10)));
        assert_eq!(
            Quota::try_per_period(7, days(30)),
            Ok(Quota::per_period(7, days(30)))
        );
    }

    #[test]
    fn sub_microsecond_intervals_are_refused() {
        let per_second = Duration::from_secs(1);
        assert_eq!(
            Quota::try_per_second(1_000_001),
            Err(QuotaError::IntervalTooShort {
                count: 1_000_001,
                period: per_second
            })
        );
        assert_eq!(
            Quota::try_per_second(1_000_000).map(|q| q.emission_interval_nanos()),
            Ok(1_000)
        );
        // 2,999 ns / 3 rounds up to 1 µs, but the rate asked for is finer.
        assert!(Quota::try_per_period(3, Duration::from_nanos(2_999)).is_err());
        assert!(Quota::try_per_period(3, Duration::from_nanos(3_000)).is_ok());
        // The panicking constructors keep clamping.
        assert_eq!(
            Quota::per_period(1_000_001, per_second).emission_interval_nanos(),
            1_000
        );
    }

    #[test]
    fn errors_explain_themselves() {
        let error: Box<dyn std::error::Error> = Box::new(QuotaError::IntervalTooShort {
            count: 2_000_000,
            period: Duration::from_secs(1),
        });
        assert_eq!(
            error.to_string(),
            "2000000 requests per 1s is more than one per microsecond, the finest rate \
             the Redis storage counts (at most 1000000 per 1s)"
        );
        assert_eq!(
            QuotaError::ZeroCount.to_string(),
            "a quota needs a non-zero request count (0 admits nothing)"
        );
        assert!(
            QuotaError::PeriodTooLong {
                period: Duration::MAX
            }
            .to_string()
            .contains("584 years")
        );
    }
}
