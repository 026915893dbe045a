//! The tiers of a [`RateTier`](super::RateTier) at one moment: a table that
//! is replaced whole when a tier is set or removed at run time, so that a
//! request is decided wholly on one version of its tier.

use std::borrow::Cow;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use super::Preparer;
use super::units::{BandAmounts, MAX_REQUEST_BANDS};
use super::{BuildError, TierEntry};
use crate::headers::TierHeaders;
use crate::quota::Quota;
use crate::storage::TierScope;

/// The most unit names a table knows of the customers' own quotas (names
/// a program gives, never a client; a bound all the same).
const MAX_KNOWN_UNITS: usize = 256;

/// Up to this many tiers, a name is looked up by comparing, not hashing.
const LINEAR_LOOKUP_MAX_TIERS: usize = 8;

/// Every tier, by name, and the default one.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    tiers: Vec<Arc<TierEntry>>,
    by_name: HashMap<Box<str>, usize, foldhash::fast::RandomState>,
    default: Option<usize>,
    /// The name of every unit a tier of this table or of an earlier
    /// version counts or counted, or a customer's own quotas did: a unit a
    /// tier does not count is not a typo when one of these names it.
    units: Arc<[Box<str>]>,
}

impl Table {
    /// The tiers in order, and the name of the default one.
    pub(crate) fn new(tiers: Vec<TierEntry>, default: Option<&str>) -> Result<Table, BuildError> {
        let mut table = Table {
            tiers: Vec::with_capacity(tiers.len()),
            by_name: HashMap::default(),
            default: None,
            units: Arc::new([]),
        };
        for entry in tiers {
            if table
                .by_name
                .insert(Box::from(&*entry.name), table.tiers.len())
                .is_some()
            {
                return Err(BuildError::DuplicateTier(entry.name.into_owned()));
            }
            table.units = with_units(&table.units, &entry);
            table.tiers.push(Arc::new(entry));
        }
        if let Some(name) = default {
            let index = table.by_name.get(name).copied();
            table.default = Some(index.ok_or_else(|| BuildError::UnknownDefaultTier(name.to_owned()))?);
        }
        Ok(table)
    }

    /// The tier named `name`, tried first at position `hint` (a
    /// [`TierTable`](super::TierTable) value's place in its table: a hit
    /// when the table's tiers are this table's first, in order).
    #[inline]
    pub(crate) fn find_hinted(&self, name: &str, hint: Option<u16>) -> Option<&Arc<TierEntry>> {
        if let Some(entry) = hint.and_then(|i| self.tiers.get(usize::from(i))) {
            // The same `&'static str` is the same name, without comparing.
            if std::ptr::eq(entry.name.as_ptr(), name.as_ptr()) && entry.name.len() == name.len() {
                return Some(entry);
            }
        }
        self.find(name)
    }

    /// The tier named `name`.
    #[inline]
    pub(crate) fn find(&self, name: &str) -> Option<&Arc<TierEntry>> {
        // A few names compare faster than they hash.
        if self.tiers.len() <= LINEAR_LOOKUP_MAX_TIERS {
            return self.tiers.iter().find(|t| *t.name == *name);
        }
        self.by_name.get(name).map(|&i| &self.tiers[i])
    }

    pub(crate) fn default_entry(&self) -> Option<&Arc<TierEntry>> {
        self.default.map(|i| &self.tiers[i])
    }

    pub(crate) fn tiers(&self) -> &[Arc<TierEntry>] {
        &self.tiers
    }

    /// This table with `entry` added, or in place of the tier of its name.
    pub(crate) fn with(&self, entry: TierEntry) -> Table {
        let mut next = self.clone();
        next.units = with_units(&self.units, &entry);
        match next.by_name.get(&*entry.name) {
            Some(&i) => next.tiers[i] = Arc::new(entry),
            None => {
                next.by_name.insert(Box::from(&*entry.name), next.tiers.len());
                next.tiers.push(Arc::new(entry));
            }
        }
        next
    }

    /// This table without the tier `name`; `None` when it has no such tier
    /// or `name` is the default tier.
    pub(crate) fn without(&self, name: &str) -> Option<Table> {
        let index = *self.by_name.get(name)?;
        if self.default == Some(index) {
            return None;
        }
        let mut tiers = self.tiers.clone();
        tiers.remove(index);
        let by_name = tiers
            .iter()
            .enumerate()
            .map(|(i, t)| (Box::from(&*t.name), i))
            .collect();
        let default = self.default.map(|d| if d > index { d - 1 } else { d });
        Some(Table {
            tiers,
            by_name,
            default,
            units: self.units.clone(),
        })
    }

    /// This table, knowing the units of `entry` too (a customer's own), up
    /// to [`MAX_KNOWN_UNITS`] names.
    pub(crate) fn knowing_units_of(&self, entry: &TierEntry) -> Table {
        let mut next = self.clone();
        if self.units.len() < MAX_KNOWN_UNITS {
            next.units = with_units(&self.units, entry);
        }
        next
    }

    /// Makes the unit `unit` known (a unit only customers' own quotas
    /// count, named by the configuration), whatever the bound on learned
    /// ones.
    pub(crate) fn know_unit(&mut self, unit: &str) {
        if !self.knows_unit(unit) {
            self.units = self.units.iter().cloned().chain([Box::from(unit)]).collect();
        }
    }

    /// Whether the table learns more units of customers' own quotas (it
    /// knows fewer than [`MAX_KNOWN_UNITS`]).
    pub(crate) fn learns_units(&self) -> bool {
        self.units.len() < MAX_KNOWN_UNITS
    }

    /// Whether a tier of this table or of an earlier version counts or
    /// counted the unit `unit`.
    pub(crate) fn knows_unit(&self, unit: &str) -> bool {
        self.units.iter().any(|known| **known == *unit)
    }
}

/// `known` and the units of `entry` not among them.
fn with_units(known: &Arc<[Box<str>]>, entry: &TierEntry) -> Arc<[Box<str>]> {
    let mut new = entry
        .units
        .iter()
        .map(|u| u.unit.as_str())
        .filter(|name| !known.iter().any(|k| **k == **name))
        .peekable();
    if new.peek().is_none() {
        return known.clone();
    }
    known.iter().cloned().chain(new.map(Box::from)).collect()
}

impl TierEntry {
    /// The tier `name` with `bands`, checked, and its state prepared by
    /// `preparer`.
    pub(crate) fn new(
        name: Cow<'static, str>,
        bands: Vec<Quota>,
        preparer: &Arc<Preparer>,
    ) -> Result<TierEntry, BuildError> {
        Self::new_in(name, bands, preparer, |name| preparer.scope(name))
    }

    /// [`TierEntry::new`] with the storage's state `scope` gives for its
    /// name (called once the name and bands are checked).
    fn new_in(
        name: Cow<'static, str>,
        bands: Vec<Quota>,
        preparer: &Arc<Preparer>,
        scope: impl FnOnce(&str) -> Arc<dyn TierScope>,
    ) -> Result<TierEntry, BuildError> {
        if name.is_empty() || name.len() > 255 || name.contains(super::OWN_QUOTAS_SEPARATOR) {
            return Err(BuildError::InvalidName(name.into_owned()));
        }
        if bands.is_empty() {
            return Err(BuildError::NoBands(name.into_owned()));
        }
        if bands.len() > MAX_REQUEST_BANDS {
            return Err(BuildError::TooManyBands(name.into_owned()));
        }
        if let Some(band) = bands.iter().find(|q| !q.unit().is_requests()) {
            let unit = band.unit().as_str().to_owned();
            return Err(BuildError::UnitInRequestBands(name.into_owned(), unit));
        }
        let unlimited = bands.iter().filter(|q| q.is_unlimited()).count();
        if unlimited > 0 && unlimited < bands.len() {
            return Err(BuildError::UnlimitedWithBands(name.into_owned()));
        }
        let unlimited = unlimited > 0;
        let bands: Box<[Quota]> = if unlimited {
            Box::new([Quota::unlimited()])
        } else {
            bands.into()
        };
        let max_cost = if unlimited {
            u32::MAX
        } else {
            bands.iter().map(Quota::burst).min().unwrap_or(0)
        };
        Ok(TierEntry {
            headers: TierHeaders::new(&name, &bands, None),
            scope: scope(&name),
            own_scope: std::sync::OnceLock::new(),
            preparer: preparer.clone(),
            name,
            decided: bands.clone(),
            units: Box::new([]),
            amounts: BandAmounts::new(bands.len(), &[]),
            bands,
            max_cost,
            unlimited,
            shadow: false,
            concurrency: None,
        })
    }

    /// This tier with at most `limit` requests of one user in flight (none
    /// for `None`), its header values rendered again.
    pub(crate) fn with_concurrency(mut self, limit: Option<NonZeroU32>) -> TierEntry {
        if self.concurrency != limit {
            self.concurrency = limit;
            self.headers = TierHeaders::new(&self.name, &self.decided, limit.map(NonZeroU32::get));
        }
        self
    }
}

impl TierEntry {
    /// `tier` with bands of one identity's own, counted apart from the
    /// tier's users (in the tier's [own scope](TierEntry::own_scope)), and
    /// its concurrency limit or one of the identity's own. Each part a tier
    /// could not have (bands, a unit's bands) is `ignored` alone: the
    /// tier's stands in for it, and the others still apply.
    pub(crate) fn own(
        tier: &TierEntry,
        bands: Option<&[Quota]>,
        concurrency: Option<NonZeroU32>,
        units: &[super::UnitQuotas],
        mut ignored: impl FnMut(&BuildError),
    ) -> TierEntry {
        let own_bands = bands.map(|bands| {
            let own = |_: &str| tier.own_scope().clone();
            let mut entry = TierEntry::new_in(tier.name.clone(), bands.to_vec(), &tier.preparer, own)?;
            // the tier's units, counted in the same bucket as its bands
            for unit in tier.units.iter() {
                entry = entry.with_unit(unit.unit.as_str(), Some(unit.bands.to_vec()))?;
            }
            Ok::<_, BuildError>(entry)
        });
        let mut entry = match own_bands {
            Some(Ok(entry)) => entry,
            Some(Err(error)) => {
                ignored(&error);
                tier.clone()
            }
            // the tier's bands, in the tier's bucket
            None => tier.clone(),
        };
        entry.shadow = tier.shadow;
        for (unit, bands) in units {
            // a unit's bands that no tier could have leave the unit as the
            // tier has it (and the rest of the contract as it is)
            match entry.clone().with_unit(unit, Some(bands.to_vec())) {
                Ok(with) => entry = with,
                Err(error) => ignored(&error),
            }
        }
        entry.with_concurrency(concurrency.or(tier.concurrency))
    }
}
