//! A unit attribute, `#[tier(unit = "tokens", per_minute = 40_000)]`: the
//! bands of a named unit a tier counts besides its requests.
//!
//! An attribute with `unit` is one: it takes the band keys and nothing of
//! the tier itself, and opens a band set of its own, where several
//! attributes without `unit` merge.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::{Attribute, Expr, ExprLit, Ident, Lit, LitStr};

use super::bands::Bands;
use super::keys::{self, Attr, Key, UNIT, skip_value, value_of};
use crate::errors::Errors;

/// The bands of one named unit.
pub(super) struct UnitLimit {
    /// The attribute's tokens, to point at.
    pub(super) tokens: TokenStream,
    /// A key was left unread (a syntax error, an unknown key) or does not
    /// belong here: the rule "no band at all" is skipped, so no secondary
    /// error appears.
    pub(super) incomplete: bool,
    /// `unit = ".."`; `None` when its value is not a string literal
    /// (reported).
    pub(super) unit: Option<LitStr>,
    pub(super) bands: Bands,
}

/// `Some` for a unit attribute, with the name of its unit: `None` when the
/// value of `unit` is not a string literal. That, and a second `unit`, are
/// reported here; other mistakes are left to the reading of the
/// attribute's keys, which reports them once.
pub(super) fn unit_of(attr: &Attribute, errors: &mut Errors) -> Option<Option<LitStr>> {
    let mut unit: Option<Option<LitStr>> = None;
    // A syntax error stops this look-ahead where it stops the real reading.
    let _ = attr.parse_nested_meta(|meta| {
        let Some(key) = meta.path.get_ident().filter(|ident| *ident == UNIT).cloned() else {
            skip_value(&meta)?;
            return Ok(());
        };
        if unit.is_some() {
            skip_value(&meta)?;
            errors.spanned(&key, format_args!("`{UNIT}` specified more than once"));
            return Ok(());
        }
        let name = match value_of(&key, &meta, "unit = \"tokens\"", errors)? {
            Some(Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            })) => Some(lit),
            Some(other) => {
                errors.spanned(other, "expected a string literal: `unit = \"tokens\"`");
                None
            }
            None => None,
        };
        unit = Some(name);
        Ok(())
    });
    unit
}

impl UnitLimit {
    /// Reads the bands of a unit attribute, whose `unit` is `unit`.
    pub(super) fn parse(attr: &Attribute, unit: Option<LitStr>, errors: &mut Errors) -> UnitLimit {
        let mut bands = Bands::new();
        let mut misplaced = false;
        let complete = keys::read_keys(attr, Attr::Unit, errors, |key, kind, meta, errors| {
            read_key(&mut bands, key, kind, meta, errors, &mut misplaced)
        });
        bands.pair_custom_band();
        UnitLimit {
            tokens: attr.to_token_stream(),
            incomplete: !complete || misplaced,
            unit,
            bands,
        }
    }

    /// The unit's name; `None` after a wrong `unit` value (reported).
    pub(super) fn name(&self) -> Option<String> {
        self.unit.as_ref().map(LitStr::value)
    }
}

fn read_key(
    bands: &mut Bands,
    key: Ident,
    kind: Key,
    meta: &ParseNestedMeta<'_>,
    errors: &mut Errors,
    misplaced: &mut bool,
) -> syn::Result<()> {
    let Key::Band(kind) = kind else {
        skip_value(meta)?;
        errors.spanned(&key, not_in_unit(&key, kind));
        *misplaced = true;
        return Ok(());
    };
    if bands.has(kind) {
        skip_value(meta)?;
        errors.spanned(&key, format_args!("`{key}` specified more than once"));
        return Ok(());
    }
    bands.read(key, kind, meta, errors)
}

/// The id the runtime keys a unit's state by: FNV-1a of the name, never 0
/// (that is requests). It must stay the same function as the id computed in
/// `tower_rate_tier::quota::Unit::new` (tower-rate-tier/src/quota/unit.rs),
/// so that two units of a tier whose ids collide are refused here rather
/// than by the runtime's `build()`.
pub(super) fn unit_id(name: &str) -> u32 {
    let mut id: u32 = 0x811c_9dc5;
    for &b in name.as_bytes() {
        id ^= u32::from(b);
        id = id.wrapping_mul(0x0100_0193);
    }
    id.max(1)
}

/// The message for a key of the tier itself in a unit attribute.
fn not_in_unit(key: &Ident, kind: Key) -> String {
    match kind {
        Key::Concurrent => format!(
            "`{key}` goes on the tier's attribute without `unit`: it limits requests in flight, not a unit"
        ),
        Key::Unlimited => format!(
            "`{key}` does not go with `unit`: a unit attribute takes bands only (`per_second` .. `per_week`, \
             or `count` with `period_secs`, and `burst`)"
        ),
        _ => format!("`{key}` does not go with `unit`: it belongs on the tier's attribute without `unit`"),
    }
}

#[cfg(test)]
mod tests {
    use super::unit_id;

    #[test]
    fn ids_are_the_runtimes() {
        for name in [
            "tokens",
            "content-bytes",
            "glbvs",
            "yacxa",
            "a",
            "a-twenty-four-byte-unit_",
        ] {
            let unit = trt::quota::Unit::new(name).unwrap();
            assert_eq!(unit_id(name), unit.id(), "{name}");
        }
        assert_eq!(unit_id("glbvs"), unit_id("yacxa"));
    }
}
