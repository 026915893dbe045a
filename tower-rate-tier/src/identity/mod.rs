//! Who is calling, and on which plan.
//!
//! The layer asks an identifier for a [`TierIdentity`] (a user id and a tier
//! name). Identifiers come in three shapes:
//!
//! * a closure over the headers, [`TierLimitLayer::identifier_fn`]; or over
//!   the whole request head ([`http::request::Parts`]: what an auth layer left
//!   in the extensions, the peer address),
//!   [`TierLimitLayer::identifier_parts_fn`]. Closures run inline: no future
//!   is boxed;
//! * a type implementing [`TierIdentifier`], for identification that waits
//!   (an API-key lookup in a database), [`TierLimitLayer::identifier`];
//! * none: every client is unidentified and handled by
//!   [`OnMissing`](crate::OnMissing) (with `UseDefault`, each client address gets
//!   the default tier's quota; see [below](#unidentified-clients)).
//!
//! [`TierLimitLayer::identifier_fn`]: crate::TierLimitLayer::identifier_fn
//! [`TierLimitLayer::identifier_parts_fn`]: crate::TierLimitLayer::identifier_parts_fn
//! [`TierLimitLayer::identifier`]: crate::TierLimitLayer::identifier
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use http::{HeaderMap, Request};
//! use tower_rate_tier::{TierIdentifier, TierIdentity};
//!
//! struct ApiKeys;
//!
//! #[tower_rate_tier::async_trait]
//! impl TierIdentifier for ApiKeys {
//!     async fn identify(&self, headers: &HeaderMap) -> Option<TierIdentity> {
//!         let key = headers.get("x-api-key")?.to_str().ok()?;
//!         // the server's record of the key (a database in a real service),
//!         // never a plan the client names
//!         let plan = match key {
//!             "pro_123" => "pro",
//!             "free_456" => "free",
//!             _ => return None,
//!         };
//!         Some(TierIdentity::new(key, plan))
//!     }
//! }
//!
//! // The layer calls `identify_parts`, which defaults to `identify` on the headers.
//! let (parts, ()) = Request::get("/").header("x-api-key", "pro_123").body(()).unwrap().into_parts();
//! assert_eq!(ApiKeys.identify_parts(&parts).await, Some(TierIdentity::new("pro_123", "pro")));
//! assert_eq!(ApiKeys.identify(&HeaderMap::new()).await, None);
//! # }
//! ```
//!
//! # Unidentified clients
//!
//! Under `OnMissing::UseDefault` an unidentified client is keyed by its
//! address, so one anonymous client cannot spend everybody's quota.
//!
//! **The peer** is an app-provided [`PeerAddr`] extension (any tower stack
//! can insert one; it wins, being the more specific), else axum's
//! `ConnectInfo<SocketAddr>` (serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`). When neither is
//! there, all unidentified clients share one bucket (`\0anonymous`) of the
//! default tier: the limit still holds in total.
//!
//! **The key** is the client's IPv4 address, or its IPv6 network: one
//! subscriber gets at least a /64 from its ISP and can rotate through all of
//! its addresses, so IPv6 clients are grouped by their /64 unless
//! [`TierLimitLayer::anonymous_ipv6_prefix`] says otherwise (`56` groups a
//! typical home allocation; above 128 counts as 128, one bucket per
//! address). IPv4-mapped IPv6 addresses (`::ffff:198.51.100.7`, what a
//! dual-stack socket reports) count as the IPv4 address. Keys read
//! `\0ip:198.51.100.7` and `\0ip:2001:db8:1:2::/64`: they start with a NUL
//! character, and an identity whose user id starts with one counts as
//! unidentified, so no identifier can hand a client an address's bucket.
//!
//! **Behind proxies**, nothing a client sends is believed unless the peer
//! is one of the layer's [`TierLimitLayer::trusted_proxies`] (addresses or
//! networks, [`IpNet`]); with none configured, forwarding headers are never
//! read. When the peer is trusted, the forwarding header is walked from the
//! right, one comma-separated entry at a time: trusted proxies are skipped,
//! and the first address that is not a trusted proxy is the client. Each
//! entry is cut from the raw bytes and parsed alone, so what a client wrote
//! to the left of the proxies' entries (non-UTF-8 bytes, forged hops) is
//! never reached and cannot spoil them. An entry that is not an address
//! (garbage, `unknown`, an obfuscated `_hidden` node, an element without
//! `for`) stops the walk, and so does a header with no entry at all: the key
//! is then the last trusted hop, which is **the proxy's own address when it
//! sent no usable hop**, so all such clients share the proxy's bucket. The
//! work is bounded: at most 20 entries of a header are read (a longer chain
//! of trusted proxies is keyed by the 20th hop from the right), and an entry
//! longer than 128 bytes (512 for a `Forwarded` element) stops the walk.
//!
//! Both forwarding headers are understood, several header lines being one
//! list (the last line right-most):
//!
//! * `X-Forwarded-For: 203.0.113.7, 2001:db8::7, [2001:db8::8]:4711` (ports
//!   allowed);
//! * RFC 7239 `Forwarded: for=203.0.113.7;proto=https, For="[2001:db8::7]:4711"`
//!   (the `for` parameter in any case, quoted or not; other parameters are
//!   ignored).
//!
//! Which one is read is [`TierLimitLayer::proxy_header`]'s choice
//! ([`ProxyHeader`]). By default the request's only forwarding header is
//! read; when it carries both and they name different clients, neither is
//! believed and the key is the proxy's: a client cannot choose its key by
//! sending the header your proxy leaves alone. Say which header your proxy
//! writes (`ProxyHeader::XForwardedFor` for nginx's
//! `$proxy_add_x_forwarded_for` and most load balancers) and the other one
//! is ignored.
//!
//! [`TierLimitLayer::anonymous_ipv6_prefix`]: crate::TierLimitLayer::anonymous_ipv6_prefix
//! [`TierLimitLayer::trusted_proxies`]: crate::TierLimitLayer::trusted_proxies
//! [`TierLimitLayer::proxy_header`]: crate::TierLimitLayer::proxy_header
//!
//! ```
//! # #[cfg(feature = "axum")] {
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use axum::{Router, body::Body, routing::get};
//! use http::Request;
//! use tower::ServiceExt;
//! use tower_rate_tier::identity::IpNet;
//! use tower_rate_tier::{PeerAddr, Quota, RateTier, TierLimitLayer};
//!
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(2)).default_tier("free").build();
//! let proxies: IpNet = "10.0.0.0/8".parse().unwrap();
//! let app = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     .layer(TierLimitLayer::new(tiers).trusted_proxies([proxies]));
//!
//! // what nginx forwards when the client sent `X-Forwarded-For: \xff`
//! let via_proxy = |client: &str| {
//!     let mut req = Request::get("/")
//!         .header("x-forwarded-for", [b"\xff, ", client.as_bytes()].concat())
//!         .body(Body::empty())
//!         .unwrap();
//!     req.extensions_mut().insert(PeerAddr("10.1.2.3:443".parse().unwrap()));
//!     req
//! };
//! let remaining = |req: Request<Body>| {
//!     let app = app.clone();
//!     async move { app.oneshot(req).await.unwrap().headers()["x-ratelimit-remaining"].clone() }
//! };
//! assert_eq!(remaining(via_proxy("2001:db8:1:2::10")).await, "1");
//! assert_eq!(remaining(via_proxy("2001:db8:1:2::99")).await, "0"); // the same /64
//! assert_eq!(remaining(via_proxy("198.51.100.7")).await, "1"); // its own bucket
//! # }
//! # main();
//! # }
//! ```

mod client_addr;
mod forwarded;
mod own;

pub use client_addr::ProxyHeader;
pub(crate) use client_addr::{ANONYMOUS_PREFIX, ClientAddrs};
/// A network of trusted proxies (`"10.0.0.0/8".parse::<IpNet>()`), from the
/// [`ipnet`](https://docs.rs/ipnet) crate; an `IpAddr` converts into one.
pub use ipnet::IpNet;

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;

use bytes::Bytes;
use http::HeaderMap;
use http::request::Parts;

use std::sync::Arc;

use crate::quota::{IntoQuotas, Quota};
use crate::tier::IntoTierName;
pub(crate) use own::OwnQuotas;

/// A client's identity: a user id and the name of their tier, and
/// optionally quotas of its own ([`with_quotas`](Self::with_quotas)).
///
/// An identity made from a `#[rate_tiers]` value also carries the value's
/// place in its enum: the limiter tries the tier there first and checks it
/// is the same `&'static str` name, so a typed tier is found without
/// comparing names. Changing [`tier`](Self::tier) afterwards is fine: a
/// name the hint does not match is looked up by name.
#[derive(Clone)]
pub struct TierIdentity {
    /// The user id the quota is counted against: 1 to
    /// [`MAX_USER_ID_LEN`](crate::tier::MAX_USER_ID_LEN) (256) bytes; the
    /// layer treats any other as unidentified
    /// ([`OnMissing`](crate::OnMissing)).
    pub user_id: String,
    /// The tier's name.
    pub tier: Cow<'static, str>,
    /// Where the tier is likely to stand in the limiter's table.
    hint: Option<u16>,
    quotas: Option<Arc<OwnQuotas>>,
}

impl PartialEq for TierIdentity {
    /// The same user, tier and own quotas (however the tier was named).
    fn eq(&self, other: &Self) -> bool {
        self.user_id == other.user_id && self.tier == other.tier && self.quotas == other.quotas
    }
}

impl Eq for TierIdentity {}

impl std::hash::Hash for TierIdentity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.user_id.hash(state);
        self.tier.hash(state);
        self.quotas.hash(state);
    }
}

impl TierIdentity {
    /// An identity; `tier` is a `&str`, a `String` or a `#[rate_tiers]` enum
    /// value.
    pub fn new(user_id: impl Into<String>, tier: impl IntoTierName) -> Self {
        let (tier, hint) = tier.into_tier_ref();
        TierIdentity {
            user_id: user_id.into(),
            tier,
            hint,
            quotas: None,
        }
    }

    /// Gives this identity bands of its own (an enterprise contract, say)
    /// instead of its tier's, counted in a bucket of its own: its headers
    /// and `RateLimit-Policy` show them under the tier's name. The tier must
    /// still be configured (or the layer's `OnUnknownTier` applies); bands
    /// that a tier could not have (none, too many, unlimited mixed with
    /// limited, a quota of a unit) are ignored with a warning and the
    /// tier's are used; the
    /// rest of the contract (its concurrency limit, its units) still applies.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, TierIdentity};
    ///
    /// let contract = TierIdentity::new("acme", "enterprise").with_quotas([Quota::per_hour(50_000)]);
    /// assert_eq!(contract.quotas(), Some(&[Quota::per_hour(50_000)][..]));
    /// ```
    pub fn with_quotas(mut self, quotas: impl IntoQuotas) -> Self {
        let bands = Some(quotas.into_quotas().into());
        self.quotas = Some(Arc::new(match self.quotas.as_deref() {
            Some(own) => own.with(bands, own.concurrency()),
            None => OwnQuotas::new(bands, None),
        }));
        self
    }

    /// Gives this identity bands of its own for the unit `unit` of its tier
    /// ([`RateTierBuilder::tier_unit`](crate::RateTierBuilder::tier_unit)),
    /// in place of the tier's: a contract with more tokens per minute, say.
    /// Its usage stays with its other bands, under the same key: the unit's
    /// state is kept as long as a band's refill window stays. Its requests
    /// keep the tier's bands (or its own, with
    /// [`with_quotas`](Self::with_quotas), in either order). A unit the
    /// tier does not have is added for this identity; bands a unit could
    /// not have (none, unlimited, too many) are ignored with a warning and
    /// the tier's are used.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, TierIdentity};
    ///
    /// let contract = TierIdentity::new("acme", "pro").with_unit_quotas("tokens", Quota::per_minute(500_000));
    /// assert_eq!(contract.unit_quotas("tokens"), Some(&[Quota::per_minute(500_000)][..]));
    /// ```
    pub fn with_unit_quotas(mut self, unit: &str, quotas: impl IntoQuotas) -> Self {
        let bands = quotas.into_quotas().into();
        self.quotas = Some(Arc::new(match self.quotas.as_deref() {
            Some(own) => own.with_unit(unit, bands),
            None => OwnQuotas::new(None, None).with_unit(unit, bands),
        }));
        self
    }

    /// The identity's own bands of `unit`, if it has any.
    pub fn unit_quotas(&self, unit: &str) -> Option<&[Quota]> {
        let own = self.quotas.as_deref()?;
        own.units().iter().find(|(u, _)| **u == *unit).map(|(_, b)| &**b)
    }

    /// Gives this identity a concurrency limit of its own: at most `limit`
    /// of its requests in flight at once, in place of its tier's
    /// ([`RateTierBuilder::tier_concurrency`](crate::RateTierBuilder::tier_concurrency)),
    /// also on a tier without one. Its rate stays the tier's (or its own,
    /// with [`with_quotas`](Self::with_quotas), in either order). A limit of
    /// 0 is ignored with a warning and the tier's is used; the rest of the
    /// contract still applies.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, TierIdentity};
    ///
    /// let contract = TierIdentity::new("acme", "pro").with_concurrency(20).with_quotas(Quota::per_hour(50_000));
    /// assert_eq!(contract.concurrency(), Some(20));
    /// ```
    pub fn with_concurrency(mut self, limit: u32) -> Self {
        self.quotas = Some(Arc::new(match self.quotas.as_deref() {
            Some(own) => own.with(own.bands().map(Box::from), Some(limit)),
            None => OwnQuotas::new(None, Some(limit)),
        }));
        self
    }

    /// The identity's own bands, if it has any.
    pub fn quotas(&self) -> Option<&[Quota]> {
        self.quotas.as_deref().and_then(OwnQuotas::bands)
    }

    /// The identity's own concurrency limit, if it has one.
    pub fn concurrency(&self) -> Option<u32> {
        self.quotas.as_deref().and_then(OwnQuotas::concurrency)
    }

    /// The identity's own bands with what the limiter built of them.
    pub(crate) fn own_quotas(&self) -> Option<&OwnQuotas> {
        self.quotas.as_deref()
    }

    /// Where its tier is likely to stand in the limiter's table.
    pub(crate) fn tier_hint(&self) -> Option<u16> {
        self.hint
    }
}

impl fmt::Debug for TierIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierIdentity")
            .field("user_id", &self.user_id)
            .field("tier", &self.tier)
            .field("quotas", &self.quotas)
            .finish()
    }
}

/// Identifies clients, possibly asynchronously.
///
/// ```
/// use http::HeaderMap;
/// use tower_rate_tier::{TierIdentifier, TierIdentity};
///
/// struct ApiKeys;
///
/// #[tower_rate_tier::async_trait]
/// impl TierIdentifier for ApiKeys {
///     async fn identify(&self, headers: &HeaderMap) -> Option<TierIdentity> {
///         let key = headers.get("x-api-key")?.to_str().ok()?;
///         // the server's record of the key (a database lookup in a real
///         // service): a client must never name its own tier
///         let (account, tier) = match key {
///             "k-7f3a" => ("acme", "pro"),
///             "k-91bc" => ("ada", "free"),
///             _ => return None,
///         };
///         Some(TierIdentity::new(account, tier))
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait TierIdentifier: Send + Sync + 'static {
    /// Identifies a client from the request headers.
    async fn identify(&self, headers: &HeaderMap) -> Option<TierIdentity>;

    /// Identifies a client from the headers and the buffered body; used when
    /// the layer buffers bodies (feature `buffered-body`). Defaults to
    /// [`identify`](Self::identify).
    async fn identify_with_body(&self, headers: &HeaderMap, body: &Bytes) -> Option<TierIdentity> {
        let _ = body;
        self.identify(headers).await
    }

    /// Identifies a client from the whole request head: the extensions an
    /// auth layer left, `ConnectInfo`, the URI. Defaults to
    /// [`identify`](Self::identify) with the headers.
    async fn identify_parts(&self, parts: &Parts) -> Option<TierIdentity> {
        self.identify(&parts.headers).await
    }
}

/// The peer address of a connection: insert it into the request extensions
/// before the layer, in stacks without axum's `ConnectInfo` or to override
/// it (it wins over `ConnectInfo`). See [Unidentified
/// clients](self#unidentified-clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);
