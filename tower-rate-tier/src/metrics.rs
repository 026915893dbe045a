//! Counters and histograms through the [`metrics`](https://docs.rs/metrics)
//! facade 0.24 (feature `metrics`).
//!
//! | name | type | labels | what |
//! | --- | --- | --- | --- |
//! | `tower_rate_tier_requests_total` | counter | `tier`, `outcome` | every request the layer decides, once ([`TierLimitLayer::metrics`](crate::TierLimitLayer::metrics)) |
//! | `tower_rate_tier_storage_duration_seconds` | histogram | `storage` | each storage operation, from the call to its answer, or until its caller stopped waiting ([`MeteredStorage`]) |
//! | `tower_rate_tier_storage_errors_total` | counter | `storage`, `kind` | failed storage operations ([`MeteredStorage`]); `kind` is `timeout`, `unavailable`, `full` or `other` |
//! | `tower_rate_tier_deny_cache_hits_total` | counter | `storage` | denials answered by a deny cache without asking the storage ([`MeteredStorage`] around it) |
//! | `tower_rate_tier_concurrent_requests` | gauge | `tier` | slots of the tier's concurrency limit held now by requests this layer admitted, all users together ([`TierLimitLayer::metrics`](crate::TierLimitLayer::metrics)) |
//! | `tower_rate_tier_units_total` | counter | `tier`, `unit`, `outcome` | units of a tier's named units ([`RateTierBuilder::tier_unit`](crate::RateTierBuilder::tier_unit)) that requests this layer admitted used: `recorded` (charged, into a debt if need be), `forgiven` (beyond the unit's debt bound), `lost` (the storage failed) ([`TierLimitLayer::metrics`](crate::TierLimitLayer::metrics)) |
//! | `tower_rate_tier_fallback_active` | gauge | `storage` | 1 while a [`Fallback`](crate::storage::Fallback) answers from its local limiter, 0 once the primary answers again ([`MeteredStorage`] around it; it follows the last decision, so with failure domains it changes with them: alert on the fallback's `on_switch`) |
//!
//! The `outcome` of a request ([`Outcome`]):
//!
//! | outcome | `tier` | when |
//! | --- | --- | --- |
//! | `allowed` | the tier charged | admitted (an unlimited tier too) |
//! | `limited` | the tier charged | refused: the quota is spent (429, or RESOURCE_EXHAUSTED) |
//! | `concurrency_limited` | the tier charged | refused: the user has as many requests in flight as the tier's concurrency limit (429, or RESOURCE_EXHAUSTED) |
//! | `shadow_limited` | the tier charged | would have been limited, let through by shadow mode (nothing consumed) |
//! | `cost_exceeds_limit` | the tier | the cost is above the tier's burst (403; let through in shadow mode) |
//! | `storage_error_allowed`, `storage_error_denied` | the tier | the storage failed; [`OnStorageError`] let it through or refused it |
//! | `check_failed` | the tier | the check failed otherwise (400) |
//! | `unidentified_allowed`, `unidentified_denied` | `unknown` | not identified; [`OnMissing::Allow`], or a refusal ([`OnMissing::Deny`], no default tier) |
//! | `unknown_tier_allowed`, `unknown_tier_denied` | `unknown` | the identifier named an unknown tier; [`OnUnknownTier::Allow`], or a refusal |
//! | `body_rejected` | `unknown` | [`buffer_body`](crate::TierLimitLayer::buffer_body) refused the body (413, 408, 400) |
//!
//! An unidentified client or an unknown tier limited with the default tier
//! counts under the default tier, with that decision's outcome. Labels are
//! bounded: `tier` is a configured tier name or `unknown` (never what a
//! client sent), there is no user or key label, and every (tier, outcome)
//! pair above is registered once, at 0, when the layer is built; a request
//! increments a ready handle (no key is built, nothing is allocated). A
//! tier added at run time ([`RateTier::set_tier`]) is counted under its own
//! name too: its pairs are registered at its first request, with the
//! recorder in force then (the global one, once installed), and kept for as
//! long as the layer lives, so their number is bounded by the tier names
//! ever configured.
//!
//! The counts are the limiter's decisions at the edge, one per request. A
//! route-level [`tier_cost`](fn@crate::tier_cost) that refuses a request the
//! edge admitted (possible only while the limiter is still learning that
//! route's cost, or for a declaration that runs on some requests only)
//! counts as `allowed`; [`on_event`](crate::TierLimitLayer::on_event)
//! reports that refusal. A request dropped before its decision (its client
//! gone, an outer timeout while the storage waits) is not counted; the
//! storage call it waited for is timed until then.
//!
//! Limiters stacked under one recorder with `metrics(true)` each count
//! the requests they decide, in the same series when their tier names
//! are the same: turn metrics on in one of them (the edge, say), or give
//! the others tier names of their own.
//!
//! # Installing a recorder
//!
//! Handles are registered with the recorder in force when
//! [`metrics(true)`](crate::TierLimitLayer::metrics) and
//! [`MeteredStorage::new`] run: install the recorder (or exporter) first.
//! The same calls describe their metrics to it (a help text and a unit
//! each, through `describe_counter!` and its kin), so a Prometheus scrape
//! carries `# HELP` and `# TYPE` lines for every one of them.
//! With `metrics-exporter-prometheus`, histograms are summaries unless you
//! give buckets:
//!
//! ```text
//! let handle = PrometheusBuilder::new()
//!     .set_buckets_for_metric(
//!         Matcher::Full(tower_rate_tier::metrics::STORAGE_DURATION_SECONDS.into()),
//!         &[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1],
//!     )?
//!     .install_recorder()?;
//! // build the RateTier and the layer now; serve `handle.render()` at /metrics
//! ```
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//! use tower_rate_tier::metrics::MeteredStorage;
//! use tower_rate_tier::storage::MemoryStorage;
//! use tower_rate_tier::{Quota, RateTier};
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! // A local recorder for the registration; the handles outlive it.
//! let tiers = metrics::with_local_recorder(&recorder, || {
//!     let storage = MeteredStorage::new(MemoryStorage::new(), "memory");
//!     RateTier::builder().tier("free", Quota::per_minute(10)).storage(storage).build()
//! });
//! tiers.check("ada", "free", 1).await.unwrap().unwrap();
//!
//! let timed = snapshotter.snapshot().into_vec().into_iter().find_map(|(key, _, _, value)| {
//!     (key.key().name() == "tower_rate_tier_storage_duration_seconds").then_some(value)
//! });
//! assert!(matches!(timed, Some(DebugValue::Histogram(samples)) if samples.len() == 1));
//! # }
//! ```

mod slots;
mod storage;
mod units;

use std::collections::HashMap;
use std::fmt;

use metrics::{Counter, SharedString, Unit};

use crate::policy::{OnMissing, OnStorageError, OnUnknownTier};
use crate::tier::{CheckError, RateLimited, RateTier};
use slots::SlotGauges;
pub use storage::MeteredStorage;
pub(crate) use units::{UnitCounters, UnitOutcome};

/// `tower_rate_tier_requests_total{tier, outcome}`.
pub const REQUESTS_TOTAL: &str = "tower_rate_tier_requests_total";
/// `tower_rate_tier_storage_duration_seconds{storage}`.
pub const STORAGE_DURATION_SECONDS: &str = "tower_rate_tier_storage_duration_seconds";
/// `tower_rate_tier_storage_errors_total{storage, kind}`.
pub const STORAGE_ERRORS_TOTAL: &str = "tower_rate_tier_storage_errors_total";
/// `tower_rate_tier_deny_cache_hits_total{storage}`: denials a deny cache
/// answered itself.
pub const DENY_CACHE_HITS_TOTAL: &str = "tower_rate_tier_deny_cache_hits_total";
/// `tower_rate_tier_fallback_active{storage}` (gauge): 1 while a fallback
/// answers locally.
pub const FALLBACK_ACTIVE: &str = "tower_rate_tier_fallback_active";
/// `tower_rate_tier_concurrent_requests{tier}` (gauge): slots in use.
pub const CONCURRENT_REQUESTS: &str = "tower_rate_tier_concurrent_requests";
/// `tower_rate_tier_units_total{tier, unit, outcome}`: units recorded
/// (`recorded`), forgiven beyond a unit's debt bound (`forgiven`) or not
/// recorded for a storage failure (`lost`).
pub const UNITS_TOTAL: &str = "tower_rate_tier_units_total";
/// The `tier` label of requests charged to no configured tier.
pub const UNKNOWN: &str = "unknown";

/// Describes [`REQUESTS_TOTAL`] (help text and unit) to the recorder in
/// force, so that an exporter prints it (`# HELP` and `# TYPE` in a
/// Prometheus scrape). Called where its handles are registered
/// ([`TierLimitLayer::metrics`](crate::TierLimitLayer::metrics)).
pub(crate) fn describe_requests() {
    metrics::describe_counter!(
        REQUESTS_TOTAL,
        Unit::Count,
        "Requests the rate limiter decided, by tier and outcome (allowed, limited, cost_exceeds_limit, ...)"
    );
    metrics::describe_gauge!(
        CONCURRENT_REQUESTS,
        Unit::Count,
        "Slots of the tier's concurrency limit held by requests in flight, all users together"
    );
}

/// Describes the storage metrics ([`STORAGE_DURATION_SECONDS`],
/// [`STORAGE_ERRORS_TOTAL`], [`DENY_CACHE_HITS_TOTAL`], [`FALLBACK_ACTIVE`])
/// to the recorder in force. Called where their handles are registered
/// ([`MeteredStorage::new`]).
pub(super) fn describe_storage() {
    metrics::describe_histogram!(
        STORAGE_DURATION_SECONDS,
        Unit::Seconds,
        "Time of each rate-limit storage operation, from the call to its answer"
    );
    metrics::describe_counter!(
        STORAGE_ERRORS_TOTAL,
        Unit::Count,
        "Failed rate-limit storage operations, by kind (timeout, unavailable, full, other)"
    );
    metrics::describe_counter!(
        DENY_CACHE_HITS_TOTAL,
        Unit::Count,
        "Denials a deny cache answered without asking the storage"
    );
    metrics::describe_gauge!(
        FALLBACK_ACTIVE,
        "1 while a fallback answers rate-limit decisions from its local limiter, 0 once the primary answers again"
    );
}

/// What became of a request: the `outcome` label of
/// [`REQUESTS_TOTAL`]. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted.
    Allowed,
    /// Refused: the quota is spent.
    Limited,
    /// Refused: the user has as many requests in flight as the tier's
    /// concurrency limit.
    ConcurrencyLimited,
    /// Would have been limited; let through by shadow mode.
    ShadowLimited,
    /// The cost is above the tier's burst.
    CostExceedsLimit,
    /// The check failed for another reason than the storage.
    CheckFailed,
    /// The storage failed and the request was let through.
    StorageErrorAllowed,
    /// The storage failed and the request was refused.
    StorageErrorDenied,
    /// Not identified, let through uncounted.
    UnidentifiedAllowed,
    /// Not identified, refused.
    UnidentifiedDenied,
    /// An unknown tier, let through uncounted.
    UnknownTierAllowed,
    /// An unknown tier, refused.
    UnknownTierDenied,
    /// The body could not be buffered for identification.
    BodyRejected,
}

const OUTCOMES: usize = 13;

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; OUTCOMES] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::ConcurrencyLimited,
        Outcome::ShadowLimited,
        Outcome::CostExceedsLimit,
        Outcome::CheckFailed,
        Outcome::StorageErrorAllowed,
        Outcome::StorageErrorDenied,
        Outcome::UnidentifiedAllowed,
        Outcome::UnidentifiedDenied,
        Outcome::UnknownTierAllowed,
        Outcome::UnknownTierDenied,
        Outcome::BodyRejected,
    ];

    /// The `outcome` label value.
    pub const fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ConcurrencyLimited => "concurrency_limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::CostExceedsLimit => "cost_exceeds_limit",
            Outcome::CheckFailed => "check_failed",
            Outcome::StorageErrorAllowed => "storage_error_allowed",
            Outcome::StorageErrorDenied => "storage_error_denied",
            Outcome::UnidentifiedAllowed => "unidentified_allowed",
            Outcome::UnidentifiedDenied => "unidentified_denied",
            Outcome::UnknownTierAllowed => "unknown_tier_allowed",
            Outcome::UnknownTierDenied => "unknown_tier_denied",
            Outcome::BodyRejected => "body_rejected",
        }
    }

    /// Whether the outcome belongs to a configured tier (else to `unknown`).
    const fn of_a_tier(self) -> bool {
        matches!(
            self,
            Outcome::Allowed
                | Outcome::Limited
                | Outcome::ConcurrencyLimited
                | Outcome::ShadowLimited
                | Outcome::CostExceedsLimit
                | Outcome::CheckFailed
                | Outcome::StorageErrorAllowed
                | Outcome::StorageErrorDenied
        )
    }
}

/// One handle per outcome; a no-op where the pair never happens.
type Row = [Counter; OUTCOMES];

fn row(tier: &str, applies: impl Fn(Outcome) -> bool) -> Row {
    Outcome::ALL.map(|outcome| {
        if applies(outcome) {
            let tier = SharedString::from(tier.to_owned());
            metrics::counter!(REQUESTS_TOTAL, "tier" => tier, "outcome" => outcome.label())
        } else {
            Counter::noop()
        }
    })
}

/// The request counters of one layer: a row of handles per configured tier
/// and one for `unknown`, registered when the layer is built; a tier added
/// or replaced later gets its row at its first request.
pub(crate) struct RequestCounters {
    /// The layer's tiers, which say whether a name missing from `by_name`
    /// is a tier added since (never a name a client chose).
    table: RateTier,
    by_name: HashMap<Box<str>, usize, foldhash::fast::RandomState>,
    tiers: Box<[Row]>,
    /// Rows of tiers added after the layer was built: as many as the names
    /// ever configured.
    added: dashmap::DashMap<Box<str>, Row, foldhash::fast::RandomState>,
    unknown: Row,
    /// The gauge of slots in use of each tier with a concurrency limit.
    gauges: SlotGauges,
}

impl RequestCounters {
    /// Registers every meaningful (tier, outcome) pair of `tiers` with the
    /// recorder in force.
    pub(crate) fn new(tiers: &RateTier) -> Self {
        let names = tiers.tier_names();
        RequestCounters {
            table: tiers.clone(),
            by_name: names
                .iter()
                .enumerate()
                .map(|(i, name)| (name.as_str().into(), i))
                .collect(),
            tiers: names.iter().map(|name| row(name, Outcome::of_a_tier)).collect(),
            added: dashmap::DashMap::default(),
            unknown: row(UNKNOWN, |outcome| {
                !outcome.of_a_tier() && outcome != Outcome::ShadowLimited
            }),
            gauges: SlotGauges::new(tiers),
        }
    }

    /// Counts one request of `tier` (a configured name, else `unknown`).
    pub(crate) fn count(&self, tier: Option<&str>, outcome: Outcome) {
        match tier {
            Some(name) => match self.by_name.get(name) {
                Some(&i) => self.tiers[i][outcome as usize].increment(1),
                None => self.count_added(name, outcome),
            },
            None => self.unknown[outcome as usize].increment(1),
        }
    }

    /// Counts a request of a tier the layer was built without: under its
    /// name once the tier table has it (its row registered now, with the
    /// recorder in force), else under `unknown`.
    #[cold]
    fn count_added(&self, name: &str, outcome: Outcome) {
        if let Some(row) = self.added.get(name) {
            return row[outcome as usize].increment(1);
        }
        if self.table.resolve(name).is_none() {
            return self.unknown[outcome as usize].increment(1);
        }
        let row = self
            .added
            .entry(name.into())
            .or_insert_with(|| row(name, Outcome::of_a_tier));
        row[outcome as usize].increment(1);
    }

    /// The gauge of a configured tier's slots in use (never per user).
    pub(crate) fn slots_in_use(&self, tier: &str) -> metrics::Gauge {
        self.gauges.get(tier)
    }

    /// Counts a charged request by what its check answered (`shadowed`:
    /// a would-be refusal is let through).
    pub(crate) fn check<T>(
        &self,
        tier: &str,
        result: &Result<Result<T, RateLimited>, CheckError>,
        policy: OnStorageError,
        shadowed: bool,
    ) {
        let outcome = match result {
            Ok(Ok(_)) => Outcome::Allowed,
            Ok(Err(_)) if shadowed => Outcome::ShadowLimited,
            Ok(Err(limited)) if limited.is_concurrency_limited() => Outcome::ConcurrencyLimited,
            Ok(Err(_)) => Outcome::Limited,
            Err(CheckError::Storage(_)) if policy == OnStorageError::Allow => Outcome::StorageErrorAllowed,
            Err(CheckError::Storage(_)) => Outcome::StorageErrorDenied,
            Err(CheckError::CostExceedsLimit { .. }) => Outcome::CostExceedsLimit,
            Err(_) => Outcome::CheckFailed,
        };
        self.count(Some(tier), outcome);
    }

    /// Counts an unidentified request the policy answers itself (one limited
    /// with the default tier is counted by its check).
    pub(crate) fn unidentified(&self, policy: OnMissing, has_default: bool) {
        match policy {
            OnMissing::UseDefault if has_default => {}
            OnMissing::Allow => self.count(None, Outcome::UnidentifiedAllowed),
            OnMissing::UseDefault | OnMissing::Deny(_) => self.count(None, Outcome::UnidentifiedDenied),
        }
    }

    /// Counts a request of an unknown tier the policy answers itself (one
    /// limited with the default tier is counted by its check).
    pub(crate) fn unknown_tier(&self, policy: OnUnknownTier, has_default: bool) {
        match policy {
            OnUnknownTier::UseDefault if has_default => {}
            OnUnknownTier::Allow => self.count(None, Outcome::UnknownTierAllowed),
            OnUnknownTier::UseDefault | OnUnknownTier::Deny(_) => {
                self.count(None, Outcome::UnknownTierDenied)
            }
        }
    }
}

impl fmt::Debug for RequestCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestCounters")
            .field("tiers", &self.tiers.len())
            .finish_non_exhaustive()
    }
}
