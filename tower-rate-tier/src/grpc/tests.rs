//! gRPC answers of the limiter's refusals, and method prices.

use super::*;

fn headers(content_type: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap());
    headers
}

#[test]
fn recognizes_grpc_content_types() {
    for (value, kind) in [
        ("application/grpc", Some("application/grpc")),
        ("application/grpc+proto", Some("application/grpc")),
        ("Application/GRPC+json", Some("application/grpc")),
        ("application/grpc;charset=utf-8", Some("application/grpc")),
        ("application/grpc-web", Some("application/grpc-web")),
        ("application/grpc-web+proto", Some("application/grpc-web")),
        (
            "application/grpc-web-text+proto",
            Some("application/grpc-web-text"),
        ),
        ("application/grpcx", None),
        ("application/grpc-webx", None),
        ("application/json", None),
        ("text/plain", None),
    ] {
        let found = content_kind(&headers(value));
        assert_eq!(found.as_ref().map(|v| v.to_str().unwrap()), kind, "{value}");
    }
    assert!(!is_grpc(&HeaderMap::new()));
}

#[test]
fn maps_statuses_by_the_spec_table() {
    assert_eq!(code_for_status(StatusCode::BAD_REQUEST), Code::Internal);
    assert_eq!(code_for_status(StatusCode::UNAUTHORIZED), Code::Unauthenticated);
    assert_eq!(code_for_status(StatusCode::FORBIDDEN), Code::PermissionDenied);
    assert_eq!(code_for_status(StatusCode::NOT_FOUND), Code::Unimplemented);
    assert_eq!(
        code_for_status(StatusCode::PAYLOAD_TOO_LARGE),
        Code::ResourceExhausted
    );
    assert_eq!(code_for_status(StatusCode::TOO_MANY_REQUESTS), Code::Unavailable);
    assert_eq!(
        code_for_status(StatusCode::SERVICE_UNAVAILABLE),
        Code::Unavailable
    );
    assert_eq!(code_for_status(StatusCode::REQUEST_TIMEOUT), Code::Unknown);
}

#[test]
fn a_plain_429_is_unavailable_and_a_foreign_body_is_tolerated() {
    let mut plain = Response::new(Bytes::from_static(b"<html>slow down</html>"));
    *plain.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let response = refusal(&headers("application/grpc"), plain, true);
    let status = Status::from_header_map(response.headers()).unwrap();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "refused by the rate limiter");
    let details = status.get_error_details();
    assert!(details.retry_info().is_none() && details.quota_failure().is_none());
    assert!(!response.headers().contains_key(GRPC_RETRY_PUSHBACK_MS));
}

#[test]
fn a_rate_limit_refusal_carries_its_details() {
    let mut limited = Response::new(Bytes::from_static(
        br#"{"detail":"rate limit exceeded","tier":"free","retry_after":7,"limit":2,"remaining":0}"#,
    ));
    *limited.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    limited.headers_mut().insert(RETRY_AFTER, HeaderValue::from(7));
    limited
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    let response = refusal(&headers("application/grpc-web"), limited, true);
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.body().is_empty());
    assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc-web");
    assert_eq!(response.headers()[GRPC_RETRY_PUSHBACK_MS], "7000");
    let status = Status::from_header_map(response.headers()).unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded (tier free); retry in 7 s");
    assert_eq!(status.metadata().get("retry-after").unwrap(), "7");
    let details = status.get_error_details();
    assert_eq!(
        details.retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(7))
    );
    let violation = &details.quota_failure().unwrap().violations[0];
    assert_eq!(violation.subject, "tier:free");
}

#[test]
fn every_violated_policy_is_a_violation() {
    let mut limited = Response::new(Bytes::from_static(
        br#"{"detail":"rate limit exceeded","tier":"multi","retry_after":3,"violated-policies":["multi.0","multi.2"]}"#,
    ));
    *limited.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    limited.headers_mut().insert(RETRY_AFTER, HeaderValue::from(3));
    let response = refusal(&headers("application/grpc"), limited, false);
    let status = Status::from_header_map(response.headers()).unwrap();
    let failure = status.get_error_details().quota_failure().cloned().unwrap();
    let subjects: Vec<&str> = failure.violations.iter().map(|v| v.subject.as_str()).collect();
    assert_eq!(subjects, ["tier:multi.0", "tier:multi.2"]);
    assert_eq!(
        failure.violations[1].description,
        "the quota of policy multi.2 of tier multi is spent"
    );
}

/// The items of a tier named outside printable ASCII are named with
/// `?` (`café` is `caf?`): a refusal is still told apart by them.
#[test]
fn a_tier_named_outside_ascii_is_matched_by_its_items() {
    let status = |body: &'static str| {
        let mut limited = Response::new(Bytes::from_static(body.as_bytes()));
        *limited.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        limited.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1));
        let response = refusal(&headers("application/grpc"), limited, false);
        Status::from_header_map(response.headers()).unwrap()
    };
    let in_flight = status(
        r#"{"tier":"café","retry_after":1,"limit":1,"unit":"concurrent-requests","violated-policies":["caf?.concurrency"]}"#,
    );
    let expected = "too many requests in flight for the concurrency limit of tier café (1 at once)";
    assert_eq!(in_flight.message(), format!("{expected}; retry in 1 s"));
    let failure = in_flight.get_error_details().quota_failure().cloned().unwrap();
    assert_eq!(failure.violations[0].subject, "tier:caf?.concurrency");
    assert_eq!(failure.violations[0].description, expected);
    let spent = status(r#"{"tier":"café","retry_after":1,"violated-policies":["caf?"]}"#);
    let failure = spent.get_error_details().quota_failure().cloned().unwrap();
    assert_eq!(
        failure.violations[0].description,
        "the quota of tier café is spent"
    );
}

fn parts(path: &str) -> Parts {
    http::Request::post(path).body(()).unwrap().into_parts().0
}

#[test]
fn prices_methods_then_services() {
    let cost = method_cost([("/a.S/Big", 9), ("/a.S/*", 3), (HEALTH, 0)]);
    assert_eq!(cost(&parts("/a.S/Big")), Some(9));
    assert_eq!(cost(&parts("/a.S/Small")), Some(3));
    assert_eq!(cost(&parts("/a.SX/Small")), None);
    assert_eq!(cost(&parts("/grpc.health.v1.Health/Watch")), Some(0));
    assert_eq!(cost(&parts("/grpc.health.v1.HealthX/Check")), None);
    assert_eq!(cost(&parts("/")), None);
}
