//! Scaffolding shared by the examples of tower-rate-tier: serving an app on
//! 127.0.0.1, a small HTTP client, and a table of what came back.
//!
//! None of this is needed to use the crate; the rate-limiting code of each
//! example is in the example itself. Run them from the workspace root:
//!
//! ```sh
//! cargo run --example quickstart            # a self-test run, then exits
//! cargo run --example quickstart -- --serve # keeps serving, for curl
//! ```

use std::net::SocketAddr;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Whether the example was started with `--serve` (keep serving for curl
/// instead of exiting after the self-test run).
pub fn serve_mode() -> bool {
    std::env::args().skip(1).any(|arg| arg == "--serve")
}

/// Binds 127.0.0.1 on an ephemeral port.
pub async fn bind_loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding 127.0.0.1 on an ephemeral port")
}

/// Serves an axum app on 127.0.0.1 (an ephemeral port), with the peer
/// address available to the limiter (`ConnectInfo`), and returns the address
/// and the server task.
pub async fn serve_axum(app: Router) -> (SocketAddr, JoinHandle<()>) {
    let listener = bind_loopback().await;
    let addr = listener.local_addr().expect("the listener's address");
    let server = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .expect("the server failed");
    });
    (addr, server)
}

/// Waits for the server task (until Ctrl-C ends the process).
pub async fn serve_forever(server: JoinHandle<()>) {
    server.await.expect("the server task panicked");
}

/// A small HTTP/1 client for one server.
#[derive(Debug, Clone)]
pub struct Client {
    inner: HyperClient<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
}

/// A response, read to the end.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// A header's value, or `-` when absent.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
    }
}

impl Client {
    /// A client for the server at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Client {
            inner: HyperClient::builder(TokioExecutor::new()).build(HttpConnector::new()),
            addr,
        }
    }

    /// `GET path` with these headers.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send(Method::GET, path, headers, Bytes::new()).await
    }

    /// Sends a request and reads the whole response.
    pub async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body)).expect("a valid request");
        let response = self.inner.request(request).await.expect("the request failed");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("reading the body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }
}

/// Prints the header of the table [`row`] prints.
pub fn header() {
    println!(
        "  {:<22}  {:<20}  {:<6}  {:>5}  {:>9}  {:>11}",
        "request", "client", "status", "limit", "remaining", "retry-after"
    );
}

/// Prints one request and what came back: status, `X-RateLimit-Limit`,
/// `X-RateLimit-Remaining`, `Retry-After`.
pub fn row(request: &str, client: &str, reply: &Reply) {
    println!(
        "  {:<22}  {:<20}  {:<6}  {:>5}  {:>9}  {:>11}",
        request,
        client,
        reply.status.as_u16(),
        reply.header("x-ratelimit-limit"),
        reply.header("x-ratelimit-remaining"),
        reply.header("retry-after"),
    );
}
