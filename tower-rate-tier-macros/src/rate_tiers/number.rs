//! The numbers of `#[tier(..)]`: an integer literal, checked here, or the
//! path of a `const`, which the compiler checks (its type by the generated
//! `Quota` call, a zero by a generated `const` assertion).

use std::fmt::Display;
use std::str::FromStr;

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, Path};

use super::keys::value_of;
use crate::errors::Errors;

/// A number as written.
#[derive(Clone)]
pub(super) enum Number<T> {
    /// A literal; `value` is `None` when it was already reported as wrong.
    Lit { value: Option<T>, span: Span },
    /// `limits::FREE_PER_HOUR`.
    Const(Path),
}

/// The integer types a key takes: `u32` for counts and bursts, `u64` for
/// `period_secs`.
pub(super) trait Integer: FromStr<Err = std::num::ParseIntError> + Display + Copy + PartialEq {
    const NAME: &'static str;
    const MAX: Self;
    const ZERO: Self;
}

impl Integer for u32 {
    const NAME: &'static str = "u32";
    const MAX: u32 = u32::MAX;
    const ZERO: u32 = 0;
}

impl Integer for u64 {
    const NAME: &'static str = "u64";
    const MAX: u64 = u64::MAX;
    const ZERO: u64 = 0;
}

impl<T: Integer> Number<T> {
    /// A number already reported as wrong (a missing value, say).
    pub(super) fn invalid(span: Span) -> Number<T> {
        Number::Lit { value: None, span }
    }

    /// The number of `key = value`; a missing or wrong value is reported,
    /// and parsing goes on.
    pub(super) fn read(
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

    /// The value of `key = expr`. Zero is accepted here and refused by
    /// validation (a literal) or by the generated code (a `const`).
    pub(super) fn parse(key: &str, expr: &Expr, errors: &mut Errors) -> Number<T> {
        let invalid = Number::invalid(expr.span());
        let lit = match expr {
            Expr::Lit(ExprLit {
                lit: Lit::Int(lit), ..
            }) => lit,
            Expr::Path(ExprPath {
                qself: None, path, ..
            }) => return Number::Const(path.clone()),
            Expr::Unary(syn::ExprUnary {
                op: syn::UnOp::Neg(_),
                ..
            }) => {
                errors.spanned(expr, format_args!("`{key}` cannot be negative"));
                return invalid;
            }
            _ => {
                errors.spanned(
                    expr,
                    format_args!(
                        "expected an integer literal or the path of a `const`: `{key} = 100` or `{key} = limits::FREE`"
                    ),
                );
                return invalid;
            }
        };
        let ty = T::NAME;
        if !lit.suffix().is_empty() && lit.suffix() != ty {
            errors.spanned(
                lit,
                format_args!("`{key}` is a `{ty}`: write it without a suffix or with `{ty}`"),
            );
            return invalid;
        }
        match lit.base10_parse::<T>() {
            Ok(value) => Number::Lit {
                value: Some(value),
                span: expr.span(),
            },
            Err(_) => {
                errors.spanned(
                    lit,
                    format_args!("`{key}` must fit in a `{ty}` (at most {})", T::MAX),
                );
                invalid
            }
        }
    }

    /// Whether this is a literal zero.
    pub(super) fn is_zero_literal(&self) -> bool {
        matches!(self, Number::Lit { value: Some(value), .. } if *value == T::ZERO)
    }

    /// The value of a literal (`None` for a `const`, or a literal already
    /// reported as wrong).
    pub(super) fn literal(&self) -> Option<T> {
        match self {
            Number::Lit { value, .. } => *value,
            Number::Const(_) => None,
        }
    }

    /// Where the number is written.
    pub(super) fn span(&self) -> Span {
        match self {
            Number::Lit { span, .. } => *span,
            Number::Const(path) => path.span(),
        }
    }
}

/// `limits::FREE` as written, for messages.
pub(super) fn path_name(path: &Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let lead = if path.leading_colon.is_some() { "::" } else { "" };
    format!("{lead}{}", segments.join("::"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse<T: Integer>(expr: &str) -> (Number<T>, bool) {
        let expr: Expr = syn::parse_str(expr).unwrap();
        let mut errors = Errors::default();
        let number = Number::parse("per_hour", &expr, &mut errors);
        (number, errors.is_empty())
    }

    #[test]
    fn literals_and_paths() {
        assert!(matches!(
            parse::<u32>("100"),
            (Number::Lit { value: Some(100), .. }, true)
        ));
        assert!(matches!(
            parse::<u32>("7u32"),
            (Number::Lit { value: Some(7), .. }, true)
        ));
        assert!(matches!(
            parse::<u64>("7u64"),
            (Number::Lit { value: Some(7), .. }, true)
        ));
        assert!(matches!(
            parse::<u64>("5_000_000_000"),
            (
                Number::Lit {
                    value: Some(5_000_000_000),
                    ..
                },
                true
            )
        ));
        let (number, ok) = parse::<u32>("::crate_a::limits::FREE");
        assert!(ok);
        match number {
            Number::Const(path) => assert_eq!(path_name(&path), "::crate_a::limits::FREE"),
            Number::Lit { .. } => panic!("a path is a const"),
        }
        assert!(parse::<u32>("0").0.is_zero_literal());
        assert!(!parse::<u32>("ZERO").0.is_zero_literal());
    }

    #[test]
    fn what_is_refused() {
        for wrong in [
            "7u64",
            "5_000_000_000",
            "-1",
            "LIMIT * 2",
            "\"100\"",
            "1.5",
            "<T as X>::N",
        ] {
            let (number, ok) = parse::<u32>(wrong);
            assert!(!ok, "{wrong}");
            assert!(matches!(number, Number::Lit { value: None, .. }), "{wrong}");
        }
        assert!(!parse::<u64>("7u32").1);
    }
}
