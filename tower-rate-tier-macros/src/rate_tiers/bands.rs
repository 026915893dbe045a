//! The bands of a tier, as its `#[tier(..)]` keys write them:
//! `per_second` .. `per_week`, `count` with `period_secs`, and `burst`.

use syn::Ident;
use syn::meta::ParseNestedMeta;

use super::keys::{BandKey, NamedPeriod};
use super::number::Number;
use crate::errors::Errors;

/// The bands of one tier, in the order of their keys; `count` and
/// `period_secs` make one once both are read.
pub(super) struct Bands {
    pub(super) list: Vec<Band>,
    /// A `count` without `period_secs` (an error).
    pub(super) count: Option<Keyed<Number<u32>>>,
    /// A `period_secs` without `count` (an error).
    pub(super) period_secs: Option<Keyed<Number<u64>>>,
    /// The place in `list` of the first of `count` and `period_secs`.
    custom_at: usize,
    pub(super) burst: Option<Keyed<Number<u32>>>,
}

/// The longest `period_secs` the runtime's `Quota::per_period` takes: a
/// period is counted in `u64` nanoseconds (about 584 years).
pub(super) const MAX_PERIOD_SECS: u64 = u64::MAX / 1_000_000_000;

/// A value with the key that introduced it.
pub(super) struct Keyed<T> {
    pub(super) key: Ident,
    pub(super) value: T,
}

/// One band: `per_hour = 100`, or `count = 50, period_secs = 900`.
pub(super) struct Band {
    pub(super) period: Period,
    /// `per_hour`, or `count`.
    pub(super) key: Ident,
    pub(super) count: Number<u32>,
}

/// The period of a band.
pub(super) enum Period {
    Named(NamedPeriod),
    /// `period_secs = s`.
    Secs(Keyed<Number<u64>>),
}

impl Bands {
    pub(super) fn new() -> Bands {
        Bands {
            list: Vec::new(),
            count: None,
            period_secs: None,
            custom_at: 0,
            burst: None,
        }
    }

    /// Whether `kind` was read already.
    pub(super) fn has(&self, kind: BandKey) -> bool {
        match kind {
            BandKey::Burst => self.burst.is_some(),
            BandKey::Count => self.count.is_some(),
            BandKey::PeriodSecs => self.period_secs.is_some(),
            BandKey::Named(period) => self
                .list
                .iter()
                .any(|band| matches!(band.period, Period::Named(p) if p == period)),
        }
    }

    /// Reads the value of `key` (of kind `kind`, not read before).
    pub(super) fn read(
        &mut self,
        key: Ident,
        kind: BandKey,
        meta: &ParseNestedMeta<'_>,
        errors: &mut Errors,
    ) -> syn::Result<()> {
        match kind {
            BandKey::Named(period) => {
                let count = Number::read(&key, meta, errors)?;
                self.list.push(Band {
                    period: Period::Named(period),
                    key,
                    count,
                });
            }
            BandKey::Burst => {
                self.burst = Some(Keyed {
                    value: Number::read(&key, meta, errors)?,
                    key,
                })
            }
            BandKey::Count | BandKey::PeriodSecs => {
                if self.count.is_none() && self.period_secs.is_none() {
                    self.custom_at = self.list.len();
                }
                if kind == BandKey::Count {
                    let value = Number::read(&key, meta, errors)?;
                    self.count = Some(Keyed { key, value });
                } else {
                    let value = Number::read(&key, meta, errors)?;
                    self.period_secs = Some(Keyed { key, value });
                }
            }
        }
        Ok(())
    }

    /// Makes `count` and `period_secs` one band, in the place of the first of
    /// the two; either one alone stays for validation to report.
    pub(super) fn pair_custom_band(&mut self) {
        match (self.count.take(), self.period_secs.take()) {
            (Some(count), Some(period)) => {
                let band = Band {
                    period: Period::Secs(period),
                    key: count.key,
                    count: count.value,
                };
                self.list.insert(self.custom_at.min(self.list.len()), band);
            }
            (count, period_secs) => {
                self.count = count;
                self.period_secs = period_secs;
            }
        }
    }

    /// A `count` or a `period_secs` without the other.
    pub(super) fn unpaired(&self) -> bool {
        self.count.is_some() || self.period_secs.is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::MAX_PERIOD_SECS;

    #[test]
    fn the_longest_period_is_the_runtimes() {
        let period = |secs| trt::Quota::try_per_period(1, Duration::from_secs(secs));
        assert!(period(MAX_PERIOD_SECS).is_ok());
        assert!(period(MAX_PERIOD_SECS + 1).is_err());
    }
}
