//! The enum and its `#[tier(..)]` attributes, parsed into small structs.
//!
//! Parsing records what each attribute says and reports what cannot be
//! represented (unknown or repeated keys, values of the wrong kind, counts
//! beyond `u32`); rules between keys and variants are [`super::valid`]'s.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Fields, Ident, ItemEnum, Lit, LitStr, Token, Variant as SynVariant};

use super::keys::{self, Key, NamedPeriod};
use super::number::Number;
use crate::errors::Errors;

/// A `#[rate_tiers]` enum.
pub(super) struct Input {
    /// The enum as it will be emitted: `#[tier]` attributes removed.
    pub(super) item: ItemEnum,
    pub(super) variants: Vec<Variant>,
}

/// One variant.
pub(super) struct Variant {
    pub(super) ident: Ident,
    /// Its `#[cfg(..)]` attributes, repeated on every generated use of it.
    pub(super) cfgs: Vec<Attribute>,
    /// The fields of a non-unit variant (an error).
    pub(super) fields: Option<Fields>,
    /// Its `#[tier(..)]` attributes merged; `None` without any.
    pub(super) tier: Option<Tier>,
}

/// What the `#[tier(..)]` attributes of one variant say.
pub(super) struct Tier {
    /// The attributes' tokens, to point at.
    pub(super) tokens: TokenStream,
    /// A syntax error stopped the parsing: rules that look at the whole tier
    /// ("no band at all") are skipped, so no secondary error appears.
    pub(super) incomplete: bool,
    /// The bands, in the order of their keys; `count` and `period_secs`
    /// make one once both are read.
    pub(super) bands: Vec<Band>,
    /// A `count` without `period_secs` (an error).
    pub(super) count: Option<Keyed<Number<u32>>>,
    /// A `period_secs` without `count` (an error).
    pub(super) period_secs: Option<Keyed<Number<u64>>>,
    /// The place among `bands` of the first of `count` and `period_secs`.
    custom_at: usize,
    pub(super) unlimited: Option<Ident>,
    pub(super) burst: Option<Keyed<Number<u32>>>,
    pub(super) name: Option<LitStr>,
    pub(super) default: Option<Ident>,
    /// The tier is dark-launched: decided and reported, never refused.
    pub(super) shadow: Option<Ident>,
    /// At most this many requests of one user in flight.
    pub(super) concurrent: Option<Keyed<Number<u32>>>,
}

/// A value with the key that introduced it.
pub(super) struct Keyed<T> {
    pub(super) key: Ident,
    pub(super) value: T,
}

/// One band: `per_hour = 100`, or `count = 50, period_secs = 900`.
pub(super) struct Band {
    pub(super) period: Period,
    /// `per_hour`, or `count`.
    pub(super) key: Ident,
    pub(super) count: Number<u32>,
}

/// The period of a band.
pub(super) enum Period {
    Named(NamedPeriod),
    /// `period_secs = s`.
    Secs(Keyed<Number<u64>>),
}

impl Input {
    /// Takes the enum apart; errors go to `errors`, and what could be read is
    /// kept so that validation can still report independent mistakes.
    pub(super) fn parse(mut item: ItemEnum, errors: &mut Errors) -> Input {
        // `#[tier]` belongs on variants; on the enum it is reported and
        // removed like the others.
        item.attrs.retain(|attr| {
            if attr.path().is_ident("tier") {
                errors.spanned(
                    attr,
                    "`#[tier(..)]` goes on the variants of a `#[rate_tiers]` enum",
                );
                false
            } else {
                true
            }
        });
        let variants = item
            .variants
            .iter_mut()
            .map(|variant| Variant::parse(variant, errors))
            .collect();
        Input { item, variants }
    }
}

impl Variant {
    /// Reads a variant and removes its `#[tier]` attributes from it.
    fn parse(variant: &mut SynVariant, errors: &mut Errors) -> Variant {
        let mut tier: Option<Tier> = None;
        let mut cfgs = Vec::new();
        let mut kept = Vec::with_capacity(variant.attrs.len());
        for attr in variant.attrs.drain(..) {
            if attr.path().is_ident("tier") {
                let tier = tier.get_or_insert_with(Tier::empty);
                tier.parse_attr(&attr, errors);
            } else {
                if attr.path().is_ident("cfg") {
                    cfgs.push(attr.clone());
                }
                kept.push(attr);
            }
        }
        variant.attrs = kept;
        if let Some(tier) = &mut tier {
            tier.pair_custom_band();
        }
        let fields = match &variant.fields {
            Fields::Unit => None,
            fields => Some(fields.clone()),
        };
        Variant {
            ident: variant.ident.clone(),
            cfgs,
            fields,
            tier,
        }
    }
}

impl Variant {
    /// The tier's name: `name = ".."`, or the variant in snake case.
    pub(super) fn tier_name(&self) -> String {
        match self.tier.as_ref().and_then(|tier| tier.name.as_ref()) {
            Some(name) => name.value(),
            None => snake_case(&self.ident),
        }
    }
}

impl Tier {
    fn empty() -> Tier {
        Tier {
            tokens: TokenStream::new(),
            incomplete: false,
            bands: Vec::new(),
            count: None,
            period_secs: None,
            custom_at: 0,
            unlimited: None,
            burst: None,
            name: None,
            default: None,
            shadow: None,
            concurrent: None,
        }
    }

    /// Adds what one `#[tier(..)]` attribute says (a variant may split its
    /// keys over several).
    fn parse_attr(&mut self, attr: &Attribute, errors: &mut Errors) {
        attr.to_tokens(&mut self.tokens);
        let mut seen_unknown = false;
        let result = attr.parse_nested_meta(|meta| {
            let Some(key) = meta.path.get_ident().cloned() else {
                skip_value(&meta)?;
                let keys = keys::listed();
                errors.spanned(&meta.path, format_args!("unknown key; expected one of {keys}"));
                seen_unknown = true;
                return Ok(());
            };
            self.parse_key(key, &meta, errors, &mut seen_unknown)
        });
        if let Err(error) = result {
            errors.push(error);
            self.incomplete = true;
        }
        // An unknown key may have been meant as a band: do not also say that
        // the tier has none.
        self.incomplete |= seen_unknown;
    }

    fn parse_key(
        &mut self,
        key: Ident,
        meta: &ParseNestedMeta<'_>,
        errors: &mut Errors,
        seen_unknown: &mut bool,
    ) -> syn::Result<()> {
        let name = key.to_string();
        let Some(kind) = Key::from_name(&name) else {
            skip_value(meta)?;
            errors.spanned(&key, keys::unknown(&name));
            *seen_unknown = true;
            return Ok(());
        };
        let repeated = match kind {
            Key::Unlimited => self.unlimited.is_some(),
            Key::Default => self.default.is_some(),
            Key::Shadow => self.shadow.is_some(),
            Key::Burst => self.burst.is_some(),
            Key::Concurrent => self.concurrent.is_some(),
            Key::Name => self.name.is_some(),
            Key::Count => self.count.is_some(),
            Key::PeriodSecs => self.period_secs.is_some(),
            Key::Band(period) => self
                .bands
                .iter()
                .any(|band| matches!(band.period, Period::Named(p) if p == period)),
        };
        if repeated {
            skip_value(meta)?;
            errors.spanned(&key, format_args!("`{name}` specified more than once"));
            return Ok(());
        }
        match kind {
            Key::Unlimited | Key::Default | Key::Shadow => {
                if let Some(value) = skip_value(meta)? {
                    errors.spanned(value, format_args!("`{name}` takes no value"));
                }
                match kind {
                    Key::Unlimited => self.unlimited = Some(key),
                    Key::Default => self.default = Some(key),
                    _ => self.shadow = Some(key),
                }
            }
            Key::Name => match value_of(&key, meta, "name = \"..\"", errors)? {
                Some(Expr::Lit(ExprLit {
                    lit: Lit::Str(lit), ..
                })) => self.name = Some(lit),
                Some(other) => errors.spanned(other, "expected a string literal: `name = \"..\"`"),
                None => {}
            },
            Key::Band(period) => {
                let count = number(&key, meta, errors)?;
                self.bands.push(Band {
                    period: Period::Named(period),
                    key,
                    count,
                });
            }
            Key::Burst => {
                self.burst = Some(Keyed {
                    value: number(&key, meta, errors)?,
                    key,
                })
            }
            Key::Concurrent => {
                self.concurrent = Some(Keyed {
                    value: number(&key, meta, errors)?,
                    key,
                })
            }
            Key::Count | Key::PeriodSecs => {
                if self.count.is_none() && self.period_secs.is_none() {
                    self.custom_at = self.bands.len();
                }
                if kind == Key::Count {
                    let value = number(&key, meta, errors)?;
                    self.count = Some(Keyed { key, value });
                } else {
                    let value = number(&key, meta, errors)?;
                    self.period_secs = Some(Keyed { key, value });
                }
            }
        }
        Ok(())
    }

    /// Makes `count` and `period_secs` one band, in the place of the first of
    /// the two; either one alone stays for validation to report.
    fn pair_custom_band(&mut self) {
        match (self.count.take(), self.period_secs.take()) {
            (Some(count), Some(period)) => {
                let band = Band {
                    period: Period::Secs(period),
                    key: count.key,
                    count: count.value,
                };
                self.bands.insert(self.custom_at.min(self.bands.len()), band);
            }
            (count, period_secs) => {
                self.count = count;
                self.period_secs = period_secs;
            }
        }
    }
}

/// The number of `key = value`; a missing or wrong value is reported, and
/// parsing goes on.
fn number<T: super::number::Integer>(
    key: &Ident,
    meta: &ParseNestedMeta<'_>,
    errors: &mut Errors,
) -> syn::Result<Number<T>> {
    let form = format!("{key} = 100");
    Ok(match value_of(key, meta, &form, errors)? {
        Some(expr) => Number::parse(&key.to_string(), &expr, errors),
        None => Number::invalid(key.span()),
    })
}

/// The `= value` of a key that needs one; a missing value is reported (and
/// `None` returned) without stopping the parsing.
fn value_of(
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
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<Option<TokenStream>> {
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

/// The default tier name of a variant: its name in snake case
/// (`TeamPlus` -> `team_plus`, `HTTPApi` -> `http_api`, `Tier2` -> `tier2`).
pub(super) fn snake_case(ident: &Ident) -> String {
    let name = ident.to_string();
    let name = name.strip_prefix("r#").unwrap_or(&name);
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = i.checked_sub(1).map(|p| chars[p]);
            let next = chars.get(i + 1).copied();
            let boundary = match prev {
                None | Some('_') => false,
                Some(p) if p.is_lowercase() || p.is_ascii_digit() => true,
                Some(p) => p.is_uppercase() && next.is_some_and(char::is_lowercase),
            };
            if boundary {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_case_of_variants() {
        let cases = [
            ("Free", "free"),
            ("TeamPlus", "team_plus"),
            ("HTTPApi", "http_api"),
            ("Tier2", "tier2"),
            ("Tier2Pro", "tier2_pro"),
            ("ABC", "abc"),
            ("Already_Snake", "already_snake"),
            ("r#Type", "type"),
        ];
        for (variant, expected) in cases {
            let ident: Ident = syn::parse_str(variant).unwrap();
            assert_eq!(snake_case(&ident), expected, "{variant}");
        }
    }
}
