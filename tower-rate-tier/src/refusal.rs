//! The refusals the limiter answers with, and the events and log lines that
//! go with them.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};

use crate::event::RateLimitEvent;
use crate::headers::{RateLimitHeaders, number};
use crate::policy::OnStorageError;
use crate::problem::{cost_exceeds_limit, problem};
use crate::response::{apply_limited_fields, too_many_requests};
use crate::storage::StorageError;
use crate::tier::{CheckError, RateLimited};

pub(crate) type EventFn = dyn Fn(&RateLimitEvent<'_>) + Send + Sync;
pub(crate) type LimitedFn = dyn Fn(&RateLimited) -> Response<Bytes> + Send + Sync;

/// How a limiter refuses and reports: its storage-error policy and the
/// user's hooks.
#[derive(Clone, Default)]
pub(crate) struct Refusals {
    /// Which rate-limit fields a 429 carries besides `Retry-After`.
    pub(crate) headers: RateLimitHeaders,
    pub(crate) on_storage_error: OnStorageError,
    pub(crate) on_event: Option<Arc<EventFn>>,
    pub(crate) on_limited: Option<Arc<LimitedFn>>,
}

impl Refusals {
    /// The refusal of a request that did not fit (429), with its headers.
    pub(crate) fn limited(&self, user: &str, cost: u32, limited: &RateLimited) -> Response<Bytes> {
        tracing::debug!(target: "tower_rate_tier", user, tier = limited.tier(), cost, retry_after_secs = limited.retry_after_secs(), "rate limited");
        self.event(&RateLimitEvent::Limited { user, cost, limited });
        let mut response = match &self.on_limited {
            Some(hook) => hook(limited),
            None => too_many_requests(limited),
        };
        let headers = response.headers_mut();
        if !headers.contains_key(http::header::RETRY_AFTER) {
            apply_limited_fields(headers, limited, self.headers);
            headers.insert(http::header::RETRY_AFTER, number(limited.retry_after_secs()));
        }
        response
    }

    /// A refusal that shadow mode lets through: reported, not enforced.
    pub(crate) fn shadow_limited(&self, user: &str, cost: u32, limited: &RateLimited) {
        tracing::debug!(target: "tower_rate_tier", user, tier = limited.tier(), cost, "rate limited (shadow mode: let through)");
        self.event(&RateLimitEvent::ShadowLimited { user, cost, limited });
    }

    /// A storage failure under [`OnStorageError`]: `None` lets the request
    /// through, `Some` is the 503.
    pub(crate) fn storage_failed(
        &self,
        user: &str,
        tier: &str,
        error: &StorageError,
    ) -> Option<Response<Bytes>> {
        let allowed = self.on_storage_error == OnStorageError::Allow;
        tracing::warn!(target: "tower_rate_tier", user, tier, %error, allowed, "rate-limit storage failed");
        self.event(&RateLimitEvent::StorageError {
            user,
            tier,
            error,
            allowed,
        });
        (!allowed).then(|| {
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the rate limiter is unavailable; try again shortly",
                serde_json::Value::Null,
            )
        })
    }

    /// A check that failed for another reason than the storage.
    pub(crate) fn check_failed(
        &self,
        user: &str,
        tier: &str,
        cost: u32,
        error: &CheckError,
    ) -> Response<Bytes> {
        match error {
            CheckError::CostExceedsLimit { tier, cost, limit } => {
                tracing::warn!(target: "tower_rate_tier", user, tier, cost, limit, "request cost exceeds the tier's burst");
                self.event(&RateLimitEvent::CostExceedsLimit {
                    user,
                    tier,
                    cost: *cost,
                    limit: *limit,
                });
                cost_exceeds_limit(tier, *cost, *limit)
            }
            other => {
                tracing::warn!(target: "tower_rate_tier", user, tier, cost, error = %other, "rate-limit check failed");
                problem(
                    StatusCode::BAD_REQUEST,
                    "the request could not be rate-limited",
                    serde_json::Value::Null,
                )
            }
        }
    }

    pub(crate) fn event(&self, event: &RateLimitEvent<'_>) {
        if let Some(f) = &self.on_event {
            f(event);
        }
    }
}

/// A route declares a cost but no limiter ran before it: refused with 500.
pub(crate) fn missing_limiter(cost: u32) -> Response<Bytes> {
    tracing::error!(
        target: "tower_rate_tier",
        cost,
        "a route declares a rate-limit cost but no TierLimitLayer ran before it; refusing the request \
         (add the limiter with Router::layer after all routes)"
    );
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "this route declares a rate-limit cost but no rate limiter runs before it; the request was refused",
        serde_json::json!({ "cost": cost }),
    )
}
