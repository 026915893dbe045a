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
//!   [`OnMissing`](crate::OnMissing) (with `UseDefault`, each peer address gets
//!   the default tier's quota).
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
//!         let plan = key.split_once('_')?.0; // a lookup in a real service
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
//! Under `OnMissing::UseDefault` an unidentified client is keyed by its peer
//! IP address, so one anonymous client cannot spend everybody's quota. The
//! address comes from axum's `ConnectInfo<SocketAddr>` (serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`) or from a
//! [`PeerAddr`] extension that any tower stack can insert. `X-Forwarded-For`
//! is only read when the peer is one of the layer's
//! [`trusted_proxies`](crate::TierLimitLayer::trusted_proxies). When no
//! address is known, all unidentified clients share one bucket (`anonymous`)
//! of the default tier: the limit still holds in total. Anonymous buckets live
//! apart from user ids (their keys start with a NUL character, and an identity
//! whose user id starts with one counts as unidentified), so no identifier can
//! hand a client an address's bucket.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http::HeaderMap;
use http::request::Parts;

use crate::tier::IntoTierName;

/// A client's identity: a user id and the name of their tier.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TierIdentity {
    /// The user id the quota is counted against (1 to 1024 bytes).
    pub user_id: String,
    /// The tier's name.
    pub tier: Cow<'static, str>,
}

impl TierIdentity {
    /// An identity; `tier` is a `&str`, a `String` or a `#[rate_tiers]` enum
    /// value.
    pub fn new(user_id: impl Into<String>, tier: impl IntoTierName) -> Self {
        TierIdentity {
            user_id: user_id.into(),
            tier: tier.into_tier_name(),
        }
    }
}

impl fmt::Debug for TierIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierIdentity")
            .field("user_id", &self.user_id)
            .field("tier", &self.tier)
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
///         // a database lookup would go here
///         let tier = if key.starts_with("pro_") { "pro" } else { "free" };
///         Some(TierIdentity::new(key, tier))
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

/// The peer address of a connection, for stacks without axum's
/// `ConnectInfo`: insert it into the request extensions before the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// The peer address of a request, as the layer sees it.
pub(crate) fn peer_ip(extensions: &http::Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    extensions.get::<PeerAddr>().map(|p| p.0.ip())
}

/// The client address: the peer, or, when the peer is a trusted proxy, the
/// right-most `X-Forwarded-For` entry that is not a trusted proxy.
#[cfg(test)]
pub(crate) fn client_ip(parts: &Parts, trusted: &[IpAddr]) -> Option<IpAddr> {
    client_ip_of(&parts.headers, &parts.extensions, trusted)
}

/// [`client_ip`] from the request's headers and extensions.
pub(crate) fn client_ip_of(
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
    trusted: &[IpAddr],
) -> Option<IpAddr> {
    let peer = peer_ip(extensions)?;
    if !trusted.contains(&peer) {
        return Some(peer);
    }
    let mut client = peer;
    for value in headers.get_all("x-forwarded-for").iter().rev() {
        let Ok(value) = value.to_str() else {
            return Some(client);
        };
        for hop in value.rsplit(',') {
            let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                return Some(client);
            };
            client = ip;
            if !trusted.contains(&ip) {
                return Some(ip);
            }
        }
    }
    Some(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: &str, xff: &[&str]) -> Parts {
        let mut req = http::Request::new(());
        req.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
        for v in xff {
            req.headers_mut().append("x-forwarded-for", v.parse().unwrap());
        }
        req.into_parts().0
    }

    #[test]
    fn forwarded_for_is_ignored_unless_the_peer_is_trusted() {
        let p = parts("10.0.0.1:5", &["1.2.3.4"]);
        assert_eq!(client_ip(&p, &[]), Some("10.0.0.1".parse().unwrap()));
        let trusted = ["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        assert_eq!(client_ip(&p, &trusted), Some("1.2.3.4".parse().unwrap()));
        let p = parts("10.0.0.1:5", &["6.6.6.6, 1.2.3.4, 10.0.0.2"]);
        assert_eq!(client_ip(&p, &trusted), Some("1.2.3.4".parse().unwrap()));
        let p = parts("10.0.0.1:5", &["garbage"]);
        assert_eq!(client_ip(&p, &trusted), Some("10.0.0.1".parse().unwrap()));
    }
}
