//! Rate-limit headers and the bodies of refusals.
//!
//! Admitted responses carry
//!
//! * `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Unix
//!   seconds, rounded up): the band closest to denying;
//! * `RateLimit-Policy` (`"free";q=10;w=60`) and `RateLimit`
//!   (`"free";r=9;t=6`) from draft-ietf-httpapi-ratelimit-headers, one item
//!   per band. `q` is the burst, `w` the seconds an emptied burst takes to
//!   refill (rounded up), `r` what remains, `t` the seconds until the band is
//!   full again (rounded up). Items of a multi-band tier are named
//!   `"free.0"`, `"free.1"`, ...
//!
//! The layer adds these itself; the functions here serve your own
//! [`on_limited`](crate::TierLimitLayer::on_limited) response or a front
//! that is not HTTP middleware:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tower_rate_tier::{Quota, RateTier, clock::FakeClock, response};
//!
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(1)).clock(FakeClock::new()).build();
//! tiers.check("ada", "free", 1).await.unwrap().unwrap();
//! let limited = tiers.check("ada", "free", 1).await.unwrap().unwrap_err();
//!
//! let mut refusal = response::too_many_requests(&limited);
//! response::apply_limited_headers(refusal.headers_mut(), &limited);
//! assert_eq!(refusal.status(), 429);
//! assert_eq!(refusal.headers()["retry-after"], "60");
//! assert_eq!(refusal.headers()["ratelimit-policy"], r#""free";q=1;w=60"#);
//! assert_eq!(refusal.headers()["ratelimit"], r#""free";r=0;t=60"#);
//! # }
//! ```
//!
//! A 429 carries the same fields, `Retry-After` (whole seconds, rounded up,
//! never 0) and an RFC 9457 `application/problem+json` body with at least
//! `tier` and `retry_after` members. Unlimited tiers get no rate-limit fields.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER, X_CONTENT_TYPE_OPTIONS};
use http::{HeaderMap, Response, StatusCode};
use serde_json::json;

use crate::tier::{Detail, RateLimitInfo, RateLimited, TierEntry};

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (IETF draft).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
const NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");

fn secs_ceil(nanos: u64) -> u64 {
    nanos.div_ceil(1_000_000_000)
}

fn num(n: u64) -> HeaderValue {
    HeaderValue::from(n)
}

/// Recently rendered header values, per thread: consecutive responses mostly
/// repeat the same numbers (a limit, a reset second, a remaining count), and a
/// clone of a cached value is a reference-count increment where rendering one
/// is an allocation.
struct ValueCache {
    numbers: Vec<Option<(u64, HeaderValue)>>,
    /// Keyed by the tier's address: tier definitions are interned for the
    /// life of the process (see `tier::intern`), so an address never names
    /// another tier.
    ratelimit: Vec<Option<(RateLimitKey, HeaderValue)>>,
}

/// A single-band `RateLimit` value: the tier (by address), `r` and `t`.
type RateLimitKey = (usize, u32, u64);

const CACHE_SLOTS: usize = 256;

thread_local! {
    static CACHE: std::cell::RefCell<ValueCache> = std::cell::RefCell::new(ValueCache {
        numbers: vec![None; CACHE_SLOTS],
        ratelimit: vec![None; CACHE_SLOTS],
    });
}

fn slot(hash: u64) -> usize {
    // Fibonacci hashing spreads nearby values over the slots.
    (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % CACHE_SLOTS
}

fn cached<K: PartialEq + Copy>(
    table: impl FnOnce(&mut ValueCache) -> &mut Vec<Option<(K, HeaderValue)>>,
    key: K,
    hash: u64,
    render: impl FnOnce() -> Option<HeaderValue>,
) -> Option<HeaderValue> {
    CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            let entry = table(&mut cache).get_mut(slot(hash))?;
            if let Some((k, v)) = entry {
                if *k == key {
                    return Some(v.clone());
                }
            }
            let value = render()?;
            *entry = Some((key, value.clone()));
            Some(value)
        })
        .ok()
        .flatten()
}

/// The header values of the three numbers of the `X-RateLimit-*` fields,
/// with one access to the thread's cache.
fn cached_nums(a: u64, b: u64, c: u64) -> (HeaderValue, HeaderValue, HeaderValue) {
    fn get(numbers: &mut [Option<(u64, HeaderValue)>], n: u64) -> HeaderValue {
        let Some(entry) = numbers.get_mut(slot(n)) else {
            return num(n);
        };
        match entry {
            Some((k, v)) if *k == n => v.clone(),
            _ => {
                let value = num(n);
                *entry = Some((n, value.clone()));
                value
            }
        }
    }
    CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            let numbers = &mut cache.numbers;
            Some((get(numbers, a), get(numbers, b), get(numbers, c)))
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| (num(a), num(b), num(c)))
}

/// A tier name as an RFC 8941 string: printable ASCII, with `"` and `\`
/// escaped; anything else becomes `?`.
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

fn push_item_name(out: &mut String, tier: &str, bands: usize, index: usize) {
    if bands == 1 {
        push_sf_string(out, tier);
    } else {
        let mut name = String::with_capacity(tier.len() + 3);
        name.push_str(tier);
        name.push('.');
        name.push_str(itoa::Buffer::new().format(index));
        push_sf_string(out, &name);
    }
}

/// The `RateLimit-Policy` value of a tier (computed once per tier).
pub(crate) fn policy_value(name: &str, bands: &[crate::Quota]) -> Option<HeaderValue> {
    let mut out = String::with_capacity(32);
    for (i, quota) in bands.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_item_name(&mut out, name, bands.len(), i);
        out.push_str(";q=");
        out.push_str(itoa::Buffer::new().format(quota.burst()));
        out.push_str(";w=");
        out.push_str(itoa::Buffer::new().format(quota.window_secs()));
    }
    HeaderValue::try_from(out).ok()
}

fn ratelimit_value(detail: &Detail) -> Option<HeaderValue> {
    let mut out = String::with_capacity(32);
    for (i, state) in detail.bands.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_item_name(&mut out, &detail.tier.name, detail.tier.bands.len(), i);
        out.push_str(";r=");
        out.push_str(itoa::Buffer::new().format(state.remaining));
        out.push_str(";t=");
        out.push_str(itoa::Buffer::new().format(secs_ceil(state.reset_after_ns)));
    }
    HeaderValue::try_from(out).ok()
}

fn cached_ratelimit(detail: &Detail) -> Option<HeaderValue> {
    let [band] = detail.bands.as_slice() else {
        return ratelimit_value(detail);
    };
    let t = secs_ceil(band.reset_after_ns);
    let key = (
        std::ptr::from_ref::<TierEntry>(detail.tier) as usize,
        band.remaining,
        t,
    );
    let hash = (key.0 as u64) ^ u64::from(band.remaining).rotate_left(20) ^ t.rotate_left(40);
    cached(|c| &mut c.ratelimit, key, hash, || ratelimit_value(detail)).or_else(|| ratelimit_value(detail))
}

fn insert_common(headers: &mut HeaderMap, detail: &Detail, limit: u32, remaining: u32, reset_at: u64) {
    // One growth of the map at most, rather than one per field.
    headers.reserve(5);
    let (limit, remaining, reset_at) = cached_nums(u64::from(limit), u64::from(remaining), reset_at);
    headers.insert(X_RATELIMIT_LIMIT, limit);
    headers.insert(X_RATELIMIT_REMAINING, remaining);
    headers.insert(X_RATELIMIT_RESET, reset_at);
    if let Some(v) = &detail.tier.policy_header {
        headers.insert(RATELIMIT_POLICY, v.clone());
    }
    if let Some(v) = cached_ratelimit(detail) {
        headers.insert(RATELIMIT, v);
    }
}

/// Adds the headers of an admitted request (none for an unlimited tier).
pub fn apply_info_headers(headers: &mut HeaderMap, info: &RateLimitInfo) {
    if info.is_unlimited() {
        return;
    }
    insert_common(
        headers,
        &info.detail,
        info.limit,
        info.remaining,
        info.reset_at_unix_secs(),
    );
}

/// Adds the headers of a denied request, `Retry-After` included.
pub fn apply_limited_headers(headers: &mut HeaderMap, limited: &RateLimited) {
    insert_common(
        headers,
        &limited.detail,
        limited.limit,
        limited.remaining,
        limited.reset_at_unix_secs(),
    );
    headers.insert(RETRY_AFTER, num(limited.retry_after_secs()));
}

/// An RFC 9457 problem response.
pub(crate) fn problem(status: StatusCode, detail: &str, extra: serde_json::Value) -> Response<Bytes> {
    let mut body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    let bytes = serde_json::to_vec(&body).map(Bytes::from).unwrap_or_default();
    let mut response = Response::new(bytes);
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response.headers_mut().insert(X_CONTENT_TYPE_OPTIONS, NOSNIFF);
    response
}

/// The default 429 response (without the rate-limit headers, which the
/// layer adds).
pub fn too_many_requests(limited: &RateLimited) -> Response<Bytes> {
    let retry = limited.retry_after_secs();
    problem(
        StatusCode::TOO_MANY_REQUESTS,
        "rate limit exceeded; retry after the number of seconds in `retry_after`",
        json!({ "tier": limited.tier(), "retry_after": retry, "limit": limited.limit, "remaining": limited.remaining }),
    )
}

/// The 403 for a request whose cost exceeds the tier's burst.
pub(crate) fn cost_exceeds_limit(tier: &str, cost: u32, limit: u32) -> Response<Bytes> {
    problem(
        StatusCode::FORBIDDEN,
        "this request costs more than the tier admits at once and can never pass",
        json!({ "tier": tier, "cost": cost, "limit": limit }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sf_strings_are_escaped() {
        let mut s = String::new();
        push_sf_string(&mut s, "a\"b\\c\u{e9}\n");
        assert_eq!(s, r#""a\"b\\c??""#);
    }
}
