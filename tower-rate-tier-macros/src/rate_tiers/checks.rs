//! The items that check each `const` of a variant's `#[tier(..)]`s where
//! the user wrote it.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;

use super::ast::Variant;
use super::bands::{MAX_PERIOD_SECS, Period};
use super::number::{Number, path_name};

/// For each `const` of a variant's `#[tier(..)]`s, an item that fails to
/// compile if it is zero (or, for `period_secs`, longer than the runtime
/// takes), with the error on the `const`'s name. (The `Quota` constructors
/// would panic too, but only where `quotas()` is compiled to machine code,
/// and with an error inside the runtime crate.)
pub(super) fn const_checks(variant: &Variant, enum_ident: &Ident) -> TokenStream {
    let mut numbers: Vec<(String, &Number<u32>)> = Vec::new();
    let mut periods = Vec::new();
    let units = variant.units.iter().map(|unit| &unit.bands);
    for bands in variant.tier.iter().map(|tier| &tier.bands).chain(units) {
        for band in &bands.list {
            numbers.push((band.key.to_string(), &band.count));
            if let Period::Secs(period) = &band.period {
                periods.push(&period.value);
            }
        }
        numbers.extend(
            bands
                .count
                .iter()
                .map(|count| (count.key.to_string(), &count.value)),
        );
        numbers.extend(
            bands
                .burst
                .iter()
                .map(|burst| (burst.key.to_string(), &burst.value)),
        );
        periods.extend(bands.period_secs.iter().map(|period| &period.value));
    }
    let concurrent = variant.tier.iter().filter_map(|tier| tier.concurrent.as_ref());
    numbers.extend(concurrent.map(|c| (c.key.to_string(), &c.value)));

    let mut checks = Vec::new();
    for (key, value) in numbers {
        if let Number::Const(path) = value {
            let what = match key.as_str() {
                "burst" => "burst",
                "concurrent" => "concurrency limit",
                _ => "count",
            };
            let message = format!(
                "`{key}` must be at least 1, and `{}` is 0: a zero {what} admits nothing",
                path_name(path)
            );
            checks.push((path, quote!(== 0), message));
        }
    }
    for value in periods {
        if let Number::Const(path) = value {
            let name = path_name(path);
            let zero = format!(
                "`period_secs` must be at least 1, and `{name}` is 0: a quota needs a non-zero period"
            );
            checks.push((path, quote!(== 0), zero));
            let max = Literal::u64_unsuffixed(MAX_PERIOD_SECS);
            let too_long = format!(
                "`period_secs` must be at most {MAX_PERIOD_SECS} (about 584 years), and `{name}` is more: \
                 a quota's period is counted in `u64` nanoseconds"
            );
            checks.push((path, quote!(> #max), too_long));
        }
    }
    let cfgs = &variant.cfgs;
    let checks = checks.into_iter().map(|(path, refused, message)| {
        // Outside the impl `Self` means nothing: name the enum.
        let mut path = path.clone();
        if let Some(first) = path.segments.first_mut().filter(|s| s.ident == "Self") {
            first.ident = Ident::new(&enum_ident.to_string(), first.ident.span());
        }
        // A span cannot cover several tokens on stable: the `const`'s own
        // name is the one to point at.
        let span = path
            .segments
            .last()
            .map_or_else(Span::call_site, |s| s.ident.span());
        quote_spanned! {span=>
            #(#cfgs)*
            #[allow(deprecated)]
            const _: () = if #path #refused {
                ::core::panic!(#message)
            };
        }
    });
    quote!(#(#checks)*)
}
