//! A tonic gRPC server with two plans, and a tonic client that is refused
//! with RESOURCE_EXHAUSTED and reads its retry delay (feature `grpc`).
//!
//! ```sh
//! cargo run --example tonic_grpc              # serves on 127.0.0.1, calls, checks, exits
//! cargo run --example tonic_grpc -- --serve   # keeps serving, for grpcurl or any gRPC client
//! ```
//!
//! The server is `tonic::transport::Server::builder().layer(limiter)`
//! around a hand-written `demo.Greeter` service (tonic's codegen types and a
//! prost codec, so no `protoc` and no build script) and the standard health
//! service. Callers send their API key as `x-api-key` metadata; `pro-` keys
//! are on the pro plan. `Report` costs 3, every other method 1, and the
//! health service is free (`grpc::method_cost`). A refused call carries
//! `google.rpc.RetryInfo` and `google.rpc.QuotaFailure` details, which the
//! client decodes with `tonic_types::StatusExt`.
//!
//! The example checks what it prints and exits non-zero on a mismatch.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_prost::ProstCodec;
use tonic_types::StatusExt;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer, grpc};
use tower_rate_tier_examples::{bind_loopback, fields, serve_mode};

const SAY_HELLO: &str = "/demo.Greeter/SayHello";
const REPORT: &str = "/demo.Greeter/Report";

/// `demo.Greeter`: two unary methods over `google.protobuf.StringValue`.
#[derive(Debug, Clone)]
struct Greeter;

impl NamedService for Greeter {
    const NAME: &'static str = "demo.Greeter";
}

impl<B> tower::Service<http::Request<B>> for Greeter
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<String, String>::default());
            let reply = |prefix: &'static str| {
                tower::service_fn(move |request: tonic::Request<String>| async move {
                    Ok::<_, Status>(tonic::Response::new(format!(
                        "{prefix}, {}",
                        request.into_inner()
                    )))
                })
            };
            Ok(match req.uri().path() {
                SAY_HELLO => grpc.unary(reply("hello"), req).await,
                REPORT => grpc.unary(reply("your report"), req).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

/// The limiter: two plans, the key from metadata, costs by method.
fn plans() -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .build()
}

fn limiter(tiers: &RateTier) -> TierLimitLayer {
    TierLimitLayer::new(tiers.clone())
        .identifier_fn(|metadata| {
            let key = metadata.get("x-api-key")?.to_str().ok()?;
            let plan = if key.starts_with("pro-") { "pro" } else { "free" };
            Some(TierIdentity::new(key, plan))
        })
        .cost_fn(grpc::method_cost([(REPORT, 3), (grpc::HEALTH, 0)]))
}

/// Calls a `demo.Greeter` method with an API key.
async fn greet(channel: &Channel, method: &'static str, key: &str) -> Result<String, Status> {
    let mut client = tonic::client::Grpc::new(channel.clone());
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(key.to_owned());
    request
        .metadata_mut()
        .insert("x-api-key", key.parse().expect("an ASCII key"));
    let codec = ProstCodec::<String, String>::default();
    let response = client
        .unary(request, PathAndQuery::from_static(method), codec)
        .await?;
    Ok(response.into_inner())
}

/// What `--serve` prints: the service's `.proto` (the server has no
/// reflection) and grpcurl calls.
fn print_how_to_call(addr: std::net::SocketAddr) {
    println!("the service, for a client without generated code (save as demo.proto):");
    println!("  syntax = \"proto3\";");
    println!("  package demo;");
    println!("  import \"google/protobuf/wrappers.proto\";");
    println!("  service Greeter {{");
    println!("    rpc SayHello(google.protobuf.StringValue) returns (google.protobuf.StringValue);");
    println!("    rpc Report(google.protobuf.StringValue) returns (google.protobuf.StringValue);");
    println!("  }}");
    println!(
        "\ntry (the 4th free call in a minute is RESOURCE_EXHAUSTED; -v shows the details and metadata):"
    );
    println!(
        "  grpcurl -plaintext -proto demo.proto -H 'x-api-key: free-1' -d '\"ada\"' {addr} demo.Greeter/SayHello"
    );
    println!(
        "  grpcurl -plaintext -proto demo.proto -H 'x-api-key: pro-1' -d '\"ada\"' {addr} demo.Greeter/Report   # pro; costs 3"
    );
    println!("  grpc_health_probe -addr={addr} -rpc-header 'x-api-key: free-1'   # the health service; free");
    println!("\nCtrl-C stops the server.");
}

/// Exits with a message when a check fails.
fn check(ok: bool, what: &str) {
    if !ok {
        eprintln!("FAIL: {what}");
        std::process::exit(1);
    }
}

fn show(method: &str, key: &str, result: &Result<String, Status>) {
    match result {
        Ok(reply) => println!("  {method:<24} {key:<10} OK                  {reply}"),
        Err(status) => println!(
            "  {method:<24} {key:<10} {:<19} {}",
            format!("{:?}", status.code()),
            status.message()
        ),
    }
}

#[tokio::main]
async fn main() {
    let listener = bind_loopback().await;
    let addr = listener.local_addr().expect("the listener's address");
    let (_health_reporter, health) = tonic_health::server::health_reporter();
    let tiers = plans();
    let server = Server::builder()
        .layer(limiter(&tiers))
        .add_service(Greeter)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener));
    let server = tokio::spawn(server);
    println!(
        "gRPC on http://{addr} (free: 3 units/minute, pro: 100; Report costs 3, health checks are free)\n"
    );
    if serve_mode() {
        print_how_to_call(addr);
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("the server failed: {e}"),
            Err(e) => eprintln!("the server task failed: {e}"),
        }
        return;
    }

    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connecting to the server");

    let mut results = Vec::new();
    for _ in 0..4 {
        let result = greet(&channel, SAY_HELLO, "free-1").await;
        show("SayHello", "free-1", &result);
        results.push(result);
    }
    let report = greet(&channel, REPORT, "pro-1").await;
    show("Report", "pro-1", &report);
    let mut health = HealthClient::new(channel.clone());
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    request
        .metadata_mut()
        .insert("x-api-key", "free-1".parse().expect("ASCII"));
    let serving = health.check(request).await.map(|r| r.into_inner().status());
    println!("  {:<24} {:<10} {serving:?}", "Health/Check", "free-1");

    check(
        results[..3].iter().all(Result::is_ok),
        "free-1's first three calls pass",
    );
    check(report.is_ok(), "pro-1's Report passes");
    let pro = tiers.check("pro-1", "pro", 0).await;
    check(
        matches!(&pro, Ok(Ok(info)) if info.remaining == 97),
        "pro-1's Report cost 3 of its 100",
    );
    check(serving.is_ok(), "the health check of a spent key passes");
    let Some(Err(refused)) = results.pop() else {
        check(false, "free-1's fourth call is refused");
        return;
    };
    check(
        refused.code() == Code::ResourceExhausted,
        "the refusal is RESOURCE_EXHAUSTED",
    );

    // What a client reads from the refusal: the retry delay and the quota.
    let retry = refused.get_details_retry_info().and_then(|info| info.retry_delay);
    let tier = refused
        .get_details_quota_failure()
        .and_then(|failure| failure.violations.first().map(|v| v.subject.clone()));
    let retry_after = refused
        .metadata()
        .get("retry-after")
        .and_then(|v| v.to_str().ok());
    println!("\nthe fourth call's status:");
    println!("  code         {:?}", refused.code());
    println!("  message      {}", refused.message());
    println!("  RetryInfo    {retry:?}");
    println!("  QuotaFailure {tier:?}");
    println!("  retry-after  {retry_after:?} (metadata)");
    check(
        retry == Some(Duration::from_secs(20)),
        "RetryInfo says 20 s (one unit every 20 s)",
    );
    check(
        tier.as_deref() == Some("tier:free"),
        "QuotaFailure names the free tier",
    );
    check(retry_after == Some("20"), "the retry-after metadata says 20");
    let ratelimit = refused.metadata().get("ratelimit").and_then(|v| v.to_str().ok());
    println!("  ratelimit    {ratelimit:?} (metadata)");
    check(
        ratelimit == Some(r#""free";r=0;t=20"#),
        "the ratelimit metadata's t is the retry delay",
    );
    // the metadata's rate-limit fields as a Structured Fields parser reads them
    let metadata = refused.metadata().clone().into_headers();
    if let Err(wrong) = fields::check(429, &metadata, b"") {
        check(false, &format!("the metadata's rate-limit fields: {wrong}"));
    }
    println!("\nall checks passed");
    server.abort();
}
