//! What a check answers: [`RateLimitInfo`] (admitted), [`RateLimited`]
//! (denied) or a [`CheckError`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::TierEntry;
use crate::clock::Nanos;
use crate::quota::Quota;
use crate::storage::{BandState, BandStates, Decision, DecisionSource, SlotState, StorageError};

/// The longest user id [`RateTier::check`](crate::RateTier::check) accepts,
/// in bytes. The layer treats an identity with a longer id as unidentified
/// ([`OnMissing`](crate::OnMissing)). It bounds what one tracked key costs
/// the memory storage, whose cap counts keys (see
/// [`MemoryStorage`](crate::storage::MemoryStorage)): hash or look up longer
/// client credentials in the identifier and pass a short id.
pub const MAX_USER_ID_LEN: usize = 256;

/// The outcome of [`RateTier::check`](crate::RateTier::check).
pub type CheckResult = Result<Result<RateLimitInfo, RateLimited>, CheckError>;

/// A request was admitted: the state after the charge.
#[derive(Clone, PartialEq, Eq)]
pub struct RateLimitInfo {
    /// The burst of the band closest to denying (`u32::MAX` when unlimited).
    pub limit: u32,
    /// Cost units that band could still admit now.
    pub remaining: u32,
    /// Time until that band is full again.
    pub reset_after: Duration,
    pub(crate) detail: Detail,
}

/// A request was denied; nothing was charged.
#[derive(Clone, PartialEq, Eq)]
pub struct RateLimited {
    /// The burst of the band that denied.
    pub limit: u32,
    /// Cost units that band could still admit now (fewer than the cost).
    pub remaining: u32,
    /// Time until the same request would be admitted.
    pub retry_after: Duration,
    /// Time until the band that denied is full again.
    pub reset_after: Duration,
    pub(crate) detail: Detail,
}

/// What both outcomes carry for the response headers.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Detail {
    pub(crate) tier: Arc<TierEntry>,
    pub(crate) now: Nanos,
    pub(crate) bands: BandStates,
    /// The index of the reported band.
    pub(crate) band: usize,
    /// Who decided.
    pub(crate) source: DecisionSource,
    /// The user's slots after the decision, for a tier with a concurrency
    /// limit.
    pub(crate) slots: Option<SlotState>,
}

macro_rules! outcome_accessors {
    ($ty:ty, $allowed:expr) => {
        impl $ty {
            /// Each band's `t` in the IETF `RateLimit` field, in the tier's
            /// order: whole seconds (rounded up, at least 1) until the band
            /// has more quota than now, computed with the quota that
            /// decided. After an admission, `None` for a full band; after a
            /// denial, the seconds until the request would fit for each band
            /// that denied it (never more than
            /// [`RateLimited::retry_after_secs`]) and `None` for the others.
            pub fn ratelimit_t_secs(&self) -> impl Iterator<Item = Option<u64>> + '_ {
                self.detail
                    .bands
                    .iter()
                    .map(|state| crate::headers::t_secs(state, $allowed))
            }

            /// The tier's name.
            pub fn tier(&self) -> &str {
                &self.detail.tier.name
            }

            /// Whether the tier is unlimited (no rate-limit headers).
            pub fn is_unlimited(&self) -> bool {
                self.detail.tier.unlimited
            }

            /// Every band of the tier with its state, in the tier's order:
            /// its request bands, then its units' bands (whose
            /// [`Quota::unit`] names the unit).
            pub fn bands(&self) -> impl Iterator<Item = (Quota, BandState)> + '_ {
                self.detail
                    .tier
                    .decided
                    .iter()
                    .copied()
                    .zip(self.detail.bands.iter().copied())
            }

            /// The storage's time of the decision, in nanoseconds since the
            /// Unix epoch.
            pub fn decided_at(&self) -> Nanos {
                self.detail.now
            }

            /// Who decided: the user's own bucket
            /// ([`DecisionSource::Storage`]), or a bucket shared by the
            /// identities a full storage had no room for
            /// ([`DecisionSource::Overflow`]).
            pub fn source(&self) -> DecisionSource {
                self.detail.source
            }

            /// The user's slots of the tier's concurrency limit after the
            /// decision (`None` for a tier without one): the limit, the
            /// requests in flight, and the `r` of the `RateLimit` field's
            /// concurrency item ([`SlotState::free`]).
            pub fn slots(&self) -> Option<SlotState> {
                self.detail.slots
            }

            /// When the reported band is full again, in Unix seconds
            /// (rounded up): the `X-RateLimit-Reset` value.
            pub fn reset_at_unix_secs(&self) -> u64 {
                let at = u128::from(self.detail.now) + self.reset_after.as_nanos();
                u64::try_from(at.div_ceil(1_000_000_000)).unwrap_or(u64::MAX)
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut d = f.debug_struct(stringify!($ty));
                d.field("tier", &self.tier());
                d.field("limit", &self.limit);
                d.field("remaining", &self.remaining);
                d.field("reset_after", &self.reset_after);
                d.finish_non_exhaustive()
            }
        }
    };
}

outcome_accessors!(RateLimitInfo, true);
outcome_accessors!(RateLimited, false);

impl RateLimitInfo {
    /// Time until the reported band has more quota than now (one more unit
    /// in [`remaining`](Self::remaining)), computed with the quota that
    /// decided: that band's `t` in the `RateLimit` field, before rounding.
    /// `None` when the band is full, or the tier unlimited. Unlike
    /// [`reset_after`](Self::reset_after), which is the time until the band
    /// is full again (`X-RateLimit-Reset`).
    pub fn more_quota_after(&self) -> Option<Duration> {
        let state = self.detail.bands.get(self.detail.band)?;
        (state.more_after_ns > 0).then(|| Duration::from_nanos(state.more_after_ns))
    }

    /// The storage's decision this admission was made of.
    pub(crate) fn into_decision(self) -> Decision {
        let Detail {
            now,
            bands,
            source,
            slots,
            ..
        } = self.detail;
        Decision {
            allowed: true,
            now,
            bands,
            source,
            slots,
        }
    }

    /// The admission of an unlimited tier: no state, no headers.
    pub(crate) fn unlimited(tier: &Arc<TierEntry>, now: Nanos) -> Self {
        RateLimitInfo {
            limit: u32::MAX,
            remaining: u32::MAX,
            reset_after: Duration::ZERO,
            detail: Detail {
                tier: tier.clone(),
                now,
                bands: BandStates::new(),
                band: 0,
                source: DecisionSource::Storage,
                slots: None,
            },
        }
    }
}

/// The request bands' `states` after `units` that the decision charged
/// were given back (same instant); a unit band's state is left as it is.
///
/// `remaining` grows by `units` exactly, whatever quota the storage decided
/// with (a fallback's local share, Redis's intervals in whole
/// microseconds): the decision took them from it. The times are computed
/// with the tier's quota, which the storage's may differ from.
pub(crate) fn refund_requests(states: &mut [BandState], tier: &TierEntry, units: u32) {
    if tier.unlimited {
        return;
    }
    for (state, quota) in states.iter_mut().zip(tier.bands.iter()) {
        let interval = u128::from(quota.emission_interval_nanos());
        let used = u128::from(state.reset_after_ns).saturating_sub(interval * u128::from(units));
        state.reset_after_ns = u64::try_from(used).unwrap_or(u64::MAX);
        state.more_after_ns =
            crate::gcra::next_unit_after(state.reset_after_ns, quota.emission_interval_nanos());
        state.remaining = state.remaining.saturating_add(units).min(quota.burst());
    }
}

impl RateLimited {
    /// The same refusal once the request's own charge of `units` is given
    /// back (a refusal by a unit after admission): its request bands'
    /// states.
    pub(crate) fn with_requests_refunded(mut self, units: u32) -> Self {
        refund_requests(&mut self.detail.bands, &self.detail.tier, units);
        self
    }

    /// The names of the `RateLimit-Policy` items whose band denied the
    /// request, in the tier's order, as a Structured Fields parser decodes
    /// them from the field (`free`, or `free.0`, `free.1`, ... in a
    /// multi-band tier): the 429 body's `violated-policies`.
    ///
    /// A refusal by the concurrency limit names its item
    /// (`free.concurrency`), after the bands that would have refused the
    /// request too.
    pub fn violated_policies(&self) -> impl Iterator<Item = &str> + '_ {
        let slots = self
            .is_concurrency_limited()
            .then_some(())
            .and(self.detail.tier.headers.slots.as_ref());
        self.detail
            .bands
            .iter()
            .zip(self.detail.tier.headers.names.iter())
            .filter(|(state, _)| state.retry_after_ns > 0)
            .map(|(_, name)| &**name)
            .chain(slots.map(|s| &*s.name))
    }

    /// Whether the request was refused because the user had as many
    /// requests in flight as the tier's concurrency limit allows (its rate
    /// was not charged). Such a refusal has `Retry-After: 1` (no better
    /// estimate exists, and a client that waits it may be refused again),
    /// or, when a band of the tier would have refused the request too (a
    /// spent rate, a unit in debt), that band's wait; the band is then
    /// reported and named in [`violated_policies`](Self::violated_policies)
    /// beside the concurrency limit.
    pub fn is_concurrency_limited(&self) -> bool {
        self.detail.slots.is_some_and(|s| s.refused)
    }

    /// `Retry-After` in whole seconds, rounded up, never 0.
    pub fn retry_after_secs(&self) -> u64 {
        let nanos = self.retry_after.as_nanos();
        u64::try_from(nanos.div_ceil(1_000_000_000))
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// The band a decision reports, with its limit and state: the band closest
/// to denying (admitted) or the band that denies longest (denied).
pub(crate) struct Reported {
    /// Its index in [`TierEntry::decided`].
    pub(crate) band: usize,
    /// Its burst (`u32::MAX` for an admission of an unlimited tier).
    pub(crate) limit: u32,
    /// Its state (`remaining` is `u32::MAX` for an admission of an
    /// unlimited tier).
    pub(crate) state: BandState,
}

impl Reported {
    /// The band `d` of `tier` reports. An admission reports a request band
    /// (a unit's state is in its own items); a refusal the band that
    /// refused longest, a unit's included.
    #[inline]
    pub(crate) fn of(tier: &TierEntry, d: &Decision) -> Reported {
        let pick = if d.allowed {
            tier.request_states(&d.bands)
                .iter()
                .enumerate()
                .min_by(|(_, a), (_, b)| {
                    a.remaining
                        .cmp(&b.remaining)
                        .then(b.reset_after_ns.cmp(&a.reset_after_ns))
                })
        } else {
            d.bands.iter().enumerate().max_by_key(|(_, s)| s.retry_after_ns)
        };
        let (band, mut state) = pick.map(|(i, s)| (i, *s)).unwrap_or_default();
        let mut limit = tier.decided.get(band).map_or(0, Quota::burst);
        if tier.unlimited && d.allowed {
            // no request band decided
            (limit, state.remaining) = (u32::MAX, u32::MAX);
        }
        Reported { band, limit, state }
    }
}

/// When a band `reset_after` from `now` is full again, in Unix seconds
/// (rounded up): the `X-RateLimit-Reset` value.
pub(crate) fn reset_at_unix_secs(now: Nanos, reset_after_ns: u64) -> u64 {
    let at = u128::from(now) + u128::from(reset_after_ns);
    u64::try_from(at.div_ceil(1_000_000_000)).unwrap_or(u64::MAX)
}

/// Turns a storage decision into the public outcome, reporting the band
/// closest to denying (admitted) or the band that denies longest (denied).
pub(crate) fn outcome(tier: &Arc<TierEntry>, d: Decision) -> Result<RateLimitInfo, RateLimited> {
    if let Some(slots) = d.slots.filter(|s| s.refused) {
        return Err(concurrency_limited(tier, d, slots));
    }
    let Reported { band, limit, state } = Reported::of(tier, &d);
    let detail = Detail {
        tier: tier.clone(),
        now: d.now,
        bands: d.bands,
        band,
        source: d.source,
        slots: d.slots,
    };
    let reset_after = Duration::from_nanos(state.reset_after_ns);
    if d.allowed {
        Ok(RateLimitInfo {
            limit,
            remaining: state.remaining,
            reset_after,
            detail,
        })
    } else {
        Err(RateLimited {
            limit,
            remaining: state.remaining,
            retry_after: Duration::from_nanos(state.retry_after_ns),
            reset_after,
            detail,
        })
    }
}

/// Whether a band of a decision refused it (it reports a wait).
pub(crate) fn a_band_refuses(bands: &[BandState]) -> bool {
    bands.iter().any(|band| band.retry_after_ns > 0)
}

/// A refusal for want of a free slot: `Retry-After: 1` (a slot comes free
/// when a request ends, which no clock tells), the concurrency limit as the
/// reported limit; or, when a band of the decision would refuse too (the
/// storage asked them, charging nothing), that band's wait and state, so
/// that the refusal is never answered sooner than the rate allows.
#[cold]
fn concurrency_limited(tier: &Arc<TierEntry>, d: Decision, slots: SlotState) -> RateLimited {
    let second = Duration::from_secs(1);
    let refusing = a_band_refuses(&d.bands);
    let (limit, remaining, retry_after, reset_after, band) = if refusing {
        let Reported { band, limit, state } = Reported::of(tier, &d);
        let retry = Duration::from_nanos(state.retry_after_ns).max(second);
        (
            limit,
            state.remaining,
            retry,
            Duration::from_nanos(state.reset_after_ns),
            band,
        )
    } else {
        // the configured limit, not a share of it that a storage decided
        // with (a `Fallback` while its primary is down)
        let limit = tier.concurrency.map_or(slots.limit, std::num::NonZeroU32::get);
        (limit, 0, second, second, 0)
    };
    // bands that would admit say nothing of this refusal
    let bands = if refusing { d.bands } else { BandStates::new() };
    RateLimited {
        limit,
        remaining,
        retry_after,
        reset_after,
        detail: Detail {
            tier: tier.clone(),
            now: d.now,
            bands,
            band,
            source: d.source,
            slots: Some(slots),
        },
    }
}

/// Why a check could not be decided.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum CheckError {
    /// The tier name is not configured.
    UnknownTier(String),
    /// The storage failed.
    Storage(StorageError),
    /// The cost exceeds the tier's burst (of its smallest band): the request
    /// could never pass. Nothing was charged.
    CostExceedsLimit {
        /// The tier.
        tier: String,
        /// The cost asked for.
        cost: u32,
        /// The most a request of this tier may cost.
        limit: u32,
    },
    /// The user id is empty or longer than [`MAX_USER_ID_LEN`] bytes.
    InvalidUserId,
    /// The tier has no unit of this name
    /// ([`RateTierBuilder::tier_unit`](crate::RateTierBuilder::tier_unit)).
    UnknownUnit {
        /// The tier.
        tier: String,
        /// The unit asked for.
        unit: String,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::UnknownTier(t) => write!(f, "unknown tier `{t}`"),
            CheckError::Storage(e) => e.fmt(f),
            CheckError::CostExceedsLimit { tier, cost, limit } => write!(
                f,
                "a request costing {cost} can never pass tier `{tier}`, whose burst is {limit}"
            ),
            CheckError::InvalidUserId => {
                write!(f, "the user id is empty or longer than {MAX_USER_ID_LEN} bytes")
            }
            CheckError::UnknownUnit { tier, unit } => {
                write!(f, "tier `{tier}` has no unit `{unit}`")
            }
        }
    }
}

impl std::error::Error for CheckError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckError::Storage(e) => Some(e),
            _ => None,
        }
    }
}

impl From<StorageError> for CheckError {
    fn from(e: StorageError) -> Self {
        CheckError::Storage(e)
    }
}
