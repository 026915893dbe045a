//! OpenAI-style rate-limit fields, for clients written against OpenAI's
//! API ([`RateLimitHeaders::OPENAI`](super::RateLimitHeaders::OPENAI)).
//!
//! One group of three fields for the request bands, and one for each unit
//! with the unit's name as suffix:
//!
//! * `x-ratelimit-limit-requests` / `-tokens`: the burst of the band the
//!   group reports;
//! * `x-ratelimit-remaining-requests` / `-tokens`: what that band could
//!   still admit now (0 while a unit is in debt);
//! * `x-ratelimit-reset-requests` / `-tokens`: OpenAI's "time until the rate
//!   limit resets to its initial state", that is until the band is full
//!   again (a unit's debt included), as a duration in the format OpenAI
//!   sends (Go's `time.Duration`: `0s`, `20ms`, `1s`, `1.5s`, `6m0s`,
//!   `1h2m3.004s`), rounded up to the millisecond so that a client that
//!   waits it finds the band full.
//!
//! A group of several bands (a per-minute and a daily band) reports the
//! band that refused longest, or, when none of them refused, the band
//! closest to denying (least remaining; of those, the one longest from
//! full), as the `X-RateLimit-*` fields do.

use std::ops::Range;

use arrayvec::ArrayVec;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::quota::{Quota, Unit};
use crate::storage::BandState;

/// `x-ratelimit-limit-requests` (OpenAI style).
pub const X_RATELIMIT_LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
/// `x-ratelimit-remaining-requests` (OpenAI style).
pub const X_RATELIMIT_REMAINING_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-requests");
/// `x-ratelimit-reset-requests` (OpenAI style): a duration such as `6m0s`.
pub const X_RATELIMIT_RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");

/// The OpenAI-style field names of a tier, rendered once when the tier is
/// built: one group for its request bands, one for each unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OpenAiFields {
    groups: Box<[Group]>,
}

/// The fields of the bands of one unit (requests or a named unit).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Group {
    /// Where the group's bands stand among the tier's decided bands.
    bands: Range<usize>,
    limit: HeaderName,
    remaining: HeaderName,
    reset: HeaderName,
}

impl OpenAiFields {
    /// The groups of `bands` (request bands first, then each unit's bands,
    /// each unit's bands next to each other); unlimited bands have none.
    pub(crate) fn new(bands: &[Quota]) -> Self {
        let mut groups = Vec::new();
        let mut start = 0;
        while let Some(first) = bands.get(start) {
            let unit = first.unit();
            let len = bands[start..].iter().take_while(|q| q.unit() == unit).count();
            let range = start..start + len;
            if !bands[range.clone()].iter().any(Quota::is_unlimited) {
                groups.extend(Group::new(unit, range));
            }
            start += len;
        }
        OpenAiFields {
            groups: groups.into(),
        }
    }

    /// How many fields [`insert`](Self::insert) adds at most.
    pub(crate) fn len(&self) -> usize {
        3 * self.groups.len()
    }

    /// Adds each group's fields for the bands' `states` after a decision;
    /// `limits` are the bands' bursts as header values. A group whose
    /// states are missing (a refusal by the concurrency limit decides no
    /// band) adds nothing.
    pub(crate) fn insert(&self, headers: &mut HeaderMap, limits: &[HeaderValue], states: &[BandState]) {
        for group in self.groups.iter() {
            let Some((i, state)) = states.get(group.bands.clone()).and_then(reported) else {
                continue;
            };
            if let Some(limit) = limits.get(group.bands.start + i) {
                headers.insert(group.limit.clone(), limit.clone());
            }
            headers.insert(group.remaining.clone(), super::number(u64::from(state.remaining)));
            headers.insert(group.reset.clone(), duration(state.reset_after_ns));
        }
    }
}

impl Group {
    fn new(unit: Unit, bands: Range<usize>) -> Option<Group> {
        if unit.is_requests() {
            return Some(Group {
                bands,
                limit: X_RATELIMIT_LIMIT_REQUESTS,
                remaining: X_RATELIMIT_REMAINING_REQUESTS,
                reset: X_RATELIMIT_RESET_REQUESTS,
            });
        }
        // a unit's name is a validated token (`a-z`, `0-9`, `-`, `_`)
        let name = |field: &str| {
            let mut name = String::with_capacity(13 + field.len() + unit.as_str().len());
            name.push_str("x-ratelimit-");
            name.push_str(field);
            name.push('-');
            name.push_str(unit.as_str());
            HeaderName::try_from(name).ok()
        };
        Some(Group {
            bands,
            limit: name("limit")?,
            remaining: name("remaining")?,
            reset: name("reset")?,
        })
    }
}

/// The band of a group the fields describe, with its index in the group:
/// the one that refused longest, or, when none refused, the one closest to
/// denying (least remaining; of those, the one longest from full).
fn reported(states: &[BandState]) -> Option<(usize, &BandState)> {
    states.iter().enumerate().min_by(|(_, a), (_, b)| {
        b.retry_after_ns
            .cmp(&a.retry_after_ns)
            .then(a.remaining.cmp(&b.remaining))
            .then(b.reset_after_ns.cmp(&a.reset_after_ns))
    })
}

/// `nanos` as a reset field's value: see [`write_duration`].
fn duration(nanos: u64) -> HeaderValue {
    let mut out = ArrayVec::new();
    write_duration(&mut out, nanos);
    HeaderValue::from_bytes(&out).unwrap_or(HeaderValue::from_static("0s"))
}

/// Writes `nanos`, rounded up to whole milliseconds, as Go's
/// `time.Duration` prints it (the format of OpenAI's reset fields): `0s`;
/// below a second, milliseconds (`20ms`); from a second on, hours and
/// minutes when there are any (minutes always after hours) and seconds
/// with up to three decimals, trailing zeros cut (`1s`, `1.5s`, `6m0s`,
/// `1h0m0.25s`). At most 18 bytes.
fn write_duration(out: &mut ArrayVec<u8, 24>, nanos: u64) {
    let mut push = |bytes: &[u8]| {
        // at most 18 bytes: always fits
        let _ = out.try_extend_from_slice(bytes);
    };
    let ms = nanos.div_ceil(1_000_000);
    if ms < 1_000 {
        push(itoa::Buffer::new().format(ms).as_bytes());
        push(if ms == 0 { b"s" } else { b"ms" });
        return;
    }
    let (secs, frac) = (ms / 1_000, ms % 1_000);
    if secs >= 3_600 {
        push(itoa::Buffer::new().format(secs / 3_600).as_bytes());
        push(b"h");
    }
    if secs >= 60 {
        push(itoa::Buffer::new().format(secs / 60 % 60).as_bytes());
        push(b"m");
    }
    push(itoa::Buffer::new().format(secs % 60).as_bytes());
    if frac > 0 {
        let digits = [b'.', digit(frac / 100), digit(frac / 10 % 10), digit(frac % 10)];
        let len = if frac % 100 == 0 {
            2
        } else if frac % 10 == 0 {
            3
        } else {
            4
        };
        push(&digits[..len]);
    }
    push(b"s");
}

/// The ASCII digit of `n` (below 10).
fn digit(n: u64) -> u8 {
    b'0' + (n % 10) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000 * MS;

    fn text(nanos: u64) -> String {
        let mut out = ArrayVec::new();
        write_duration(&mut out, nanos);
        String::from_utf8(out.to_vec()).unwrap_or_default()
    }

    #[test]
    fn durations_are_written_as_go_prints_them() {
        for (nanos, expected) in [
            (0, "0s"),
            (1, "1ms"),
            (MS, "1ms"),
            (20 * MS, "20ms"),
            (999 * MS, "999ms"),
            (999 * MS + 1, "1s"),
            (SEC, "1s"),
            (1_500 * MS, "1.5s"),
            (1_250 * MS, "1.25s"),
            (8_640 * MS, "8.64s"),
            (33_023 * MS, "33.023s"),
            (59 * SEC + 999 * MS, "59.999s"),
            (60 * SEC, "1m0s"),
            (6 * 60 * SEC, "6m0s"),
            (172_800 * MS, "2m52.8s"),
            (3_600 * SEC, "1h0m0s"),
            (3_723 * SEC + 4 * MS, "1h2m3.004s"),
            (86_400 * SEC, "24h0m0s"),
            (u64::MAX, "5124095h34m33.71s"),
        ] {
            assert_eq!(text(nanos), expected, "{nanos} ns");
        }
    }

    #[test]
    fn durations_round_up_to_the_millisecond() {
        assert_eq!(text(12 * SEC + 1), "12.001s");
        assert_eq!(text(60 * SEC - 1), "1m0s");
        assert_eq!(text(60 * SEC + 1), "1m0.001s");
        assert_eq!(duration(1_999_999), "2ms");
    }

    fn state(remaining: u32, reset_after_ns: u64, retry_after_ns: u64) -> BandState {
        BandState {
            remaining,
            reset_after_ns,
            retry_after_ns,
            ..BandState::default()
        }
    }

    #[test]
    fn a_group_reports_the_band_that_refused_longest_or_is_closest_to_denying() {
        // admitted: least remaining, then longest from full
        let admitted = [state(5, 10, 0), state(3, 20, 0), state(3, 30, 0)];
        assert_eq!(reported(&admitted).map(|(i, _)| i), Some(2));
        // refused: the longest wait, whatever remains
        let refused = [state(0, 10, 5), state(9, 30, 0), state(2, 20, 7)];
        assert_eq!(reported(&refused).map(|(i, _)| i), Some(2));
        assert_eq!(reported(&[]), None);
    }

    #[test]
    fn each_unit_has_its_group_and_unlimited_bands_none() {
        let tokens = Unit::new("tokens").unwrap();
        let bytes = Unit::new("content-bytes").unwrap();
        let bands = [
            Quota::per_second(2),
            Quota::per_minute(60).in_unit(tokens),
            Quota::per_day(1_000).in_unit(tokens),
            Quota::per_hour(10).in_unit(bytes),
        ];
        let fields = OpenAiFields::new(&bands);
        assert_eq!(fields.len(), 9);
        let limits: Vec<HeaderValue> = bands
            .iter()
            .map(|q| super::super::number(q.burst().into()))
            .collect();
        let mut headers = HeaderMap::new();
        let states = [
            state(1, 500 * MS, 0),
            state(60, 0, 0),
            state(40, 82_944 * SEC, 0),
            state(10, 0, 0),
        ];
        fields.insert(&mut headers, &limits, &states);
        let field = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(field("x-ratelimit-limit-requests"), Some("2"));
        assert_eq!(field("x-ratelimit-remaining-requests"), Some("1"));
        assert_eq!(field("x-ratelimit-reset-requests"), Some("500ms"));
        assert_eq!(field("x-ratelimit-limit-tokens"), Some("1000"));
        assert_eq!(field("x-ratelimit-remaining-tokens"), Some("40"));
        assert_eq!(field("x-ratelimit-reset-tokens"), Some("23h2m24s"));
        assert_eq!(field("x-ratelimit-reset-content-bytes"), Some("0s"));
        assert_eq!(headers.len(), 9);
        // an unlimited tier's band has no group; no states, no fields
        assert_eq!(OpenAiFields::new(&[Quota::unlimited()]).len(), 0);
        let mut headers = HeaderMap::new();
        fields.insert(&mut headers, &limits, &[]);
        assert!(headers.is_empty());
    }
}
