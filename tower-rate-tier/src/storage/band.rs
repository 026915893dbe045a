//! The stable names of a tier's bands: [`band_names`].

use std::fmt;

use crate::quota::Quota;

/// A name for each band of a tier that stays the same when bands are added,
/// removed or reordered: its refill window in milliseconds (to the nearest
/// one, so that `per_second(3)`, whose interval is rounded up to
/// 333,333,334 ns, is a one-second band as `per_second(2)` is), and a
/// counter telling apart bands of one tier with the same window. Storages
/// key a band's state by it, so a band keeps its state across configuration
/// changes that keep its window.
///
/// A band of a named unit ([`Quota::unit`]) is named apart from the request
/// bands and from other units' bands: its name carries the unit's
/// [id](crate::quota::Unit::id), and its counter counts the earlier bands of
/// the same unit and window only.
pub fn band_names(bands: &[Quota]) -> impl Iterator<Item = BandName> + '_ {
    bands.iter().enumerate().map(|(i, quota)| {
        let window_ms = window_ms(quota);
        let repeat = bands[..i]
            .iter()
            .filter(|q| q.unit().id() == quota.unit().id() && window_ms_eq(q, window_ms))
            .count();
        BandName {
            window_ms,
            repeat: u8::try_from(repeat).unwrap_or(u8::MAX),
            unit: quota.unit().id(),
        }
    })
}

pub(crate) fn window_ms(quota: &Quota) -> u64 {
    quota.refill_nanos().saturating_add(500_000) / 1_000_000
}

fn window_ms_eq(quota: &Quota, ms: u64) -> bool {
    window_ms(quota) == ms
}

/// The stable name of one band of a tier; see [`band_names`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct BandName {
    /// The band's refill window in milliseconds, to the nearest one.
    pub window_ms: u64,
    /// How many earlier bands of the tier (of its unit) have the same
    /// window.
    pub repeat: u8,
    /// The [id](crate::quota::Unit::id) of the unit the band counts: 0 for
    /// requests.
    pub unit: u32,
}

impl fmt::Display for BandName {
    /// `w3600000`, or `w3600000.1` for a repeated window; a unit's band
    /// starts with its unit's id, `u1a2b3c4d.w60000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unit != 0 {
            write!(f, "u{:08x}.", self.unit)?;
        }
        write!(f, "w{}", self.window_ms)?;
        if self.repeat > 0 {
            write!(f, ".{}", self.repeat)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_names_are_stable_and_distinct() {
        let bands = [Quota::per_second(5), Quota::per_day(100), Quota::per_second(10)];
        let names: Vec<String> = band_names(&bands).map(|n| n.to_string()).collect();
        assert_eq!(names, ["w1000", "w86400000", "w1000.1"]);
        assert_eq!(
            band_names(&[Quota::per_second(3)]).next().map(|n| n.to_string()),
            Some("w1000".into())
        );
        // a raise that keeps the period keeps the name
        let raised: Vec<BandName> = band_names(&[Quota::per_hour(200)]).collect();
        let before: Vec<BandName> = band_names(&[Quota::per_hour(100)]).collect();
        assert_eq!(raised, before);
    }
}
