//! No axum: a hyper 1 server (through hyper-util) serving a
//! `tower::service_fn` wrapped in `TierLimitLayer`.
//!
//! ```sh
//! cargo run --example tower_hyper            # a self-test run, then exits
//! cargo run --example tower_hyper -- --serve # keeps serving, for curl
//! ```
//!
//! The request body is hyper's own `Incoming`; the response body is any
//! type that can be built from `Bytes` (here `Full<Bytes>`). Without axum
//! there is no `MatchedPath` or `ConnectInfo`: the cost comes from a
//! `cost_fn` over the path, and the peer address from a [`PeerAddr`]
//! extension inserted per connection (it keys clients without an API key).

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_rate_tier::{PeerAddr, Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_examples::{Client, bind_loopback, header, row, serve_mode};

async fn handle(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = match request.uri().path() {
        "/search" => "results\n",
        _ => "hello\n",
    };
    Ok(Response::new(Full::new(Bytes::from_static(body.as_bytes()))))
}

fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let key = headers.get("x-api-key")?.to_str().ok()?;
    let tier = if key.starts_with("pro-") { "pro" } else { "free" };
    Some(TierIdentity::new(key, tier))
}

fn limiter() -> TierLimitLayer {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(4))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .build();
    TierLimitLayer::new(tiers)
        .identifier_fn(identify)
        .cost_fn(|parts| (parts.uri.path() == "/search").then_some(5))
}

/// Accepts connections and serves each with hyper's HTTP/1 connection
/// driver; the tower stack is built per connection to carry its peer address.
async fn serve(listener: TcpListener, limiter: TierLimitLayer) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let service = ServiceBuilder::new()
            .map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(PeerAddr(peer));
                request
            })
            .layer(limiter.clone())
            .service_fn(handle);
        tokio::spawn(async move {
            let connection = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            if let Err(error) = connection.await {
                eprintln!("connection from {peer}: {error}");
            }
        });
    }
}

#[tokio::main]
async fn main() {
    let listener = bind_loopback().await;
    let addr: SocketAddr = listener.local_addr().expect("the listener's address");
    let server = tokio::spawn(serve(listener, limiter()));
    println!("serving on http://{addr} with hyper (free: 4 requests/minute, pro: 100; /search costs 5)\n");

    if serve_mode() {
        println!("try:");
        println!("  curl -i -H 'x-api-key: free-1' http://{addr}/");
        println!("  curl -i -H 'x-api-key: pro-1' http://{addr}/search");
        println!("  curl -i http://{addr}/            # no key: free, keyed by address");
        println!("\nCtrl-C to stop.");
        server.await.expect("the server task panicked");
        return;
    }

    let client = Client::new(addr);
    header();
    for _ in 0..5 {
        row(
            "GET /",
            "free-1",
            &client.get("/", &[("x-api-key", "free-1")]).await,
        );
    }
    for _ in 0..2 {
        row(
            "GET /search",
            "pro-1",
            &client.get("/search", &[("x-api-key", "pro-1")]).await,
        );
    }
    row(
        "GET /search",
        "free-2",
        &client.get("/search", &[("x-api-key", "free-2")]).await,
    );
    row("GET /", "no key (by address)", &client.get("/", &[]).await);
    println!(
        "\nfree-1's 5th request in a minute is refused (429); a search (5) is more than the free burst (403)."
    );
    server.abort();
}
