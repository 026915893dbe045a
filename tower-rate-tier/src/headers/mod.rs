//! The values of the rate-limit header fields.
//!
//! What depends only on a tier (its `RateLimit-Policy`, each band's
//! `X-RateLimit-Limit`, the item names of `RateLimit`, the names of its
//! OpenAI-style fields) is rendered once when the tier is built
//! ([`TierHeaders`]); the numbers that change with every decision are
//! written with `itoa` into a stack buffer.

mod openai;

use http::header::{HeaderName, HeaderValue};

pub use self::openai::{
    X_RATELIMIT_LIMIT_REQUESTS, X_RATELIMIT_REMAINING_REQUESTS, X_RATELIMIT_RESET_REQUESTS,
};
use crate::quota::Quota;
use crate::storage::BandState;

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (IETF draft).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which rate-limit fields responses carry: see
/// `TierLimitLayer::headers`. A 429 always carries `Retry-After` and its
/// body, whatever the choice.
///
/// Sets combine with [`union`](Self::union):
///
/// ```
/// use tower_rate_tier::RateLimitHeaders;
///
/// const FIELDS: RateLimitHeaders = RateLimitHeaders::ALL.union(RateLimitHeaders::OPENAI);
/// assert!(FIELDS.legacy() && FIELDS.ietf() && FIELDS.openai());
/// assert!(!RateLimitHeaders::ALL.openai());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimitHeaders {
    legacy: bool,
    ietf: bool,
    openai: bool,
}

impl RateLimitHeaders {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` and the IETF
    /// `RateLimit-Policy` and `RateLimit` (the default). The OpenAI-style
    /// fields are not among them: add them with
    /// `ALL.union(RateLimitHeaders::OPENAI)`.
    pub const ALL: RateLimitHeaders = RateLimitHeaders {
        legacy: true,
        ietf: true,
        openai: false,
    };
    /// The IETF `RateLimit-Policy` and `RateLimit` only.
    pub const IETF: RateLimitHeaders = RateLimitHeaders {
        legacy: false,
        ietf: true,
        openai: false,
    };
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` only.
    pub const LEGACY: RateLimitHeaders = RateLimitHeaders {
        legacy: true,
        ietf: false,
        openai: false,
    };
    /// OpenAI-style fields only, for clients written against OpenAI's API:
    /// `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests` and
    /// `x-ratelimit-reset-requests` for the request bands, and the same
    /// for each unit with the unit's name as suffix
    /// (`x-ratelimit-remaining-tokens`). The reset is the time until the
    /// band is full again, as a duration in OpenAI's format (`1s`, `6m0s`,
    /// `20ms`), rounded up to the millisecond. Each group reports one band:
    /// the one that refused longest, or else the one closest to denying.
    /// See the [`response`](crate::response) module.
    pub const OPENAI: RateLimitHeaders = RateLimitHeaders {
        legacy: false,
        ietf: false,
        openai: true,
    };
    /// No rate-limit fields.
    pub const NONE: RateLimitHeaders = RateLimitHeaders {
        legacy: false,
        ietf: false,
        openai: false,
    };

    /// The fields of both `self` and `other`.
    #[must_use]
    pub const fn union(self, other: RateLimitHeaders) -> RateLimitHeaders {
        RateLimitHeaders {
            legacy: self.legacy || other.legacy,
            ietf: self.ietf || other.ietf,
            openai: self.openai || other.openai,
        }
    }

    /// Whether the `X-RateLimit-*` fields are sent.
    pub const fn legacy(self) -> bool {
        self.legacy
    }

    /// Whether the IETF `RateLimit-Policy` and `RateLimit` fields are sent.
    pub const fn ietf(self) -> bool {
        self.ietf
    }

    /// Whether the OpenAI-style `x-ratelimit-*-requests` and
    /// `x-ratelimit-*-<unit>` fields are sent.
    pub const fn openai(self) -> bool {
        self.openai
    }
}

impl Default for RateLimitHeaders {
    fn default() -> Self {
        RateLimitHeaders::ALL
    }
}

/// The header values of one tier that do not change between decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TierHeaders {
    /// `RateLimit-Policy`: every band's item, then the concurrency item.
    pub(crate) policy: Option<HeaderValue>,
    /// `X-RateLimit-Limit` of each band: its burst.
    pub(crate) limits: Box<[HeaderValue]>,
    /// Each band's `RateLimit` item name as an RFC 8941 string (`"free"`,
    /// or `"free.0"` in a multi-band tier).
    items: Box<[Box<str>]>,
    /// Each band's item name as a Structured Fields parser decodes it from
    /// `items` (no quotes, no escapes): what a 429 body's
    /// `violated-policies` lists.
    pub(crate) names: Box<[Box<str>]>,
    /// The concurrency limit's item, when the tier has one.
    pub(crate) slots: Option<SlotItem>,
    /// The names of the OpenAI-style fields of the request bands and of
    /// each unit.
    pub(crate) openai: openai::OpenAiFields,
}

/// The `RateLimit-Policy` item of a tier's concurrency limit
/// (`"free.concurrency";q=2;qu="concurrent-requests"`): its name and limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotItem {
    /// The item name as an RFC 8941 string.
    item: Box<str>,
    /// The item name as a parser decodes it.
    pub(crate) name: Box<str>,
    /// The limit, as `X-RateLimit-Limit` of a concurrency refusal.
    pub(crate) limit: HeaderValue,
}

/// The quota unit the draft registers for a concurrency limit.
pub(crate) const CONCURRENT_REQUESTS: &str = "concurrent-requests";

impl TierHeaders {
    /// The values of the tier `name` with `bands` (none shown when they are
    /// unlimited) and at most `concurrency` requests of a user in flight.
    ///
    /// `bands` are the bands a decision of the tier is over: its request
    /// bands, then its units' bands (see [`Quota::unit`]). A unit's items
    /// are named for the tier and the unit (`free.tokens`, or
    /// `free.tokens.0`, `free.tokens.1` for a unit of several bands); the
    /// unit the draft registers for bytes of content carries
    /// `qu="content-bytes"`, any other unit is named in the item name only.
    pub(crate) fn new(name: &str, bands: &[Quota], concurrency: Option<u32>) -> Self {
        let names: Box<[Box<str>]> = bands
            .iter()
            .enumerate()
            .map(|(i, quota)| {
                let unit = quota.unit();
                let same = |q: &&Quota| q.unit() == unit;
                let index = bands[..i].iter().filter(same).count();
                let count = bands.iter().filter(same).count();
                let mut item = policy_name(name);
                if !unit.is_requests() {
                    item.push('.');
                    item.push_str(unit.as_str());
                }
                if count > 1 {
                    item.push('.');
                    item.push_str(itoa::Buffer::new().format(index));
                }
                item.into_boxed_str()
            })
            .collect();
        let items: Box<[Box<str>]> = names.iter().map(|name| sf_string(name)).collect();
        let mut policy = String::with_capacity(32);
        if !bands.iter().any(Quota::is_unlimited) {
            for (i, (quota, item)) in bands.iter().zip(&items).enumerate() {
                if i > 0 {
                    policy.push_str(", ");
                }
                policy.push_str(item);
                policy.push_str(";q=");
                policy.push_str(itoa::Buffer::new().format(quota.burst()));
                policy.push_str(";w=");
                policy.push_str(itoa::Buffer::new().format(quota.window_secs().min(SF_INTEGER_MAX)));
                if quota.unit().is_content_bytes() {
                    policy.push_str(";qu=\"");
                    policy.push_str(crate::quota::CONTENT_BYTES);
                    policy.push('"');
                }
            }
        }
        let slots = concurrency.map(|limit| {
            let mut name = policy_name(name);
            name.push_str(".concurrency");
            let item = sf_string(&name);
            if !policy.is_empty() {
                policy.push_str(", ");
            }
            policy.push_str(&item);
            policy.push_str(";q=");
            policy.push_str(itoa::Buffer::new().format(limit));
            policy.push_str(";qu=\"");
            policy.push_str(CONCURRENT_REQUESTS);
            policy.push('"');
            SlotItem {
                item,
                name: name.into_boxed_str(),
                limit: number(u64::from(limit)),
            }
        });
        TierHeaders {
            policy: (!policy.is_empty())
                .then(|| HeaderValue::try_from(policy).ok())
                .flatten(),
            limits: bands.iter().map(|q| number(u64::from(q.burst()))).collect(),
            items,
            names,
            slots,
            openai: openai::OpenAiFields::new(bands),
        }
    }

    /// The `RateLimit` value for the bands' states after a decision that
    /// `allowed` or not, and the concurrency limit's free slots, written
    /// into a stack buffer first so that the value is one allocation of its
    /// exact size.
    ///
    /// `t` is the draft's "seconds until additional quota is made
    /// available" ([`t_secs`]); an item without one has none. The
    /// concurrency item never has one: a slot comes free when a request
    /// ends, which no clock tells.
    pub(crate) fn ratelimit(
        &self,
        states: &[BandState],
        allowed: bool,
        free: Option<u32>,
    ) -> Option<HeaderValue> {
        let mut out = Stack::default();
        for (i, (state, item)) in states.iter().zip(&self.items).enumerate() {
            if i > 0 {
                out.push(b", ");
            }
            out.push(item.as_bytes());
            out.push(b";r=");
            out.push(itoa::Buffer::new().format(state.remaining).as_bytes());
            if let Some(t) = t_secs(state, allowed) {
                out.push(b";t=");
                out.push(itoa::Buffer::new().format(t).as_bytes());
            }
        }
        if let (Some(slots), Some(free)) = (&self.slots, free) {
            if !out.as_bytes().is_empty() {
                out.push(b", ");
            }
            out.push(slots.item.as_bytes());
            out.push(b";r=");
            out.push(itoa::Buffer::new().format(free).as_bytes());
        }
        if out.as_bytes().is_empty() {
            return None;
        }
        HeaderValue::from_bytes(out.as_bytes()).ok()
    }
}

/// The largest Integer a Structured Field holds (RFC 9651: at most 15
/// digits). A window longer than that (31.7 million years: a burst in the
/// billions of a yearly quota) is written as this, since a parser rejects
/// the whole field for one longer Integer.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// A band's `t` (whole seconds, rounded up, at least 1) after a decision
/// that `allowed` the request or not: until the band has more quota than now
/// when admitted (none when it is full); until the request would fit when
/// this band denied it; none for a band that did not deny a denied request
/// (the draft makes `t` optional, and a daily band's next unit can be much
/// later than the `Retry-After` its per-second band gives).
pub(crate) fn t_secs(state: &BandState, allowed: bool) -> Option<u64> {
    let nanos = if allowed {
        state.more_after_ns
    } else {
        state.retry_after_ns
    };
    (nanos > 0).then(|| secs_ceil(nanos).max(1))
}

/// A header value being written: on the stack while it fits (every value
/// but those of very long tier names), then on the heap.
#[derive(Default)]
struct Stack {
    inline: arrayvec::ArrayVec<u8, 128>,
    heap: Vec<u8>,
}

impl Stack {
    fn push(&mut self, bytes: &[u8]) {
        if self.heap.is_empty() && self.inline.try_extend_from_slice(bytes).is_ok() {
            return;
        }
        if self.heap.is_empty() {
            self.heap.extend_from_slice(&self.inline);
        }
        self.heap.extend_from_slice(bytes);
    }

    fn as_bytes(&self) -> &[u8] {
        if self.heap.is_empty() {
            &self.inline
        } else {
            &self.heap
        }
    }
}

/// Whole seconds, rounded up.
pub(crate) fn secs_ceil(nanos: u64) -> u64 {
    nanos.div_ceil(1_000_000_000)
}

/// A number as a header value (its digits written by `itoa` on the stack,
/// then one allocation of their size).
pub(crate) fn number(n: u64) -> HeaderValue {
    let mut digits = itoa::Buffer::new();
    HeaderValue::from_bytes(digits.format(n).as_bytes()).unwrap_or_else(|_| HeaderValue::from(n))
}

/// The tier's part of its items' names: its name, with every character a
/// Structured Fields string cannot hold (anything but printable ASCII)
/// replaced by `?`.
pub(crate) fn policy_name(tier: &str) -> String {
    tier.chars()
        .map(|c| if matches!(c, ' '..='~') { c } else { '?' })
        .collect()
}

/// [`push_sf_string`] into a string of its own.
fn sf_string(name: &str) -> Box<str> {
    let mut item = String::with_capacity(name.len() + 2);
    push_sf_string(&mut item, name);
    item.into_boxed_str()
}

/// A tier name as an RFC 8941 string: printable ASCII, with `"` and `\`
/// escaped; anything else becomes `?`.
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sf_strings_are_escaped() {
        let mut s = String::new();
        push_sf_string(&mut s, "a\"b\\c\u{e9}\n");
        assert_eq!(s, r#""a\"b\\c??""#);
    }

    #[test]
    fn tier_values_are_rendered_once() {
        let h = TierHeaders::new("free", &[Quota::per_second(5), Quota::per_day(100)], None);
        assert_eq!(
            h.policy.as_ref().map(|v| v.to_str().unwrap_or_default()),
            Some(r#""free.0";q=5;w=1, "free.1";q=100;w=86400"#)
        );
        assert_eq!(h.limits[1], "100");
        let states = [
            BandState {
                remaining: 4,
                reset_after_ns: 1,
                retry_after_ns: 0,
                more_after_ns: 1,
                ..BandState::default()
            },
            BandState {
                remaining: 100,
                reset_after_ns: 0,
                retry_after_ns: 0,
                more_after_ns: 0,
                ..BandState::default()
            },
        ];
        // a full band has no `t`
        assert_eq!(
            h.ratelimit(&states, true, None).unwrap(),
            r#""free.0";r=4;t=1, "free.1";r=100"#
        );
        assert_eq!(&*h.names[1], "free.1");
        // on a denial only the band that denied has a `t`
        let denied = [
            BandState {
                remaining: 0,
                reset_after_ns: 1_000_000_000,
                retry_after_ns: 200_000_000,
                more_after_ns: 200_000_000,
                ..BandState::default()
            },
            BandState {
                remaining: 90,
                reset_after_ns: 10 * 864_000_000_000,
                retry_after_ns: 0,
                more_after_ns: 864_000_000_000,
                ..BandState::default()
            },
        ];
        assert_eq!(
            h.ratelimit(&denied, false, None).unwrap(),
            r#""free.0";r=0;t=1, "free.1";r=90"#
        );
    }

    #[test]
    fn a_concurrency_limit_is_its_own_item() {
        let h = TierHeaders::new("free", &[Quota::per_minute(20)], Some(2));
        assert_eq!(
            h.policy.as_ref().map(|v| v.to_str().unwrap_or_default()),
            Some(r#""free";q=20;w=60, "free.concurrency";q=2;qu="concurrent-requests""#)
        );
        let state = BandState {
            remaining: 19,
            reset_after_ns: 3_000_000_000,
            retry_after_ns: 0,
            more_after_ns: 3_000_000_000,
            ..BandState::default()
        };
        assert_eq!(
            h.ratelimit(&[state], true, Some(1)).unwrap(),
            r#""free";r=19;t=3, "free.concurrency";r=1"#
        );
        // a refusal by concurrency reports the concurrency item only
        assert_eq!(
            h.ratelimit(&[], false, Some(0)).unwrap(),
            r#""free.concurrency";r=0"#
        );
        // an unlimited tier shows its concurrency limit alone
        let h = TierHeaders::new("team", &[Quota::unlimited()], Some(100));
        assert_eq!(
            h.policy.as_ref().map(|v| v.to_str().unwrap_or_default()),
            Some(r#""team.concurrency";q=100;qu="concurrent-requests""#)
        );
    }

    #[test]
    fn policy_names_are_what_a_parser_decodes() {
        let h = TierHeaders::new("fr\"e\\e\u{e9}", &[Quota::per_second(1)], None);
        assert_eq!(&*h.names[0], "fr\"e\\e?");
        assert_eq!(
            h.policy.as_ref().map(|v| v.to_str().unwrap_or_default()),
            Some(r#""fr\"e\\e?";q=1;w=1"#)
        );
    }
}
