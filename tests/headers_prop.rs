//! The rate-limit headers and the 429 body, as a property: random tiers
//! (one to three bands, odd names) and random request sequences (waits,
//! costs 0 to above the burst) go through the layer under a `FakeClock`, and
//! every response is compared with an exact token-bucket model:
//!
//! * the status (200, 429, or 403 for a cost above the smallest burst);
//! * `X-RateLimit-Limit`/`-Remaining`/`-Reset` describe the band the layer
//!   reports (closest to denying when admitted, the longest wait when
//!   denied), `Retry-After` is `ceil(retry_after)` and never 0;
//! * `RateLimit-Policy` and `RateLimit` parse (with `sfv`, an RFC 9651
//!   parser) as lists of strings with integer parameters, one item per band
//!   (`"name.i"` for several), with the right `q`, `w`, `r`, `t`, and the
//!   tier name escaped (printable ASCII kept, `"` and `\` escaped, anything
//!   else `?`); `t` is the seconds until more quota than now (none on a full
//!   band), and on a 429 the seconds until the request fits on the bands
//!   that denied it (none on the others), never more than `Retry-After`;
//! * the 429 body is the draft's `quota-exceeded` problem whose
//!   `violated-policies` are the names of the denying bands' items as the
//!   parser decodes them, whose `tier` is the name and whose `retry_after`
//!   is the `Retry-After` value.
//!
//! 1,000 cases of up to 24 requests each.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier, TierCost, TierIdentity, TierLimitLayer};

const CASES: u32 = 1_000;
const SEC: u64 = 1_000_000_000;

// ---------------------------------------------------------------- inputs

#[derive(Debug, Clone, Copy)]
struct Band {
    quota: Quota,
    period_ns: u64,
    /// Requests per period, as written.
    count: u32,
}

fn band() -> impl Strategy<Value = Band> {
    (0..4usize, 1u32..=60, prop::option::of(1u32..=20)).prop_map(|(period, n, burst)| {
        let (quota, period_ns) = match period {
            0 => (Quota::per_second(n), SEC),
            1 => (Quota::per_minute(n), 60 * SEC),
            2 => (Quota::per_hour(n), 3_600 * SEC),
            _ => (Quota::per_day(n), 86_400 * SEC),
        };
        Band {
            quota: burst.map_or(quota, |b| quota.with_burst(b)),
            period_ns,
            count: n,
        }
    })
}

fn tier_name() -> impl Strategy<Value = String> {
    let odd = prop_oneof![
        6 => prop::char::range('a', 'z'),
        1 => prop::sample::select(vec!['"', '\\', '<', '>', '&', ';', ',', '=', ' ', '\'', '\n', '\u{1}', '\u{7f}', 'é', '😀']),
        1 => any::<char>(),
    ];
    prop_oneof![
        1 => Just("free".to_owned()),
        3 => prop::collection::vec(odd, 1..16).prop_map(String::from_iter),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Wait {
    None,
    Nanos(u64),
    /// A fraction (in 1/64) of the first band's period.
    Period(u8),
}

fn op() -> impl Strategy<Value = (Wait, u32)> {
    let wait = prop_oneof![
        3 => Just(Wait::None),
        2 => (1u64..=3 * SEC).prop_map(Wait::Nanos),
        2 => (1u8..=96).prop_map(Wait::Period),
    ];
    // costs are drawn up to 22: above every burst sometimes
    let cost = prop_oneof![4 => Just(1u32), 2 => 0u32..=5, 1 => 0u32..=22];
    (wait, cost)
}

// ---------------------------------------------------------------- model

/// A token bucket per band, tokens kept as `tokens × I` nanoseconds.
struct Model {
    bands: Vec<(Quota, u128)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    remaining: u32,
    reset_after_ns: u64,
    retry_after_ns: u64,
    /// Until one more token: what is missing of a whole one (0 when full).
    next_token_ns: u64,
}

impl Model {
    fn new(bands: &[Band]) -> Self {
        Model {
            bands: bands.iter().map(|b| (b.quota, cap(&b.quota))).collect(),
        }
    }

    fn refill(&mut self, ns: u64) {
        for (q, tokens) in &mut self.bands {
            *tokens = (*tokens + u128::from(ns)).min(cap(q));
        }
    }

    fn state(q: &Quota, tokens: u128, retry: u128) -> State {
        let i = u128::from(q.emission_interval_nanos());
        let next = if tokens == cap(q) { 0 } else { i - tokens % i };
        State {
            remaining: u32::try_from(tokens / i).unwrap(),
            reset_after_ns: u64::try_from(cap(q) - tokens).unwrap(),
            retry_after_ns: u64::try_from(retry).unwrap(),
            next_token_ns: u64::try_from(next).unwrap(),
        }
    }

    /// `Some((admitted, per-band states))`, or `None` when the cost exceeds
    /// the smallest burst (403).
    fn take(&mut self, cost: u32) -> Option<(bool, Vec<State>)> {
        if self.bands.iter().any(|(q, _)| cost > q.burst()) {
            return None;
        }
        let need = |q: &Quota| u128::from(q.emission_interval_nanos()) * u128::from(cost);
        let admitted = self.bands.iter().all(|(q, t)| *t >= need(q));
        if admitted {
            for (q, t) in &mut self.bands {
                *t -= need(q);
            }
        }
        let states = self
            .bands
            .iter()
            .map(|(q, t)| {
                let retry = if admitted || *t >= need(q) { 0 } else { need(q) - t };
                Model::state(q, *t, retry)
            })
            .collect();
        Some((admitted, states))
    }
}

fn cap(q: &Quota) -> u128 {
    u128::from(q.emission_interval_nanos()) * u128::from(q.burst())
}

/// The band the `X-` fields describe: closest to denying (fewest remaining,
/// then the longest reset, the first on ties) when admitted; the longest
/// wait (the last on ties) when denied.
fn reported(admitted: bool, states: &[State]) -> usize {
    if admitted {
        let mut best = 0;
        for (i, s) in states.iter().enumerate() {
            let b = &states[best];
            if (s.remaining, std::cmp::Reverse(s.reset_after_ns))
                < (b.remaining, std::cmp::Reverse(b.reset_after_ns))
            {
                best = i;
            }
        }
        best
    } else {
        let mut best = 0;
        for (i, s) in states.iter().enumerate() {
            if s.retry_after_ns >= states[best].retry_after_ns {
                best = i;
            }
        }
        best
    }
}

fn secs_ceil(ns: u128) -> u64 {
    u64::try_from(ns.div_ceil(u128::from(SEC))).unwrap()
}

// ---------------------------------------------------------------- RFC 9651

/// One list item: a string and its integer parameters.
type Item = (String, Vec<(String, i64)>);

/// A field parsed by `sfv` (an RFC 9651 Structured Fields parser) as a List
/// whose members are all Items with a String value and Integer parameters,
/// the draft's shape of `RateLimit` and `RateLimit-Policy`; or what is wrong
/// with it.
fn parse_sf_list(input: &str) -> Result<Vec<Item>, String> {
    let list: sfv::List = sfv::Parser::new(input).parse().map_err(|e| e.to_string())?;
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                return Err(format!("an inner list in {input:?}"));
            };
            let name = item
                .bare_item
                .as_string()
                .ok_or_else(|| format!("an item that is not a string in {input:?}"))?
                .as_str()
                .to_owned();
            let params = item
                .params
                .iter()
                .map(|(key, value)| {
                    let n = value
                        .as_integer()
                        .map(i64::from)
                        .filter(|n| *n >= 0)
                        .ok_or_else(|| format!("parameter {} is not a non-negative integer", key.as_str()))?;
                    Ok((key.as_str().to_owned(), n))
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok((name, params))
        })
        .collect()
}

/// What the name looks like inside the header after escaping.
fn header_name(tier: &str, bands: usize, index: usize) -> String {
    let mut name: String = tier
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect();
    if bands > 1 {
        name.push_str(&format!(".{index}"));
    }
    name
}

// ---------------------------------------------------------------- the case

fn run_case(
    rt: &tokio::runtime::Runtime,
    tier: &str,
    bands: &[Band],
    ops: &[(Wait, u32)],
) -> Result<(), TestCaseError> {
    let clock = FakeClock::new();
    let quotas: Vec<Quota> = bands.iter().map(|b| b.quota).collect();
    let tiers = RateTier::builder()
        .tier(tier, quotas.clone())
        .clock(clock.clone())
        .build();
    let name = tier.to_owned();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier_fn(move |_| Some(TierIdentity::new("u", name.clone()))));
    let mut model = Model::new(bands);
    let mut now = u128::from(FakeClock::START_UNIX_SECS) * u128::from(SEC);
    // the policy: one item per band, q = burst, w = the burst's window as
    // written (burst / count of the period), in whole seconds rounded up
    let expected_policy: Vec<Item> = quotas
        .iter()
        .zip(bands)
        .enumerate()
        .map(|(i, (q, band))| {
            let written = u128::from(band.period_ns) * u128::from(q.burst());
            let w = secs_ceil(written.div_ceil(u128::from(band.count)));
            (
                header_name(tier, quotas.len(), i),
                vec![("q".into(), i64::from(q.burst())), ("w".into(), w as i64)],
            )
        })
        .collect();
    for (step, &(wait, cost)) in ops.iter().enumerate() {
        let ns = match wait {
            Wait::None => 0,
            Wait::Nanos(n) => n,
            Wait::Period(f) => bands[0].period_ns / 64 * u64::from(f),
        };
        clock.advance(Duration::from_nanos(ns));
        model.refill(ns);
        now += u128::from(ns);
        let mut req = Request::get("/").body(Body::empty()).unwrap();
        req.extensions_mut().insert(TierCost(cost));
        let response = rt.block_on(app.clone().oneshot(req)).unwrap();
        let (parts, body) = response.into_parts();
        let body = rt.block_on(body.collect()).unwrap().to_bytes();
        let header = |name: &str| -> Option<String> {
            parts
                .headers
                .get(name)
                .map(|v| v.to_str().expect("header values are visible ASCII").to_owned())
        };
        let ctx = format!("step {step}, cost {cost}, {:?}", parts.headers);
        let Some((admitted, states)) = model.take(cost) else {
            prop_assert_eq!(parts.status, StatusCode::FORBIDDEN, "{}", ctx);
            prop_assert_eq!(header("retry-after"), None);
            continue;
        };
        let expected_status = if admitted {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        prop_assert_eq!(parts.status, expected_status, "{}", ctx);
        let r = reported(admitted, &states);
        let s = states[r];
        prop_assert_eq!(
            header("x-ratelimit-limit"),
            Some(quotas[r].burst().to_string()),
            "{}",
            ctx
        );
        prop_assert_eq!(
            header("x-ratelimit-remaining"),
            Some(s.remaining.to_string()),
            "{}",
            ctx
        );
        prop_assert_eq!(
            header("x-ratelimit-reset"),
            Some(secs_ceil(now + u128::from(s.reset_after_ns)).to_string()),
            "{}",
            ctx
        );
        let policy = parse_sf_list(&header("ratelimit-policy").unwrap_or_default());
        prop_assert_eq!(policy, Ok(expected_policy.clone()), "{}", ctx);
        // `t`: until more quota than now (none when full); on a 429, until
        // the request fits, on the bands that denied it only
        let t_of = |st: &State| {
            let ns = if admitted {
                st.next_token_ns
            } else {
                st.retry_after_ns
            };
            (ns > 0).then(|| secs_ceil(u128::from(ns)).max(1))
        };
        let expected_ratelimit: Vec<Item> = states
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let mut params = vec![("r".into(), i64::from(st.remaining))];
                if let Some(t) = t_of(st) {
                    params.push(("t".into(), t as i64));
                }
                (header_name(tier, states.len(), i), params)
            })
            .collect();
        let ratelimit = parse_sf_list(&header("ratelimit").unwrap_or_default());
        prop_assert_eq!(ratelimit, Ok(expected_ratelimit), "{}", ctx);
        if admitted {
            prop_assert_eq!(header("retry-after"), None);
        } else {
            let retry = secs_ceil(u128::from(s.retry_after_ns)).max(1);
            prop_assert!(retry >= 1);
            prop_assert_eq!(header("retry-after"), Some(retry.to_string()), "{}", ctx);
            // never earlier than the `t` of a denying item
            for t in states.iter().filter_map(t_of) {
                prop_assert!(retry >= t, "retry-after {} < t {}: {}", retry, t, ctx);
            }
            let json: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
            prop_assert_eq!(
                json["type"].as_str(),
                Some("https://iana.org/assignments/http-problem-types#quota-exceeded")
            );
            let violated: Vec<String> = states
                .iter()
                .enumerate()
                .filter(|(_, st)| st.retry_after_ns > 0)
                .map(|(i, _)| header_name(tier, states.len(), i))
                .collect();
            prop_assert_eq!(
                &json["violated-policies"],
                &serde_json::json!(violated),
                "{}",
                ctx
            );
            prop_assert_eq!(json["tier"].as_str(), Some(tier));
            prop_assert_eq!(json["retry_after"].as_u64(), Some(retry));
            prop_assert_eq!(json["limit"].as_u64(), Some(u64::from(quotas[r].burst())));
            prop_assert_eq!(json["remaining"].as_u64(), Some(u64::from(s.remaining)));
        }
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn headers_and_bodies_match_the_model(
        tier in tier_name(),
        bands in prop::collection::vec(band(), 1..=3),
        ops in prop::collection::vec(op(), 1..=24),
    ) {
        thread_local!(static RT: tokio::runtime::Runtime = runtime());
        RT.with(|rt| run_case(rt, &tier, &bands, &ops))?;
    }
}

/// What the property reads fields with refuses what is not a Structured
/// Fields list of strings with non-negative integer parameters, so the
/// property cannot pass on malformed headers.
#[test]
fn the_list_parser_refuses_malformed_fields() {
    assert_eq!(
        parse_sf_list(r#""a\"b";q=1;w=60, "c";r=0"#),
        Ok(vec![
            ("a\"b".into(), vec![("q".into(), 1), ("w".into(), 60)]),
            ("c".into(), vec![("r".into(), 0)])
        ])
    );
    for bad in [
        r#"free;q=1"#,
        r#""fr"ee";q=1"#,
        "\"fr\u{e9}e\";q=1",
        "\"a\nb\";q=1",
        r#""a\x";q=1"#,
        r#""a";Q=1"#,
        r#""a";q=-1"#,
        r#""a";q"#,
        r#""a";q=1,"#,
        r#""a";q=1 "b""#,
        r#""a";q=1234567890123456"#,
    ] {
        assert!(parse_sf_list(bad).is_err(), "{bad}");
    }
}

/// Configurations built and dropped one after another (tests, or tiers
/// swapped while the process runs) each get their own tier name in
/// `RateLimit`. The per-thread cache of rendered values once keyed a tier
/// by its address, which a new tier can get once the old one is freed, and
/// served the old tier's name.
#[test]
fn a_new_configuration_never_gets_the_header_of_a_dropped_one() {
    let rt = runtime();
    for i in 0..50 {
        let name = format!("tier-{i}");
        let tiers = RateTier::builder()
            .tier(name.as_str(), Quota::per_minute(10))
            .clock(FakeClock::new())
            .build();
        let app =
            Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(TierLimitLayer::new(tiers).identifier_fn({
                    let name = name.clone();
                    move |_: &http::HeaderMap| Some(TierIdentity::new("u", name.clone()))
                }));
        let response = rt
            .block_on(app.oneshot(Request::get("/").body(Body::empty()).unwrap()))
            .unwrap();
        assert_eq!(
            response.headers()["ratelimit"],
            format!("\"{name}\";r=9;t=6").as_str(),
            "configuration {i}"
        );
    }
}
