//! Rate-limit header fields on responses, and the 429 refusal.
//!
//! Admitted responses carry
//!
//! * `X-RateLimit-Limit` (the burst), `X-RateLimit-Remaining`,
//!   `X-RateLimit-Reset` (the Unix time, in seconds rounded up, at which the
//!   band is full again): the request band closest to denying;
//! * `RateLimit-Policy` (`"free";q=10;w=60`) and `RateLimit`
//!   (`"free";r=9;t=6`) from draft-ietf-httpapi-ratelimit-headers, one item
//!   per band. `q` is the burst, `w` the seconds an emptied burst takes to
//!   refill (rounded up), `r` what remains, `t` the draft's "seconds until
//!   additional quota is made available": whole seconds, rounded up and at
//!   least 1, until the band admits more than now (a full band carries no
//!   `t`). Items of a multi-band tier are named `"free.0"`, `"free.1"`, ...
//!
//! A tier's units ([`tier_unit`](crate::RateTierBuilder::tier_unit)) are
//! items of their own after the request bands, named for the tier and the
//! unit: `"free.tokens"`, or `"free.tokens.0"`, `"free.tokens.1"` for a
//! unit of several bands. The draft's `qu` parameter only ever carries a
//! unit the draft registers: `qu="content-bytes"` on the items of the
//! `content-bytes` unit, `qu="concurrent-requests"` on a concurrency
//! limit's item (`"free.concurrency"`); request bands carry none (the
//! draft's default, `requests`), and any other unit is told by its item's
//! name alone. A unit in debt has `r=0` and a `t` that counts the debt.
//!
//! On a 429, the `t` of each band that refused is the time until the same
//! request would fit, so `Retry-After` (the longest of them) is never
//! earlier than any refusing item's `t`; bands that did not refuse carry no
//! `t`. A refusal by a unit (in debt, or a reservation that does not fit)
//! reports that unit's band in the `X-RateLimit-*` fields.
//!
//! [`RateLimitHeaders::OPENAI`](crate::RateLimitHeaders::OPENAI) adds the
//! fields OpenAI's API sends, for clients written against it:
//! `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests` and
//! `x-ratelimit-reset-requests` for the request band closest to denying,
//! and the same for each unit with the unit's name as suffix
//! (`x-ratelimit-remaining-tokens`; for a unit of several bands, its band
//! closest to denying). `limit` is the band's burst, `remaining` what it
//! could admit now, and `reset` the time until the band is full again (as
//! OpenAI's "time until the rate limit resets to its initial state"), in
//! OpenAI's format, Go's `time.Duration`: `0s`, `20ms`, `1s`, `1.5s`,
//! `6m0s`, `1h2m3.004s`, rounded up to the millisecond. On a 429 they
//! describe the state that refused: in each group the band that refused
//! longest, if one did. A refusal by the concurrency limit alone has none
//! of them; one that a band would make too has that band's.
//!
//! The layer adds these itself; the functions here serve your own
//! [`on_limited`](crate::TierLimitLayer::on_limited) response or a front
//! that is not HTTP middleware:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tower_rate_tier::{Quota, RateLimitHeaders, RateTier, clock::FakeClock, response};
//!
//! let tiers = RateTier::builder()
//!     .tier("free", Quota::per_minute(1))
//!     .tier_unit("free", "tokens", Quota::per_minute(1_000))
//!     .clock(FakeClock::new())
//!     .build();
//! tiers.check("ada", "free", 1).await.unwrap().unwrap();
//! let limited = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
//!
//! let mut refusal = response::too_many_requests(&limited);
//! response::apply_limited_headers(refusal.headers_mut(), &limited);
//! assert_eq!(refusal.status(), 429);
//! assert_eq!(refusal.headers()["retry-after"], "60");
//! assert_eq!(
//!     refusal.headers()["ratelimit-policy"],
//!     r#""free";q=1;w=60, "free.tokens";q=1000;w=60"#
//! );
//! assert_eq!(refusal.headers()["ratelimit"], r#""free";r=0;t=60, "free.tokens";r=1000"#);
//!
//! // OpenAI-style fields, for a front of your own
//! let mut headers = http::HeaderMap::new();
//! response::apply_limited_fields(&mut headers, &limited, RateLimitHeaders::OPENAI);
//! assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
//! assert_eq!(headers["x-ratelimit-reset-requests"], "1m0s");
//! assert_eq!(headers["x-ratelimit-limit-tokens"], "1000");
//! assert_eq!(headers["x-ratelimit-reset-tokens"], "0s");
//! # }
//! ```
//!
//! A 429 carries the same fields, `Retry-After` (whole seconds, rounded up,
//! never 0) and an RFC 9457 `application/problem+json` body of the draft's
//! type [`QUOTA_EXCEEDED`], whose `violated-policies` lists the names of the
//! `RateLimit-Policy` items that refused, with `tier`, `retry_after`, and
//! the `unit`, `limit` and `remaining` of the band that refused longest.
//! Unlimited tiers without units get no rate-limit fields.

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, Response};
use serde_json::json;

use crate::headers::{CONCURRENT_REQUESTS, RateLimitHeaders, number};
pub use crate::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_LIMIT_REQUESTS, X_RATELIMIT_REMAINING,
    X_RATELIMIT_REMAINING_REQUESTS, X_RATELIMIT_RESET, X_RATELIMIT_RESET_REQUESTS,
};
pub use crate::problem::QUOTA_EXCEEDED;
use crate::problem::quota_exceeded;
use crate::quota::Quota;
use crate::storage::{BandState, Decision, SlotState};
use crate::tier::{
    Detail, RateLimitInfo, RateLimited, Reported, TierEntry, a_band_refuses, reset_at_unix_secs,
};

fn insert_common(headers: &mut HeaderMap, info: Fields<'_>, which: RateLimitHeaders) {
    let tier = &info.tier.headers;
    // One growth of the map at most, rather than one per field.
    headers.reserve(if which.openai() { 5 + tier.openai.len() } else { 5 });
    let slots = info.slots;
    let by_slots = slots.is_some_and(|s| s.refused);
    // an unlimited tier reports a refusal (by its concurrency limit or a
    // unit), never an admission
    if which.legacy() && (!info.allowed || !info.tier.unlimited) {
        // a refusal by concurrency reports the concurrency limit, unless a
        // band refused too (the refusal then reports that band)
        let limit = match (&tier.slots, by_slots && !a_band_refuses(info.bands)) {
            (Some(item), true) => Some(&item.limit),
            _ => tier.limits.get(info.band),
        };
        if let Some(limit) = limit {
            headers.insert(X_RATELIMIT_LIMIT, limit.clone());
        }
        headers.insert(X_RATELIMIT_REMAINING, number(u64::from(info.remaining)));
        headers.insert(X_RATELIMIT_RESET, number(info.reset_at));
    }
    let bands: &[crate::storage::BandState] = if info.tier.counts_nothing() {
        &[]
    } else {
        info.bands
    };
    if which.ietf() {
        if let Some(policy) = &tier.policy {
            headers.insert(RATELIMIT_POLICY, policy.clone());
        }
        if let Some(value) = tier.ratelimit(bands, info.allowed, slots.map(|s| s.free())) {
            headers.insert(RATELIMIT, value);
        }
    }
    if which.openai() {
        tier.openai.insert(headers, &tier.limits, bands);
    }
}

/// What the fields of both outcomes are made of.
struct Fields<'a> {
    tier: &'a TierEntry,
    /// Every band's state, in the tier's order.
    bands: &'a [BandState],
    /// The reported band.
    band: usize,
    slots: Option<SlotState>,
    allowed: bool,
    remaining: u32,
    reset_at: u64,
}

impl<'a> Fields<'a> {
    fn of(detail: &'a Detail, allowed: bool, remaining: u32, reset_at: u64) -> Self {
        Fields {
            tier: &detail.tier,
            bands: &detail.bands,
            band: detail.band,
            slots: detail.slots,
            allowed,
            remaining,
            reset_at,
        }
    }
}

/// The chosen fields of an admission of `tier` from the storage's
/// `decision` as it stands, without building a [`RateLimitInfo`]: what
/// [`apply_info_fields`] adds for the outcome of that decision.
pub(crate) fn apply_admitted_fields(
    headers: &mut HeaderMap,
    tier: &TierEntry,
    decision: &Decision,
    which: RateLimitHeaders,
) {
    if (tier.counts_nothing() && decision.slots.is_none()) || which == RateLimitHeaders::NONE {
        return;
    }
    let Reported { band, state, .. } = Reported::of(tier, decision);
    let fields = Fields {
        tier,
        bands: &decision.bands,
        band,
        slots: decision.slots,
        allowed: true,
        remaining: state.remaining,
        reset_at: reset_at_unix_secs(decision.now, state.reset_after_ns),
    };
    insert_common(headers, fields, which);
}

/// Adds the headers of an admitted request (none for an unlimited tier).
pub fn apply_info_headers(headers: &mut HeaderMap, info: &RateLimitInfo) {
    apply_info_fields(headers, info, RateLimitHeaders::ALL);
}

/// Adds the headers of a denied request, `Retry-After` included.
pub fn apply_limited_headers(headers: &mut HeaderMap, limited: &RateLimited) {
    apply_limited_fields(headers, limited, RateLimitHeaders::ALL);
    headers.insert(RETRY_AFTER, number(limited.retry_after_secs()));
}

/// The chosen fields of an admitted request (none for an unlimited tier
/// without units): [`apply_info_headers`] is this with
/// [`RateLimitHeaders::ALL`].
pub fn apply_info_fields(headers: &mut HeaderMap, info: &RateLimitInfo, which: RateLimitHeaders) {
    if (info.detail.tier.counts_nothing() && info.slots().is_none()) || which == RateLimitHeaders::NONE {
        return;
    }
    let fields = Fields::of(&info.detail, true, info.remaining, info.reset_at_unix_secs());
    insert_common(headers, fields, which);
}

/// The chosen fields of a denied request's state, without `Retry-After`
/// ([`apply_limited_headers`] adds it to [`RateLimitHeaders::ALL`]).
pub fn apply_limited_fields(headers: &mut HeaderMap, limited: &RateLimited, which: RateLimitHeaders) {
    if which == RateLimitHeaders::NONE {
        return;
    }
    let fields = Fields::of(
        &limited.detail,
        false,
        limited.remaining,
        limited.reset_at_unix_secs(),
    );
    insert_common(headers, fields, which);
}

/// The default 429 response (without the rate-limit headers, which the
/// layer adds): an RFC 9457 problem of the draft's type
/// [`QUOTA_EXCEEDED`], whose
/// `violated-policies` names the `RateLimit-Policy` items that refused
/// ([`RateLimited::violated_policies`]), with the members `tier`,
/// `retry_after` (seconds), and the `unit` (`requests`, a unit's name such
/// as `tokens`, or `concurrent-requests`), `limit` and `remaining` of the
/// band that refused longest.
pub fn too_many_requests(limited: &RateLimited) -> Response<Bytes> {
    let retry = limited.retry_after_secs();
    let violated: Vec<&str> = limited.violated_policies().collect();
    let reported = limited
        .detail
        .tier
        .decided
        .get(limited.detail.band)
        .map(Quota::unit)
        .unwrap_or_default();
    // refused for want of a slot alone, or also by a band (which it then
    // reports, as `limit` and `remaining` do)
    let by_band = a_band_refuses(&limited.detail.bands);
    let (unit, detail) = match (limited.is_concurrency_limited(), by_band) {
        (true, false) => (
            CONCURRENT_REQUESTS,
            "too many requests of this client in flight; retry when one of them has ended",
        ),
        (true, true) => (
            reported.as_str(),
            "rate limit exceeded, and too many requests of this client in flight; retry after the \
             number of seconds in `retry_after`",
        ),
        (false, _) => (
            reported.as_str(),
            "rate limit exceeded; retry after the number of seconds in `retry_after`",
        ),
    };
    quota_exceeded(
        detail,
        json!({
            "violated-policies": violated,
            "tier": limited.tier(),
            "retry_after": retry,
            "unit": unit,
            "limit": limited.limit,
            "remaining": limited.remaining,
        }),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::storage::{BandStates, Lease};
    use crate::{Quota, RateTier};

    /// Tiers of every shape: one band, several, with units, with a
    /// concurrency limit, unlimited with either.
    fn tiers() -> RateTier {
        RateTier::builder()
            .tier("one", Quota::per_minute(10))
            .tier("two", [Quota::per_second(5), Quota::per_hour(100)])
            .tier("units", Quota::per_minute(20))
            .tier_unit(
                "units",
                "tokens",
                [Quota::per_minute(1_000), Quota::per_day(9_000)],
            )
            .tier_unit("units", "content-bytes", Quota::per_hour(1 << 20))
            .tier("slots", Quota::per_minute(30))
            .tier_concurrency("slots", 2)
            .tier("open", Quota::unlimited())
            .tier_concurrency("open", 3)
            .tier("open-units", Quota::unlimited())
            .tier_unit("open-units", "tokens", Quota::per_minute(500))
            .build()
    }

    fn state() -> impl Strategy<Value = BandState> {
        (any::<u32>(), any::<u64>(), any::<u64>(), 0..3u64, any::<u64>()).prop_map(
            |(remaining, reset, more, shape, debt)| {
                // a full band, a partly used one, a band in debt
                let used = shape > 0;
                BandState {
                    remaining,
                    reset_after_ns: if used { reset } else { 0 },
                    more_after_ns: if used { more } else { 0 },
                    debt_ns: if shape == 2 { debt } else { 0 },
                    ..BandState::default()
                }
            },
        )
    }

    proptest! {
        /// The fields an admission's charge writes from the storage's
        /// decision are those of the public outcome of that decision.
        #[test]
        fn admitted_fields_are_the_outcomes(
            tier in prop::sample::select(vec!["one", "two", "units", "slots", "open", "open-units"]),
            states in prop::collection::vec(state(), 0..6),
            now in any::<u64>(),
            in_use in 1..4u32,
            which in prop::sample::select(vec![
                RateLimitHeaders::ALL,
                RateLimitHeaders::IETF,
                RateLimitHeaders::LEGACY,
                RateLimitHeaders::OPENAI,
                RateLimitHeaders::NONE,
            ]),
        ) {
            let tiers = tiers();
            let tier = tiers.resolve(tier).expect("configured");
            let bands: BandStates = states.into_iter().take(tier.decided.len()).collect();
            let mut decision = Decision::new(true, now, bands);
            if let Some(limit) = tier.concurrency {
                decision = decision.with_slots(SlotState {
                    limit: limit.get(),
                    in_use,
                    lease: Some(Lease(7)),
                    refused: false,
                });
            }
            let mut lean = HeaderMap::new();
            apply_admitted_fields(&mut lean, &tier, &decision, which);
            let info = crate::tier::outcome(&tier, decision).expect("admitted");
            let mut general = HeaderMap::new();
            apply_info_fields(&mut general, &info, which);
            prop_assert_eq!(lean, general);
        }
    }
}
