//! A reservation refused in a tonic handler and answered with `?` (the
//! crate's `tonic::Status`) consumes nothing in any limiter of the call, as
//! the 429 does over HTTP; a handler's own RESOURCE_EXHAUSTED after a
//! refusal it did without is an answer like any other.

use tonic::Code;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_types::StatusExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier, TierLimitLayer};

use super::demo::{self, Demo, FIRST_OF_TWO, RESERVE, SWALLOW, api_key, send};
use super::left;

/// `outer` and `inner` stacked in front of the demo service.
async fn serve_stacked(outer: &RateTier, inner: &RateTier) -> tonic::transport::Channel {
    let (listener, addr) = demo::listener().await;
    let server = Server::builder()
        .layer(TierLimitLayer::new(outer.clone()).identifier_fn(api_key))
        .layer(TierLimitLayer::new(inner.clone()).identifier_fn(api_key))
        .add_service(Demo)
        .serve_with_incoming(TcpIncoming::from(listener));
    tokio::spawn(server);
    demo::connect(addr).await
}

/// A tier of 10 requests a minute with `tokens` a minute, and 100 points
/// a minute when `points`.
fn plan(tokens: u32, points: bool) -> RateTier {
    let builder = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier_unit("free", "tokens", Quota::per_minute(tokens))
        .clock(FakeClock::new());
    match points {
        true => builder
            .tier_unit("free", "points", Quota::per_minute(100))
            .build(),
        false => builder.build(),
    }
}

/// Either limiter refuses the tokens: neither keeps anything of the call.
#[tokio::test]
async fn a_refusal_in_either_of_two_stacked_limiters_consumes_nothing_in_both() {
    // (outer, inner): the inner refuses, then the outer does
    for (outer, inner) in [
        (plan(1_000, true), plan(100, false)),
        (plan(100, false), plan(1_000, true)),
    ] {
        let channel = serve_stacked(&outer, &inner).await;
        send(&channel, RESERVE, "ada", "free", "60".into()).await.unwrap();
        let before = (left(&outer, "ada").await, left(&inner, "ada").await);
        let status = send(&channel, RESERVE, "ada", "free", "60".into())
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!((left(&outer, "ada").await, left(&inner, "ada").await), before);
    }
}

/// The handler did without a refused reservation, did its work, and
/// answered RESOURCE_EXHAUSTED of its own: the call counts, with what it
/// recorded and reserved.
#[tokio::test]
async fn a_handlers_own_resource_exhausted_after_a_refusal_it_did_without_counts() {
    let tiers = plan(100, true);
    let channel = super::demo::serve_tonic(TierLimitLayer::new(tiers.clone()).identifier_fn(api_key)).await;
    let status = send(&channel, SWALLOW, "ada", "free", "x".into())
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::ResourceExhausted, "upstream quota")
    );
    assert_eq!(
        left(&tiers, "ada").await,
        [
            ("requests".into(), 9),
            ("tokens".into(), 90),
            ("points".into(), 90)
        ]
    );
}

/// A handler that met two refusals and answers with the first: the call
/// consumes nothing.
#[tokio::test]
async fn answering_the_first_of_two_refusals_consumes_nothing() {
    let tiers = plan(100, true);
    tiers.record("ada", "free", "tokens", 50).await.unwrap();
    tiers.record("ada", "free", "points", 50).await.unwrap();
    let before = left(&tiers, "ada").await;
    let channel = super::demo::serve_tonic(TierLimitLayer::new(tiers.clone()).identifier_fn(api_key)).await;
    let status = send(&channel, FIRST_OF_TWO, "ada", "free", "x".into())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let quota = status.get_details_quota_failure().expect("a QuotaFailure detail");
    assert_eq!(quota.violations[0].subject, "tier:free.tokens");
    assert_eq!(left(&tiers, "ada").await, before);
}
