//! One request through a router, and what came back; the tests' identifier.

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_rate_tier::TierIdentity;

/// The identifier of the router tests: `x-user` (must be UTF-8) is the user,
/// `x-tier` the tier (default `free`).
pub fn header_identity(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    let tier = headers
        .get("x-tier")
        .and_then(|t| t.to_str().ok())
        .unwrap_or("free");
    Some(TierIdentity::new(user, tier))
}

/// A response, its body read.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Reply {
    /// A header as text (panics on a non-text value: tests only).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("a text header value"))
    }

    /// `X-RateLimit-Remaining` as a number.
    pub fn remaining(&self) -> Option<u32> {
        self.header("x-ratelimit-remaining")
            .map(|v| v.parse().expect("a number"))
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the body is JSON")
    }
}

/// Sends `req` through (a clone of) `app` and reads the whole reply.
pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let response = app.clone().oneshot(req).await.expect("routers are infallible");
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("a readable body").to_bytes(),
    }
}
