//! The refusals the limiter answers with, and the events and log lines that
//! go with them.
//!
//! What a client controls never reaches a log line or an event as it is:
//!
//! * user ids are written as their [`Pseudonym`]: 8 hex digits of a SipHash
//!   keyed with a random key of the limiter's own, the same for one id
//!   throughout the limiter's life (to correlate lines), useless to anyone
//!   without the key (to recover the id);
//! * tier names an identifier reported but the configuration does not know
//!   are cut to their first 64 characters, control characters and quotes
//!   escaped;
//! * warnings a client can cause at will (unknown tiers, costs above the
//!   burst, storage failures, failed refunds) are written at most once per
//!   10 s each, with the number of occurrences since the last one written.
//!   Events are not throttled: each refusal reports its own.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Response, StatusCode};

use crate::event::RateLimitEvent;
use crate::headers::{RateLimitHeaders, number};
use crate::policy::OnStorageError;
use crate::problem::{cost_exceeds_limit, problem};
use crate::response::{apply_limited_fields, too_many_requests};
use crate::storage::StorageError;
use crate::throttle::Throttle;
use crate::tier::{CheckError, RateLimited};

pub(crate) type EventFn = dyn Fn(&RateLimitEvent<'_>) + Send + Sync;
pub(crate) type LimitedFn = dyn Fn(&RateLimited) -> Response<Bytes> + Send + Sync;

/// A client-chosen tier name is shown up to this many characters.
const MAX_SHOWN_TIER: usize = 64;

/// How a limiter refuses and reports: its storage-error policy, the user's
/// hooks, the key of its pseudonyms and the state of its throttled warnings.
#[derive(Clone, Default)]
pub(crate) struct Refusals {
    /// Which rate-limit fields a 429 carries besides `Retry-After`.
    pub(crate) headers: RateLimitHeaders,
    pub(crate) on_storage_error: OnStorageError,
    pub(crate) on_event: Option<Arc<EventFn>>,
    pub(crate) on_limited: Option<Arc<LimitedFn>>,
    pub(crate) pseudonyms: Pseudonyms,
    warnings: Arc<Warnings>,
    /// Whether this layer's last decision came from a fallback's local
    /// limiter.
    fallback: Arc<std::sync::atomic::AtomicBool>,
    /// The counters of units recorded, when the layer counts metrics.
    #[cfg(feature = "metrics")]
    pub(crate) units: Option<Arc<crate::metrics::UnitCounters>>,
}

/// Names user ids in logs and events by a keyed hash (SipHash-1-3 under a
/// random key drawn when the limiter is built).
#[derive(Clone, Default)]
pub(crate) struct Pseudonyms(RandomState);

impl Pseudonyms {
    /// `user`'s pseudonym under this limiter's key.
    pub(crate) fn of(&self, user: &str) -> Pseudonym {
        let hash = self.0.hash_one(user.as_bytes());
        let mut hex = [0u8; 8];
        for (i, digit) in hex.iter_mut().enumerate() {
            let nibble = (hash >> (60 - 4 * i)) & 0xf;
            *digit = b"0123456789abcdef"[nibble as usize];
        }
        Pseudonym(hex)
    }
}

/// A user id's pseudonym: 8 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pseudonym([u8; 8]);

impl Pseudonym {
    pub(crate) fn as_str(&self) -> &str {
        // Hex digits are ASCII.
        std::str::from_utf8(&self.0).unwrap_or("????????")
    }
}

impl fmt::Display for Pseudonym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Pseudonym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A client-chosen string as logs and events show it: its first
/// [`MAX_SHOWN_TIER`] characters, escaped as in a Rust string literal, `…`
/// after a cut.
pub(crate) fn shown(client: &str) -> String {
    let mut out: String = client
        .chars()
        .take(MAX_SHOWN_TIER)
        .flat_map(char::escape_debug)
        .collect();
    if client.chars().nth(MAX_SHOWN_TIER).is_some() {
        out.push('…');
    }
    out
}

/// The throttles of the warnings a client can cause, shared by the clones of
/// one limiter.
struct Warnings {
    start: Instant,
    storage: Throttle,
    unknown_tier: Throttle,
    cost: Throttle,
    check: Throttle,
    refund: Throttle,
    own_quotas: Throttle,
    usage: Throttle,
}

impl Default for Warnings {
    fn default() -> Self {
        Warnings {
            start: Instant::now(),
            storage: Throttle::default(),
            unknown_tier: Throttle::default(),
            cost: Throttle::default(),
            check: Throttle::default(),
            refund: Throttle::default(),
            own_quotas: Throttle::default(),
            usage: Throttle::default(),
        }
    }
}

impl Warnings {
    fn due(&self, throttle: &Throttle) -> Option<u64> {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        throttle.due(ms)
    }
}

impl Refusals {
    /// The refusal of a request that did not fit (429), with its headers.
    pub(crate) fn limited(&self, user: &str, cost: u32, limited: &RateLimited) -> Response<Bytes> {
        let user = self.pseudonyms.of(user);
        tracing::debug!(target: "tower_rate_tier", %user, tier = limited.tier(), cost, retry_after_secs = limited.retry_after_secs(), "rate limited");
        self.event(&RateLimitEvent::Limited {
            user: user.as_str(),
            cost,
            limited,
        });
        let mut response = match &self.on_limited {
            Some(hook) => hook(limited),
            None => too_many_requests(limited),
        };
        // The fields and `Retry-After` a custom response did not set itself.
        let headers = response.headers_mut();
        let remaining_set = headers
            .keys()
            .any(|name| name.as_str().starts_with("x-ratelimit-remaining"));
        if !remaining_set && !headers.contains_key(crate::headers::RATELIMIT) {
            apply_limited_fields(headers, limited, self.headers);
        }
        if !headers.contains_key(http::header::RETRY_AFTER) {
            headers.insert(http::header::RETRY_AFTER, number(limited.retry_after_secs()));
        }
        response
    }

    /// A refusal that shadow mode lets through: reported, not enforced.
    pub(crate) fn shadow_limited(&self, user: &str, cost: u32, limited: &RateLimited) {
        let user = self.pseudonyms.of(user);
        tracing::debug!(target: "tower_rate_tier", %user, tier = limited.tier(), cost, "rate limited (shadow mode: let through)");
        self.event(&RateLimitEvent::ShadowLimited {
            user: user.as_str(),
            cost,
            limited,
        });
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
        let user = self.pseudonyms.of(user);
        if let Some(skipped) = self.warnings.due(&self.warnings.storage) {
            tracing::warn!(target: "tower_rate_tier", %user, tier, %error, allowed, skipped, "rate-limit storage failed");
        }
        self.event(&RateLimitEvent::StorageError {
            user: user.as_str(),
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
                self.above_burst(user, tier, *cost, *limit, None)
            }
            other => {
                let user = self.pseudonyms.of(user);
                if let Some(skipped) = self.warnings.due(&self.warnings.check) {
                    tracing::warn!(target: "tower_rate_tier", %user, tier, cost, error = %other, skipped, "rate-limit check failed");
                }
                problem(
                    StatusCode::BAD_REQUEST,
                    "the request could not be rate-limited",
                    serde_json::Value::Null,
                )
            }
        }
    }

    /// A cost above the tier's burst, or (with `unit`) a reservation above
    /// the smallest burst of that unit: a 403 that can never pass, its
    /// warning and its event.
    pub(crate) fn above_burst(
        &self,
        user: &str,
        tier: &str,
        cost: u32,
        limit: u32,
        unit: Option<&str>,
    ) -> Response<Bytes> {
        let user = self.pseudonyms.of(user);
        if let Some(skipped) = self.warnings.due(&self.warnings.cost) {
            tracing::warn!(target: "tower_rate_tier", %user, tier, unit, cost, limit, skipped, "request cost exceeds the tier's burst");
        }
        self.event(&RateLimitEvent::CostExceedsLimit {
            user: user.as_str(),
            tier,
            cost,
            limit,
        });
        cost_exceeds_limit(tier, cost, limit, unit)
    }

    /// An identifier named a tier the configuration does not have.
    pub(crate) fn unknown_tier(&self, user: &str, tier: &str, policy: &dyn fmt::Debug) {
        let user = self.pseudonyms.of(user);
        let due = self.warnings.due(&self.warnings.unknown_tier);
        if due.is_none() && self.on_event.is_none() {
            return;
        }
        let tier = shown(tier);
        if let Some(skipped) = due {
            tracing::warn!(target: "tower_rate_tier", %user, tier, ?policy, skipped, "unknown tier");
        }
        self.event(&RateLimitEvent::UnknownTier {
            user: user.as_str(),
            tier: &tier,
        });
    }

    /// A request was decided in its tier's overflow bucket (the storage
    /// logs that itself).
    pub(crate) fn overflow(&self, user: &str, tier: &str) {
        if self.on_event.is_some() {
            let user = self.pseudonyms.of(user);
            self.event(&RateLimitEvent::Overflow {
                user: user.as_str(),
                tier,
            });
        }
    }

    /// Notes where a decision came from, and reports a switch to or from a
    /// fallback's local limiter once.
    pub(crate) fn decided_by(&self, source: crate::storage::DecisionSource) {
        use std::sync::atomic::Ordering::Relaxed;
        let local = source == crate::storage::DecisionSource::Fallback;
        if self.fallback.load(Relaxed) != local && self.fallback.swap(local, Relaxed) != local {
            self.event(&RateLimitEvent::Fallback { active: local });
        }
    }

    /// A refund the storage could not make: the request stays over-charged.
    pub(crate) fn refund_failed(&self, error: &dyn fmt::Display) {
        if let Some(skipped) = self.warnings.due(&self.warnings.refund) {
            tracing::warn!(target: "tower_rate_tier", %error, skipped, "rate-limit refund failed");
        }
    }

    /// An identity's own quotas are not bands a tier could have: it was
    /// limited with its tier's.
    pub(crate) fn own_quotas_ignored(&self, tier: &str, error: &dyn fmt::Display) {
        if let Some(skipped) = self.warnings.due(&self.warnings.own_quotas) {
            tracing::warn!(target: "tower_rate_tier", tier, %error, skipped, "an identity's own quotas were ignored");
        }
    }

    /// Usage was recorded: `used` units of `unit`, of which `forgiven`
    /// beyond its debt bound (reported, never lost silently).
    pub(crate) fn usage_recorded(&self, user: &str, tier: &str, unit: &str, used: u32, forgiven: u32) {
        #[cfg(feature = "metrics")]
        if let Some(counters) = &self.units {
            use crate::metrics::UnitOutcome;
            counters.count(
                tier,
                unit,
                UnitOutcome::Recorded,
                u64::from(used - forgiven.min(used)),
            );
            if forgiven > 0 {
                counters.count(tier, unit, UnitOutcome::Forgiven, u64::from(forgiven));
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = used;
        if forgiven > 0 {
            self.usage_forgiven(user, tier, unit, forgiven);
        }
    }

    fn usage_forgiven(&self, user: &str, tier: &str, unit: &str, units: u32) {
        if let Some(skipped) = self.warnings.due(&self.warnings.usage) {
            tracing::warn!(target: "tower_rate_tier", tier, unit, units, skipped, "usage beyond the unit's debt bound was forgiven");
        }
        if self.on_event.is_some() {
            let user = self.pseudonyms.of(user);
            self.event(&RateLimitEvent::UsageForgiven {
                user: user.as_str(),
                tier,
                unit,
                units,
            });
        }
    }

    /// Usage that could not be recorded (the storage failed, an unknown
    /// unit): counted and logged.
    pub(crate) fn usage_lost(&self, user: &str, tier: &str, unit: &str, units: u32, error: &CheckError) {
        #[cfg(feature = "metrics")]
        if let (Some(counters), CheckError::Storage(_)) = (&self.units, error) {
            counters.count(tier, unit, crate::metrics::UnitOutcome::Lost, u64::from(units));
        }
        if let Some(skipped) = self.warnings.due(&self.warnings.usage) {
            tracing::warn!(target: "tower_rate_tier", tier, unit = %shown(unit), units, %error, skipped, "usage was not recorded");
        }
        if self.on_event.is_some() {
            let user = self.pseudonyms.of(user);
            let unit = shown(unit);
            self.event(&RateLimitEvent::UsageLost {
                user: user.as_str(),
                tier,
                unit: &unit,
                units,
                error,
            });
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
        "a route declares a rate-limit cost (tier_cost or #[tier_cost]) but no TierLimitLayer ran before it, \
         so the request is refused (500) rather than let through uncounted; add the limiter with \
         Router::layer after all routes, or on a method router after the cost \
         (get(h).layer(tier_cost(n)).layer(limiter): the last layer runs first). 0.3's route-level order, \
         .layer(limiter).layer(tier_cost(n)), runs the cost first and ends here"
    );
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "this route declares a rate-limit cost but no rate limiter runs before it; the request was refused",
        serde_json::json!({ "cost": cost }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudonyms_are_stable_per_limiter_and_keyed() {
        let a = Pseudonyms::default();
        let b = Pseudonyms::default();
        assert_eq!(a.of("ada").as_str(), a.clone().of("ada").as_str());
        assert_eq!(a.of("ada").as_str().len(), 8);
        assert!(a.of("ada").as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.of("ada"), a.of("bob"));
        // another limiter, another key
        assert_ne!(a.of("ada"), b.of("ada"));
    }

    #[test]
    fn client_strings_are_cut_and_escaped() {
        assert_eq!(shown("gold"), "gold");
        assert_eq!(shown("a\nb\u{1b}[31m\"c"), "a\\nb\\u{1b}[31m\\\"c");
        let long = "x".repeat(10_000);
        assert_eq!(shown(&long), format!("{}…", "x".repeat(64)));
    }

    #[test]
    fn a_throttle_writes_once_per_period_and_counts_the_rest() {
        let t = Throttle::default();
        assert_eq!(t.due(0), Some(0));
        assert_eq!(t.due(5), None);
        assert_eq!(t.due(9_998), None);
        assert_eq!(t.due(10_000), Some(2));
        assert_eq!(t.due(10_001), None);
        assert_eq!(t.due(25_000), Some(1));
    }
}
