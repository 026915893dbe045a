//! The enum and its `#[tier(..)]` attributes, parsed into small structs.
//!
//! Parsing records what each attribute says and reports what cannot be
//! represented (unknown or repeated keys, values of the wrong kind, counts
//! beyond `u32`); rules between keys and variants are [`super::valid`]'s.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::{Attribute, Expr, ExprLit, Fields, Ident, ItemEnum, Lit, LitStr, Variant as SynVariant};

use super::bands::{Bands, Keyed};
use super::keys::{self, Attr, Key, skip_value, value_of};
use super::number::Number;
use super::unit::{UnitLimit, unit_of};
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
    /// Its `#[tier(..)]` attributes without `unit`, merged; `None` without
    /// any.
    pub(super) tier: Option<Tier>,
    /// Its unit attributes, `#[tier(unit = "..", ..)]`, in their order.
    pub(super) units: Vec<UnitLimit>,
}

/// What the `#[tier(..)]` attributes without `unit` of one variant say: the
/// tier, and the bands of its requests.
pub(super) struct Tier {
    /// The attributes' tokens, to point at.
    pub(super) tokens: TokenStream,
    /// A syntax error stopped the parsing: rules that look at the whole tier
    /// ("no band at all") are skipped, so no secondary error appears.
    pub(super) incomplete: bool,
    pub(super) bands: Bands,
    pub(super) unlimited: Option<Ident>,
    pub(super) name: Option<LitStr>,
    pub(super) default: Option<Ident>,
    /// The tier is dark-launched: decided and reported, never refused.
    pub(super) shadow: Option<Ident>,
    /// At most this many requests of one user in flight.
    pub(super) concurrent: Option<Keyed<Number<u32>>>,
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
        let mut units = Vec::new();
        let mut cfgs = Vec::new();
        let mut kept = Vec::with_capacity(variant.attrs.len());
        for attr in variant.attrs.drain(..) {
            if attr.path().is_ident("tier") {
                match unit_of(&attr, errors) {
                    Some(unit) => units.push(UnitLimit::parse(&attr, unit, errors)),
                    None => tier.get_or_insert_with(Tier::empty).parse_attr(&attr, errors),
                }
            } else {
                if attr.path().is_ident("cfg") {
                    cfgs.push(attr.clone());
                }
                kept.push(attr);
            }
        }
        variant.attrs = kept;
        if let Some(tier) = &mut tier {
            tier.bands.pair_custom_band();
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
            units,
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
            bands: Bands::new(),
            unlimited: None,
            name: None,
            default: None,
            shadow: None,
            concurrent: None,
        }
    }

    /// Adds what one `#[tier(..)]` attribute without `unit` says (a variant
    /// may split its keys over several).
    fn parse_attr(&mut self, attr: &Attribute, errors: &mut Errors) {
        attr.to_tokens(&mut self.tokens);
        let complete = keys::read_keys(attr, Attr::Requests, errors, |key, kind, meta, errors| {
            self.parse_key(key, kind, meta, errors)
        });
        // An unknown key may have been meant as a band: do not also say that
        // the tier has none.
        self.incomplete |= !complete;
    }

    fn parse_key(
        &mut self,
        key: Ident,
        kind: Key,
        meta: &ParseNestedMeta<'_>,
        errors: &mut Errors,
    ) -> syn::Result<()> {
        let name = key.to_string();
        let repeated = match kind {
            Key::Band(kind) => self.bands.has(kind),
            Key::Unlimited => self.unlimited.is_some(),
            Key::Default => self.default.is_some(),
            Key::Shadow => self.shadow.is_some(),
            Key::Concurrent => self.concurrent.is_some(),
            Key::Name => self.name.is_some(),
        };
        if repeated {
            skip_value(meta)?;
            errors.spanned(&key, format_args!("`{name}` specified more than once"));
            return Ok(());
        }
        match kind {
            Key::Band(kind) => self.bands.read(key, kind, meta, errors)?,
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
            Key::Concurrent => {
                self.concurrent = Some(Keyed {
                    value: Number::read(&key, meta, errors)?,
                    key,
                })
            }
        }
        Ok(())
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
