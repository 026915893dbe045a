//! gRPC (tonic) requests refused as gRPC (feature `grpc`).
//!
//! A gRPC client reads a call's outcome from `grpc-status`, not from the
//! HTTP status: a bare 429 becomes UNAVAILABLE, which clients retry at once.
//! So [`TierLimitLayer`](crate::TierLimitLayer) answers a gRPC request
//! (`content-type: application/grpc`, `application/grpc+proto`,
//! `application/grpc+json`, `application/grpc-web`, `application/grpc-web-text`
//! and their `+suffix` variants) in gRPC's own form, a *trailers-only*
//! response:
//!
//! * HTTP 200, `content-type: application/grpc` (`application/grpc-web` or
//!   `application/grpc-web-text` for gRPC-Web), no body;
//! * `grpc-status: 8` (RESOURCE_EXHAUSTED) and a readable, percent-encoded
//!   `grpc-message` (`rate limit exceeded (tier free); retry in 30 s`; over
//!   a [concurrency limit](crate::RateTierBuilder::tier_concurrency), `too
//!   many requests in flight for the concurrency limit of tier free (2 at
//!   once); retry in 1 s`);
//! * `grpc-status-details-bin`: a `google.rpc.Status` whose details are a
//!   `google.rpc.RetryInfo` (the retry delay: `Retry-After`, whole seconds
//!   rounded up, never 0) and a `google.rpc.QuotaFailure` with one violation
//!   per band that refused, its subject `tier:` and the band's
//!   `RateLimit-Policy` item name (`tier:free` for a one-band tier,
//!   `tier:free.0`, `tier:free.1`, ... in a multi-band tier, `tier:free.concurrency`
//!   for the concurrency limit: the 429 body's `violated-policies`), which
//!   `tonic_types::StatusExt` decodes;
//! * the HTTP refusal's rate-limit fields as metadata: `retry-after`,
//!   `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset`,
//!   `ratelimit-policy`, `ratelimit` (its `t` as on HTTP: on a refusal, the
//!   seconds until the call would fit, on the bands that refused only);
//! * `grpc-retry-pushback-ms` (gRFC A6: a client whose retry policy covers
//!   the code waits that long) only when
//!   [`grpc_retry_pushback(true)`](crate::TierLimitLayer::grpc_retry_pushback)
//!   is set.
//!
//! Every other refusal keeps its message and maps its HTTP status through
//! the table of gRPC's
//! [HTTP to gRPC status mapping](https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md),
//! plus one addition:
//!
//! | refusal | HTTP | gRPC code |
//! | --- | --- | --- |
//! | rate limited (a 429 with `Retry-After`) | 429 | RESOURCE_EXHAUSTED (8), with RetryInfo and QuotaFailure |
//! | cost above the tier's burst (never passes) | 403 | PERMISSION_DENIED (7), with QuotaFailure |
//! | [`OnMissing::Deny`](crate::OnMissing::Deny) / [`OnUnknownTier::Deny`](crate::OnUnknownTier::Deny) with 400 | 400 | INTERNAL (13) (the table's choice) |
//! | ... with 401 | 401 | UNAUTHENTICATED (16) |
//! | ... with 403, no default tier | 403 | PERMISSION_DENIED (7) |
//! | ... with 404 | 404 | UNIMPLEMENTED (12) |
//! | a 413 (not in the table, which says UNKNOWN) | 413 | RESOURCE_EXHAUSTED (8) |
//! | any other 429 (no `Retry-After`) | 429 | UNAVAILABLE (14) |
//! | storage failure under [`OnStorageError::Deny`](crate::OnStorageError::Deny) | 503 | UNAVAILABLE (14) |
//! | 502, 504 | | UNAVAILABLE (14) |
//! | anything else | | UNKNOWN (2) |
//!
//! [`refusal`] is that conversion, one function over the limiter's HTTP
//! refusal, applied where the limiter answers; the decision itself knows
//! nothing of gRPC. Other requests keep the HTTP answers.
//!
//! # Costs by method
//!
//! A gRPC call is a POST to `/package.Service/Method`, so its cost is a
//! [`cost_fn`](crate::TierLimitLayer::cost_fn) over the path.
//! [`method_cost`] builds one from a table; an entry `/package.Service/*`
//! prices every method of a service, and [`HEALTH`] with cost 0 exempts the
//! standard health service. Unlisted methods cost 1.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, clock::FakeClock, grpc};
//!
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(6)).clock(FakeClock::new()).build();
//! let limiter = TierLimitLayer::new(tiers)
//!     .identifier_fn(|headers| Some(TierIdentity::new(headers.get("x-api-key")?.to_str().ok()?, "free")))
//!     .cost_fn(grpc::method_cost([("/shop.Orders/Export", 5), (grpc::HEALTH, 0)]));
//! let service = ServiceBuilder::new()
//!     .layer(limiter)
//!     .service(service_fn(|_req: Request<()>| async { Ok::<_, std::convert::Infallible>(Response::new(Bytes::new())) }));
//! let call = |path: &str| {
//!     let request = Request::post(path).header("content-type", "application/grpc").header("x-api-key", "ada");
//!     service.clone().oneshot(request.body(()).unwrap())
//! };
//! let grpc_status = |response: &Response<_>| response.headers().get("grpc-status").cloned();
//!
//! assert_eq!(grpc_status(&call("/shop.Orders/Export").await.unwrap()), None); // passed: 5 of 6 spent
//! let refused = call("/shop.Orders/Export").await.unwrap();
//! assert_eq!(refused.status(), 200); // trailers-only
//! assert_eq!(refused.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
//! assert_eq!(refused.headers()["retry-after"], "40"); // metadata too
//! assert_eq!(grpc_status(&call("/shop.Orders/Get").await.unwrap()), None); // costs 1: fits
//! assert_eq!(grpc_status(&call("/grpc.health.v1.Health/Check").await.unwrap()), None); // free
//! # }
//! ```
//!
//! # Where it runs
//!
//! * tonic's server: `Server::builder().layer(limiter).add_service(..)`;
//! * tonic services routed inside an axum app (`Router::route_service`, or
//!   tonic's `Routes::into_axum_router`), under the app's one
//!   `Router::layer(limiter)`, served with axum's `http2` feature.
//!
//! Identify callers from metadata (it arrives as request headers) with
//! [`identifier_fn`](crate::TierLimitLayer::identifier_fn). tonic's server
//! gives no axum `ConnectInfo`: to key unidentified callers by address,
//! turn tonic's `TcpConnectInfo` into a [`PeerAddr`](crate::PeerAddr) in a
//! layer before the limiter:
//!
//! ```text
//! let stack = tower::ServiceBuilder::new()
//!     .map_request(|mut req: http::Request<tonic::body::Body>| {
//!         let peer = req.extensions().get::<TcpConnectInfo>().and_then(|info| info.remote_addr());
//!         if let Some(addr) = peer {
//!             req.extensions_mut().insert(PeerAddr(addr));
//!         }
//!         req
//!     })
//!     .layer(limiter);
//! Server::builder().layer(stack).add_service(..)
//! ```
//!
//! A gRPC request whose headers identify it is not buffered:
//! [`buffer_body(true)`](crate::TierLimitLayer::buffer_body) asks the
//! identifier for its headers first, so identified streams flow untouched;
//! one its headers do not identify is buffered and identified from its body
//! like any other request (no header a client sends turns body
//! identification off), and body refusals answer in gRPC form. A cost declared at the route
//! ([`tier_cost`](fn@crate::tier_cost)) is an axum route feature and answers
//! its refusals as HTTP; price gRPC methods with [`method_cost`] (or any
//! `cost_fn`), which the limiter charges before the call starts.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER, X_CONTENT_TYPE_OPTIONS};
use http::request::Parts;
use http::{HeaderMap, HeaderName, Response, StatusCode};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The standard health service (`grpc.health.v1.Health`), every method: a
/// [`method_cost`] entry `(grpc::HEALTH, 0)` exempts it from the rate and
/// the concurrency limit (a unit in debt still holds it, as every call).
pub const HEALTH: &str = "/grpc.health.v1.Health/*";

/// `grpc-retry-pushback-ms` (gRFC A6).
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Whether a request is gRPC or gRPC-Web, by its `content-type`.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    content_kind(headers).is_some()
}

/// The gRPC flavour of a request: the response `content-type` it expects.
fn content_kind(headers: &HeaderMap) -> Option<HeaderValue> {
    let value = headers.get(CONTENT_TYPE)?.as_bytes();
    // `application/grpc`, then the end, `+codec`, `;params`, or `-web...`.
    let rest = strip_prefix_ignore_case(value, b"application/grpc")?;
    let ends = |rest: &[u8]| matches!(rest.first(), None | Some(b'+' | b';'));
    if ends(rest) {
        return Some(HeaderValue::from_static("application/grpc"));
    }
    let web = strip_prefix_ignore_case(rest, b"-web")?;
    if ends(web) {
        return Some(HeaderValue::from_static("application/grpc-web"));
    }
    let text = strip_prefix_ignore_case(web, b"-text")?;
    ends(text).then(|| HeaderValue::from_static("application/grpc-web-text"))
}

fn strip_prefix_ignore_case<'a>(value: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let head = value.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &value[prefix.len()..])
}

/// The gRPC code of a refusal with this HTTP status, by the gRPC spec's table
/// (429 is UNAVAILABLE there) plus 413 as RESOURCE_EXHAUSTED. A rate-limit
/// refusal is RESOURCE_EXHAUSTED whatever this says; see the
/// [module docs](self).
pub fn code_for_status(status: StatusCode) -> Code {
    match status {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::PAYLOAD_TOO_LARGE => Code::ResourceExhausted,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// The limiter's answer to a request with these headers: the gRPC form of
/// its HTTP `refusal` when the request is gRPC (see the [module docs](self)),
/// else `refusal` unchanged. `retry_pushback` adds `grpc-retry-pushback-ms`
/// to a rate-limit refusal.
///
/// The refusal is read as the limiter builds it: its status, `Retry-After`
/// and rate-limit fields, and a JSON problem body with `detail` and, for
/// quota refusals, `tier` (`cost` and `limit` for a cost above the burst).
/// A body that is not JSON (your own
/// [`on_limited`](crate::TierLimitLayer::on_limited) response, say) gives a
/// generic message and no QuotaFailure.
pub fn refusal(request: &HeaderMap, refusal: Response<Bytes>, retry_pushback: bool) -> Response<Bytes> {
    match content_kind(request) {
        Some(content_type) => to_grpc(refusal, retry_pushback, content_type),
        None => refusal,
    }
}

/// A refusal (a usage reservation's, say) as the `tonic::Status` a handler
/// answers with: the status the layer answers a gRPC call with.
pub(crate) fn refusal_status(refusal: Response<Bytes>) -> tonic::Status {
    let answer = to_grpc(refusal, false, HeaderValue::from_static("application/grpc"));
    let mut fields = answer.headers().clone();
    fields.remove(CONTENT_TYPE);
    tonic::Status::from_header_map(&fields)
        .unwrap_or_else(|| tonic::Status::internal("the usage was refused"))
}

fn to_grpc(refusal: Response<Bytes>, retry_pushback: bool, content_type: HeaderValue) -> Response<Bytes> {
    let (parts, body) = refusal.into_parts();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let text = |member: &str| problem.get(member).and_then(serde_json::Value::as_str);
    let retry_secs = parts
        .headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let limited = parts.status == StatusCode::TOO_MANY_REQUESTS && retry_secs.is_some();
    let code = if limited {
        Code::ResourceExhausted
    } else {
        code_for_status(parts.status)
    };

    let tier = text("tier");
    let number = |member: &str| problem.get(member).and_then(serde_json::Value::as_u64);
    let violated: Vec<&str> = problem
        .get("violated-policies")
        .and_then(serde_json::Value::as_array)
        .map(|names| names.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    // The items are named from the tier as a Structured Fields string can
    // hold it (`café` is `caf?`).
    let policy = tier.map(crate::headers::policy_name);
    // A refusal by the concurrency limit names its item alone
    // (`free.concurrency`), and `limit` is that limit.
    let in_flight = match (tier, policy.as_deref(), violated.as_slice()) {
        (Some(tier), Some(policy), [name]) if name.strip_prefix(policy) == Some(".concurrency") => {
            let at_once = number("limit")
                .map(|n| format!(" ({n} at once)"))
                .unwrap_or_default();
            Some(format!(
                "too many requests in flight for the concurrency limit of tier {tier}{at_once}"
            ))
        }
        _ => None,
    };
    let message = match (limited, tier, retry_secs, &in_flight) {
        (true, _, Some(secs), Some(in_flight)) => format!("{in_flight}; retry in {secs} s"),
        (true, Some(tier), Some(secs), None) => {
            format!("rate limit exceeded (tier {tier}); retry in {secs} s")
        }
        (true, None, Some(secs), None) => format!("rate limit exceeded; retry in {secs} s"),
        _ => text("detail").unwrap_or("refused by the rate limiter").to_owned(),
    };
    let mut details = ErrorDetails::new();
    if limited {
        details.set_retry_info(retry_secs.map(Duration::from_secs));
    }
    if let Some(tier) = tier {
        match (number("cost"), number("limit")) {
            (Some(cost), Some(limit)) if !limited => {
                details.add_quota_failure_violation(
                    format!("tier:{tier}"),
                    format!("a call costs {cost}, more than the tier's burst of {limit}"),
                );
            }
            _ if violated.is_empty() => {
                details.add_quota_failure_violation(
                    format!("tier:{tier}"),
                    format!("the quota of tier {tier} is spent"),
                );
            }
            _ => {
                // One violation per band that refused (or for the
                // concurrency limit), named as its `RateLimit-Policy` item
                // (the tier's own name for a one-band tier).
                let concurrency = policy.as_deref().map(|p| format!("{p}.concurrency"));
                for name in violated {
                    let description = match &in_flight {
                        Some(in_flight) => in_flight.clone(),
                        // beside a band that refused too
                        None if concurrency.as_deref() == Some(name) => {
                            format!("too many requests in flight for the concurrency limit of tier {tier}")
                        }
                        None if Some(name) == policy.as_deref() => {
                            format!("the quota of tier {tier} is spent")
                        }
                        None => format!("the quota of policy {name} of tier {tier} is spent"),
                    };
                    details.add_quota_failure_violation(format!("tier:{name}"), description);
                }
            }
        }
    }

    let mut metadata = parts.headers;
    for entity in [CONTENT_TYPE, CONTENT_LENGTH, X_CONTENT_TYPE_OPTIONS] {
        metadata.remove(entity);
    }
    let status =
        Status::with_error_details_and_metadata(code, message, details, MetadataMap::from_headers(metadata));
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    if status.add_header(headers).is_err() {
        // Only a message that cannot be a header value gets here (the
        // encodings rule it out): the code alone still tells the client.
        headers.clear();
        headers.insert(Status::GRPC_STATUS, HeaderValue::from(code as i32));
    }
    headers.insert(CONTENT_TYPE, content_type);
    if let (true, true, Some(secs)) = (retry_pushback, limited, retry_secs) {
        headers.insert(
            GRPC_RETRY_PUSHBACK_MS,
            HeaderValue::from(secs.saturating_mul(1000)),
        );
    }
    response
}

/// A [`cost_fn`](crate::TierLimitLayer::cost_fn) pricing gRPC methods by
/// path: entries `/package.Service/Method` (one method) or
/// `/package.Service/*` (every method of the service; a method's own entry
/// wins). Requests it does not list get `None` (cost 1, or the route's).
///
/// ```
/// use tower_rate_tier::{Quota, RateTier, TierLimitLayer, grpc};
/// # let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let layer = TierLimitLayer::new(tiers).cost_fn(grpc::method_cost([
///     ("/shop.Orders/Export", 20),
///     ("/shop.Search/*", 5),
///     (grpc::HEALTH, 0),
/// ]));
/// # let _ = layer;
/// ```
pub fn method_cost<I, P>(costs: I) -> impl Fn(&Parts) -> Option<u32> + Send + Sync + 'static
where
    I: IntoIterator<Item = (P, u32)>,
    P: AsRef<str>,
{
    let mut methods = HashMap::<Box<str>, u32, foldhash::fast::RandomState>::default();
    let mut services = HashMap::<Box<str>, u32, foldhash::fast::RandomState>::default();
    for (path, cost) in costs {
        let path = path.as_ref();
        match path.strip_suffix('*') {
            // Kept with its trailing slash: `/pkg.Svc/` never matches `/pkg.SvcX/`.
            Some(service) => services.insert(service.into(), cost),
            None => methods.insert(path.into(), cost),
        };
    }
    move |parts: &Parts| {
        let path = parts.uri.path();
        if let Some(cost) = methods.get(path) {
            return Some(*cost);
        }
        let service = &path[..=path.rfind('/')?];
        services.get(service).copied()
    }
}

#[cfg(test)]
mod tests;
