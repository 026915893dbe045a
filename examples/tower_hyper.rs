//! No axum: a hyper 1 server (through hyper-util) serving a
//! `tower::service_fn` wrapped in `TierLimitLayer`.
//!
//! ```sh
//! cargo run --example tower_hyper            # a self-test run, then exits
//! cargo run --example tower_hyper -- --serve # keeps serving, for curl
//! ```
//!
//! The request body is hyper's own `Incoming`, the response body the
//! service's own (here `Full<Bytes>`): the limiter answers refusals in a
//! `ResponseBody` around it and never builds the inner body type. Without
//! axum there is no `MatchedPath` or `ConnectInfo`: the cost comes from a
//! `cost_fn` over the path, and the peer address from a [`PeerAddr`]
//! extension inserted per connection (it keys clients without an API key).
//! The self-test run checks every row it prints and exits with status 1 if
//! one differs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;

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
use tower_rate_tier_examples::{Client, SelfTest, bind_loopback, serve_mode, want};

async fn handle(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = match request.uri().path() {
        "/search" => "results\n",
        _ => "hello\n",
    };
    Ok(Response::new(Full::new(Bytes::from_static(body.as_bytes()))))
}

/// API key -> (account, plan); a database in a real service. The plan is
/// the server's record, never something the client sends.
const API_KEYS: &[(&str, &str, &str)] = &[
    ("key-3e1", "acct-1", "free"),
    ("key-7c4", "acct-2", "pro"),
    ("key-b09", "acct-3", "free"),
];

fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let key = headers.get("x-api-key")?.to_str().ok()?;
    let (_, account, plan) = API_KEYS.iter().find(|(k, _, _)| *k == key)?;
    Some(TierIdentity::new(*account, *plan))
}

fn limiter() -> TierLimitLayer {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(4))
        .tier("pro", Quota::per_hour(1_000))
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
async fn main() -> ExitCode {
    let listener = bind_loopback().await;
    let addr: SocketAddr = listener.local_addr().expect("the listener's address");
    let server = tokio::spawn(serve(listener, limiter()));
    println!(
        "serving on http://{addr} with hyper (free: 4 requests/minute, pro: 1,000/hour; /search costs 5)\n"
    );

    if serve_mode() {
        println!("try:");
        println!("  curl -i -H 'x-api-key: key-3e1' http://{addr}/         # free");
        println!("  curl -i -H 'x-api-key: key-7c4' http://{addr}/search   # pro; costs 5");
        println!("  curl -i http://{addr}/                                # no key: free, keyed by address");
        println!("\nCtrl-C to stop.");
        server.await.expect("the server task panicked");
        return ExitCode::SUCCESS;
    }

    let client = Client::new(addr);
    let mut test = SelfTest::new();
    let free = [("x-api-key", "key-3e1")];
    for remaining in ["3", "2", "1", "0"] {
        test.row(
            "GET /",
            "acct-1 (free)",
            &client.get("/", &free).await,
            want(200, remaining, "-"),
        );
    }
    // 4 a minute: a unit comes back every 15 s
    test.row(
        "GET /",
        "acct-1 (free)",
        &client.get("/", &free).await,
        want(429, "0", "15"),
    );
    let pro = [("x-api-key", "key-7c4")];
    for remaining in ["995", "990"] {
        test.row(
            "GET /search",
            "acct-2 (pro)",
            &client.get("/search", &pro).await,
            want(200, remaining, "-"),
        );
    }
    // 5 is more than the free burst of 4: it can never pass
    let reply = client.get("/search", &[("x-api-key", "key-b09")]).await;
    test.row("GET /search", "acct-3 (free)", &reply, want(403, "-", "-"));
    // no key, or one the server does not know: the free plan, by address
    test.row(
        "GET /",
        "no key (by address)",
        &client.get("/", &[]).await,
        want(200, "3", "-"),
    );
    let reply = client.get("/", &[("x-api-key", "pro-please")]).await;
    test.row("GET /", "unknown key", &reply, want(200, "2", "-"));
    println!(
        "\nacct-1's 5th request in a minute is refused (429); a search (5) is more than the free burst (403)."
    );
    server.abort();
    test.finish()
}
