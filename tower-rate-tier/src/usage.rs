//! [`TierUsage`], a request's usage of its tier's units, and [`TierRefusal`].

use bytes::Bytes;
use http::{Response, StatusCode};

use crate::cost::{Charges, NotedRefusal, Refused};

/// A request's usage of its tier's units (tokens, points,
/// any unit of [`RateTierBuilder::tier_unit`](crate::RateTierBuilder::tier_unit)),
/// charged when the handler knows it.
///
/// A request behind the layer is admitted when its request bands admit it
/// and none of its units is exhausted. The handler then tells the limiter
/// what the request used:
///
/// * [`reserve`](TierUsage::reserve) takes an estimate up front, and
///   refuses with a [`TierRefusal`] (the 429 the layer gives, with the
///   unit's fields) when it does not fit. A reservation refused with 429
///   gives the request's own charge back: the response carries the
///   limiter's refusal mark, so a refused request consumes nothing. One
///   above the unit's smallest burst, which could never fit, is a 403 that
///   keeps the request counted.
/// * [`record`](TierUsage::record) settles what was used: it gives back the
///   unused part of the reservation, or charges what exceeds it even beyond
///   what is left, putting the unit in debt of at most one burst of its
///   smallest band (the tier's next requests are refused until it is
///   repaid at the unit's rate). Usage beyond that bound is forgiven and
///   reported ([`RateLimitEvent::UsageForgiven`](crate::RateLimitEvent::UsageForgiven)
///   and a warning). It never waits: a storage that must (Redis) is
///   answered in a task of its own, and a write that fails is logged and
///   reported ([`RateLimitEvent::UsageLost`](crate::RateLimitEvent::UsageLost));
///   under a [`Fallback`](crate::storage::Fallback) the local limiter
///   takes it instead.
/// * A reservation never recorded (the handler failed, the client went
///   away, the stream was dropped) stays charged: the work it stood for
///   may have been done. Record the real usage on every path that knows it.
/// * A unit recorded twice is charged twice: each record is usage, settling
///   the reservation left at that moment.
///
/// The handle is `Clone + Send + 'static`: move it into a streamed body and
/// record when the stream ends. With stacked limiters each one whose tier
/// has the unit takes it; in shadow mode a unit's would-be refusal is
/// reported and let through. The unit `content-bytes` is counted by the
/// layer itself from the response body (see [`CONTENT_BYTES`](crate::quota::CONTENT_BYTES)).
///
/// For tonic services, [`TierUsage::from_extensions`] finds the handle in
/// the request's extensions.
#[derive(Clone, Debug)]
pub struct TierUsage {
    charges: Charges,
}

/// A refusal of a [`TierUsage`] call: the response to answer with (429
/// with the unit's fields; 403 for an amount that could never fit; 500
/// when no tier of a limiter in front counts or counted the unit). A 429 gives the request's own charge
/// back (the request consumes nothing); a 403 keeps it (asking for more
/// than a unit's burst is the client's error, and must not reach the
/// handler more often than the request bands allow).
#[derive(Debug)]
pub struct TierRefusal {
    response: Response<Bytes>,
}

impl TierUsage {
    /// The handle of the request whose extensions these are (a tonic
    /// request's `extensions()`), when a limiter admitted it.
    pub fn from_extensions(extensions: &http::Extensions) -> Option<TierUsage> {
        let charges = extensions.get::<Charges>()?;
        (!charges.0.is_empty()).then(|| TierUsage {
            charges: charges.clone(),
        })
    }

    /// Takes `n` units of `unit` up front from every limiter whose tier has
    /// the unit; refused (nothing taken anywhere) when it does not fit in
    /// one of them. A tier without the unit (a plan that does not limit
    /// it) takes nothing, when a tier of the same limiter counts it or did
    /// (before a change at run time), or a customer's own quotas of a
    /// request it saw did. A unit no tier counts or counted is
    /// an error (a 500 that names it): a misspelt unit is never silently
    /// uncounted; a request a limiter let through uncounted (by policy, or
    /// a storage failure under `OnStorageError::Allow`) is not refused for
    /// it.
    pub async fn reserve(&self, unit: &str, n: u32) -> Result<(), TierRefusal> {
        let mut taken = 0;
        for charge in self.charges.0.iter().flatten().filter(|c| c.counts(unit)) {
            if let Err(refused) = charge.reserve(unit, n).await {
                // give back what the limiters before it took
                for earlier in self
                    .charges
                    .0
                    .iter()
                    .flatten()
                    .filter(|c| c.counts(unit))
                    .take(taken)
                {
                    earlier.unreserve(unit, n);
                }
                if !refused.counted {
                    // every limiter of the request knows the refusal when
                    // the handler answers with it (as a `tonic::Status`)
                    let noted = NotedRefusal::of(&refused.response);
                    for charge in self.charges.0.iter().flatten() {
                        charge.note_usage_refusal(noted.clone());
                    }
                }
                return Err(TierRefusal::from(refused));
            }
            taken += 1;
        }
        // a limiter that let the request through uncounted (by policy, a
        // storage failure under `OnStorageError::Allow`, an unlimited tier)
        // counts nothing of it
        if taken == 0 && !self.let_through() && !self.knows(unit) {
            return Err(TierRefusal::new(unknown_unit(unit)));
        }
        Ok(())
    }

    /// Settles `unit` at `used` units in every limiter whose tier has it:
    /// the unused part of the reservation given back, or what exceeds it
    /// charged, into a bounded debt. Never waits and never fails: what
    /// cannot be recorded (no tier of a limiter counts or counted the
    /// unit, the storage failed) is logged and reported as an event; a
    /// tier without a unit another tier counts records nothing, silently.
    pub fn record(&self, unit: &str, used: u32) {
        let mut recorded = false;
        for charge in self.charges.0.iter().flatten().filter(|c| c.counts(unit)) {
            charge.record(unit, used);
            recorded = true;
        }
        if !recorded && !self.let_through() && !self.knows(unit) {
            if let Some(charge) = self.charges.0.iter().flatten().next() {
                charge.unit_unknown(unit, used);
            }
        }
    }

    /// Whether a limiter let the request through without counting it.
    fn let_through(&self) -> bool {
        self.charges.0.iter().any(Option::is_none)
    }

    /// Whether a limiter in front knows `unit` (a tier of its counts or
    /// counted it): a tier without it, a plan that does not limit it, is
    /// not a typo.
    fn knows(&self, unit: &str) -> bool {
        self.charges.0.iter().flatten().any(|c| c.knows_unit(unit))
    }
}

impl From<Refused> for TierRefusal {
    fn from(refused: Refused) -> Self {
        if refused.counted {
            // the request counts: no refusal mark, but no cache may keep it,
            // and its content is the limiter's
            let mut response = refused.response;
            crate::body::mark_answer(&mut response);
            return TierRefusal { response };
        }
        TierRefusal::new(refused.response)
    }
}

impl TierRefusal {
    fn new(mut response: Response<Bytes>) -> Self {
        crate::body::mark_refusal(&mut response);
        TierRefusal { response }
    }

    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        self.response.status()
    }

    /// The response it answers with: its fields and its RFC 9457 body.
    pub fn response(&self) -> &Response<Bytes> {
        &self.response
    }

    /// The response it answers with, for a service that is not axum.
    pub fn into_http(self) -> Response<Bytes> {
        self.response
    }
}

impl std::fmt::Display for TierRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "usage refused with {}", self.response.status())
    }
}

impl std::error::Error for TierRefusal {}

/// No limiter in front of the handler counts `unit`: a 500 that names it.
fn unknown_unit(unit: &str) -> Response<Bytes> {
    let unit = crate::refusal::shown(unit);
    tracing::error!(
        target: "tower_rate_tier",
        unit,
        "usage of a unit no limiter in front of this handler counts: refused with 500 (a unit only \
         customers' own quotas count is named with `RateTierBuilder::contract_unit`)"
    );
    crate::problem::problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "no rate limiter in front of this handler counts this unit",
        serde_json::json!({ "unit": unit }),
    )
}

#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for TierUsage {
    type Rejection = TierRefusal;

    async fn from_request_parts(parts: &mut http::request::Parts, _state: &S) -> Result<Self, TierRefusal> {
        TierUsage::from_extensions(&parts.extensions).ok_or_else(|| {
            tracing::error!(target: "tower_rate_tier", "a handler takes TierUsage but no TierLimitLayer ran before it: refused with 500");
            TierRefusal::new(crate::problem::problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "no rate limiter runs in front of this handler",
                serde_json::Value::Null,
            ))
        })
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for TierRefusal {
    fn into_response(self) -> axum::response::Response {
        self.response.map(axum::body::Body::from)
    }
}

#[cfg(feature = "grpc")]
impl From<TierRefusal> for tonic::Status {
    /// The refusal as the gRPC status the layer answers a gRPC call with
    /// (see [`grpc`](crate::grpc)): RESOURCE_EXHAUSTED with `RetryInfo` and
    /// a `QuotaFailure` naming the unit's item for a refusal by a unit,
    /// PERMISSION_DENIED for an amount that could never fit; the rate-limit
    /// fields as metadata. Answered (`?` in a handler), a refusal for want
    /// of quota consumes nothing, as the layer's 429 does: the layer knows
    /// the call's status for the refusal its reservation got, and gives
    /// back the request's charge and every reservation the handler did not
    /// record.
    fn from(refusal: TierRefusal) -> Self {
        crate::grpc::refusal_status(refusal.response)
    }
}
