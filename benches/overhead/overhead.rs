//! Pushes requests through an axum `Router` in process, for counting
//! instructions under callgrind: without a limiter, with tower-rate-tier's
//! layer, and with tower_governor's. See `run.sh` and `BENCHMARKS.md`.
//!
//! `overhead MODE N` with MODE one of `none`, `ours`, `governor`.

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use tower::ServiceExt;
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};

const USERS: usize = 1_000;

/// tower_governor keyed by the same header.
#[derive(Clone)]
struct UserHeader;

impl KeyExtractor for UserHeader {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, GovernorError> {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    Some(TierIdentity::new(user, Cow::Borrowed("free")))
}

fn app(mode: &str) -> Router {
    let router = Router::new().route("/", get(|| async { "ok" }));
    match mode {
        "none" => router,
        // the cost of any router-wide layer in axum (boxing, futures), for reference
        "noop" => router.layer(tower::layer::util::Identity::new()),
        "ours" => {
            let tiers = RateTier::builder()
                .tier("free", Quota::per_hour(10_000))
                .default_tier("free")
                .build();
            router.layer(TierLimitLayer::new(tiers).identifier_fn(identify))
        }
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .per_millisecond(360)
                .burst_size(10_000)
                .key_extractor(UserHeader)
                .use_headers()
                .finish()
                .expect("valid governor config");
            router.layer(tower_governor::GovernorLayer::new(Arc::new(config)))
        }
        other => panic!("unknown mode {other}: use none, ours or governor"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "ours".into());
    let n: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let users: Vec<HeaderValue> = (0..USERS)
        .map(|i| HeaderValue::from_str(&format!("user-{i}")).expect("ascii"))
        .collect();
    let app = app(&mode);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let ok = rt.block_on(async {
        let mut ok = 0usize;
        for i in 0..n {
            let mut req = Request::new(Body::empty());
            req.headers_mut().insert("x-user", users[i % USERS].clone());
            let response = app.clone().oneshot(req).await.expect("infallible");
            ok += usize::from(response.status() == StatusCode::OK);
        }
        ok
    });
    assert_eq!(ok, n, "every request must be admitted");
    println!("{mode}: {n} requests admitted");
}
