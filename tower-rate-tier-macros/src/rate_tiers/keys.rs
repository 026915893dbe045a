//! The keys `#[tier(..)]` knows, how their values are read, and what to say
//! about one it does not.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Expr, Ident, Token};

use crate::errors::Errors;

/// A key of `#[tier(..)]`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Key {
    /// A key of the tier's bands.
    Band(BandKey),
    Unlimited,
    Name,
    Default,
    Shadow,
    /// `concurrent = n`: at most `n` requests of one user in flight.
    Concurrent,
}

/// A key that [`Bands`](super::bands::Bands) reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum BandKey {
    /// `per_second = n` and the other fixed periods.
    Named(NamedPeriod),
    /// `count = n`, the count of a band with `period_secs`.
    Count,
    /// `period_secs = s`, the period of a band with `count`.
    PeriodSecs,
    Burst,
}

/// A period that has its own key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum NamedPeriod {
    Second,
    Minute,
    Hour,
    Day,
    Week,
}

/// Every key, in the order the messages list them.
const KEYS: [(&str, Key); 13] = [
    ("per_second", Key::Band(BandKey::Named(NamedPeriod::Second))),
    ("per_minute", Key::Band(BandKey::Named(NamedPeriod::Minute))),
    ("per_hour", Key::Band(BandKey::Named(NamedPeriod::Hour))),
    ("per_day", Key::Band(BandKey::Named(NamedPeriod::Day))),
    ("per_week", Key::Band(BandKey::Named(NamedPeriod::Week))),
    ("count", Key::Band(BandKey::Count)),
    ("period_secs", Key::Band(BandKey::PeriodSecs)),
    ("unlimited", Key::Unlimited),
    ("burst", Key::Band(BandKey::Burst)),
    ("concurrent", Key::Concurrent),
    ("name", Key::Name),
    ("default", Key::Default),
    ("shadow", Key::Shadow),
];

impl Key {
    pub(super) fn from_name(name: &str) -> Option<Key> {
        KEYS.iter().find(|(known, _)| *known == name).map(|&(_, key)| key)
    }
}

impl NamedPeriod {
    /// The `Quota` constructor of this period, which is also its key.
    pub(super) fn constructor(self) -> &'static str {
        match self {
            NamedPeriod::Second => "per_second",
            NamedPeriod::Minute => "per_minute",
            NamedPeriod::Hour => "per_hour",
            NamedPeriod::Day => "per_day",
            NamedPeriod::Week => "per_week",
        }
    }
}

/// Every key, in backticks, for the messages.
pub(super) fn listed() -> String {
    let keys: Vec<String> = KEYS.iter().map(|(name, _)| format!("`{name}`")).collect();
    keys.join(", ")
}

/// The message for an unknown key: the closest known key if one is near
/// enough to be a typo, the way to write any period for another `per_*`,
/// the list of keys otherwise.
pub(super) fn unknown(name: &str) -> String {
    if let Some(known) = closest(name) {
        return format!("unknown key `{name}`; did you mean `{known}`?");
    }
    if name.starts_with("per_") {
        return format!(
            "unknown key `{name}`; for a period without a key of its own, write \
             `count = 100, period_secs = 2_592_000` (100 per 30 days, refilled continuously)"
        );
    }
    format!("unknown key `{name}`; expected one of {}", listed())
}

/// The known key `name` was most likely meant to be: within an edit or two
/// (about one in four characters), or one that `name` begins
/// (`period` -> `period_secs`).
fn closest(name: &str) -> Option<&'static str> {
    let limit = (name.chars().count() / 4).max(1);
    KEYS.iter()
        .map(|&(known, _)| (strsim::damerau_levenshtein(name, known), known))
        .filter(|&(distance, known)| distance <= limit || (name.len() >= 3 && known.starts_with(name)))
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, known)| known)
}

/// The `= value` of a key that needs one; a missing value is reported (and
/// `None` returned) without stopping the parsing.
pub(super) fn value_of(
    key: &Ident,
    meta: &ParseNestedMeta<'_>,
    form: &str,
    errors: &mut Errors,
) -> syn::Result<Option<Expr>> {
    if meta.input.peek(Token![=]) {
        meta.input.parse::<Token![=]>()?;
        return meta.input.parse::<Expr>().map(Some);
    }
    let wrong = skip_value(meta)?;
    let what = wrong.as_ref().map_or(key.span(), Spanned::span);
    errors.at(what, format_args!("`{key}` needs a value: `{form}`"));
    Ok(None)
}

/// Consumes whatever value follows a key (`= expr` or `(..)`), returning its
/// tokens, so that parsing can go on after a wrong key.
pub(super) fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<Option<TokenStream>> {
    let input = meta.input;
    if input.peek(Token![=]) {
        let eq: Token![=] = input.parse()?;
        let expr: Expr = input.parse()?;
        let mut tokens = eq.to_token_stream();
        expr.to_tokens(&mut tokens);
        Ok(Some(tokens))
    } else if input.peek(syn::token::Paren) {
        let group: proc_macro2::Group = input.parse()?;
        Ok(Some(group.into_token_stream()))
    } else {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_a_suggestion() {
        let cases = [
            ("per_minut", "per_minute"),
            ("per_hours", "per_hour"),
            ("per_weak", "per_week"),
            ("burts", "burst"),
            ("defualt", "default"),
            ("unlimted", "unlimited"),
            ("period", "period_secs"),
            ("period_sec", "period_secs"),
            ("counts", "count"),
            ("per_sec", "per_second"),
        ];
        for (typo, meant) in cases {
            assert_eq!(closest(typo), Some(meant), "{typo}");
            assert_eq!(
                unknown(typo),
                format!("unknown key `{typo}`; did you mean `{meant}`?")
            );
        }
    }

    #[test]
    fn unrelated_keys_get_the_list() {
        for name in ["colour", "rate", "max", "limit", "x"] {
            assert_eq!(closest(name), None, "{name}");
            assert!(unknown(name).ends_with("`name`, `default`, `shadow`"), "{name}");
        }
    }

    #[test]
    fn another_period_gets_count_and_period_secs() {
        for name in ["per_month", "per_year", "per_fortnight"] {
            assert_eq!(closest(name), None, "{name}");
            assert!(
                unknown(name).contains("`count = 100, period_secs = 2_592_000`"),
                "{name}"
            );
        }
    }

    #[test]
    fn every_key_is_found_by_its_name() {
        for (name, key) in KEYS {
            assert_eq!(Key::from_name(name), Some(key));
            if let Key::Band(BandKey::Named(period)) = key {
                assert_eq!(period.constructor(), name);
            }
        }
        assert_eq!(Key::from_name("per_month"), None);
    }
}
