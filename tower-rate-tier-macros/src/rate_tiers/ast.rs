//! The enum and its `#[tier(..)]` attributes, parsed into small structs.
//!
//! Parsing records what each attribute says and reports what cannot be
//! represented (unknown or repeated keys, values of the wrong kind, counts
//! beyond `u32`); rules between keys and variants are [`super::valid`]'s.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Fields, Ident, ItemEnum, Lit, LitStr, Token, Variant as SynVariant};

use crate::errors::Errors;

/// The keys `#[tier(..)]` knows, for the "unknown key" message.
const KEYS: &str =
    "`per_second`, `per_minute`, `per_hour`, `per_day`, `unlimited`, `burst`, `name`, `default`";

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
    pub(super) bands: Vec<Band>,
    pub(super) unlimited: Option<Ident>,
    pub(super) burst: Option<Keyed<Count>>,
    pub(super) name: Option<LitStr>,
    pub(super) default: Option<Ident>,
}

/// A value with the key that introduced it.
pub(super) struct Keyed<T> {
    pub(super) key: Ident,
    pub(super) value: T,
}

/// One band: `per_hour = 100`.
pub(super) struct Band {
    pub(super) unit: Unit,
    pub(super) key: Ident,
    pub(super) count: Count,
}

/// A count as written; `value` is `None` when the literal was already
/// reported as wrong.
#[derive(Clone, Copy)]
pub(super) struct Count {
    pub(super) value: Option<u32>,
    pub(super) span: Span,
}

/// The period of a band.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Unit {
    Second,
    Minute,
    Hour,
    Day,
}

impl Unit {
    fn from_key(key: &str) -> Option<Unit> {
        Some(match key {
            "per_second" => Unit::Second,
            "per_minute" => Unit::Minute,
            "per_hour" => Unit::Hour,
            "per_day" => Unit::Day,
            _ => return None,
        })
    }

    /// The `Quota` constructor of this period.
    pub(super) fn constructor(self) -> &'static str {
        match self {
            Unit::Second => "per_second",
            Unit::Minute => "per_minute",
            Unit::Hour => "per_hour",
            Unit::Day => "per_day",
        }
    }
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
            unlimited: None,
            burst: None,
            name: None,
            default: None,
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
                errors.spanned(&meta.path, format_args!("unknown key; expected one of {KEYS}"));
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
        let repeated = match name.as_str() {
            "unlimited" => self.unlimited.is_some(),
            "default" => self.default.is_some(),
            "burst" => self.burst.is_some(),
            "name" => self.name.is_some(),
            other => match Unit::from_key(other) {
                Some(unit) => self.bands.iter().any(|band| band.unit == unit),
                None => {
                    skip_value(meta)?;
                    errors.spanned(&key, format_args!("unknown key `{name}`; expected one of {KEYS}"));
                    *seen_unknown = true;
                    return Ok(());
                }
            },
        };
        if repeated {
            skip_value(meta)?;
            errors.spanned(&key, format_args!("`{name}` specified more than once"));
            return Ok(());
        }
        match name.as_str() {
            "unlimited" | "default" => {
                if let Some(value) = skip_value(meta)? {
                    errors.spanned(value, format_args!("`{name}` takes no value"));
                }
                if name == "unlimited" {
                    self.unlimited = Some(key);
                } else {
                    self.default = Some(key);
                }
            }
            "name" => match value_of(&key, meta, "name = \"..\"", errors)? {
                Some(Expr::Lit(ExprLit {
                    lit: Lit::Str(lit), ..
                })) => self.name = Some(lit),
                Some(other) => errors.spanned(other, "expected a string literal: `name = \"..\"`"),
                None => {}
            },
            _ => {
                let form = format!("{name} = 100");
                let count = match value_of(&key, meta, &form, errors)? {
                    Some(expr) => parse_count(&name, &expr, errors),
                    None => Count {
                        value: None,
                        span: key.span(),
                    },
                };
                match Unit::from_key(&name) {
                    Some(unit) => self.bands.push(Band { unit, key, count }),
                    None => self.burst = Some(Keyed { key, value: count }),
                }
            }
        }
        Ok(())
    }
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

/// A count: an integer literal (unsuffixed or `u32`) that fits a `u32`.
/// Zero is accepted here and refused by validation.
fn parse_count(key: &str, expr: &Expr, errors: &mut Errors) -> Count {
    let span = expr.span();
    let invalid = Count { value: None, span };
    let lit = match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => lit,
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            errors.spanned(expr, format_args!("`{key}` cannot be negative"));
            return invalid;
        }
        _ => {
            errors.spanned(expr, format_args!("expected an integer literal: `{key} = 100`"));
            return invalid;
        }
    };
    if !matches!(lit.suffix(), "" | "u32") {
        errors.spanned(
            lit,
            format_args!("`{key}` is a `u32`: write it without a suffix or with `u32`"),
        );
        return invalid;
    }
    match lit.base10_parse::<u32>() {
        Ok(value) => Count {
            value: Some(value),
            span,
        },
        Err(_) => {
            errors.spanned(
                lit,
                format_args!("`{key}` must fit in a `u32` (at most {})", u32::MAX),
            );
            invalid
        }
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
