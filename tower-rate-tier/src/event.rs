//! [`RateLimitEvent`]: what the limiter reports to operators.

use crate::storage::StorageError;
use crate::tier::{CheckError, RateLimited};

/// Something the limiter decided that an operator may want to know; see
/// [`TierLimitLayer::on_event`](crate::TierLimitLayer::on_event). The same
/// events are written as `tracing` events (target `tower_rate_tier`; the
/// warnings a client can cause at will at most once per 10 s each).
///
/// **No event carries a user id.** Every `user` field holds the id's
/// pseudonym: 8 hex digits of a hash keyed with a random key of the
/// limiter's own, the same for one id throughout the limiter's life, and the
/// same the limiter's log lines show, so events and logs of one client can
/// be correlated without the id being written anywhere.
/// [`TierLimitLayer::user_pseudonym`](crate::TierLimitLayer::user_pseudonym)
/// gives a known id's pseudonym (to find a customer's lines). Metrics should
/// not be labelled with pseudonyms either: there are as many as clients. A
/// `tier` field holds a configured tier's name, except in
/// [`UnknownTier`](Self::UnknownTier).
///
/// ```
/// # #[cfg(feature = "axum")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::{Arc, Mutex};
/// use axum::{Router, body::Body, routing::get};
/// use http::Request;
/// use tower::ServiceExt;
/// use tower_rate_tier::{Quota, RateLimitEvent, RateTier, TierIdentity, TierLimitLayer};
///
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = seen.clone();
/// let tiers = RateTier::builder().tier("free", Quota::per_minute(1)).build();
/// let layer = TierLimitLayer::new(tiers)
///     .identifier_fn(|_| Some(TierIdentity::new("ada@example.com", "free")))
///     .on_event(move |event| {
///         if let RateLimitEvent::Limited { user, .. } = event {
///             log.lock().unwrap().push(user.to_string());
///         }
///     });
/// let pseudonym = layer.user_pseudonym("ada@example.com");
/// let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
/// for _ in 0..2 {
///     app.clone().oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
/// }
/// assert_eq!(*seen.lock().unwrap(), [pseudonym.clone()]);
/// assert_eq!(pseudonym.len(), 8);
/// # }
/// # #[cfg(not(feature = "axum"))]
/// # fn main() {}
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RateLimitEvent<'a> {
    /// A request was refused with 429.
    Limited {
        /// The user's pseudonym (never the id).
        user: &'a str,
        /// The cost that did not fit.
        cost: u32,
        /// The state that refused it.
        limited: &'a RateLimited,
    },
    /// A request that would have been refused with 429 was let through:
    /// the layer, or its tier, is in shadow mode. Nothing was consumed.
    ShadowLimited {
        /// The user's pseudonym (never the id).
        user: &'a str,
        /// The cost that did not fit.
        cost: u32,
        /// The state that would have refused it.
        limited: &'a RateLimited,
    },
    /// A request cost more than its tier's burst and was refused with 403
    /// (or, in shadow mode, let through).
    CostExceedsLimit {
        /// The user's pseudonym (never the id).
        user: &'a str,
        /// The tier.
        tier: &'a str,
        /// The cost.
        cost: u32,
        /// The tier's burst.
        limit: u32,
    },
    /// The storage failed; `allowed` tells what [`OnStorageError`](crate::OnStorageError) made of it.
    StorageError {
        /// The user's pseudonym (never the id).
        user: &'a str,
        /// The tier.
        tier: &'a str,
        /// The failure.
        error: &'a StorageError,
        /// Whether the request was let through.
        allowed: bool,
    },
    /// The identifier named a tier that is not configured.
    UnknownTier {
        /// The user's pseudonym (never the id).
        user: &'a str,
        /// The unknown tier name, as the client may have chosen it: its
        /// first 64 characters, escaped as in a Rust string literal (`…`
        /// after a cut).
        tier: &'a str,
    },
    /// The storage had no room for the user's own bucket (the memory
    /// storage at its key cap): the request was decided in the bucket its
    /// tier shares between all such users, with the tier's quota (see
    /// [`MemoryStorage`](crate::storage::MemoryStorage)). A `Limited` event
    /// follows when that bucket refused it.
    Overflow {
        /// The user's pseudonym (never the id).
        user: &'a str,
        /// The tier.
        tier: &'a str,
    },
    /// The storage started (`active: true`) or stopped answering from a
    /// [`Fallback`](crate::storage::Fallback)'s local limiter, as this
    /// layer's decisions show: reported once per switch, each way. With
    /// failure domains, the decisions of a healthy domain and of one
    /// answered locally interleave, and this event follows them; alert on
    /// the fallback's own `on_switch`, which reports it as a whole.
    Fallback {
        /// Whether decisions now come from the local limiter.
        active: bool,
    },
    /// Usage recorded beyond what a unit had left went past its debt bound
    /// (one burst of the unit's smallest band): the excess was forgiven.
    UsageForgiven {
        /// The user's pseudonym (never the id).
        user: &'a str,
        /// The tier.
        tier: &'a str,
        /// The unit.
        unit: &'a str,
        /// The units forgiven (of the band that forgave most).
        units: u32,
    },
    /// Usage could not be recorded: the storage failed (with no fallback
    /// to take it), or the tier has no such unit.
    UsageLost {
        /// The user's pseudonym (never the id).
        user: &'a str,
        /// The tier.
        tier: &'a str,
        /// The unit, as the program named it (escaped, cut at 64
        /// characters).
        unit: &'a str,
        /// The units that were not recorded.
        units: u32,
        /// Why.
        error: &'a CheckError,
    },
    /// The client was not identified (or its user id was empty or too long).
    Unidentified,
    /// A route declares a cost but no limiter ran before it; it was refused
    /// with 500. Reserved: the refusal comes before any limiter runs, so no
    /// limiter's `on_event` hears it; it is logged as an error (target
    /// `tower_rate_tier`).
    MissingLimiter {
        /// The declared cost.
        cost: u32,
    },
}
