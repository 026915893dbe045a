//! [`TierLimitLayer`]: the configuration of the middleware.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response};
use tower_layer::Layer;

#[cfg(feature = "buffered-body")]
use super::config::BodyLimits;
use super::config::{Identify, LayerConfig};
use super::service::TierLimitService;
use crate::cost::Ledger;
use crate::event::RateLimitEvent;
use crate::headers::RateLimitHeaders;
use crate::identity::{ClientAddrs, IpNet, ProxyHeader, TierIdentifier, TierIdentity};
use crate::policy::{OnStorageError, OnUnknownTier};
use crate::refusal::Refusals;
use crate::tier::{RateLimited, RateTier};

/// A tower [`Layer`] that rate-limits requests by tier.
///
/// For each request it identifies the client, resolves the tier
/// ([`OnMissing`](crate::OnMissing), [`OnUnknownTier`]), works out the cost
/// (see [Costs](crate::cost)), and asks the storage. Admitted requests reach
/// the inner service and get rate-limit headers on the way out; refused ones
/// are answered (429, 403, 503) without calling the inner service.
///
/// It works under axum's `Router::layer` (one router-wide layer charges every
/// route's cost exactly), in a `tower::ServiceBuilder`, and around any tower
/// HTTP service: refusals travel in a [`ResponseBody`](crate::ResponseBody),
/// so the limiter never builds the inner service's body type.
///
/// The identity, and above all the tier, must come from something the
/// server trusts (an API-key lookup, verified token claims, what an auth
/// middleware left in the request), never from a value the client sends:
/// a client that names its own plan picks the largest. Here an auth
/// middleware has checked the caller and left its `Account`:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::{Router, routing::get};
/// use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
///
/// /// What the auth middleware inserts once it has checked the credentials.
/// #[derive(Clone)]
/// struct Account {
///     id: String,
///     plan: String,
/// }
///
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .tier("pro", Quota::per_minute(100))
///     .default_tier("free")
///     .build();
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(TierLimitLayer::new(tiers).identifier_parts_fn(|parts| {
///         let account = parts.extensions.get::<Account>()?;
///         Some(TierIdentity::new(&account.id, account.plan.as_str()))
///     }));
/// # let _ = app;
/// # }
/// ```
///
/// Clients without an identity are limited on the default tier, keyed by
/// their address: serve axum with
/// `into_make_service_with_connect_info::<SocketAddr>()` (or insert a
/// [`PeerAddr`](crate::PeerAddr)), or they all share one bucket (the layer
/// logs a warning the first time).
///
/// Clones share the route costs the layer learned (by method and
/// `MatchedPath`; axum makes the service anew for each request of a
/// handler, from a clone). Two routers that serve the same method and path
/// at different prices take a layer each, made with
/// [`TierLimitLayer::new`], not clones of one.
#[derive(Clone)]
pub struct TierLimitLayer {
    pub(crate) config: Arc<LayerConfig>,
}

impl TierLimitLayer {
    /// A layer over these tiers. Without an identifier every client is
    /// unidentified (see [`OnMissing`](crate::OnMissing)).
    pub fn new(tiers: RateTier) -> Self {
        TierLimitLayer {
            config: Arc::new(LayerConfig {
                ledger: Arc::new(Ledger {
                    tiers,
                    refusals: Refusals::default(),
                    learned: Arc::default(),
                    refund_on: None,
                    headers: RateLimitHeaders::ALL,
                    shadow: false,
                }),
                identify: Identify::Nobody,
                on_unknown_tier: OnUnknownTier::default(),
                cost_fn: None,
                client_addrs: ClientAddrs::default(),
                warned_no_address: Arc::default(),
                #[cfg(feature = "buffered-body")]
                body: BodyLimits::default(),
                #[cfg(feature = "grpc")]
                grpc_retry_pushback: false,
                #[cfg(feature = "metrics")]
                metrics: None,
            }),
        }
    }

    /// The configuration, for a builder method. A layer configured from a
    /// clone of another is a layer of its own, with its own one-time
    /// warnings.
    pub(crate) fn configure(&mut self) -> &mut LayerConfig {
        let config = Arc::make_mut(&mut self.config);
        config.warned_no_address = Arc::default();
        config
    }

    /// The refusal settings, which the charges share.
    fn refusals(&mut self) -> &mut Refusals {
        &mut Arc::make_mut(&mut self.configure().ledger).refusals
    }

    /// Identifies clients with a closure over the request headers. It runs
    /// inline, without boxing a future.
    pub fn identifier_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&HeaderMap) -> Option<TierIdentity> + Send + Sync + 'static,
    {
        self.configure().identify = Identify::Headers(Arc::new(f));
        self
    }

    /// Identifies clients with a closure over the whole request head
    /// (extensions an auth layer left, `ConnectInfo`, the URI).
    pub fn identifier_parts_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<TierIdentity> + Send + Sync + 'static,
    {
        self.configure().identify = Identify::Parts(Arc::new(f));
        self
    }

    /// Identifies clients with a [`TierIdentifier`] (which may wait, e.g. for
    /// a database). The layer calls
    /// [`identify_parts`](TierIdentifier::identify_parts), or
    /// [`identify_with_body`](TierIdentifier::identify_with_body) when it
    /// buffers bodies.
    pub fn identifier<I: TierIdentifier>(mut self, identifier: I) -> Self {
        self.configure().identify = Identify::Async(Arc::new(identifier));
        self
    }

    /// The policy for storage failures (default [`OnStorageError::Allow`]).
    pub fn on_storage_error(mut self, policy: OnStorageError) -> Self {
        self.refusals().on_storage_error = policy;
        self
    }

    /// The policy for tiers the configuration does not know (default
    /// [`OnUnknownTier::UseDefault`]).
    pub fn on_unknown_tier(mut self, policy: OnUnknownTier) -> Self {
        self.configure().on_unknown_tier = policy;
        self
    }

    /// Prices requests before they reach their route: `Some(cost)` fixes the
    /// cost (over any route-level declaration), `None` leaves it to the route
    /// (or 1). The closure sees the request head, including axum's
    /// `MatchedPath`; this is how health checks are exempted up front:
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// # use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
    /// use axum::extract::MatchedPath;
    /// # let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// let layer = TierLimitLayer::new(tiers).cost_fn(|parts| {
    ///     let path = parts.extensions.get::<MatchedPath>()?;
    ///     (path.as_str() == "/health").then_some(0)
    /// });
    /// # let _ = layer;
    /// # }
    /// ```
    pub fn cost_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<u32> + Send + Sync + 'static,
    {
        self.configure().cost_fn = Some(Arc::new(f));
        self
    }

    /// Which rate-limit fields responses carry (default
    /// [`RateLimitHeaders::ALL`]: the `X-RateLimit-*` fields and the IETF
    /// draft's `RateLimit-Policy` and `RateLimit`). A 429 always carries
    /// `Retry-After` and its body; its rate-limit fields follow this choice
    /// too. For clients written against OpenAI's API, add
    /// [`RateLimitHeaders::OPENAI`] (`x-ratelimit-remaining-requests`,
    /// `x-ratelimit-reset-tokens: 6m0s`, ...; see the
    /// [`response`](crate::response) module):
    ///
    /// ```
    /// # use tower_rate_tier::{Quota, RateLimitHeaders, RateTier, TierLimitLayer};
    /// # let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// let layer = TierLimitLayer::new(tiers).headers(RateLimitHeaders::ALL.union(RateLimitHeaders::OPENAI));
    /// # let _ = layer;
    /// ```
    pub fn headers(mut self, which: RateLimitHeaders) -> Self {
        Arc::make_mut(&mut self.configure().ledger).headers = which;
        self.refusals().headers = which;
        self
    }

    /// Shadow mode: every request is decided and reported (events, `tracing`)
    /// as usual, but no quota refusal is enforced: a request that would get
    /// 429 (or 403 for a cost above the burst) reaches the inner service,
    /// and consumes nothing, so that enforcing later does not start users in
    /// debt. Identification and unknown-tier policies still apply. A
    /// request shadowed instead of a 429 carries the rate-limit fields of the
    /// state that would have refused it, without `Retry-After`, and is
    /// reported as [`RateLimitEvent::ShadowLimited`]; one whose cost is above
    /// the burst carries no fields and is reported as
    /// [`RateLimitEvent::CostExceedsLimit`]. One tier alone is shadowed with
    /// [`RateTierBuilder::shadow_tier`](crate::RateTierBuilder::shadow_tier),
    /// and enforced again at run time with
    /// [`RateTier::set_shadow`](crate::RateTier::set_shadow).
    pub fn shadow(mut self, shadow: bool) -> Self {
        Arc::make_mut(&mut self.configure().ledger).shadow = shadow;
        self
    }

    /// Gives a request's charge back when the inner service answers with a
    /// status `f` picks, e.g. `.refund_on(|status| status.is_server_error())`
    /// so that clients are not charged for the server's failures. Without
    /// it, every admitted request is charged, whatever its answer, and an
    /// inner service's own 429 is charged too (it is the service's answer,
    /// not this limiter's). A refusal by another limiter of this crate
    /// further in is always given back: a refused request consumes nothing.
    pub fn refund_on<F>(mut self, f: F) -> Self
    where
        F: Fn(http::StatusCode) -> bool + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.configure().ledger).refund_on = Some(Arc::new(f));
        self
    }

    /// Calls `f` for every [`RateLimitEvent`] (limited requests, storage
    /// errors, unknown tiers, costs above the burst, ...), for metrics or
    /// logs. It runs inline: keep it quick.
    pub fn on_event<F>(mut self, f: F) -> Self
    where
        F: Fn(&RateLimitEvent<'_>) + Send + Sync + 'static,
    {
        self.refusals().on_event = Some(Arc::new(f));
        self
    }

    /// Builds the 429 response yourself. The layer adds `Retry-After` unless
    /// the closure set it, and the rate-limit fields (as chosen with
    /// [`headers`](Self::headers)) unless the closure set
    /// `X-RateLimit-Remaining`, an OpenAI-style
    /// `x-ratelimit-remaining-*` field or `RateLimit` itself.
    pub fn on_limited<F>(mut self, f: F) -> Self
    where
        F: Fn(&RateLimited) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.refusals().on_limited = Some(Arc::new(f));
        self
    }

    /// Proxies whose forwarding headers are believed when keying
    /// unidentified clients by address: addresses (`IpAddr`) or networks
    /// ([`IpNet`], `10.0.0.0/8`); each call replaces the list. Default:
    /// none, and no forwarding header is ever read. How the headers are
    /// walked, and what happens when a proxy sent no usable hop, is told in
    /// [Unidentified clients](crate::identity#unidentified-clients).
    ///
    /// The items are generic, so a bare `"10.0.0.1".parse().unwrap()` needs
    /// its type: `.parse::<IpAddr>()`, or `.parse::<IpNet>()` for a network.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use tower_rate_tier::identity::IpNet;
    /// # use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
    /// # let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// let proxy: IpAddr = "192.0.2.1".parse().unwrap();
    /// let private: IpNet = "10.0.0.0/8".parse().unwrap();
    /// let layer = TierLimitLayer::new(tiers).trusted_proxies([IpNet::from(proxy), private]);
    /// # let _ = layer;
    /// ```
    pub fn trusted_proxies<I>(mut self, proxies: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<IpNet>,
    {
        self.configure()
            .client_addrs
            .set_trusted(proxies.into_iter().map(Into::into));
        self
    }

    /// Which forwarding header the [trusted proxies](Self::trusted_proxies)
    /// write (default [`ProxyHeader::Both`]: whichever the request carries,
    /// neither when both name different clients).
    pub fn proxy_header(mut self, header: ProxyHeader) -> Self {
        self.configure().client_addrs.set_proxy_header(header);
        self
    }

    /// The prefix length unidentified IPv6 clients are grouped by (default
    /// 64: one subscriber's network, whose addresses a client can rotate
    /// through). `56` groups a typical home allocation; 128 keys each
    /// address alone, and larger values count as 128. IPv4 clients are
    /// keyed by their address.
    pub fn anonymous_ipv6_prefix(mut self, len: u8) -> Self {
        self.configure().client_addrs.set_ipv6_prefix(len);
        self
    }

    /// Adds `grpc-retry-pushback-ms` (the retry delay in milliseconds) to
    /// the RESOURCE_EXHAUSTED answer of a rate-limited gRPC call (default
    /// off): a client whose retry policy lists RESOURCE_EXHAUSTED then waits
    /// that long before it retries. See [`grpc`](crate::grpc).
    #[cfg(feature = "grpc")]
    pub fn grpc_retry_pushback(mut self, enabled: bool) -> Self {
        self.configure().grpc_retry_pushback = enabled;
        self
    }

    /// Counts every request in `tower_rate_tier_requests_total{tier,
    /// outcome}` (default off); see [`metrics`](crate::metrics). The
    /// counters are registered now, with the recorder in force: install it
    /// before this call.
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, enabled: bool) -> Self {
        let counters = enabled.then(|| {
            crate::metrics::describe_requests();
            Arc::new(crate::metrics::RequestCounters::new(self.tiers()))
        });
        let units = enabled.then(|| Arc::new(crate::metrics::UnitCounters::new(self.tiers())));
        self.configure().metrics = counters;
        Arc::make_mut(&mut self.configure().ledger).refusals.units = units;
        self
    }

    /// The pseudonym this layer's log lines and [`RateLimitEvent`]s give
    /// `user_id` (8 hex digits of a hash under a random key of this
    /// layer's own, drawn by [`TierLimitLayer::new`]): to find one
    /// customer's lines. Clones of the layer share it.
    pub fn user_pseudonym(&self, user_id: &str) -> String {
        self.config.ledger.refusals.pseudonyms.of(user_id).to_string()
    }

    /// The tiers this layer limits with.
    pub fn tiers(&self) -> &RateTier {
        &self.config.ledger.tiers
    }
}

impl<S> Layer<S> for TierLimitLayer {
    type Service = TierLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TierLimitService::new(inner, self.config.clone())
    }
}

impl fmt::Debug for TierLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierLimitLayer")
            .field("tiers", &self.config.ledger.tiers)
            .field("on_storage_error", &self.config.ledger.refusals.on_storage_error)
            .field("on_unknown_tier", &self.config.on_unknown_tier)
            .field("client_addrs", &self.config.client_addrs)
            .finish_non_exhaustive()
    }
}
