//! Unidentified clients keyed by address, through a real axum `Router`:
//! IPv6 networks, IPv4-mapped addresses, the peer an app provides, trusted
//! proxies by network, `X-Forwarded-For` and `Forwarded` read from the
//! right, and headers a client forges, garbles or inflates.
//!
//! Most cases are one relation: with a quota of 2, request `a` is sent
//! twice, then request `b`; `b` is refused exactly when it landed in `a`'s
//! bucket.

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::identity::{IpNet, ProxyHeader};
use tower_rate_tier::{PeerAddr, Quota, RateTier, TierLimitLayer};
use tower_rate_tier_tests::reply::send;

// ---------------------------------------------------------------- helpers

/// A request: its peer (`ConnectInfo`, an app's `PeerAddr`, both or none)
/// and its headers, as raw bytes.
#[derive(Clone, Default)]
struct Spec {
    connect: Option<&'static str>,
    app_peer: Option<&'static str>,
    headers: Vec<(&'static str, Vec<u8>)>,
}

/// A request whose `ConnectInfo` is `peer` (`198.51.100.7:1`, `[2001:db8::1]:1`).
fn from(peer: &'static str) -> Spec {
    Spec {
        connect: Some(peer),
        ..Spec::default()
    }
}

/// A request from the trusted proxy `10.0.0.1`.
fn via_proxy() -> Spec {
    from("10.0.0.1:443")
}

impl Spec {
    fn header(mut self, name: &'static str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name, value.as_ref().to_vec()));
        self
    }

    fn xff(self, value: impl AsRef<[u8]>) -> Self {
        self.header("x-forwarded-for", value)
    }

    fn fwd(self, value: impl AsRef<[u8]>) -> Self {
        self.header("forwarded", value)
    }

    fn app_peer(mut self, peer: &'static str) -> Self {
        self.app_peer = Some(peer);
        self
    }

    fn build(&self) -> Request<Body> {
        let mut r = Request::get("/").body(Body::empty()).unwrap();
        if let Some(peer) = self.connect {
            r.extensions_mut()
                .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        }
        if let Some(peer) = self.app_peer {
            r.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
        }
        for (name, value) in &self.headers {
            r.headers_mut().append(
                HeaderName::from_static(name),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        r
    }
}

/// A router whose anonymous clients get `quota` requests each.
fn app(quota: u32, configure: impl FnOnce(TierLimitLayer) -> TierLimitLayer) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(quota))
        .default_tier("free")
        .clock(FakeClock::new())
        .build();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(configure(TierLimitLayer::new(tiers)))
}

/// The status of one request; never a 5xx.
async fn status(app: &Router, spec: &Spec) -> StatusCode {
    let status = send(app, spec.build()).await.status;
    assert!(
        status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
        "{status}"
    );
    status
}

/// Whether `b` is counted in `a`'s bucket, on a fresh router.
async fn same_bucket(configure: Configure, a: &Spec, b: &Spec) -> bool {
    let app = app(2, configure);
    assert_eq!(status(&app, a).await, StatusCode::OK);
    assert_eq!(status(&app, a).await, StatusCode::OK);
    status(&app, b).await == StatusCode::TOO_MANY_REQUESTS
}

fn defaults(l: TierLimitLayer) -> TierLimitLayer {
    l
}

fn prefix_56(l: TierLimitLayer) -> TierLimitLayer {
    l.anonymous_ipv6_prefix(56)
}

fn prefix_128(l: TierLimitLayer) -> TierLimitLayer {
    l.anonymous_ipv6_prefix(128)
}

/// `10.0.0.0/8` is trusted (a network), and so is `192.0.2.1` (an address).
fn behind_proxies(l: TierLimitLayer) -> TierLimitLayer {
    let proxy: IpAddr = "192.0.2.1".parse().unwrap();
    let private: IpNet = "10.0.0.0/8".parse().unwrap();
    l.trusted_proxies([IpNet::from(proxy), private])
}

fn exact_proxy(l: TierLimitLayer) -> TierLimitLayer {
    let proxy: IpAddr = "10.0.0.1".parse().unwrap();
    l.trusted_proxies([proxy])
}

fn xff_only(l: TierLimitLayer) -> TierLimitLayer {
    behind_proxies(l).proxy_header(ProxyHeader::XForwardedFor)
}

fn forwarded_only(l: TierLimitLayer) -> TierLimitLayer {
    behind_proxies(l).proxy_header(ProxyHeader::Forwarded)
}

// ---------------------------------------------------------------- the table

/// A row of the table: `b` lands in `a`'s bucket (`same`) or not.
type Row = (&'static str, Spec, Spec, bool);

/// How a table's layer is configured.
type Configure = fn(TierLimitLayer) -> TierLimitLayer;

#[tokio::test]
async fn clients_share_a_bucket_exactly_when_they_should() {
    let kib64 = "1".repeat(64 * 1024);
    let many_lines = (0..1000).fold(via_proxy(), |s, i| s.xff(format!("203.0.113.{}", i % 250)));
    let chain = |client: &str| format!("{client}{}", ", 10.0.0.2".repeat(50));
    let (same, apart) = (true, false);
    #[rustfmt::skip]
    let table: Vec<(Configure, Vec<Row>)> = vec![
        (defaults, vec![
            ("one /64 is one client", from("[2001:db8:1:2::1]:1"), from("[2001:db8:1:2:ffff:ffff:ffff:fffe]:9"), same),
            ("two /64s are two clients", from("[2001:db8:1:2::1]:1"), from("[2001:db8:1:3::1]:1"), apart),
            ("IPv4 by the whole address", from("198.51.100.7:1"), from("198.51.100.8:1"), apart),
            ("IPv4-mapped IPv6 is the IPv4 address", from("[::ffff:198.51.100.7]:1"), from("198.51.100.7:2"), same),
            ("IPv4-mapped addresses are not grouped by /64", from("[::ffff:198.51.100.7]:1"), from("[::ffff:198.51.100.8]:1"), apart),
            ("PeerAddr wins over ConnectInfo", from("198.51.100.2:1").app_peer("198.51.100.1:1"), from("198.51.100.1:1"), same),
            ("ConnectInfo is not the key beside PeerAddr", from("198.51.100.2:1").app_peer("198.51.100.1:1"), from("198.51.100.2:1"), apart),
            ("X-Forwarded-For is ignored by default", from("198.51.100.9:1").xff("203.0.113.1"), from("198.51.100.9:1").xff("203.0.113.2"), same),
            ("Forwarded is ignored by default", from("198.51.100.9:1").fwd("for=203.0.113.1"), from("198.51.100.9:1").fwd("for=203.0.113.2"), same),
        ]),
        (prefix_56, vec![
            ("a /56 groups neighbouring /64s", from("[2001:db8:1:2::1]:1"), from("[2001:db8:1:3::1]:1"), same),
            ("two /56s are two clients", from("[2001:db8:1:2::1]:1"), from("[2001:db8:1:102::1]:1"), apart),
        ]),
        (prefix_128, vec![
            ("/128 keys each address", from("[2001:db8::1]:1"), from("[2001:db8::2]:1"), apart),
        ]),
        (exact_proxy, vec![
            ("an exact trusted address is believed", via_proxy().xff("203.0.113.1"), via_proxy().xff("203.0.113.2"), apart),
            ("an exact trusted address trusts no neighbour", from("10.0.0.2:1").xff("203.0.113.1"), from("10.0.0.2:1").xff("203.0.113.2"), same),
        ]),
        (behind_proxies, vec![
            // X-Forwarded-For
            ("a peer outside the trusted network is not believed", from("11.0.0.1:1").xff("203.0.113.1"), from("11.0.0.1:1").xff("203.0.113.2"), same),
            ("any peer of the trusted network is believed", from("10.9.8.7:1").xff("203.0.113.1"), from("10.1.1.1:1").xff("203.0.113.1"), same),
            ("a trusted IPv4-mapped peer is believed", from("[::ffff:10.0.0.1]:1").xff("203.0.113.1"), via_proxy().xff("203.0.113.1"), same),
            ("a \\xff the client sent leaves the proxy's hop usable", via_proxy().xff(b"\xff, 203.0.113.1"), via_proxy().xff(b"\xff, 203.0.113.2"), apart),
            ("a \\xff the client sent changes nothing", via_proxy().xff(b"\xff, 203.0.113.1"), from("192.0.2.1:1").xff("203.0.113.1"), same),
            ("a forged left-most hop changes nothing", via_proxy().xff("6.6.6.6, 203.0.113.1"), via_proxy().xff("7.7.7.7, 203.0.113.1"), same),
            ("a client cannot forge trusted hops", via_proxy().xff("6.6.6.6, 10.0.0.5, 203.0.113.1"), via_proxy().xff("203.0.113.1"), same),
            ("forwarded IPv6 clients are grouped by /64", via_proxy().xff("2001:db8:7:7::1"), via_proxy().xff("[2001:db8:7:7::2]:4711"), same),
            ("a forwarded IPv4-mapped hop is IPv4", via_proxy().xff("::ffff:203.0.113.1"), via_proxy().xff("203.0.113.1:80"), same),
            ("several lines are one list", via_proxy().xff("6.6.6.6").xff("203.0.113.1"), via_proxy().xff("203.0.113.1"), same),
            // nothing usable: the proxy's own address
            ("garbage from a proxy keys the proxy", via_proxy().xff("not an ip"), via_proxy().xff(b"\xfe\xff"), same),
            ("no hop at all keys the proxy", via_proxy().xff("unknown"), via_proxy(), same),
            ("a 64 KiB entry keys the proxy", via_proxy().xff(&kib64), via_proxy(), same),
            ("a 64 KiB entry left of the proxy's hop is skipped", via_proxy().xff(format!("{kib64}, 203.0.113.1")), via_proxy().xff("203.0.113.1"), same),
            ("1000 header lines: the last is read", many_lines.clone().xff("203.0.113.251"), via_proxy().xff("203.0.113.251"), same),
            ("1000 header lines: another client", many_lines.xff("203.0.113.251"), via_proxy().xff("203.0.113.252"), apart),
            ("50 trusted hops: the walk ends on a proxy", via_proxy().xff(chain("203.0.113.1")), via_proxy().xff(chain("203.0.113.2")), same),
            // Forwarded
            ("Forwarded with quoted IPv6 and ports", via_proxy().fwd(r#"for="[2001:db8:5::1]:4711""#), via_proxy().fwd(r#"for="[2001:db8:5::2]:80";proto=https"#), same),
            ("Forwarded: two IPv6 networks", via_proxy().fwd(r#"for="[2001:db8:5::1]:4711""#), via_proxy().fwd(r#"for="[2001:db8:6::1]""#), apart),
            ("Forwarded `for` in any case, with a port", via_proxy().fwd("For=203.0.113.1:8080"), via_proxy().xff("203.0.113.1"), same),
            ("Forwarded elements and lines from the right", via_proxy().fwd("for=6.6.6.6").fwd("for=7.7.7.7, for=203.0.113.1;proto=https"), via_proxy().fwd("FOR=203.0.113.1"), same),
            ("Forwarded: trusted elements are skipped", via_proxy().fwd("for=203.0.113.1, for=10.0.0.3"), via_proxy().fwd("for=203.0.113.2, for=10.0.0.3"), apart),
            ("Forwarded `unknown` keys the proxy", via_proxy().fwd("for=203.0.113.1, for=unknown"), via_proxy(), same),
            ("Forwarded `_hidden` keys the proxy", via_proxy().fwd("for=_hidden"), via_proxy().fwd("for=_other"), same),
            // both headers
            ("both headers agreeing name the client", via_proxy().xff("203.0.113.1").fwd("for=203.0.113.1"), via_proxy().xff("203.0.113.2"), apart),
            ("both headers agreeing: the same client", via_proxy().xff("203.0.113.1").fwd("for=203.0.113.1"), via_proxy().xff("203.0.113.1"), same),
            ("both headers disagreeing key the proxy", via_proxy().xff("203.0.113.1").fwd("for=6.6.6.6"), via_proxy(), same),
        ]),
        (xff_only, vec![
            ("X-Forwarded-For only: Forwarded is ignored", via_proxy().xff("203.0.113.1").fwd("for=6.6.6.6"), via_proxy().xff("203.0.113.1"), same),
        ]),
        (forwarded_only, vec![
            ("Forwarded only: X-Forwarded-For is ignored", via_proxy().fwd("for=203.0.113.1").xff("6.6.6.6"), via_proxy().fwd("for=203.0.113.1"), same),
        ]),
    ];
    let mut wrong = Vec::new();
    for (configure, rows) in &table {
        for (name, a, b, expected) in rows {
            if same_bucket(*configure, a, b).await != *expected {
                wrong.push(*name);
            }
        }
    }
    assert!(wrong.is_empty(), "wrong buckets: {wrong:#?}");
}

// ---------------------------------------------------------------- rotation and spoofing

#[tokio::test]
async fn a_hundred_addresses_of_one_64_share_one_bucket() {
    let app = app(100, defaults);
    for i in 0..100u32 {
        let peer = format!(
            "[2001:db8:aa:bb:{:x}:{:x}:{:x}:{:x}]:{}",
            i,
            i * 7,
            i * 13 + 1,
            i * 31 + 2,
            1000 + i
        );
        let r = send(
            &app,
            Request::get("/")
                .extension(ConnectInfo(peer.parse::<SocketAddr>().unwrap()))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(
            (r.status, r.remaining()),
            (StatusCode::OK, Some(99 - i)),
            "{peer}"
        );
    }
    let one_more = from("[2001:db8:aa:bb:dead:beef:0:1]:1");
    assert_eq!(status(&app, &one_more).await, StatusCode::TOO_MANY_REQUESTS);
    let next_network = from("[2001:db8:aa:bc::1]:1");
    assert_eq!(status(&app, &next_network).await, StatusCode::OK);
}

/// What a client can put in front of (or instead of) the proxy's entry.
fn client_written() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = vec![
        b"203.0.113.99".to_vec(),
        b"10.0.0.7".to_vec(),
        b"6.6.6.6, 10.0.0.7".to_vec(),
        b"\xff\xfe".to_vec(),
        b"unknown".to_vec(),
        b"[2001:db8::1]:80, ::ffff:1.2.3.4".to_vec(),
        b"for=1.2.3.4".to_vec(),
        b",,,,".to_vec(),
        "1.1.1.1, ".repeat(20_000).into_bytes(),
        vec![b'9'; 64 * 1024],
    ];
    values.push([&vec![b','; 64 * 1024][..], b"10.0.0.9"].concat());
    values
}

#[tokio::test]
async fn a_client_behind_a_trusted_proxy_never_chooses_its_key() {
    // The proxy appends the real client (203.0.113.1) to whatever came in.
    let app = app(3, behind_proxies);
    let mut statuses = Vec::new();
    for value in client_written() {
        let mut appended = value.clone();
        appended.extend_from_slice(b", 203.0.113.1");
        statuses.push(status(&app, &via_proxy().xff(&appended)).await);
        // a second line appended by the proxy instead of a joined list
        statuses.push(status(&app, &via_proxy().xff(&value).xff("203.0.113.1")).await);
        // Forwarded forged next to the proxy's X-Forwarded-For never helps
        let forged = via_proxy().fwd(&value).xff(&appended);
        statuses.push(status(&app, &forged).await);
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    // the client's own bucket of 3, and the proxy's bucket of 3 for the
    // requests whose two headers disagree; never a fresh bucket per value
    assert_eq!(ok, 6, "{statuses:?}");
    assert_eq!(
        status(&app, &via_proxy().xff("203.0.113.1")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // another client behind the same proxy is untouched
    assert_eq!(
        status(&app, &via_proxy().xff(b"\xff, 203.0.113.2")).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_client_talking_directly_never_chooses_its_key() {
    let app = app(3, behind_proxies);
    let mut statuses = Vec::new();
    for value in client_written() {
        for spec in [
            from("198.51.100.9:1").xff(&value),
            from("198.51.100.9:2").fwd(&value),
            from("198.51.100.9:3").xff(&value).fwd(&value),
        ] {
            statuses.push(status(&app, &spec).await);
        }
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 3, "{statuses:?}");
}
