//! Answering locally: the local limiter with the instance's share of each
//! quota, where it keeps a tier, and what a decision needs to be answered
//! there later.

use std::sync::Arc;
use std::time::Duration;

use arrayvec::ArrayVec;
use smallvec::SmallVec;

use super::Shared;
use crate::clock::Clock;
use crate::quota::Quota;
use crate::storage::{
    Amount, Amounts, Decision, DecisionSource, MAX_BANDS, Op, ScopeKey, Slots, Storage, StorageError,
    StorageErrorKind, TierScope,
};

impl Shared {
    /// The local limiter's decision of `call` in the tier `local`, with
    /// every band scaled to the share, in the state of spell `epoch`.
    pub(super) fn answer_locally(
        &self,
        local: Local<'_>,
        call: Call<'_>,
        epoch: u64,
    ) -> Result<Decision, StorageError> {
        let bands_out_of_range =
            || StorageError::new(StorageErrorKind::Other, "a decision needs 1 to MAX_BANDS bands");
        if call.bands.is_empty() {
            return Err(bands_out_of_range());
        }
        // A customer's own bands come with each decision: they are scaled
        // here, never kept per distinct quota.
        let mut scaled = ArrayVec::<Quota, MAX_BANDS>::new();
        for quota in call.bands {
            scaled
                .try_push(scale(quota, self.share))
                .map_err(|_| bands_out_of_range())?;
        }
        // The spell's state under keys of its own (the epoch before the
        // user id), in the local limiter's scope of the tier: a new spell
        // starts afresh, and the sweep removes an old spell's keys.
        let mut user = String::with_capacity(21 + call.user.len());
        user.push_str(itoa::Buffer::new().format(epoch));
        user.push(':');
        user.push_str(call.user);
        let fit = |amount| fit_share(amount, call.bands, &scaled);
        let op = match call.op {
            Op::Charge(cost) => each_or(Op::Charge(cost), fit(Amount::Charge(cost))),
            Op::Refund(units) => each_or(Op::Refund(units), fit(Amount::Refund(units))),
            Op::Acquire { cost, slots } => {
                let slots = scale_slots(slots, self.share);
                match fit(Amount::Charge(cost)) {
                    Some(amounts) => Op::AcquireEach { amounts, slots },
                    None => Op::Acquire { cost, slots },
                }
            }
            Op::Each(amounts) => Op::Each(scale_debts(amounts, self.share, call.bands, &scaled)),
            Op::AcquireEach { amounts, slots } => Op::AcquireEach {
                amounts: scale_debts(amounts, self.share, call.bands, &scaled),
                slots: scale_slots(slots, self.share),
            },
            op => op,
        };
        let decided = match local {
            Local::Prepared(scope) => scope.decide(&user, &scaled, op, call.clock),
            Local::Named(at) => self.local.decide(at.user(&user), &scaled, op, call.clock),
        };
        match decided.into_ready() {
            Ok(decided) => decided.map(|mut d| {
                if d.allowed {
                    not_taken(&mut d, call.op, op);
                }
                d.with_source(DecisionSource::Fallback)
            }),
            Err(_) => Err(StorageError::new(
                StorageErrorKind::Other,
                "the local fallback limiter did not decide at once",
            )),
        }
    }
}

/// `quota` scaled to `share`: see [Scaling](super#scaling).
pub(super) fn scale(quota: &Quota, share: f64) -> Quota {
    if quota.is_unlimited() || share >= 1.0 {
        return *quota;
    }
    // `as` saturates: a burst or an interval too large to scale stays
    // within its type.
    let burst = ((f64::from(quota.burst()) * share).ceil() as u32).max(1);
    let interval = ((quota.emission_interval_nanos() as f64 / share).ceil() as u64).max(1);
    Quota::per_period(1, Duration::from_nanos(interval))
        .with_burst(burst)
        .in_unit(quota.unit())
}

/// A concurrency limit scaled to `share`: `ceil(limit × share)`, at least 1
/// (two instances with 3 slots between them get 2 each).
pub(super) fn scale_slots(slots: Slots, share: f64) -> Slots {
    if share >= 1.0 {
        return slots;
    }
    let limit = ((f64::from(slots.limit) * share).ceil() as u32).max(1);
    Slots { limit, ..slots }
}

/// A request's amount (a charge, or a refund of one) in the local request
/// band `share` of the band `band`: at most the share's burst. A cost
/// within the band's burst but above its share's could never fit (a 429
/// whose wait never comes true): it fits once the share is full again,
/// takes it whole, and its wait says when; a refund gives back as much. A
/// cost above the band's own burst stays as it is (the primary would
/// refuse it too). Each band on its own: a longer band whose share fits
/// the cost is charged all of it.
fn in_share(amount: Amount, band: &Quota, share: &Quota) -> Amount {
    if !band.unit().is_requests() || band.is_unlimited() {
        return amount;
    }
    let fit = |n: u32| if n > band.burst() { n } else { n.min(share.burst()) };
    match amount {
        Amount::Charge(n) => Amount::Charge(fit(n)),
        Amount::Refund(n) => Amount::Refund(fit(n)),
        other => other,
    }
}

/// `amount` in every band, as [`in_share`] says, when that changes it in
/// some band: the amounts per band (with no debt).
fn fit_share(amount: Amount, bands: &[Quota], scaled: &[Quota]) -> Option<Amounts> {
    let fitted = bands
        .iter()
        .zip(scaled)
        .map(|(band, share)| in_share(amount, band, share));
    if fitted.clone().all(|fitted| fitted == amount) {
        return None;
    }
    let mut amounts = Amounts::new();
    for fitted in fitted {
        amounts.push(fitted, 0);
    }
    Some(amounts)
}

/// `uniform`, or the decision of `amounts` per band in its stead.
fn each_or(uniform: Op, amounts: Option<Amounts>) -> Op {
    amounts.map_or(uniform, Op::Each)
}

/// `amounts` for the local limiter's `scaled` bands: each debt bound scaled
/// to the share, a request's amount as [`in_share`] says, and a unit's
/// reservation larger than one of its local
/// bands (which the share could never fit: a 429 whose wait never comes
/// true) asked as the smallest of those bands instead, in every band of the
/// unit (it fits once that band is full again, and its wait says when; the
/// decision says what was not taken, see [`not_taken`]).
pub(super) fn scale_debts(amounts: Amounts, share: f64, bands: &[Quota], scaled: &[Quota]) -> Amounts {
    if share >= 1.0 {
        return amounts;
    }
    let band = |i: usize| scaled.get(i).copied().unwrap_or(Quota::unlimited());
    let mut local = Amounts::new();
    for (i, (amount, debt)) in amounts.iter().enumerate() {
        let amount = match amount {
            Amount::Charge(n) if debt > 0 => {
                let unit = band(i).unit();
                // the most every band of the unit reserving `n` can take
                let fits = (0..amounts.len())
                    .filter(|&j| band(j).unit() == unit && !band(j).is_unlimited())
                    .filter(|&j| matches!(amounts.get(j), (Amount::Charge(m), d) if m == n && d > 0))
                    .map(|j| band(j).burst())
                    .fold(n, u32::min);
                Amount::Charge(fits)
            }
            other => match (bands.get(i), scaled.get(i)) {
                (Some(band), Some(share)) => in_share(other, band, share),
                _ => other,
            },
        };
        // `as` saturates
        local.push(amount, (f64::from(debt) * share).ceil() as u32);
    }
    local
}

/// Tells, in the band states of `decision` (admitted), how much of each
/// reservation `asked` made the local limiter did not take (`local`, the
/// operation it carried out, asked less): [`BandState::forgiven`] of the
/// reservation's bands, so that what was taken is what a settlement gives
/// back. A reservation is a charge with a debt bound (a unit's); a
/// request's cost fitted to a share is none, and its bands say nothing.
///
/// [`BandState::forgiven`]: crate::storage::BandState::forgiven
fn not_taken(decision: &mut Decision, asked: Op, local: Op) {
    for (i, state) in decision.bands.iter_mut().enumerate() {
        if let ((Amount::Charge(n), 1..), (Amount::Charge(taken), _)) = (asked.band(i), local.band(i)) {
            state.forgiven = n.saturating_sub(taken);
        }
    }
}

/// Where the local limiter keeps a tier.
#[derive(Clone, Copy)]
pub(super) enum Local<'a> {
    /// Its scope, prepared with the tier.
    Prepared(&'a Arc<dyn TierScope>),
    /// Its names, for a decision by name.
    Named(ScopeKey<'a>),
}

impl Local<'_> {
    /// The same, owned, for a decision waiting for the primary.
    pub(super) fn keep(self) -> KeptLocal {
        match self {
            Local::Prepared(scope) => KeptLocal::Prepared(scope.clone()),
            Local::Named(at) => KeptLocal::Named(Text::new([at.namespace, at.tier])),
        }
    }
}

/// A [`Local`] owned.
pub(super) enum KeptLocal {
    Prepared(Arc<dyn TierScope>),
    /// The namespace and the tier.
    Named(Text<2>),
}

impl KeptLocal {
    pub(super) fn local(&self) -> Local<'_> {
        match self {
            KeptLocal::Prepared(scope) => Local::Prepared(scope),
            KeptLocal::Named(names) => {
                let [namespace, tier] = names.parts();
                Local::Named(ScopeKey { namespace, tier })
            }
        }
    }
}

/// One decision of a tier's user: what answering it locally needs.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub(super) user: &'a str,
    pub(super) bands: &'a [Quota],
    pub(super) op: Op,
    pub(super) clock: &'a Arc<dyn Clock>,
}

impl Call<'_> {
    /// The same, owned, for a decision waiting for the primary.
    pub(super) fn keep(self) -> KeptCall {
        KeptCall {
            user: Text::new([self.user]),
            // none when there are too many: answered locally, an error
            bands: ArrayVec::try_from(self.bands).unwrap_or_default(),
            op: self.op,
            clock: self.clock.clone(),
        }
    }
}

/// A [`Call`] owned.
pub(super) struct KeptCall {
    user: Text<1>,
    bands: ArrayVec<Quota, MAX_BANDS>,
    op: Op,
    clock: Arc<dyn Clock>,
}

impl KeptCall {
    pub(super) fn call(&self) -> Call<'_> {
        let [user] = self.user.parts();
        Call {
            user,
            bands: &self.bands,
            op: self.op,
            clock: &self.clock,
        }
    }
}

/// `N` strings, one after the other, kept inline while short.
pub(super) struct Text<const N: usize> {
    bytes: SmallVec<[u8; 48]>,
    ends: [usize; N],
}

impl<const N: usize> Text<N> {
    fn new(parts: [&str; N]) -> Self {
        let mut bytes = SmallVec::new();
        let ends = parts.map(|part| {
            bytes.extend_from_slice(part.as_bytes());
            bytes.len()
        });
        Text { bytes, ends }
    }

    fn parts(&self) -> [&str; N] {
        let mut start = 0;
        self.ends.map(|end| {
            // Each part was a `&str`, cut at its own boundaries.
            let part = std::str::from_utf8(&self.bytes[start..end]).unwrap_or_default();
            start = end;
            part
        })
    }
}
