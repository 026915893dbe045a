//! A metered completion API: each plan limits requests *and* tokens a
//! minute, and a streamed answer's tokens are charged when the stream ends.
//!
//! ```sh
//! cargo run --example axum_llm_tokens            # a self-test run, then exits
//! cargo run --example axum_llm_tokens -- --serve # keeps serving, for curl
//! ```
//!
//! `POST /v1/completions` takes `{"prompt": "...", "max_tokens": 200}` and
//! streams its answer, one word per frame, from a fake model that echoes
//! the prompt (at most `max_tokens` words; a token is a word). What a call
//! uses is billed as LLM APIs bill it: the prompt's tokens and the
//! answer's. The handler reserves `max_tokens` before it starts (a 429
//! naming `free.tokens` when they do not fit), and the stream records what
//! the call used when it ends: the unused part of the reservation comes
//! back, and a long prompt's tokens beyond it are charged, into debt if
//! need be. While a plan's tokens are in debt, every request of that
//! account is refused until the debt is repaid at the plan's rate.
//!
//! free: 20 requests and 1,000 tokens a minute (a request back every 3 s, a
//! token every 60 ms); pro: 600 requests and 100,000 tokens a minute. The
//! API key (`Authorization: Bearer ...`) names the account and its plan.
//!
//! The self-test runs the limiter on a `FakeClock` that it moves by hand, so
//! every number it checks (tokens left, seconds to wait) is exact however
//! loaded the machine is; `--serve` runs on the system clock. It exits with
//! status 1 on any mismatch.

use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Method, StatusCode};
use http_body::Frame;
use serde::Deserialize;
use tower_rate_tier::clock::{Clock, FakeClock, SystemClock};
use tower_rate_tier::{OnMissing, Quota, RateTier, TierIdentity, TierLimitLayer, TierRefusal, TierUsage};
use tower_rate_tier_examples::{
    Client, Reply, SelfTest, fields, serve_axum, serve_forever, serve_mode, want,
};

/// Who holds which API key, on which plan (a database in a real service).
const API_KEYS: &[(&str, &str, &str)] = &[("sk-ana", "ana", "free"), ("sk-bo", "bo", "pro")];

fn identify(headers: &HeaderMap) -> Option<TierIdentity> {
    let bearer = headers.get("authorization")?.to_str().ok()?;
    let key = bearer.strip_prefix("Bearer ")?;
    let (_, account, plan) = API_KEYS.iter().find(|(k, _, _)| *k == key)?;
    Some(TierIdentity::new(*account, *plan))
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: String,
    max_tokens: u32,
}

/// Takes the account's `TierUsage` before the body (axum runs the body
/// extractor last), reserves `max_tokens`, and hands the handle to the
/// stream, which records the usage.
async fn complete(
    usage: TierUsage,
    Json(request): Json<CompletionRequest>,
) -> Result<impl IntoResponse, TierRefusal> {
    usage.reserve("tokens", request.max_tokens).await?;
    let answer = Completion::new(&request.prompt, request.max_tokens, usage);
    Ok(([(CONTENT_TYPE, "text/plain; charset=utf-8")], Body::new(answer)))
}

/// The answer of the fake model, a word per frame. It records the call's
/// tokens (the prompt's and the answer's) when the stream ends, and in
/// `Drop` when the stream is dropped before its end (the client went away):
/// then the words produced so far count. It records at the end rather than
/// leaving it all to `Drop`, so that the usage is settled before the last
/// chunk of the response goes out: a client that has read the whole answer
/// finds it recorded.
struct Completion {
    words: std::vec::IntoIter<Bytes>,
    prompt_tokens: u32,
    sent: u32,
    usage: Option<TierUsage>,
}

impl Completion {
    fn new(prompt: &str, max_tokens: u32, usage: TierUsage) -> Self {
        let limit = usize::try_from(max_tokens).unwrap_or(usize::MAX);
        let words: Vec<Bytes> = prompt
            .split_whitespace()
            .take(limit)
            .map(|word| Bytes::from([word, " "].concat()))
            .collect();
        Completion {
            words: words.into_iter(),
            prompt_tokens: tokens(prompt),
            sent: 0,
            usage: Some(usage),
        }
    }

    /// Records the tokens used so far, once.
    fn settle(&mut self) {
        if let Some(usage) = self.usage.take() {
            usage.record("tokens", self.prompt_tokens.saturating_add(self.sent));
        }
    }
}

impl http_body::Body for Completion {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // A real model would produce these over seconds.
        match self.words.next() {
            Some(word) => {
                self.sent += 1;
                Poll::Ready(Some(Ok(Frame::data(word))))
            }
            None => {
                self.settle();
                Poll::Ready(None)
            }
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.settle();
    }
}

/// The fake tokenizer: a token per word.
fn tokens(text: &str) -> u32 {
    u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX)
}

fn app(clock: impl Clock) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(20))
        .tier_unit("free", "tokens", Quota::per_minute(1_000))
        .tier("pro", Quota::per_minute(600))
        .tier_unit("pro", "tokens", Quota::per_minute(100_000))
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED)) // no key, or an unknown one
        .clock(clock)
        .build();
    Router::new()
        .route("/v1/completions", post(complete))
        // uses no tokens, and is refused too while the account's tokens are in debt
        .route("/v1/models", get(|| async { Json(["echo-1"]) }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(identify))
}

/// A prompt of `words` words.
fn prompt(words: usize) -> String {
    let text = "the quick brown fox jumps over the lazy dog";
    let words: Vec<&str> = text.split(' ').cycle().take(words).collect();
    words.join(" ")
}

/// `POST /v1/completions` with this key, prompt and `max_tokens`.
async fn completion(client: &Client, key: &str, prompt: &str, max_tokens: u32) -> Reply {
    let body = serde_json::json!({ "prompt": prompt, "max_tokens": max_tokens });
    let bearer = format!("Bearer {key}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    client
        .send(
            Method::POST,
            "/v1/completions",
            &headers,
            Bytes::from(body.to_string()),
        )
        .await
}

/// `GET /v1/models` with this key.
async fn models(client: &Client, key: &str) -> Reply {
    let bearer = format!("Bearer {key}");
    client
        .get("/v1/models", &[("authorization", bearer.as_str())])
        .await
}

/// Checks the parsed parameters of an item of a reply's rate-limit field.
fn check_item(test: &mut SelfTest, what: &str, reply: &Reply, field: &str, item: &str, expected: &str) {
    test.equal(
        &format!("{what}: {field} {item:?}"),
        fields::item(&reply.headers, field, item).as_deref(),
        Some(expected),
    );
}

/// Checks the `violated-policies` of a 429's body.
fn check_violated(test: &mut SelfTest, what: &str, reply: &Reply, expected: &[&str]) {
    let problem: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
    test.equal(
        &format!("{what}: violated-policies"),
        problem["violated-policies"].clone(),
        serde_json::json!(expected),
    );
}

#[tokio::main]
async fn main() -> ExitCode {
    if serve_mode() {
        let (addr, server) = serve_axum(app(SystemClock::new())).await;
        println!(
            "serving on http://{addr} (free: 20 requests and 1,000 tokens a minute; pro: 600 and 100,000)\n"
        );
        println!("try:");
        println!(
            "  curl -sN -D - -H 'authorization: Bearer sk-ana' -H 'content-type: application/json' \\\n    \
             -d '{{\"prompt\": \"say this back to me\", \"max_tokens\": 200}}' http://{addr}/v1/completions"
        );
        println!("  # max_tokens above 1,000 never fits the free plan: 403; a prompt of a thousand words");
        println!("  # puts ana's tokens in debt: every request of hers gets 429 until it is repaid");
        println!("  curl -i -H 'authorization: Bearer sk-bo' http://{addr}/v1/models   # pro");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return ExitCode::SUCCESS;
    }

    // The limiter's time moves only when the self-test says.
    let clock = FakeClock::new();
    let (addr, server) = serve_axum(app(clock.clone())).await;
    println!(
        "serving on http://{addr} (free: 20 requests and 1,000 tokens a minute; pro: 600 and 100,000)\n"
    );
    let client = Client::new(addr);
    println!("completion P+M: a prompt of P tokens, max_tokens M\n");
    let mut test = SelfTest::new();

    // 1. 8 prompt tokens, 200 reserved, 8 answered: 16 used, 184 back.
    // The fields of an admitted response describe the account when it was
    // admitted, before the handler's reservation.
    let short = prompt(8);
    let reply = completion(&client, "sk-ana", &short, 200).await;
    test.row("completion 8+200", "ana (free)", &reply, want(200, "19", "-"));
    test.equal(
        "the answer",
        String::from_utf8_lossy(&reply.body),
        format!("{short} ").into(),
    );
    check_item(&mut test, "1st", &reply, "ratelimit-policy", "free", "q=20;w=60");
    check_item(
        &mut test,
        "1st",
        &reply,
        "ratelimit-policy",
        "free.tokens",
        "q=1000;w=60",
    );
    check_item(&mut test, "1st", &reply, "ratelimit", "free", "r=19;t=3");
    check_item(&mut test, "1st", &reply, "ratelimit", "free.tokens", "r=1000");

    // 2. 300 prompt tokens, 100 reserved and answered: 400 used, 300 more
    // than reserved, charged from what is left (984 - 400 = 584)
    let reply = completion(&client, "sk-ana", &prompt(300), 100).await;
    test.row("completion 300+100", "ana (free)", &reply, want(200, "18", "-"));
    test.equal(
        "words answered",
        tokens(&String::from_utf8_lossy(&reply.body)),
        100,
    );
    check_item(&mut test, "2nd", &reply, "ratelimit", "free.tokens", "r=984;t=1");

    // 3. max_tokens above the plan's burst can never fit: 403, no
    // Retry-After; the request still counts (r=17), so that asking for too
    // much never reaches the handler more often than the plan's requests
    let reply = completion(&client, "sk-ana", &short, 2_000).await;
    test.row("completion 8+2000", "ana (free)", &reply, want(403, "17", "-"));

    // 4. 900 do not fit in the 584 left: refused by tokens while requests
    // remain; 316 tokens short at 60 ms each is 18.96 s
    let reply = completion(&client, "sk-ana", &short, 900).await;
    test.row("completion 8+900", "ana (free)", &reply, want(429, "584", "19"));
    check_violated(&mut test, "4th", &reply, &["free.tokens"]);
    check_item(&mut test, "4th", &reply, "ratelimit", "free.tokens", "r=584;t=19");

    // 5. 600 prompt tokens, 400 reserved and answered: 1,000 used where 584
    // were left, a debt of 416. The call refused by tokens consumed no
    // request: this one is the 4th counted (r=16).
    let reply = completion(&client, "sk-ana", &prompt(600), 400).await;
    test.row("completion 600+400", "ana (free)", &reply, want(200, "16", "-"));
    check_item(&mut test, "5th", &reply, "ratelimit", "free", "r=16;t=3");
    check_item(&mut test, "5th", &reply, "ratelimit", "free.tokens", "r=584;t=1");

    // 6. in debt: every request is refused until the 416 tokens and one more
    // are back, 417 x 60 ms = 25.02 s, Retry-After 26, though 16 requests
    // remain
    let reply = completion(&client, "sk-ana", &short, 200).await;
    test.row("completion 8+200", "ana (in debt)", &reply, want(429, "0", "26"));
    check_violated(&mut test, "6th", &reply, &["free.tokens"]);
    check_item(&mut test, "6th", &reply, "ratelimit", "free.tokens", "r=0;t=26");
    check_item(&mut test, "6th", &reply, "ratelimit", "free", "r=16");
    let reply = models(&client, "sk-ana").await;
    test.row("GET /v1/models", "ana (in debt)", &reply, want(429, "0", "26"));

    // another account on another plan is not affected
    let reply = completion(&client, "sk-bo", &short, 4_000).await;
    test.row("completion 8+4000", "bo (pro)", &reply, want(200, "599", "-"));
    check_item(
        &mut test,
        "bo's",
        &reply,
        "ratelimit-policy",
        "pro.tokens",
        "q=100000;w=60",
    );
    check_item(&mut test, "bo's", &reply, "ratelimit", "pro.tokens", "r=100000");

    // 7. 1 ms before the debt's wait is over: still refused; then admitted
    clock.advance(Duration::from_millis(25_019));
    let reply = models(&client, "sk-ana").await;
    test.row(
        "GET models +25.019s",
        "ana (in debt)",
        &reply,
        want(429, "0", "1"),
    );
    clock.advance(Duration::from_millis(1));
    // admitted: its X- fields describe the requests (ana's are all back,
    // one charged); the tokens' item shows the one token back
    let reply = models(&client, "sk-ana").await;
    test.row("GET models +25.020s", "ana (free)", &reply, want(200, "19", "-"));
    check_item(
        &mut test,
        "at 25.020 s",
        &reply,
        "ratelimit",
        "free.tokens",
        "r=1;t=1",
    );

    // no key: 401, nothing counted
    let reply = client.get("/v1/models", &[]).await;
    test.row("GET /v1/models", "no key", &reply, want(401, "-", "-"));

    println!(
        "\nana's calls are charged the tokens they used when their answers end: a reservation's unused\n\
         part comes back, tokens beyond it are charged. A call that does not fit is refused by tokens\n\
         while requests remain; a debt refuses every request of hers until it is repaid, to the ms."
    );
    server.abort();
    test.finish()
}
