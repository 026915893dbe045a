//! RFC 9457 `application/problem+json` bodies for every refusal.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, X_CONTENT_TYPE_OPTIONS};
use http::{Response, StatusCode};
use serde_json::json;

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
const NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");

/// An RFC 9457 problem response; `extra` members are added to the body.
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

/// The 403 for a request whose cost exceeds the tier's burst.
pub(crate) fn cost_exceeds_limit(tier: &str, cost: u32, limit: u32) -> Response<Bytes> {
    problem(
        StatusCode::FORBIDDEN,
        "this request costs more than the tier admits at once and can never pass",
        json!({ "tier": tier, "cost": cost, "limit": limit }),
    )
}
