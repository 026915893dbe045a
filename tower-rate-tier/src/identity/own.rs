//! [`OwnQuotas`]: an identity's bands of its own, and the tier entry made of
//! them, built once per [`with_quotas`](super::TierIdentity::with_quotas)
//! value and shared by its clones.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::quota::Quota;
use crate::tier::{BuildError, TierEntry, UnitQuotas};

/// The bands of one contract, and the entry they make with the tier they
/// were last used with. An identifier that keeps identities (a cache in
/// front of a customer database) clones them, and every clone finds the
/// entry built: a request with its own quotas builds nothing. Nothing is
/// kept outside the value: a contract no identity holds any more is gone.
pub(crate) struct OwnQuotas {
    /// Bands of its own; `None` for the tier's.
    bands: Option<Box<[Quota]>>,
    /// A concurrency limit of its own (0 is refused when the entry is
    /// built); `None` for the tier's.
    concurrency: Option<u32>,
    /// Bands of its own for some units (the tier's for the others).
    units: Box<[UnitQuotas]>,
    built: Mutex<Option<Built>>,
}

struct Built {
    /// The tier entry it was built from (compared by address: the weak
    /// reference keeps the allocation, so the address is never reused).
    base: Weak<TierEntry>,
    entry: Arc<TierEntry>,
}

impl OwnQuotas {
    pub(crate) fn new(bands: Option<Box<[Quota]>>, concurrency: Option<u32>) -> Self {
        OwnQuotas {
            bands,
            concurrency,
            units: Box::new([]),
            built: Mutex::new(None),
        }
    }

    /// The same contract with `bands` of its own for `unit`.
    pub(crate) fn with_unit(&self, unit: &str, bands: Box<[Quota]>) -> Self {
        let mut units: Vec<_> = self.units.iter().filter(|(u, _)| **u != *unit).cloned().collect();
        units.push((unit.into(), bands));
        OwnQuotas {
            bands: self.bands.clone(),
            concurrency: self.concurrency,
            units: units.into(),
            built: Mutex::new(None),
        }
    }

    /// The same contract with bands of its own (`None`: the tier's) and a
    /// concurrency limit of its own (`None`: the tier's).
    pub(crate) fn with(&self, bands: Option<Box<[Quota]>>, concurrency: Option<u32>) -> Self {
        OwnQuotas {
            bands,
            concurrency,
            units: self.units.clone(),
            built: Mutex::new(None),
        }
    }

    pub(crate) fn units(&self) -> &[UnitQuotas] {
        &self.units
    }

    pub(crate) fn bands(&self) -> Option<&[Quota]> {
        self.bands.as_deref()
    }

    pub(crate) fn concurrency(&self) -> Option<u32> {
        self.concurrency
    }

    /// `tier` with these quotas: the entry built for it before, else built
    /// now (and kept, in place of one built for another version of the
    /// tier). A part a tier could not have (its bands, a limit of 0, a
    /// unit's bands) is `ignored` alone, when the entry is built: the
    /// tier's stands in for it, and the other parts still apply.
    pub(crate) fn entry(
        &self,
        tier: &Arc<TierEntry>,
        mut ignored: impl FnMut(&BuildError),
    ) -> Arc<TierEntry> {
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(built) = &*built {
            if std::ptr::eq(built.base.as_ptr(), Arc::as_ptr(tier)) {
                return built.entry.clone();
            }
        }
        let concurrency = self.concurrency.and_then(|n| {
            let limit = NonZeroU32::new(n);
            if limit.is_none() {
                ignored(&BuildError::ZeroConcurrency(tier.name.to_string()));
            }
            limit
        });
        let own = TierEntry::own(tier, self.bands.as_deref(), concurrency, &self.units, ignored);
        let entry = Arc::new(own);
        *built = Some(Built {
            base: Arc::downgrade(tier),
            entry: entry.clone(),
        });
        entry
    }
}

impl PartialEq for OwnQuotas {
    fn eq(&self, other: &Self) -> bool {
        self.bands == other.bands && self.concurrency == other.concurrency && self.units == other.units
    }
}

impl Eq for OwnQuotas {}

impl Hash for OwnQuotas {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bands.hash(state);
        self.concurrency.hash(state);
        self.units.hash(state);
    }
}

impl fmt::Debug for OwnQuotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnQuotas")
            .field("bands", &self.bands)
            .field("concurrency", &self.concurrency)
            .field("units", &self.units)
            .finish()
    }
}
