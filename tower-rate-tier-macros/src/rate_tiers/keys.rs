//! The keys `#[tier(..)]` knows, how their values are read, and what to say
//! about one it does not.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, Ident, Token};

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

/// `unit = ".."`: the named unit whose bands an attribute gives. Not a
/// [`Key`]: it is read before the other keys, and makes the attribute a unit
/// attribute ([`super::unit`]).
pub(super) const UNIT: &str = "unit";

/// The two kinds of `#[tier(..)]` attribute.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Attr {
    /// Without `unit`: the tier itself and the bands of its requests.
    Requests,
    /// With `unit = ".."`: the bands of a named unit.
    Unit,
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

impl Attr {
    /// The keys this attribute takes, in the order the messages list them.
    fn keys(self) -> impl Iterator<Item = &'static str> {
        KEYS.iter()
            .filter(move |(_, key)| self == Attr::Requests || matches!(key, Key::Band(_)))
            .map(|&(name, _)| name)
            .chain([UNIT])
    }
}

/// The keys `attr` takes, in backticks, for the messages.
fn listed(attr: Attr) -> String {
    let keys: Vec<String> = attr.keys().map(|name| format!("`{name}`")).collect();
    keys.join(", ")
}

/// The message for an unknown key in `attr`: the closest key it takes if
/// one is near enough to be a typo, the way to write any period for another
/// `per_*`, the list of its keys otherwise.
fn unknown(name: &str, attr: Attr) -> String {
    if let Some(known) = closest(name, attr) {
        return format!("unknown key `{name}`; did you mean `{known}`?");
    }
    if name.starts_with("per_") {
        return format!(
            "unknown key `{name}`; for a period without a key of its own, write \
             `count = 100, period_secs = 2_592_000` (100 per 30 days, refilled continuously)"
        );
    }
    format!("unknown key `{name}`; expected one of {}", listed(attr))
}

/// The key of `attr` that `name` was most likely meant to be: within an
/// edit or two (about one in four characters), or one that `name` begins
/// (`period` -> `period_secs`).
fn closest(name: &str, attr: Attr) -> Option<&'static str> {
    let limit = (name.chars().count() / 4).max(1);
    attr.keys()
        .map(|known| (strsim::damerau_levenshtein(name, known), known))
        .filter(|&(distance, known)| distance <= limit || (name.len() >= 3 && known.starts_with(name)))
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, known)| known)
}

/// Reads the keys of one `#[tier(..)]` of kind `attr`: `read` gets each
/// known key but `unit` (read before, by [`super::unit::unit_of`]), and an
/// unknown key is reported with the keys `attr` takes. `false` when a key
/// was left unread: after an unknown key, or a syntax error (reported too).
pub(super) fn read_keys(
    attr: &Attribute,
    kind: Attr,
    errors: &mut Errors,
    mut read: impl FnMut(Ident, Key, &ParseNestedMeta<'_>, &mut Errors) -> syn::Result<()>,
) -> bool {
    let mut complete = true;
    let result = attr.parse_nested_meta(|meta| {
        let Some(key) = meta.path.get_ident().cloned() else {
            skip_value(&meta)?;
            let keys = listed(kind);
            errors.spanned(&meta.path, format_args!("unknown key; expected one of {keys}"));
            complete = false;
            return Ok(());
        };
        let name = key.to_string();
        if name == UNIT {
            skip_value(&meta)?;
            return Ok(());
        }
        let Some(known) = Key::from_name(&name) else {
            skip_value(&meta)?;
            errors.spanned(&key, unknown(&name, kind));
            complete = false;
            return Ok(());
        };
        read(key, known, &meta, errors)
    });
    if let Err(error) = result {
        errors.push(error);
        complete = false;
    }
    complete
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
            assert_eq!(closest(typo, Attr::Requests), Some(meant), "{typo}");
            assert_eq!(
                unknown(typo, Attr::Requests),
                format!("unknown key `{typo}`; did you mean `{meant}`?")
            );
        }
    }

    #[test]
    fn unrelated_keys_get_the_list() {
        for name in ["colour", "rate", "max", "limit", "x"] {
            assert_eq!(closest(name, Attr::Requests), None, "{name}");
            assert!(
                unknown(name, Attr::Requests).ends_with("`name`, `default`, `shadow`, `unit`"),
                "{name}"
            );
        }
    }

    #[test]
    fn another_period_gets_count_and_period_secs() {
        for name in ["per_month", "per_year", "per_fortnight"] {
            assert_eq!(closest(name, Attr::Requests), None, "{name}");
            assert!(
                unknown(name, Attr::Requests).contains("`count = 100, period_secs = 2_592_000`"),
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
        // `unit` selects the attribute; it is no `Key`.
        assert_eq!(Key::from_name(UNIT), None);
    }

    #[test]
    fn a_unit_attribute_lists_and_suggests_its_own_keys() {
        assert_eq!(
            listed(Attr::Unit),
            "`per_second`, `per_minute`, `per_hour`, `per_day`, `per_week`, `count`, `period_secs`, `burst`, `unit`"
        );
        assert_eq!(closest("unti", Attr::Requests), Some("unit"));
        assert_eq!(closest("per_minut", Attr::Unit), Some("per_minute"));
        // Keys of the request attribute are not suggested in a unit's.
        assert_eq!(closest("defualt", Attr::Requests), Some("default"));
        assert_eq!(closest("defualt", Attr::Unit), None);
    }
}
