//! gRPC over real TCP with a real tonic client: admitted calls, then
//! RESOURCE_EXHAUSTED with details the client decodes, costs per method,
//! the health service exempted, a streaming call refused at its start, a
//! call over a concurrency limit (a stream holding the slot) refused,
//! storage-error policies, other refusals through the status table. tonic
//! routed inside an axum app is in `axum.rs`.

mod axum;
mod demo;
mod usage_refusals;

use std::time::Duration;

use http::StatusCode;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{OnMissing, OnStorageError, OnUnknownTier, Quota, RateTier, TierLimitLayer, grpc};

use demo::{CHEAP, Down, EXPENSIVE, RESERVE, api_key, call, send, serve_tonic};

/// free: 2 a minute; pro: 100 a minute. Time stands still.
fn plans(free: Quota) -> RateTier {
    RateTier::builder()
        .tier("free", free)
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .clock(FakeClock::new())
        .build()
}

fn metadata<'a>(status: &'a tonic::Status, name: &str) -> Option<&'a str> {
    status
        .metadata()
        .get(name)
        .map(|v| v.to_str().expect("text metadata"))
}

#[tokio::test]
async fn a_spent_quota_answers_resource_exhausted_with_retry_info() {
    let limiter = TierLimitLayer::new(plans(Quota::per_minute(2))).identifier_fn(api_key);
    let channel = serve_tonic(limiter).await;

    assert_eq!(
        call(&channel, CHEAP, "ada", "free").await.unwrap(),
        "hello from ada"
    );
    call(&channel, CHEAP, "ada", "free").await.unwrap();
    let status = call(&channel, CHEAP, "ada", "free").await.unwrap_err();

    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded (tier free); retry in 30 s");
    let retry = status.get_details_retry_info().expect("a RetryInfo detail");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(30)));
    let quota = status.get_details_quota_failure().expect("a QuotaFailure detail");
    assert_eq!(quota.violations.len(), 1);
    assert_eq!(quota.violations[0].subject, "tier:free");
    // the HTTP rate-limit fields, as metadata
    assert_eq!(metadata(&status, "retry-after"), Some("30"));
    assert_eq!(metadata(&status, "x-ratelimit-limit"), Some("2"));
    assert_eq!(metadata(&status, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(metadata(&status, "ratelimit-policy"), Some(r#""free";q=2;w=60"#));
    assert_eq!(metadata(&status, "grpc-retry-pushback-ms"), None, "opt-in only");

    // another plan, another key: unaffected
    for _ in 0..5 {
        call(&channel, CHEAP, "bob", "pro").await.unwrap();
    }
}

#[tokio::test]
async fn retry_pushback_is_opt_in() {
    let limiter = TierLimitLayer::new(plans(Quota::per_minute(1)))
        .identifier_fn(api_key)
        .grpc_retry_pushback(true);
    let channel = serve_tonic(limiter).await;

    call(&channel, CHEAP, "ada", "free").await.unwrap();
    let status = call(&channel, CHEAP, "ada", "free").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(metadata(&status, "grpc-retry-pushback-ms"), Some("60000"));
}

async fn health_check(
    channel: &tonic::transport::Channel,
    key: &str,
) -> Result<ServingStatus, tonic::Status> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    request.metadata_mut().insert("x-api-key", key.parse().unwrap());
    let response = HealthClient::new(channel.clone()).check(request).await?;
    Ok(response.into_inner().status())
}

#[tokio::test]
async fn methods_cost_what_the_table_says_and_health_is_free() {
    let limiter = TierLimitLayer::new(plans(Quota::per_minute(6)))
        .identifier_fn(api_key)
        .cost_fn(grpc::method_cost([(EXPENSIVE, 5), (grpc::HEALTH, 0)]));
    let channel = serve_tonic(limiter).await;

    call(&channel, EXPENSIVE, "ada", "free").await.unwrap(); // 5 of 6
    let status = call(&channel, EXPENSIVE, "ada", "free").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    // 4 more units at one per 10 s; a refused call charged nothing
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(40))
    );
    call(&channel, CHEAP, "ada", "free").await.unwrap(); // 6 of 6
    let status = call(&channel, CHEAP, "ada", "free").await.unwrap_err();
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(10))
    );

    // the spent key still reaches the health service
    for _ in 0..10 {
        assert_eq!(
            health_check(&channel, "ada").await.unwrap(),
            ServingStatus::Serving
        );
    }
}

#[tokio::test]
async fn a_streaming_call_is_refused_at_its_start() {
    let limiter = TierLimitLayer::new(plans(Quota::per_minute(1))).identifier_fn(api_key);
    let channel = serve_tonic(limiter).await;
    let watch = |key: &'static str| {
        let mut client = HealthClient::new(channel.clone());
        async move {
            let mut request = tonic::Request::new(HealthCheckRequest {
                service: String::new(),
            });
            request.metadata_mut().insert("x-api-key", key.parse().unwrap());
            client.watch(request).await
        }
    };

    // admitted: the stream delivers
    let mut stream = watch("ada").await.unwrap().into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    assert_eq!(first.unwrap().unwrap().unwrap().status(), ServingStatus::Serving);

    // refused before any message: the call itself fails
    let status = watch("ada").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(60))
    );
    // another key still streams
    let mut stream = watch("bob").await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());
}

#[tokio::test]
async fn a_call_over_the_concurrency_limit_names_the_concurrency_item() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .tier_concurrency("free", 1)
        .clock(FakeClock::new())
        .build();
    let channel = serve_tonic(TierLimitLayer::new(tiers).identifier_fn(api_key)).await;
    let watch = || {
        let mut client = HealthClient::new(channel.clone());
        async move {
            let mut request = tonic::Request::new(HealthCheckRequest {
                service: String::new(),
            });
            request.metadata_mut().insert("x-api-key", "ada".parse().unwrap());
            client.watch(request).await
        }
    };

    // a streaming call holds ada's one slot for the stream's life
    let mut stream = watch().await.unwrap().into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    assert_eq!(first.unwrap().unwrap().unwrap().status(), ServingStatus::Serving);
    let status = call(&channel, CHEAP, "ada", "free").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    // it says what happened: a call in flight too many, not a spent quota
    let in_flight = "too many requests in flight for the concurrency limit of tier free (1 at once)";
    assert_eq!(status.message(), format!("{in_flight}; retry in 1 s"));
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(1))
    );
    let quota = status.get_details_quota_failure().expect("a QuotaFailure detail");
    let subjects: Vec<&str> = quota.violations.iter().map(|v| v.subject.as_str()).collect();
    assert_eq!(subjects, ["tier:free.concurrency"], "{quota:?}");
    assert_eq!(quota.violations[0].description, in_flight);
    let policy = metadata(&status, "ratelimit-policy").unwrap();
    assert!(
        policy.contains(r#""free.concurrency";q=1;qu="concurrent-requests""#),
        "{policy}"
    );
    // another caller has a slot of its own
    call(&channel, CHEAP, "bob", "free").await.unwrap();

    // the stream cancelled: the slot comes back
    drop(stream);
    let mut admitted = false;
    for _ in 0..200 {
        if call(&channel, CHEAP, "ada", "free").await.is_ok() {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(admitted, "the cancelled stream's slot never came back");
}

#[tokio::test]
async fn storage_errors_follow_the_policy() {
    let down = |policy| {
        let tiers = RateTier::builder()
            .tier("free", Quota::per_minute(2))
            .storage(Down)
            .build();
        TierLimitLayer::new(tiers)
            .identifier_fn(api_key)
            .on_storage_error(policy)
    };

    let open = serve_tonic(down(OnStorageError::Allow)).await;
    for _ in 0..5 {
        call(&open, CHEAP, "ada", "free").await.unwrap();
    }

    let closed = serve_tonic(down(OnStorageError::Deny)).await;
    let status = call(&closed, CHEAP, "ada", "free").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        "the rate limiter is unavailable; try again shortly"
    );
    assert!(status.get_details_retry_info().is_none());
}

#[tokio::test]
async fn other_refusals_map_through_the_status_table() {
    // a cost above the burst can never pass: no retry delay
    let limiter = TierLimitLayer::new(plans(Quota::per_minute(2)))
        .identifier_fn(api_key)
        .on_unknown_tier(OnUnknownTier::Deny(StatusCode::NOT_FOUND))
        .cost_fn(grpc::method_cost([(EXPENSIVE, 50)]));
    let channel = serve_tonic(limiter).await;
    let status = call(&channel, EXPENSIVE, "ada", "free").await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.get_details_retry_info().is_none());
    let violation = &status.get_details_quota_failure().unwrap().violations[0];
    assert_eq!(violation.subject, "tier:free");
    assert_eq!(
        violation.description,
        "a call costs 50, more than the tier's burst of 2"
    );
    // an unknown plan denied with 404: UNIMPLEMENTED by the table
    let status = call(&channel, CHEAP, "ada", "platinum").await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    assert_eq!(status.message(), "the client's tier is not configured");

    // unidentified callers denied with 401: UNAUTHENTICATED
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
        .build();
    let channel = serve_tonic(TierLimitLayer::new(tiers).identifier_fn(api_key)).await;
    let mut client = HealthClient::new(channel);
    let status = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(status.message(), "the client is not identified");
}

#[tokio::test]
async fn unidentified_callers_are_keyed_by_tonics_peer_address() {
    use std::sync::{Arc, Mutex};
    use tonic::transport::server::TcpConnectInfo;
    use tower_rate_tier::{PeerAddr, RateLimitEvent};

    let limited_keys = Arc::new(Mutex::new(Vec::new()));
    let seen = limited_keys.clone();
    let limiter = TierLimitLayer::new(plans(Quota::per_minute(1)))
        .identifier_fn(api_key)
        .on_event(move |event| {
            if let RateLimitEvent::Limited { user, .. } = event {
                seen.lock().unwrap().push(user.to_string());
            }
        });
    let pseudonyms = limiter.clone();
    // the recipe of the `grpc` module docs
    let stack = tower::ServiceBuilder::new()
        .map_request(|mut req: http::Request<tonic::body::Body>| {
            let peer = req
                .extensions()
                .get::<TcpConnectInfo>()
                .and_then(|info| info.remote_addr());
            if let Some(addr) = peer {
                req.extensions_mut().insert(PeerAddr(addr));
            }
            req
        })
        .layer(limiter);
    let (listener, addr) = demo::listener().await;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = tonic::transport::Server::builder()
        .layer(stack)
        .add_service(health)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    let mut client = HealthClient::new(demo::connect(addr).await);
    let check = || HealthCheckRequest {
        service: String::new(),
    };

    client.check(check()).await.unwrap();
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let keys = limited_keys.lock().unwrap();
    assert_eq!(keys.len(), 1);
    // events carry the key's pseudonym: the anonymous key of the address
    assert_eq!(
        keys[0],
        pseudonyms.user_pseudonym("\0ip:127.0.0.1"),
        "keyed by address"
    );
}

/// What a usage refusal leaves, by the units left of each band.
pub(crate) async fn left(tiers: &RateTier, user: &str) -> Vec<(String, u32)> {
    let bands: Vec<_> = match tiers.check(user, "free", 0).await.unwrap() {
        Ok(admitted) => admitted.bands().collect(),
        // a unit at 0 refuses even a peek
        Err(refused) => refused.bands().collect(),
    };
    bands
        .into_iter()
        .map(|(quota, band)| (quota.unit().as_str().to_owned(), band.remaining))
        .collect()
}

/// A tonic handler answers a refused reservation with the crate's
/// `tonic::Status` (RESOURCE_EXHAUSTED, an HTTP 200 without the refusal's
/// marks): the call consumes nothing, as the layer's own 429 does: its
/// request charge and the reservations it did not record come back.
#[tokio::test]
async fn a_reservation_refused_in_a_tonic_handler_consumes_nothing() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(100))
        .tier_unit("free", "points", Quota::per_minute(100))
        .clock(FakeClock::new())
        .build();
    let channel = serve_tonic(TierLimitLayer::new(tiers.clone()).identifier_fn(api_key)).await;
    send(&channel, RESERVE, "ada", "free", "60".into()).await.unwrap();
    let before = left(&tiers, "ada").await;
    assert_eq!(
        before,
        [
            ("requests".into(), 9),
            ("tokens".into(), 40),
            ("points".into(), 90)
        ]
    );
    let status = send(&channel, RESERVE, "ada", "free", "60".into())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let quota = status.get_details_quota_failure().expect("a QuotaFailure detail");
    assert_eq!(quota.violations[0].subject, "tier:free.tokens");
    // settled when the response went out, before the client read it
    assert_eq!(left(&tiers, "ada").await, before);
    // a handler's own RESOURCE_EXHAUSTED, with no refusal of the limiter,
    // is an answer like any other: its request counts
    send(&channel, RESERVE, "ada", "free", "40".into()).await.unwrap();
    assert_eq!(
        left(&tiers, "ada").await,
        [
            ("requests".into(), 8),
            ("tokens".into(), 0),
            ("points".into(), 80)
        ]
    );
}
