//! RFC 9457 `application/problem+json` bodies for every refusal.
//!
//! A 429 for a spent quota is the `quota-exceeded` problem type of
//! draft-ietf-httpapi-ratelimit-headers ([`QUOTA_EXCEEDED`]); every other
//! refusal is `about:blank` (its title the status's reason phrase).

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, X_CONTENT_TYPE_OPTIONS};
use http::{Response, StatusCode};
use serde_json::json;

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
const NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");

/// The problem type of a 429 for a spent quota
/// (draft-ietf-httpapi-ratelimit-headers, "Quota Exceeded").
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The title registered for [`QUOTA_EXCEEDED`].
const QUOTA_EXCEEDED_TITLE: &str = "Quota Exceeded";

/// An RFC 9457 `about:blank` problem response; `extra` members are added to
/// the body.
pub(crate) fn problem(status: StatusCode, detail: &str, extra: serde_json::Value) -> Response<Bytes> {
    typed_problem(
        status,
        "about:blank",
        status.canonical_reason().unwrap_or("Error"),
        detail,
        extra,
    )
}

/// A [`QUOTA_EXCEEDED`] problem response (429); `extra` members (the
/// draft's `violated-policies` among them) are added to the body.
pub(crate) fn quota_exceeded(detail: &str, extra: serde_json::Value) -> Response<Bytes> {
    typed_problem(
        StatusCode::TOO_MANY_REQUESTS,
        QUOTA_EXCEEDED,
        QUOTA_EXCEEDED_TITLE,
        detail,
        extra,
    )
}

fn typed_problem(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    extra: serde_json::Value,
) -> Response<Bytes> {
    let mut body = json!({
        "type": kind,
        "title": title,
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

/// The 403 for a request whose cost exceeds the tier's burst, or (with
/// `unit`) a reservation above the smallest burst of that unit of the tier.
pub(crate) fn cost_exceeds_limit(tier: &str, cost: u32, limit: u32, unit: Option<&str>) -> Response<Bytes> {
    match unit {
        None => problem(
            StatusCode::FORBIDDEN,
            "this request costs more than the tier admits at once and can never pass",
            json!({ "tier": tier, "cost": cost, "limit": limit }),
        ),
        Some(unit) => problem(
            StatusCode::FORBIDDEN,
            "this reservation asks for more of the unit than the tier admits at once and can never pass",
            json!({ "tier": tier, "unit": unit, "cost": cost, "limit": limit }),
        ),
    }
}
