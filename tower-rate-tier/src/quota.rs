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
//! ```
//!
//! # Rounding
//!
//! Time is kept in nanoseconds. A period that does not divide evenly by `n`
//! gives an emission interval rounded *up*, so a quota never admits more than
//! it says: `Quota::per_second(3)` admits one request every 333,333,334 ns.
//! A rate finer than one request per nanosecond (only `per_second(n)` with
//! `n > 1_000_000_000` can ask for it) is clamped to one per nanosecond. The
//! Redis storage keeps microseconds and rounds the interval up to a whole
//! microsecond in the same way (at most 1,000,000 requests per second per
//! key there).

use std::time::Duration;

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
}

impl Quota {
    const fn per_period(n: u32, period_ns: u64, what: &'static str) -> Quota {
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
        }
    }

    /// `n` requests per second, burst `n`. Panics if `n` is 0.
    pub const fn per_second(n: u32) -> Quota {
        Quota::per_period(n, NANOS_PER_SEC, "per_second")
    }

    /// `n` requests per minute, burst `n`. Panics if `n` is 0.
    pub const fn per_minute(n: u32) -> Quota {
        Quota::per_period(n, 60 * NANOS_PER_SEC, "per_minute")
    }

    /// `n` requests per hour, burst `n`. Panics if `n` is 0.
    pub const fn per_hour(n: u32) -> Quota {
        Quota::per_period(n, 3_600 * NANOS_PER_SEC, "per_hour")
    }

    /// `n` requests per day, burst `n`. Panics if `n` is 0.
    pub const fn per_day(n: u32) -> Quota {
        Quota::per_period(n, 86_400 * NANOS_PER_SEC, "per_day")
    }

    /// A quota with no limit: requests are never counted or denied, and
    /// responses carry no rate-limit headers.
    pub const fn unlimited() -> Quota {
        Quota {
            interval_ns: 0,
            burst: 0,
        }
    }

    /// The same sustained rate with another burst. Panics if `burst` is 0.
    /// An unlimited quota stays unlimited.
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
        }
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
    /// rounded up.
    pub const fn window_secs(&self) -> u64 {
        self.refill_nanos().div_ceil(NANOS_PER_SEC)
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
}
