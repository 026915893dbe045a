//! The rules of `#[rate_tiers]` that span several keys or variants.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use quote::ToTokens;

use super::ast::{Input, Tier, Variant};
use super::bands::{Bands, MAX_PERIOD_SECS, Period};
use super::unit::{UnitLimit, unit_id};
use crate::errors::Errors;

/// The longest tier name the runtime accepts, in bytes.
const MAX_NAME_LEN: usize = 255;

/// The longest unit name the runtime accepts, in bytes.
const MAX_UNIT_LEN: usize = 24;

/// The most request bands a tier has (the runtime's `MAX_REQUEST_BANDS`).
const MAX_REQUEST_BANDS: usize = 4;

/// The most bands a tier's requests and units have together (the
/// runtime's `storage::MAX_BANDS`).
const MAX_BANDS: usize = 8;

/// The character that separates a tier's name from its customers' own
/// quotas in storage (the runtime's `tier::OWN_QUOTAS_SEPARATOR`).
const OWN_QUOTAS_SEPARATOR: char = '\u{1f}';

/// The unit names the runtime keeps for itself, and what to write instead.
const RESERVED_UNITS: [(&str, &str); 3] = [
    (
        "requests",
        "requests are limited by the tier's attribute without `unit`",
    ),
    (
        "concurrent-requests",
        "`concurrent = n` on the tier's attribute without `unit` limits requests in flight",
    ),
    (
        "concurrency",
        "`concurrent = n` on the tier's attribute without `unit` limits requests in flight (its item is named `<tier>.concurrency`)",
    ),
];

impl Input {
    /// Reports every broken rule to `errors`.
    pub(super) fn validate(&self, errors: &mut Errors) {
        let generics = &self.item.generics;
        if !generics.params.is_empty() || generics.where_clause.is_some() {
            errors.spanned(generics, "a `#[rate_tiers]` enum cannot be generic");
        }
        if self.variants.is_empty() {
            errors.spanned(
                &self.item.ident,
                "a `#[rate_tiers]` enum needs at least one variant",
            );
        }

        let mut names: HashMap<String, &Variant> = HashMap::new();
        let mut default: Option<&Variant> = None;
        for variant in &self.variants {
            variant.validate(errors);
            let Some(tier) = &variant.tier else { continue };

            let name = variant.tier_name();
            if let Some(first) = names.get(&name) {
                let message = format!("tier name `{name}` is already used by `{}`", first.ident);
                match &tier.name {
                    Some(lit) => errors.spanned(lit, message),
                    None => errors.spanned(&variant.ident, message),
                }
            } else {
                names.insert(name, variant);
            }

            if let Some(key) = &tier.default {
                match default {
                    Some(first) => errors.spanned(
                        key,
                        format_args!("only one tier can be the `default`; `{}` already is", first.ident),
                    ),
                    None => default = Some(variant),
                }
            }
        }
    }
}

impl Variant {
    fn validate(&self, errors: &mut Errors) {
        if let Some(fields) = &self.fields {
            errors.spanned(
                fields,
                format_args!("a tier is a unit variant: `{}` cannot carry data", self.ident),
            );
        }
        match &self.tier {
            Some(tier) => tier.validate(errors),
            None if self.units.is_empty() => errors.spanned(
                &self.ident,
                format_args!(
                    "variant `{}` has no `#[tier(..)]` attribute; add one, e.g. `#[tier(per_hour = 100)]` or `#[tier(unlimited)]`",
                    self.ident
                ),
            ),
            None => errors.spanned(
                &self.ident,
                format_args!(
                    "variant `{}` has only unit attributes; add a `#[tier(..)]` without `unit` for its requests, \
                     e.g. `#[tier(per_hour = 100)]` or `#[tier(unlimited)]`",
                    self.ident
                ),
            ),
        }

        let requests = self
            .tier
            .as_ref()
            .filter(|tier| tier.unlimited.is_none())
            .map_or(0, |tier| tier.bands.list.len());
        let total = requests + self.units.iter().map(|u| u.bands.list.len()).sum::<usize>();
        if total > MAX_BANDS && requests <= MAX_REQUEST_BANDS {
            errors.spanned(
                &self.ident,
                format_args!(
                    "`{}` has {total} bands with its units; a tier has at most {MAX_BANDS} in all",
                    self.ident
                ),
            );
        }

        let mut units = HashSet::new();
        let mut ids: HashMap<u32, String> = HashMap::new();
        for unit in &self.units {
            unit.validate(errors);
            let (Some(lit), Some(name)) = (&unit.unit, unit.name()) else {
                continue;
            };
            // A wrong name is reported already; a repeated one just below.
            if unit_name_problem(&name).is_none() {
                match ids.entry(unit_id(&name)) {
                    Entry::Occupied(other) if *other.get() != name => errors.spanned(
                        lit,
                        format_args!(
                            "units `{}` and `{name}` of `{}` have the same id (a hash collision: their state \
                             would be shared); rename one",
                            other.get(),
                            self.ident
                        ),
                    ),
                    Entry::Occupied(_) => {}
                    Entry::Vacant(slot) => {
                        slot.insert(name.clone());
                    }
                }
            }
            if units.contains(&name) {
                errors.spanned(
                    lit,
                    format_args!(
                        "unit `{}` specified more than once on `{}`; put its bands in one `#[tier(unit = {}, ..)]`",
                        name.escape_debug(),
                        self.ident,
                        lit.to_token_stream()
                    ),
                );
            } else {
                units.insert(name);
            }
        }
    }
}

impl Tier {
    fn validate(&self, errors: &mut Errors) {
        self.bands.validate("requests", errors);
        let bands = &self.bands.list;
        if let Some(unlimited) = &self.unlimited {
            if !bands.is_empty() {
                let bands: Vec<String> = bands.iter().map(|band| format!("`{}`", band.key)).collect();
                errors.spanned(
                    unlimited,
                    format_args!(
                        "`unlimited` cannot be combined with a band ({})",
                        bands.join(", ")
                    ),
                );
            }
            if let Some(burst) = &self.bands.burst {
                errors.spanned(&burst.key, "`burst` does not apply to an `unlimited` tier");
            }
        } else if bands.is_empty() {
            if !self.incomplete && !self.bands.unpaired() {
                errors.spanned(
                    &self.tokens,
                    "a tier needs `unlimited` or at least one band: `per_second`, `per_minute`, `per_hour`, \
                     `per_day`, `per_week`, or `count` with `period_secs`",
                );
            }
        } else if bands.len() > MAX_REQUEST_BANDS {
            errors.spanned(
                &self.tokens,
                format_args!(
                    "a tier has at most {MAX_REQUEST_BANDS} request bands; this one has {}",
                    bands.len()
                ),
            );
        } else if let Some(burst) = self.bands.burst.as_ref().filter(|_| bands.len() > 1) {
            errors.spanned(
                &burst.key,
                format_args!(
                    "`burst` applies to one-band tiers only; this tier has {} bands",
                    bands.len()
                ),
            );
        }

        if let Some(concurrent) = self.concurrent.as_ref().filter(|c| c.value.is_zero_literal()) {
            errors.at(
                concurrent.value.span(),
                "`concurrent` must be at least 1: a limit of 0 requests in flight admits nothing",
            );
        }
        if let Some(name) = &self.name {
            let len = name.value().len();
            if len == 0 || len > MAX_NAME_LEN {
                errors.spanned(
                    name.to_token_stream(),
                    format_args!("a tier name is 1 to {MAX_NAME_LEN} bytes long"),
                );
            } else if name.value().contains(OWN_QUOTAS_SEPARATOR) {
                errors.spanned(
                    name.to_token_stream(),
                    "a tier name cannot hold U+001F: it separates a tier's name from the storage name of \
                     its customers' own quotas",
                );
            }
        }
    }
}

impl UnitLimit {
    fn validate(&self, errors: &mut Errors) {
        if let Some(lit) = &self.unit {
            if let Some(problem) = unit_name_problem(&lit.value()) {
                errors.spanned(lit, problem);
            }
        }
        let name = self.name().map(|name| name.escape_debug().to_string());
        self.bands.validate(name.as_deref().unwrap_or("units"), errors);
        let whose = match &name {
            Some(name) => format!("unit `{name}`"),
            None => "a unit".to_owned(),
        };
        let bands = &self.bands.list;
        if bands.is_empty() {
            if !self.incomplete && !self.bands.unpaired() {
                errors.spanned(
                    &self.tokens,
                    format_args!(
                        "{whose} needs at least one band: `per_second`, `per_minute`, `per_hour`, `per_day`, \
                         `per_week`, or `count` with `period_secs`"
                    ),
                );
            }
        } else if let Some(burst) = self.bands.burst.as_ref().filter(|_| bands.len() > 1) {
            errors.spanned(
                &burst.key,
                format_args!(
                    "`burst` applies to one-band units only; {whose} has {} bands",
                    bands.len()
                ),
            );
        }
    }
}

/// What is wrong with a unit name, if anything: it is reserved, or not 1 to
/// 24 bytes of `a`-`z`, `0`-`9`, `-` and `_` that start with a letter.
fn unit_name_problem(name: &str) -> Option<String> {
    if let Some((_, instead)) = RESERVED_UNITS.iter().find(|(reserved, _)| *reserved == name) {
        return Some(format!("unit `{name}` is reserved: {instead}"));
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    let rule = format!(
        "a unit name is 1 to {MAX_UNIT_LEN} bytes of lowercase ASCII letters, digits, `-` and `_`, \
         starting with a letter"
    );
    if name.is_empty() {
        return Some(format!("empty unit name: {rule}"));
    }
    let problem = if name.len() > MAX_UNIT_LEN {
        format!("it is {} bytes long", name.len())
    } else if let Some(c) = name.chars().find(|&c| !allowed(c)) {
        format!("`{}` is not allowed", c.escape_debug())
    } else if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        "it does not start with a lowercase letter".to_owned()
    } else {
        return None;
    };
    Some(format!(
        "invalid unit name `{}` ({problem}): {rule}",
        name.escape_debug()
    ))
}

impl Bands {
    /// The rules of the bands alone: literal zeros and periods too long (a
    /// `const` that is either is the generated code's to report), and
    /// `count` with `period_secs`.
    /// `counted` is what a band counts, for the messages: `requests`,
    /// `tokens`.
    fn validate(&self, counted: &str, errors: &mut Errors) {
        let counts = self.list.iter().map(|band| (&band.key, &band.count));
        let unpaired = self.count.iter().map(|count| (&count.key, &count.value));
        for (key, count) in counts.chain(unpaired) {
            if count.is_zero_literal() {
                errors.at(
                    count.span(),
                    format_args!("`{key}` must be at least 1: a zero count admits nothing"),
                );
            }
        }
        let periods = self.list.iter().filter_map(|band| match &band.period {
            Period::Secs(period) => Some(period),
            Period::Named(_) => None,
        });
        for period in periods.chain(&self.period_secs) {
            if period.value.is_zero_literal() {
                errors.at(
                    period.value.span(),
                    "`period_secs` must be at least 1: a quota needs a non-zero period",
                );
            } else if period.value.literal().is_some_and(|secs| secs > MAX_PERIOD_SECS) {
                errors.at(
                    period.value.span(),
                    format_args!(
                        "`period_secs` must be at most {MAX_PERIOD_SECS} (about 584 years): a quota's period is \
                         counted in `u64` nanoseconds"
                    ),
                );
            }
        }
        if let Some(burst) = self.burst.as_ref().filter(|burst| burst.value.is_zero_literal()) {
            errors.at(
                burst.value.span(),
                "`burst` must be at least 1: a zero burst admits nothing",
            );
        }
        if let Some(count) = &self.count {
            errors.spanned(
                &count.key,
                format_args!(
                    "`count` needs `period_secs`: `count = 50, period_secs = 900` is 50 {counted} per 900 seconds"
                ),
            );
        }
        if let Some(period) = &self.period_secs {
            errors.spanned(
                &period.key,
                format_args!(
                    "`period_secs` needs `count`: `count = 50, period_secs = 900` is 50 {counted} per 900 seconds"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_as_the_runtime_takes_them() {
        for good in [
            "tokens",
            "content-bytes",
            "images_v2",
            "a",
            "a-twenty-four-byte-unit_",
        ] {
            assert_eq!(unit_name_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "requests",
            "concurrent-requests",
            "concurrency",
            "Tokens",
            "2fa",
            "-tokens",
            "_tokens",
            "content bytes",
            "tökens",
            "a-twenty-five-bytes-unit_",
        ] {
            assert!(unit_name_problem(bad).is_some(), "{bad}");
        }
    }
}
