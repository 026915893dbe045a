//! A loopback HTTP load test: an axum app behind the limiter on
//! `127.0.0.1`, a real pooled hyper client, a bounded number of requests.
//!
//! Before and after the load (both after a warm-up, with the client dropped
//! and the connections closed) it counts open file descriptors and live heap
//! bytes; the binary must install the counting allocator (see
//! [`crate::heap`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};

use crate::heap;

/// The size of a run.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Requests sent in the measured phase.
    pub requests: usize,
    /// Concurrent client tasks.
    pub concurrency: usize,
    /// Distinct users (request `i` is user `i % users`).
    pub users: usize,
    /// Each user's quota per day (no refill to speak of during a run).
    pub quota: u32,
    /// One request in this many asks the server to close the connection,
    /// so that connections are opened and closed during the run.
    pub close_every: usize,
    /// The measured phase is repeated this many times (each with a new
    /// client), to tell a one-off growth (caches filling up) from a leak.
    pub rounds: usize,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// 200 answers.
    pub ok: usize,
    /// 429 answers.
    pub limited: usize,
    /// Any other status, a transport error, or a body that failed.
    pub errors: usize,
    /// Admitted requests per user, warm-up included.
    pub admitted_per_user: Vec<u32>,
    /// Open file descriptors before the load.
    pub fds_before: usize,
    /// ... and after (the last round).
    pub fds_after: usize,
    /// Live heap bytes before the load.
    pub heap_before: usize,
    /// ... and after (the last round).
    pub heap_after: usize,
    /// Live heap bytes after each round.
    pub heap_after_rounds: Vec<usize>,
    /// The highest live heap seen during the load (sampled by the client).
    pub heap_peak: usize,
    /// Wall time of the measured phase.
    pub elapsed: Duration,
}

fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let user = headers.get("x-user")?.to_str().ok()?;
    Some(TierIdentity::new(user, "free"))
}

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Sends `count` requests from `concurrency` tasks; returns per user
/// `(admitted, limited, errors)` and the peak live heap seen.
async fn send_all(
    addr: SocketAddr,
    users: usize,
    count: usize,
    concurrency: usize,
    close_every: usize,
    offset: usize,
) -> (HashMap<usize, (u32, u32, u32)>, usize) {
    let client = client();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, next) = (client.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen: HashMap<usize, (u32, u32, u32)> = HashMap::new();
            let mut peak = 0usize;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let n = i + offset;
                let user = n % users;
                let mut req =
                    Request::get(format!("http://{addr}/")).header("x-user", format!("user-{user}"));
                if close_every > 0 && n % close_every == close_every - 1 {
                    req = req.header("connection", "close");
                }
                let req = req.body(Empty::new()).expect("a valid request");
                let entry = seen.entry(user).or_default();
                let answer = tokio::time::timeout(Duration::from_secs(10), async {
                    let response = client.request(req).await.ok()?;
                    let status = response.status();
                    let body = response.into_body().collect().await.ok()?.to_bytes();
                    Some((status, body))
                })
                .await;
                match answer {
                    Ok(Some((StatusCode::OK, body))) if body == "ok" => entry.0 += 1,
                    Ok(Some((StatusCode::TOO_MANY_REQUESTS, body)))
                        if serde_json::from_slice::<serde_json::Value>(&body).is_ok() =>
                    {
                        entry.1 += 1
                    }
                    _ => entry.2 += 1,
                }
                if i % 64 == 0 {
                    peak = peak.max(heap::live_bytes());
                }
            }
            (seen, peak)
        }));
    }
    let mut all: HashMap<usize, (u32, u32, u32)> = HashMap::new();
    let mut peak = 0;
    for task in tasks {
        let (seen, p) = task.await.expect("a client task panicked");
        peak = peak.max(p);
        for (user, (a, l, e)) in seen {
            let entry = all.entry(user).or_default();
            entry.0 += a;
            entry.1 += l;
            entry.2 += e;
        }
    }
    drop(client);
    (all, peak)
}

/// Runs the scenario on the current multi-threaded runtime.
pub async fn run(load: Load) -> Report {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_day(load.quota))
        .default_tier("free")
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identify));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("a local address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });

    // Warm-up: one request of every user (their keys exist from now on),
    // a few refusals, a closed connection; then the client goes away.
    let warm = load.users + load.concurrency;
    let (warm_seen, _) = send_all(addr, load.users, warm, load.concurrency, load.close_every, 0).await;
    let fds_before = heap::settled_fds(Duration::from_secs(5)).await;
    let heap_before = heap::live_bytes();

    let started = Instant::now();
    let mut seen: HashMap<usize, (u32, u32, u32)> = HashMap::new();
    let mut heap_peak = 0;
    let mut heap_after_rounds = Vec::new();
    let mut fds_after = fds_before;
    for round in 0..load.rounds.max(1) {
        let (round_seen, peak) = send_all(
            addr,
            load.users,
            load.requests / load.rounds.max(1),
            load.concurrency,
            load.close_every,
            warm + round * load.requests,
        )
        .await;
        heap_peak = heap_peak.max(peak);
        for (user, (a, l, e)) in round_seen {
            let entry = seen.entry(user).or_default();
            entry.0 += a;
            entry.1 += l;
            entry.2 += e;
        }
        fds_after = heap::settled_fds(Duration::from_secs(5)).await;
        heap_after_rounds.push(heap::live_bytes());
    }
    let elapsed = started.elapsed();
    let heap_after = heap_after_rounds.last().copied().unwrap_or(heap_before);

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;

    let mut report = Report {
        ok: 0,
        limited: 0,
        errors: 0,
        admitted_per_user: vec![0; load.users],
        fds_before,
        fds_after,
        heap_before,
        heap_after,
        heap_after_rounds,
        heap_peak,
        elapsed,
    };
    for (user, (a, l, e)) in seen {
        report.ok += a as usize;
        report.limited += l as usize;
        report.errors += e as usize;
        report.admitted_per_user[user] += a;
    }
    for (user, (a, _, e)) in warm_seen {
        report.errors += e as usize;
        report.admitted_per_user[user] += a;
    }
    report
}
