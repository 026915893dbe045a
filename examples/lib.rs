//! Scaffolding shared by the examples of tower-rate-tier: serving an app on
//! 127.0.0.1, a small HTTP client, and a [`SelfTest`] that prints a table of
//! what came back and checks it.
//!
//! None of this is needed to use the crate; the rate-limiting code of each
//! example is in the example itself. Run them from the workspace root:
//!
//! ```sh
//! cargo run --example quickstart            # a self-test run, then exits
//! cargo run --example quickstart -- --serve # keeps serving, for curl
//! ```
//!
//! A self-test run checks every status, remaining count and retry delay it
//! prints against what the example says it shows, and exits with status 1
//! when one differs.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub mod fields;

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

/// What a reply must show: its status, `X-RateLimit-Remaining` and
/// `Retry-After`, each as printed (`-` for a field that must be absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// The status.
    pub status: u16,
    /// `X-RateLimit-Remaining`, or `-`.
    pub remaining: &'static str,
    /// `Retry-After`, or `-`.
    pub retry_after: &'static str,
}

/// A reply's status, `X-RateLimit-Remaining` and `Retry-After` (`-` for an
/// absent field): `want(429, "0", "12")`.
pub fn want(status: u16, remaining: &'static str, retry_after: &'static str) -> Want {
    Want {
        status,
        remaining,
        retry_after,
    }
}

/// An example's self-test: prints a table of requests and what came back,
/// checks each row against what the example claims, and ends with an exit
/// status that says whether every check held.
#[derive(Debug, Default)]
pub struct SelfTest {
    checks: usize,
    failures: Vec<String>,
}

impl SelfTest {
    /// A self-test; prints the table's header.
    pub fn new() -> Self {
        println!(
            "  {:<22}  {:<20}  {:<6}  {:>5}  {:>9}  {:>11}",
            "request", "client", "status", "limit", "remaining", "retry-after"
        );
        SelfTest::default()
    }

    /// Prints one request and what came back (status, `X-RateLimit-Limit`,
    /// `X-RateLimit-Remaining`, `Retry-After`), checks it against `want`,
    /// and checks its rate-limit fields as a client parses them
    /// ([`fields::check`]).
    pub fn row(&mut self, request: &str, client: &str, reply: &Reply, want: Want) {
        let status = reply.status.as_u16();
        let remaining = reply.header("x-ratelimit-remaining");
        let retry_after = reply.header("retry-after");
        println!(
            "  {:<22}  {:<20}  {:<6}  {:>5}  {:>9}  {:>11}",
            request,
            client,
            status,
            reply.header("x-ratelimit-limit"),
            remaining,
            retry_after,
        );
        match fields::check(status, &reply.headers, &reply.body) {
            Ok(()) => self.checks += 1,
            Err(wrong) => self.fail(format!("{request} as {client}: the rate-limit fields: {wrong}")),
        }
        if (status, remaining, retry_after) == (want.status, want.remaining, want.retry_after) {
            self.checks += 1;
        } else {
            self.fail(format!(
                "{request} as {client}: expected status {}, remaining {}, retry-after {}; \
                 got {status}, {remaining}, {retry_after}",
                want.status, want.remaining, want.retry_after
            ));
        }
    }

    /// Checks that `got` is `expected`.
    pub fn equal<T: PartialEq + Debug>(&mut self, what: &str, got: T, expected: T) {
        if got == expected {
            self.checks += 1;
        } else {
            self.fail(format!("{what}: expected {expected:?}, got {got:?}"));
        }
    }

    fn fail(&mut self, message: String) {
        println!("  ^ MISMATCH: {message}");
        self.failures.push(message);
    }

    /// Reports the result: success when every check held, else the
    /// mismatches (on stderr) and exit status 1.
    pub fn finish(self) -> ExitCode {
        if self.failures.is_empty() {
            println!("\nself-test: all {} checks hold", self.checks);
            return ExitCode::SUCCESS;
        }
        eprintln!(
            "\nself-test FAILED: {} of {} checks",
            self.failures.len(),
            self.checks + self.failures.len()
        );
        for failure in &self.failures {
            eprintln!("  {failure}");
        }
        ExitCode::FAILURE
    }
}
