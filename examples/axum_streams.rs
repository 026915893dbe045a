//! A concurrency limit per plan: at most 2 streams of a free user at once.
//!
//! ```sh
//! cargo run --example axum_streams            # a self-test run, then exits
//! cargo run --example axum_streams -- --serve # keeps serving, for curl
//! ```
//!
//! `/export` streams its answer slowly (a line every 100 ms), the way an
//! export, a long poll or a model's completion does. A rate limit alone lets
//! a free user who stays within 20 requests a minute hold 20 such streams
//! open; `tier_concurrency("free", 2)` holds them to 2 at once. A slot is
//! held from admission until the response is over: the stream's last line
//! was sent, or the client went away. The self-test opens three streams:
//! the third is refused (429, `Retry-After: 1`, the `RateLimit-Policy` item
//! `"free.concurrency";q=2;qu="concurrent-requests"`), and admitted once
//! the first stream has ended. It exits with status 1 on any mismatch.

use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_examples::{Reply, SelfTest, serve_axum, serve_forever, serve_mode, want};

/// The account and its plan, as an API gateway in front sets them (see the
/// `axum_basic` example for why only a gateway may).
fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let account = headers.get("x-account")?.to_str().ok()?;
    let plan = headers.get("x-plan")?.to_str().ok()?;
    Some(TierIdentity::new(account, plan))
}

/// `lines` lines, one every 100 ms.
struct SlowExport {
    left: u32,
    tick: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for SlowExport {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        if self.tick.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.left -= 1;
        let next = tokio::time::Instant::now() + Duration::from_millis(100);
        self.tick.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"row\n")))))
    }
}

async fn export() -> Body {
    Body::new(SlowExport {
        left: 5,
        tick: Box::pin(tokio::time::sleep(Duration::ZERO)),
    })
}

fn app() -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(20))
        // at most 2 requests of one free user in flight at once
        .tier_concurrency("free", 2)
        .tier("pro", Quota::per_minute(600))
        .tier_concurrency("pro", 20)
        .build();
    Router::new()
        .route("/export", get(export))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identify))
}

type Http = HyperClient<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

/// Opens `/export`: the response as soon as its headers arrive, its body
/// still streaming.
async fn open(client: &Http, addr: SocketAddr, account: &str) -> Response<Incoming> {
    let request = Request::get(format!("http://{addr}/export"))
        .header("x-account", account)
        .header("x-plan", "free")
        .body(Empty::new())
        .expect("a valid request");
    client.request(request).await.expect("the request failed")
}

/// A row of the self-test for a stream whose body is still open (read
/// `body` for a refusal, whose body is its problem document).
fn reply(response: &Response<Incoming>, body: Bytes) -> Reply {
    Reply {
        status: response.status(),
        headers: response.headers().clone(),
        body,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let (addr, server) = serve_axum(app()).await;
    println!("serving on http://{addr}\n");
    if serve_mode() {
        println!("try three at once (free: 2 streams in flight):");
        println!(
            "  for i in 1 2 3; do curl -sN -H 'x-account: ana' -H 'x-plan: free' -D - http://{addr}/export & done; wait"
        );
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return ExitCode::SUCCESS;
    }

    let client = HyperClient::builder(TokioExecutor::new()).build_http();
    let mut test = SelfTest::new();
    let first = open(&client, addr, "ana").await;
    test.row(
        "GET /export (1st)",
        "ana (free)",
        &reply(&first, Bytes::new()),
        want(200, "19", "-"),
    );
    test.equal(
        "ratelimit-policy",
        first.headers()["ratelimit-policy"].to_str().unwrap_or("-"),
        r#""free";q=20;w=60, "free.concurrency";q=2;qu="concurrent-requests""#,
    );
    test.equal(
        "ratelimit of the 1st",
        first.headers()["ratelimit"].to_str().unwrap_or("-"),
        r#""free";r=19;t=3, "free.concurrency";r=1"#,
    );
    let second = open(&client, addr, "ana").await;
    test.row(
        "GET /export (2nd)",
        "ana (free)",
        &reply(&second, Bytes::new()),
        want(200, "18", "-"),
    );

    // both streams are still open: the third is refused, and charged nothing
    let third = open(&client, addr, "ana").await;
    let (status, headers) = (third.status(), third.headers().clone());
    let body = third
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let third = Reply {
        status,
        headers,
        body: body.clone(),
    };
    test.row("GET /export (3rd)", "ana (free)", &third, want(429, "0", "1"));
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    test.equal(
        "violated-policies",
        problem["violated-policies"].clone(),
        serde_json::json!(["free.concurrency"]),
    );
    test.equal(
        "ratelimit of the 3rd",
        third.header("ratelimit"),
        r#""free.concurrency";r=0"#,
    );

    // another account has slots of its own
    let bob = open(&client, addr, "bob").await;
    test.row(
        "GET /export",
        "bob (free)",
        &reply(&bob, Bytes::new()),
        want(200, "19", "-"),
    );

    // the first stream runs to its end: its slot comes back
    let rows = first
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    test.equal("rows of the 1st stream", rows.len(), 5 * 4);
    let again = open(&client, addr, "ana").await;
    test.row(
        "GET /export (again)",
        "ana (free)",
        &reply(&again, Bytes::new()),
        want(200, "17", "-"),
    );

    println!(
        "\nana may hold 2 exports open at once: the 3rd is refused (429, Retry-After: 1) while both stream,\n\
         and costs nothing of her 20 a minute; once the 1st has sent its last row, she opens another."
    );
    drop((second, bob, again));
    server.abort();
    test.finish()
}
