//! The address an unidentified client is keyed by: the peer, or the client a
//! trusted proxy saw, IPv6 grouped by network. The rules are told in the
//! [module docs](super#unidentified-clients).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use http::{Extensions, HeaderMap};
use ipnet::{IpNet, Ipv4Net};

use super::PeerAddr;
use super::forwarded::{Hops, Kind};

/// Keys of unidentified clients start with a NUL, which no valid identity
/// does: anonymous buckets never share the key space of user ids.
pub(crate) const ANONYMOUS_PREFIX: &str = "\0";

/// The IPv6 prefix length anonymous clients are grouped by unless the layer
/// says otherwise: the smallest network an ISP hands one subscriber.
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 64;

/// `\0ip:` and the longest IPv6 text with `/128`.
const KEY_CAPACITY: usize = 56;

/// Which forwarding header the trusted proxies write; see
/// [`TierLimitLayer::proxy_header`](crate::TierLimitLayer::proxy_header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// Read whichever of `Forwarded` and `X-Forwarded-For` the request
    /// carries; when it carries both and they name different clients,
    /// neither is believed and the key is the proxy's address (the
    /// default: a client cannot choose its key through the header a proxy
    /// leaves alone).
    #[default]
    Both,
    /// Read `X-Forwarded-For` only (nginx's `$proxy_add_x_forwarded_for`,
    /// most load balancers); `Forwarded` is ignored.
    XForwardedFor,
    /// Read the RFC 7239 `Forwarded` header only; `X-Forwarded-For` is
    /// ignored.
    Forwarded,
}

/// How the layer finds and keys the address of an unidentified client.
#[derive(Debug, Clone)]
pub(crate) struct ClientAddrs {
    trusted: Arc<[IpNet]>,
    header: ProxyHeader,
    ipv6_prefix: u8,
}

impl Default for ClientAddrs {
    fn default() -> Self {
        ClientAddrs {
            trusted: Arc::new([]),
            header: ProxyHeader::default(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl ClientAddrs {
    /// Replaces the trusted proxies. IPv4-mapped IPv6 networks are stored as
    /// the IPv4 networks they are.
    pub(crate) fn set_trusted(&mut self, proxies: impl IntoIterator<Item = IpNet>) {
        self.trusted = proxies.into_iter().map(canonical_net).collect();
    }

    /// The IPv6 prefix length anonymous clients are grouped by; above 128
    /// means 128.
    pub(crate) fn set_ipv6_prefix(&mut self, len: u8) {
        self.ipv6_prefix = len.min(128);
    }

    pub(crate) fn set_proxy_header(&mut self, header: ProxyHeader) {
        self.header = header;
    }

    /// The storage key of an unidentified client: `\0ip:198.51.100.7`,
    /// `\0ip:2001:db8:1:2::/64`, or `\0anonymous` when no address is known.
    pub(crate) fn anonymous_key(&self, headers: &HeaderMap, extensions: &Extensions) -> String {
        let mut key = String::with_capacity(KEY_CAPACITY);
        key.push_str(ANONYMOUS_PREFIX);
        let Some(ip) = self.client_ip(headers, extensions) else {
            key.push_str("anonymous");
            return key;
        };
        key.push_str("ip:");
        // Writing into a `String` cannot fail.
        let _ = match ip {
            IpAddr::V4(ip) => write!(key, "{ip}"),
            IpAddr::V6(ip) => {
                let len = self.ipv6_prefix;
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                write!(key, "{}/{len}", Ipv6Addr::from(u128::from(ip) & mask))
            }
        };
        key
    }

    /// The client address: the peer, or, when the peer is a trusted proxy,
    /// the right-most forwarded hop that is not a trusted proxy (the last
    /// trusted one when the walk stops first). IPv4-mapped IPv6 addresses
    /// come out as IPv4.
    pub(crate) fn client_ip(&self, headers: &HeaderMap, extensions: &Extensions) -> Option<IpAddr> {
        let peer = peer_ip(extensions)?;
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let walk = |kind| self.walk(peer, Hops::new(headers, kind));
        Some(match self.header {
            ProxyHeader::XForwardedFor => walk(Kind::XForwardedFor),
            ProxyHeader::Forwarded => walk(Kind::Forwarded),
            ProxyHeader::Both => match (
                Kind::XForwardedFor.is_present(headers),
                Kind::Forwarded.is_present(headers),
            ) {
                (true, true) => {
                    let client = walk(Kind::XForwardedFor);
                    if client == walk(Kind::Forwarded) {
                        client
                    } else {
                        peer
                    }
                }
                (false, true) => walk(Kind::Forwarded),
                _ => walk(Kind::XForwardedFor),
            },
        })
    }

    fn walk(&self, peer: IpAddr, hops: Hops<'_>) -> IpAddr {
        let mut client = peer;
        for hop in hops {
            client = hop.to_canonical();
            if !self.is_trusted(client) {
                break;
            }
        }
        client
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }
}

/// The peer address: an app-provided [`PeerAddr`] (the more specific), else
/// axum's `ConnectInfo<SocketAddr>`.
fn peer_ip(extensions: &Extensions) -> Option<IpAddr> {
    let peer = extensions.get::<PeerAddr>().map(|p| p.0.ip());
    #[cfg(feature = "axum")]
    let peer = peer.or_else(|| {
        extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|info| info.0.ip())
    });
    peer.map(|ip| ip.to_canonical())
}

/// `::ffff:10.0.0.0/104` is `10.0.0.0/8`; networks are truncated to their
/// prefix.
fn canonical_net(net: IpNet) -> IpNet {
    let net = match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, IpNet::V4),
            None => net,
        },
        _ => net,
    };
    net.trunc()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn request(peer: &str, headers: &[(&str, &str)]) -> (HeaderMap, Extensions) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let mut ext = Extensions::new();
        ext.insert(PeerAddr(peer.parse().unwrap()));
        (map, ext)
    }

    fn addrs(trusted: &[&str], header: ProxyHeader) -> ClientAddrs {
        let mut a = ClientAddrs::default();
        a.set_trusted(trusted.iter().map(|t| net(t)));
        a.set_proxy_header(header);
        a
    }

    fn client(a: &ClientAddrs, peer: &str, headers: &[(&str, &str)]) -> IpAddr {
        let (h, e) = request(peer, headers);
        a.client_ip(&h, &e).unwrap()
    }

    fn key(a: &ClientAddrs, peer: &str) -> String {
        let (h, e) = request(peer, &[]);
        a.anonymous_key(&h, &e)
    }

    #[test]
    fn keys_show_the_address_or_the_masked_network() {
        let mut a = ClientAddrs::default();
        assert_eq!(key(&a, "198.51.100.7:1"), "\0ip:198.51.100.7");
        assert_eq!(key(&a, "[::ffff:198.51.100.7]:1"), "\0ip:198.51.100.7");
        assert_eq!(key(&a, "[2001:db8:1:2:3:4:5:6]:1"), "\0ip:2001:db8:1:2::/64");
        a.set_ipv6_prefix(56);
        assert_eq!(key(&a, "[2001:db8:1:2ff:3:4:5:6]:1"), "\0ip:2001:db8:1:200::/56");
        a.set_ipv6_prefix(200);
        assert_eq!(key(&a, "[2001:db8::6]:1"), "\0ip:2001:db8::6/128");
        a.set_ipv6_prefix(0);
        assert_eq!(key(&a, "[2001:db8::6]:1"), "\0ip:::/0");
        let none = a.anonymous_key(&HeaderMap::new(), &Extensions::new());
        assert_eq!(none, "\0anonymous");
    }

    #[test]
    fn nothing_forwarded_is_believed_without_trusted_proxies() {
        let a = ClientAddrs::default();
        let headers = [("x-forwarded-for", "1.1.1.1"), ("forwarded", "for=2.2.2.2")];
        assert_eq!(client(&a, "10.0.0.1:5", &headers), ip("10.0.0.1"));
        let a = addrs(&["10.0.0.2/32"], ProxyHeader::Both);
        assert_eq!(client(&a, "10.0.0.1:5", &headers[..1]), ip("10.0.0.1"));
    }

    #[test]
    fn trusted_networks_and_mapped_addresses() {
        let a = addrs(
            &["10.0.0.0/8", "::ffff:192.168.0.0/112", "fd00::/8"],
            ProxyHeader::Both,
        );
        let xff = |v| [("x-forwarded-for", v)];
        assert_eq!(client(&a, "10.20.30.40:5", &xff("1.1.1.1")), ip("1.1.1.1"));
        assert_eq!(client(&a, "[::ffff:10.0.0.1]:5", &xff("1.1.1.1")), ip("1.1.1.1"));
        assert_eq!(client(&a, "192.168.3.4:5", &xff("1.1.1.1")), ip("1.1.1.1"));
        assert_eq!(client(&a, "[fd12::1]:5", &xff("::ffff:1.1.1.1")), ip("1.1.1.1"));
        assert_eq!(client(&a, "11.0.0.1:5", &xff("1.1.1.1")), ip("11.0.0.1"));
        // trusted hops are skipped, a forged left-most hop is never reached
        assert_eq!(
            client(&a, "10.0.0.1:5", &xff("6.6.6.6, 1.1.1.1, 10.9.9.9")),
            ip("1.1.1.1")
        );
        // the walk stops at the last trusted hop, the proxy when it sent none
        assert_eq!(client(&a, "10.0.0.1:5", &xff("junk, 10.9.9.9")), ip("10.9.9.9"));
        assert_eq!(client(&a, "10.0.0.1:5", &xff("junk")), ip("10.0.0.1"));
        assert_eq!(client(&a, "10.0.0.1:5", &[]), ip("10.0.0.1"));
    }

    #[test]
    fn a_chain_of_trusted_hops_past_the_cap_is_keyed_by_the_last_hop_read() {
        let a = addrs(&["10.0.0.0/8"], ProxyHeader::Both);
        let chain: Vec<String> = (1..=30).map(|i| format!("10.0.0.{i}")).collect();
        let value = format!("1.1.1.1, {}", chain.join(", "));
        let got = client(&a, "10.0.0.99:5", &[("x-forwarded-for", &value)]);
        assert_eq!(
            got,
            ip(&format!("10.0.0.{}", 30 - super::super::forwarded::MAX_HOPS + 1))
        );
    }

    #[test]
    fn which_header_is_read() {
        let both = addrs(&["10.0.0.1/32"], ProxyHeader::Both);
        let xff_only = addrs(&["10.0.0.1/32"], ProxyHeader::XForwardedFor);
        let fwd_only = addrs(&["10.0.0.1/32"], ProxyHeader::Forwarded);
        let p = "10.0.0.1:5";
        let fwd = ("forwarded", "for=\"[2001:db8::1]:4711\"");
        let xff = ("x-forwarded-for", "2001:db8::1");
        let forged_xff = ("x-forwarded-for", "6.6.6.6");
        assert_eq!(client(&both, p, &[fwd]), ip("2001:db8::1"));
        assert_eq!(client(&both, p, &[xff]), ip("2001:db8::1"));
        assert_eq!(client(&both, p, &[fwd, xff]), ip("2001:db8::1"));
        // disagreeing headers: neither is believed
        assert_eq!(client(&both, p, &[fwd, forged_xff]), ip("10.0.0.1"));
        assert_eq!(client(&xff_only, p, &[fwd]), ip("10.0.0.1"));
        assert_eq!(client(&xff_only, p, &[fwd, forged_xff]), ip("6.6.6.6"));
        assert_eq!(client(&fwd_only, p, &[fwd, forged_xff]), ip("2001:db8::1"));
        assert_eq!(client(&fwd_only, p, &[xff]), ip("10.0.0.1"));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn an_app_provided_peer_wins_over_connect_info() {
        let mut ext = Extensions::new();
        ext.insert(axum::extract::ConnectInfo::<std::net::SocketAddr>(
            "10.0.0.1:1".parse().unwrap(),
        ));
        assert_eq!(peer_ip(&ext), Some(ip("10.0.0.1")));
        ext.insert(PeerAddr("10.0.0.2:1".parse().unwrap()));
        assert_eq!(peer_ip(&ext), Some(ip("10.0.0.2")));
    }
}
