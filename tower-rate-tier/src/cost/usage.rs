//! A request's usage of its tier's units, through its charge: reservations
//! taken up front, usage recorded when it is known, the bytes of content
//! its response body carried.
//!
//! A reservation is kept in the charge until it is settled by a record of
//! the same unit; one never settled stays charged (the work it stood for
//! may have been done: the client went away, the handler failed after
//! using it).

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use super::parts::Parts;
use super::{Charge, Ledger};
use crate::meter::{ContentMeter, UsageSink};
use crate::quota::CONTENT_BYTES;
use crate::storage::{Amount, Decide, Decision, DecisionSource, StorageError};
use crate::tier::{CheckError, TierEntry, check_result, forgiven, moves_nothing, settlement};

/// A refused reservation: the response to answer with, and whether the
/// request stays counted (else the response carries the limiter's refusal
/// mark, and every limiter gives the request's charge back).
pub(crate) struct Refused {
    pub(crate) response: Response<Bytes>,
    pub(crate) counted: bool,
}

impl Refused {
    fn consuming_nothing(response: Response<Bytes>) -> Self {
        Refused {
            response,
            counted: false,
        }
    }
}

/// A refusal of a reservation that consumes nothing, as the request's
/// charges note it: its HTTP status, and the gRPC status it becomes (its
/// code and details, the `RetryInfo` and `QuotaFailure` of this very
/// refusal), by which a tonic handler's answer is known to be it.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "grpc"), allow(dead_code))] // read by gRPC answers only
pub(crate) struct NotedRefusal {
    status: http::StatusCode,
    #[cfg(feature = "grpc")]
    grpc: (tonic::Code, Bytes),
}

/// The refusals a request's reservations got, oldest first, at most
/// [`MAX_NOTED_REFUSALS`] (boxed in a charge: a thin pointer).
#[derive(Debug, Default)]
pub(crate) struct NotedRefusals(pub(super) Vec<NotedRefusal>);

/// The most refusals of reservations one request's charge keeps (a handler
/// that meets more answers with one of its last ones, if any).
pub(super) const MAX_NOTED_REFUSALS: usize = 8;

impl NotedRefusal {
    /// The refusal `response` (a 429 or 503 that consumes nothing).
    pub(crate) fn of(response: &Response<Bytes>) -> Self {
        NotedRefusal {
            status: response.status(),
            #[cfg(feature = "grpc")]
            grpc: {
                let mut copy = Response::new(response.body().clone());
                *copy.status_mut() = response.status();
                *copy.headers_mut() = response.headers().clone();
                let status = crate::grpc::refusal_status(copy);
                (status.code(), status.details().to_vec().into())
            },
        }
    }

    /// Whether `response` is a gRPC answer that is this refusal, which it
    /// then answers: a [`TierRefusal`](crate::TierRefusal) turned into a
    /// `tonic::Status` carries none of the refusal's marks, and its HTTP
    /// status is 200. It is known by its status: the refusal's code and
    /// details (a handler's own status, after a refusal it did not answer
    /// with, is not it). Such a response is marked a refusal (it consumes
    /// nothing here or in limiters further out); `Some(true)` when the
    /// refusal was for want of quota (every reservation the handler did
    /// not record comes back too), `None` when it does not answer it.
    #[cfg(feature = "grpc")]
    pub(crate) fn answered_by<B>(&self, response: &mut Response<B>) -> Option<bool> {
        if !crate::grpc::is_grpc(response.headers()) {
            return None;
        }
        let answered = tonic::Status::from_header_map(response.headers())?;
        if (answered.code(), answered.details()) != (self.grpc.0, &self.grpc.1[..]) {
            return None;
        }
        crate::body::mark_refusal(response);
        Some(self.status == http::StatusCode::TOO_MANY_REQUESTS)
    }
}

impl Charge {
    /// Notes `refusal`, which a reservation of this request got (in this
    /// limiter or another one of the request).
    pub(crate) fn note_usage_refusal(&self, refusal: NotedRefusal) {
        let mut state = self.lock();
        let noted = &mut state.usage_refusals.get_or_insert_default().0;
        if noted.len() == MAX_NOTED_REFUSALS {
            noted.remove(0);
        }
        noted.push(refusal);
    }
}

impl Charge {
    /// Whether this charge's tier counts `unit`.
    pub(crate) fn counts(&self, unit: &str) -> bool {
        self.tier.unit(unit).is_some()
    }

    /// Whether a tier of this charge's limiter counts or counted `unit`
    /// (see [`RateTier::knows_unit`]).
    pub(crate) fn knows_unit(&self, unit: &str) -> bool {
        self.ledger.tiers.knows_unit(unit)
    }

    /// Takes `n` units of `unit` up front: `Err` is the refusal to answer
    /// with (429 with the unit's fields, or 403 when `n` could never fit).
    /// In shadow mode a would-be refusal is reported and let through,
    /// reserving nothing.
    pub(crate) async fn reserve(&self, unit: &str, n: u32) -> Result<(), Refused> {
        let tiers = &self.ledger.tiers;
        let refusals = &self.ledger.refusals;
        let shadowed = self.ledger.shadowed(&self.tier);
        let charge = Amount::Charge(n);
        let decided = match tiers.start_usage(self.user.id(), &self.tier, unit, charge, None) {
            Ok(decide) => check_result(&self.tier, decide.await),
            Err(error) => Err(error),
        };
        match decided {
            Ok(Ok(info)) => {
                // what a fallback's local limiter did not take of it
                let not_taken = info
                    .bands()
                    .filter(|(quota, _)| quota.unit().as_str() == unit)
                    .map(|(_, state)| state.forgiven)
                    .max()
                    .unwrap_or(0);
                self.add_reserved(unit, n - not_taken.min(n), info.source());
                Ok(())
            }
            Ok(Err(limited)) if shadowed => {
                refusals.shadow_limited(self.user.as_str(), n, &limited);
                Ok(())
            }
            Ok(Err(limited)) => {
                // its fields as they stand once the request's own charge is
                // given back (the refusal's mark does that on the way out)
                let charged = self.lock().charged.total();
                let limited = limited.with_requests_refunded(charged);
                Err(Refused::consuming_nothing(refusals.limited(
                    self.user.as_str(),
                    n,
                    &limited,
                )))
            }
            Err(CheckError::Storage(error)) => {
                match refusals.storage_failed(self.user.as_str(), &self.tier.name, &error) {
                    // let through (fail open): nothing reserved
                    None => Ok(()),
                    Some(refusal) => Err(Refused::consuming_nothing(refusal)),
                }
            }
            Err(error) => {
                let user = self.user.as_str();
                let refusal = match error {
                    CheckError::CostExceedsLimit { cost, limit, .. } => {
                        refusals.above_burst(user, &self.tier.name, cost, limit, Some(unit))
                    }
                    error => refusals.check_failed(user, &self.tier.name, n, &error),
                };
                // A reservation that could never fit (403) is the client's
                // own error: its request stays counted, so that asking for
                // more than a burst never reaches the handler more often
                // than the request bands allow.
                if shadowed {
                    Ok(())
                } else {
                    Err(Refused {
                        response: refusal,
                        counted: true,
                    })
                }
            }
        }
    }

    /// Settles `unit` at `used` units: the reservation's unused part given
    /// back, or what exceeds it charged, into debt if need be. Never waits:
    /// a storage that must is answered in a task of its own.
    pub(crate) fn record(&self, unit: &str, used: u32) {
        let mut reserved = self.take_reserved(unit);
        let amount = settlement(reserved.total(), used);
        if moves_nothing(amount) {
            // used exactly what was reserved: recorded, nothing to ask
            let refusals = &self.ledger.refusals;
            return refusals.usage_recorded(self.user.as_str(), &self.tier.name, unit, used, 0);
        }
        if let Amount::Refund(back) = amount {
            // each part given back where it was reserved; the last one
            // reports the usage
            let parts = reserved.take(back);
            let last = parts.each().count();
            for (i, (units, decided_by)) in parts.each().enumerate() {
                let used = if i + 1 == last { used } else { 0 };
                // what was used was charged by the reservation: a failed
                // refund loses none of it
                let usage = Usage { used, lost: 0 };
                self.settle_part(unit, usage, Amount::Refund(units), decided_by);
            }
            return;
        }
        // beyond the reservation: what a failed charge loses
        let lost = match amount {
            Amount::Force(more) => more,
            _ => 0,
        };
        self.settle_part(unit, Usage { used, lost }, amount, DecisionSource::Storage);
    }

    /// Starts `amount` of `unit` (a refund: of what a decision of
    /// `decided_by` reserved) and reports `usage` when it is settled.
    fn settle_part(&self, unit: &str, usage: Usage, amount: Amount, decided_by: DecisionSource) {
        let tiers = &self.ledger.tiers;
        match tiers.start_usage(self.user.id(), &self.tier, unit, amount, Some(decided_by)) {
            Ok(decide) => self.settled(unit, usage, decide),
            Err(error) => usage.failed(&self.ledger, self.user.as_str(), &self.tier.name, unit, &error),
        }
    }

    /// Reports what a settlement forgave, or lost, now or when the storage
    /// answers (only then are the charge's names copied, for the task).
    fn settled(&self, unit: &str, usage: Usage, decide: Decide) {
        let decided = match decide.into_ready() {
            Ok(decided) => decided,
            Err(pending) => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let (ledger, user, tier) = (self.ledger.clone(), self.user.clone(), self.tier.clone());
                    let unit = unit.to_owned();
                    runtime.spawn(async move {
                        report(&ledger, user.as_str(), &tier, &unit, usage, pending.await);
                    });
                    return;
                }
                Err(_) => Err(StorageError::new(
                    crate::storage::StorageErrorKind::Other,
                    "the storage waits and no tokio runtime runs here",
                )),
            },
        };
        report(&self.ledger, self.user.as_str(), &self.tier, unit, usage, decided);
    }

    /// Gives back `n` units of `unit` this charge reserved (a reservation
    /// another limiter refused).
    pub(crate) fn unreserve(&self, unit: &str, n: u32) {
        let mut reserved = self.take_reserved(unit);
        let parts = reserved.take(n);
        self.put_reserved(unit, reserved);
        self.give_back_reserved(unit, parts);
    }

    /// The request was refused for want of quota (a 429 of its own or of a
    /// limiter further in), and such a request consumes nothing: every
    /// reservation the handler left unsettled is given back, whichever unit
    /// refused it.
    pub(crate) fn give_back_unrecorded(&self) {
        let reserved = std::mem::take(&mut self.lock().reserved);
        for (id, parts) in reserved {
            if let Some(bands) = self.tier.units.iter().find(|bands| bands.unit.id() == id) {
                self.give_back_reserved(bands.unit.as_str(), parts);
            }
        }
    }

    /// Gives `parts` of `unit` back, each where it was reserved.
    fn give_back_reserved(&self, unit: &str, parts: Parts) {
        for (units, decided_by) in parts.each() {
            let refund = Amount::Refund(units);
            if let Ok(decide) =
                self.ledger
                    .tiers
                    .start_usage(self.user.id(), &self.tier, unit, refund, Some(decided_by))
            {
                self.settled(unit, Usage { used: 0, lost: 0 }, decide);
            }
        }
    }

    /// Usage of a unit no limiter of the request counts: reported, lost.
    pub(crate) fn unit_unknown(&self, unit: &str, used: u32) {
        let error = CheckError::UnknownUnit {
            tier: self.tier.name.to_string(),
            unit: crate::refusal::shown(unit),
        };
        self.ledger
            .refusals
            .usage_lost(self.user.as_str(), &self.tier.name, unit, used, &error);
    }

    /// Adds `n` units of `unit` reserved by a decision of `decided_by`.
    fn add_reserved(&self, unit: &str, n: u32, decided_by: DecisionSource) {
        self.put_reserved(unit, Parts::by(n, decided_by));
    }

    /// Adds `more` to what is reserved of `unit`.
    fn put_reserved(&self, unit: &str, more: Parts) {
        if more.total() == 0 {
            return;
        }
        let Some(unit) = self.tier.unit(unit).map(|u| u.unit.id()) else {
            return;
        };
        let mut state = self.lock();
        match state.reserved.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, reserved)) => reserved.add(more),
            None => state.reserved.push((unit, more)),
        }
    }

    /// The units of `unit` reserved and not settled yet, now settled.
    fn take_reserved(&self, unit: &str) -> Parts {
        let none = Parts::default();
        let Some(unit) = self.tier.unit(unit).map(|u| u.unit.id()) else {
            return none;
        };
        let mut state = self.lock();
        let at = state.reserved.iter().position(|(u, _)| *u == unit);
        at.map_or(none, |at| state.reserved.swap_remove(at).1)
    }

    /// A refusal's content is the limiter's and counts nothing: what the
    /// handler reserved of `content-bytes` is given back.
    pub(crate) fn refused_content(&self) {
        if self.counts(CONTENT_BYTES) {
            self.unreserve(CONTENT_BYTES, u32::MAX);
        }
    }

    /// A meter of the response body's content, when the tier counts
    /// `content-bytes`.
    pub(crate) fn content_meter(self: &Arc<Self>) -> Option<ContentMeter> {
        self.counts(CONTENT_BYTES)
            .then(|| ContentMeter::new(self.clone() as Arc<dyn UsageSink>))
    }
}

impl UsageSink for Charge {
    /// Records `bytes` in settlements of at most `u32::MAX` each: a body
    /// above 4 GiB is charged whole (into the debt bound, what is beyond it
    /// forgiven and reported, never dropped unseen).
    fn content_bytes(&self, bytes: u64) {
        let mut left = bytes;
        loop {
            let part = u32::try_from(left).unwrap_or(u32::MAX);
            self.record(CONTENT_BYTES, part);
            left -= u64::from(part);
            if left == 0 {
                return;
            }
        }
    }
}

/// What a settlement reports: `used` units of usage, of which `lost` are
/// lost when its storage call fails (what it charges beyond the
/// reservation; the rest the reservation charged).
#[derive(Clone, Copy)]
struct Usage {
    used: u32,
    lost: u32,
}

impl Usage {
    /// Reports a settlement whose storage call failed: what the
    /// reservation charged is recorded, what was to be charged beyond it
    /// is lost; a failed refund loses no usage (the unused part stays
    /// charged, as any failed refund).
    fn failed(self, ledger: &Ledger, user: &str, tier: &str, unit: &str, error: &CheckError) {
        let refusals = &ledger.refusals;
        let lost = self.lost.min(self.used);
        if self.used > lost {
            refusals.usage_recorded(user, tier, unit, self.used - lost, 0);
        }
        if lost > 0 {
            refusals.usage_lost(user, tier, unit, lost, error);
        } else {
            refusals.refund_failed(error);
        }
    }
}

/// Reports a settlement of `usage` of `unit` by `user` of `tier`:
/// recorded (and what its debt bound forgave), or lost.
fn report(
    ledger: &Ledger,
    user: &str,
    tier: &TierEntry,
    unit: &str,
    usage: Usage,
    decided: Result<Decision, StorageError>,
) {
    match decided {
        Ok(decision) => {
            let units = tier.unit(unit).map_or(0, |bands| forgiven(bands, &decision));
            ledger
                .refusals
                .usage_recorded(user, &tier.name, unit, usage.used, units);
        }
        Err(error) => usage.failed(ledger, user, &tier.name, unit, &CheckError::Storage(error)),
    }
}
