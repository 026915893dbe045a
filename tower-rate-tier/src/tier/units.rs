//! A tier's bands of named units (`tokens`, `content-bytes`): what a
//! decision over them asks of each band.
//!
//! A tier with units is decided over its request bands and then each unit's
//! bands, in one decision ([`TierEntry::decided`]): a request charges the
//! request bands and requires at least one unit and no debt in each unit
//! band; a reservation charges one unit's bands; usage recorded after the
//! fact forces a unit's bands into a debt of at most one burst of the unit's
//! smallest band. Every other band of the decision is peeked with its debt
//! bound, so that no decision clamps a unit's debt away.

use std::borrow::Cow;

use super::{BuildError, TierEntry};
use crate::headers::TierHeaders;
use crate::quota::{Quota, Unit};
use crate::storage::{Amount, Amounts, MAX_BANDS, Op, Slots};

/// The most request bands one tier may have.
pub const MAX_REQUEST_BANDS: usize = 4;

/// A tier's bands of one named unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnitBands {
    pub(crate) unit: Unit,
    /// Where the unit's bands start in [`TierEntry::decided`].
    pub(crate) at: usize,
    /// The unit's bands, each counting the unit.
    pub(crate) bands: Box<[Quota]>,
    /// The most one reservation may take: the smallest burst.
    pub(crate) max: u32,
}

impl UnitBands {
    /// The debt each band of the unit may be in: one burst of its smallest
    /// band.
    pub(crate) fn debt(&self) -> u32 {
        self.max
    }
}

/// The amounts a tier's decisions over all its bands start from, made once
/// with the tier's units: every request band peeked, every unit band
/// with its debt bound either peeked or required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BandAmounts {
    /// An admission's, before its cost is set in the request bands: each
    /// unit band requires one unit and no debt.
    admit: Amounts,
    /// Every band peeked.
    peek: Amounts,
}

impl BandAmounts {
    /// The amounts of `requests` request bands followed by the bands of
    /// `units`.
    pub(crate) fn new(requests: usize, units: &[UnitBands]) -> Self {
        let mut admit = Amounts::new();
        let mut peek = Amounts::new();
        for _ in 0..requests {
            admit.push(Amount::Charge(0), 0);
            peek.push(Amount::Charge(0), 0);
        }
        for unit in units {
            for _ in unit.bands.iter() {
                admit.push(Amount::Require, unit.debt());
                peek.push(Amount::Charge(0), unit.debt());
            }
        }
        BandAmounts { admit, peek }
    }
}

impl TierEntry {
    /// Whether no decision of the tier counts anything: an unlimited tier
    /// without units (its concurrency limit aside).
    pub(crate) fn counts_nothing(&self) -> bool {
        self.unlimited && self.units.is_empty()
    }

    /// The unit named `unit` of this tier, if it has it.
    #[inline]
    pub(crate) fn unit(&self, unit: &str) -> Option<&UnitBands> {
        self.units.iter().find(|u| u.unit.is(unit))
    }

    /// The operation a request's admission asks of every band: `cost` in
    /// each request band, and in each unit band at least one unit and no
    /// debt.
    #[inline]
    pub(crate) fn admission(&self, cost: u32) -> Op {
        if self.units.is_empty() {
            return Op::Charge(cost);
        }
        let mut amounts = self.amounts.admit;
        amounts.fill(0..self.first_unit(), Amount::Charge(cost));
        Op::Each(amounts)
    }

    /// The operation that gives `cost` back to the request bands (and
    /// peeks the unit bands with their debt bounds).
    pub(crate) fn refund(&self, cost: u32) -> Op {
        if self.units.is_empty() {
            return Op::Refund(cost);
        }
        let mut amounts = self.amounts.peek;
        amounts.fill(0..self.first_unit(), Amount::Refund(cost));
        Op::Each(amounts)
    }

    /// The operation that takes one of `slots` and admits a request of
    /// `cost` as [`TierEntry::admission`] does, in one decision.
    #[inline]
    pub(crate) fn acquire(&self, cost: u32, slots: Slots) -> Op {
        match self.admission(cost) {
            Op::Each(amounts) => Op::AcquireEach { amounts, slots },
            _ => Op::Acquire { cost, slots },
        }
    }

    /// The operation that does `amount` to `unit`'s bands and peeks every
    /// other band (each with its debt bound).
    pub(crate) fn on_unit(&self, unit: &UnitBands, amount: Amount) -> Op {
        let mut amounts = self.amounts.peek;
        amounts.fill(unit.range(), amount);
        Op::Each(amounts)
    }

    /// Where the unit bands start in [`TierEntry::decided`]: after the
    /// request bands (none for an unlimited tier).
    pub(crate) fn first_unit(&self) -> usize {
        self.units.first().map_or(self.decided.len(), |u| u.at)
    }

    /// The states of the request bands of a decision over
    /// [`TierEntry::decided`].
    pub(crate) fn request_states<'a, T>(&self, states: &'a [T]) -> &'a [T] {
        &states[..self.first_unit().min(states.len())]
    }

    /// This tier with `unit`'s bands (in place of the unit's bands it had),
    /// or without the unit for `None`; checked.
    pub(crate) fn with_unit(
        mut self,
        unit: &str,
        bands: Option<Vec<Quota>>,
    ) -> Result<TierEntry, BuildError> {
        let name = |e: fn(String, String) -> BuildError| e(self.name.to_string(), unit.to_owned());
        let parsed = Unit::new(unit).map_err(|error| BuildError::InvalidUnit {
            tier: self.name.to_string(),
            error,
        })?;
        let mut units: Vec<(Unit, Box<[Quota]>)> = self
            .units
            .iter()
            .filter(|u| u.unit != parsed)
            .map(|u| (u.unit, u.bands.clone()))
            .collect();
        if let Some((other, _)) = units.iter().find(|(u, _)| u.id() == parsed.id()) {
            return Err(BuildError::InvalidUnit {
                tier: self.name.to_string(),
                error: crate::quota::UnitError::SameId(unit.to_owned(), other.as_str().to_owned()),
            });
        }
        if let Some(bands) = bands {
            if bands.is_empty() || bands.iter().any(Quota::is_unlimited) {
                return Err(name(BuildError::InvalidUnitBands));
            }
            let bands = bands.into_iter().map(|q| q.in_unit(parsed)).collect();
            match self.units.iter().position(|u| u.unit == parsed) {
                // a unit set again keeps its place
                Some(i) => units.insert(i, (parsed, bands)),
                None => units.push((parsed, bands)),
            }
        }
        let requests: &[Quota] = if self.unlimited { &[] } else { &self.bands };
        let total = requests.len() + units.iter().map(|(_, b)| b.len()).sum::<usize>();
        if total > MAX_BANDS {
            return Err(name(BuildError::TooManyUnitBands));
        }
        let mut decided = requests.to_vec();
        let mut placed = Vec::with_capacity(units.len());
        for (unit, bands) in units {
            let at = decided.len();
            decided.extend_from_slice(&bands);
            placed.push(UnitBands {
                unit,
                at,
                max: bands.iter().map(Quota::burst).min().unwrap_or(0),
                bands,
            });
        }
        if decided.is_empty() {
            // an unlimited tier without units: its one unlimited band
            decided = self.bands.to_vec();
        }
        self.amounts = BandAmounts::new(requests.len(), &placed);
        self.units = placed.into();
        self.decided = decided.into();
        self.headers = TierHeaders::new(&self.name, &self.decided, self.concurrency.map(|c| c.get()));
        Ok(self)
    }
}

/// A unit's name and a contract's bands of it (an identity's own).
pub(crate) type UnitQuotas = (Box<str>, Box<[Quota]>);

/// The units of a builder: `(tier, unit, bands)` in the order given.
pub(crate) type UnitSpecs = Vec<(Cow<'static, str>, String, Vec<Quota>)>;
