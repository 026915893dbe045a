//! The rules of `#[rate_tiers]` that span several keys or variants.

use std::collections::HashMap;

use quote::ToTokens;

use super::ast::{Input, Tier, Variant};
use super::bands::{Bands, Period};
use crate::errors::Errors;

/// The longest tier name the runtime accepts, in bytes.
const MAX_NAME_LEN: usize = 255;

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
            None => errors.spanned(
                &self.ident,
                format_args!(
                    "variant `{}` has no `#[tier(..)]` attribute; add one, e.g. `#[tier(per_hour = 100)]` or `#[tier(unlimited)]`",
                    self.ident
                ),
            ),
        }
    }
}

impl Tier {
    fn validate(&self, errors: &mut Errors) {
        self.bands.validate(errors);
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
            }
        }
    }
}

impl Bands {
    /// The rules of the bands alone: literal zeros (a `const` that is zero
    /// is the generated code's to report), and `count` with `period_secs`.
    fn validate(&self, errors: &mut Errors) {
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
                "`count` needs `period_secs`: `count = 50, period_secs = 900` is 50 requests per 900 seconds",
            );
        }
        if let Some(period) = &self.period_secs {
            errors.spanned(
                &period.key,
                "`period_secs` needs `count`: `count = 50, period_secs = 900` is 50 requests per 900 seconds",
            );
        }
    }
}
