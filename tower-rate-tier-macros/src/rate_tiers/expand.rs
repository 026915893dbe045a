//! What `#[rate_tiers]` emits.

use std::collections::HashSet;

use proc_macro2::{Literal, Span, TokenStream};
use quote::{ToTokens, quote};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, Item, ItemEnum, Meta, Path, Token, parse_quote};

use super::ast::{Input, Variant};
use super::bands::{Bands, MAX_PERIOD_SECS, Period};
use super::checks::const_checks;
use super::number::Number;
use crate::errors::Errors;
use crate::krate;

/// The traits the enum derives unless its own `#[derive(..)]` lists them:
/// `TierTable` needs `Copy`, and tests and maps want the others.
const DERIVES: [(&str, &str); 6] = [
    ("Clone", "::core::clone::Clone"),
    ("Copy", "::core::marker::Copy"),
    ("PartialEq", "::core::cmp::PartialEq"),
    ("Eq", "::core::cmp::Eq"),
    ("Hash", "::core::hash::Hash"),
    ("Debug", "::core::fmt::Debug"),
];

/// `#[rate_tiers]` on `item`: the enum and its impls, or the item and the
/// errors.
pub(crate) fn expand(args: TokenStream, item: Item) -> TokenStream {
    let mut errors = Errors::default();
    if !args.is_empty() {
        errors.spanned(&args, "`#[rate_tiers]` takes no arguments");
    }
    let item = match item {
        Item::Enum(item) => item,
        Item::Struct(item) => {
            errors.spanned(item.struct_token, "`#[rate_tiers]` goes on an enum, not a struct");
            return with_errors(item.into_token_stream(), errors);
        }
        Item::Union(item) => {
            errors.spanned(item.union_token, "`#[rate_tiers]` goes on an enum, not a union");
            return with_errors(item.into_token_stream(), errors);
        }
        other => {
            errors.at(Span::call_site(), "`#[rate_tiers]` goes on an enum");
            return with_errors(other.into_token_stream(), errors);
        }
    };

    let input = Input::parse(item, &mut errors);
    input.validate(&mut errors);
    let tokens = if errors.is_empty() {
        generate(&input, Mode::Complete)
    } else if input.has_table_shape() {
        // Keep `Plan::ALL`, `"pro".parse::<Plan>()` and the rest compiling
        // elsewhere in the crate, so that only the real errors show.
        generate(&input, Mode::Fallback)
    } else {
        input.item.into_token_stream()
    };
    with_errors(tokens, errors)
}

fn with_errors(mut tokens: TokenStream, errors: Errors) -> TokenStream {
    tokens.extend(errors.into_compile_errors());
    tokens
}

/// Whether the impls are valid Rust even if some `#[tier]` is wrong.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Everything checked: the real tables.
    Complete,
    /// Errors were reported: the same items with empty quota tables, so that
    /// uses of them add no errors of their own.
    Fallback,
}

impl Input {
    /// A non-generic enum of unit variants: the impls type-check.
    fn has_table_shape(&self) -> bool {
        let generics = &self.item.generics;
        generics.params.is_empty()
            && generics.where_clause.is_none()
            && self.variants.iter().all(|variant| variant.fields.is_none())
    }
}

fn generate(input: &Input, mode: Mode) -> TokenStream {
    let krate = krate::runtime();
    let private = quote!(#krate::__private);
    let item = with_derives(&input.item);
    let ident = &item.ident;
    let vis = &item.vis;
    let variants = &input.variants;

    let all = variants.iter().map(|v| {
        let (cfgs, ident) = (&v.cfgs, &v.ident);
        quote!(#(#cfgs)* Self::#ident)
    });
    let name_arms = variants.iter().map(|v| {
        let (cfgs, ident) = (&v.cfgs, &v.ident);
        let name = Literal::string(&v.tier_name());
        quote!(#(#cfgs)* Self::#ident => #name,)
    });
    let quota_arms = variants.iter().map(|v| {
        let (cfgs, ident) = (&v.cfgs, &v.ident);
        let quotas = match mode {
            Mode::Complete => quotas(v, &private),
            Mode::Fallback => TokenStream::new(),
        };
        quote!(#(#cfgs)* Self::#ident => const { &[#quotas] },)
    });

    // `FromStr`: one arm per name (a name repeated by mistake keeps its
    // first arm only, so that no "unreachable pattern" adds to the errors).
    let mut seen = HashSet::new();
    let parse_arms = variants.iter().filter(|v| seen.insert(v.tier_name())).map(|v| {
        let (cfgs, ident) = (&v.cfgs, &v.ident);
        let name = Literal::string(&v.tier_name());
        quote!(#(#cfgs)* #name => ::core::result::Result::Ok(Self::#ident),)
    });
    let known = variants.iter().map(|v| {
        let cfgs = &v.cfgs;
        let name = Literal::string(&v.tier_name());
        quote!(#(#cfgs)* #name)
    });
    let input_name = Ident::new("__trt_name", Span::mixed_site());
    let formatter = Ident::new("__trt_f", Span::mixed_site());
    let default_tier = default_tier(variants);
    let shadowed = shadowed(variants);
    let concurrency = concurrency(variants);
    let units = match mode {
        Mode::Complete => units(variants, &private),
        // The trait's own `tier_units`: no unit.
        Mode::Fallback => TokenStream::new(),
    };
    let const_checks = variants.iter().map(|v| const_checks(v, ident));

    quote! {
        #item

        #(#const_checks)*

        // A `#[deprecated]` enum or variant is the user's to warn about where
        // the user names it, not in what the attribute generates.
        #[allow(deprecated)]
        impl #ident {
            /// Every tier, in declaration order.
            #vis const ALL: &'static [Self] = &[#(#all),*];

            /// The tier's name, as configured in the limiter and parsed by
            /// `FromStr`.
            #vis const fn name(self) -> &'static ::core::primitive::str {
                match self {
                    #(#name_arms)*
                }
            }

            /// The tier's quota bands (`[Quota::unlimited()]` for an
            /// unlimited tier).
            #vis const fn quotas(self) -> &'static [#private::Quota] {
                match self {
                    #(#quota_arms)*
                }
            }
        }

        #[automatically_derived]
        #[allow(deprecated)]
        impl ::core::fmt::Display for #ident {
            fn fmt(&self, #formatter: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                #formatter.pad(Self::name(*self))
            }
        }

        #[automatically_derived]
        #[allow(deprecated)]
        impl ::core::str::FromStr for #ident {
            type Err = #private::ParseTierError;

            fn from_str(#input_name: &::core::primitive::str) -> ::core::result::Result<Self, Self::Err> {
                match #input_name {
                    #(#parse_arms)*
                    _ => ::core::result::Result::Err(#private::ParseTierError::new(#input_name, &[#(#known),*])),
                }
            }
        }

        #[automatically_derived]
        #[allow(deprecated)]
        impl #private::TierTable for #ident {
            fn all() -> &'static [Self] {
                Self::ALL
            }

            fn tier_name(self) -> &'static ::core::primitive::str {
                Self::name(self)
            }

            fn tier_quotas(self) -> &'static [#private::Quota] {
                Self::quotas(self)
            }

            fn default_tier() -> ::core::option::Option<Self> {
                #default_tier
            }

            fn tier_shadow(self) -> ::core::primitive::bool {
                #shadowed
            }

            fn tier_concurrency(self) -> ::core::option::Option<::core::primitive::u32> {
                #concurrency
            }

            #units
        }
    }
}

/// The enum with `#[derive(..)]` of the traits it does not derive yet.
fn with_derives(item: &ItemEnum) -> ItemEnum {
    let mut derived = HashSet::new();
    for attr in item.attrs.iter().filter(|attr| attr.path().is_ident("derive")) {
        // A malformed `#[derive]` is the compiler's to report.
        if let Ok(paths) = attr.parse_args_with(Punctuated::<Path, Token![,]>::parse_terminated) {
            derived.extend(
                paths
                    .iter()
                    .filter_map(|path| path.segments.last())
                    .map(|s| s.ident.to_string()),
            );
        }
    }
    let missing: Vec<Path> = DERIVES
        .iter()
        .filter(|(name, _)| !derived.contains(*name))
        .map(|(_, path)| syn::parse_str(path).expect("a valid path"))
        .collect();
    let mut item = item.clone();
    if !missing.is_empty() {
        item.attrs.push(parse_quote!(#[derive(#(#missing),*)]));
    }
    item
}

/// The `Quota` expressions of a checked tier.
fn quotas(variant: &Variant, private: &TokenStream) -> TokenStream {
    let Some(tier) = &variant.tier else {
        return TokenStream::new();
    };
    if tier.unlimited.is_some() {
        return quote!(#private::Quota::unlimited());
    }
    band_quotas(&tier.bands, private)
}

/// The `Quota` expressions of checked bands.
fn band_quotas(bands: &Bands, private: &TokenStream) -> TokenStream {
    let burst = bands.burst.as_ref().map(|burst| {
        let burst = number(&burst.value, "u32", Literal::u32_unsuffixed);
        quote!(.with_burst(#burst))
    });
    let quotas = bands.list.iter().map(|band| {
        let count = number(&band.count, "u32", Literal::u32_unsuffixed);
        match &band.period {
            Period::Named(period) => {
                let constructor = Ident::new(period.constructor(), Span::call_site());
                quote!(#private::Quota::#constructor(#count) #burst)
            }
            Period::Secs(period) => {
                let secs = period_secs(&period.value);
                quote!(#private::Quota::per_period(#count, ::core::time::Duration::from_secs(#secs)) #burst)
            }
        }
    });
    quote!(#(#quotas),*)
}

/// A checked number: the literal, or the value of the `const`.
fn number<T: Copy>(number: &Number<T>, ty: &str, literal: fn(T) -> Literal) -> TokenStream {
    match number {
        Number::Lit { value, .. } => value.map(literal).into_token_stream(),
        // A zero `const` fails the build in `const_checks`, with the error on
        // its path; the table takes 1 instead, so that no second error from
        // inside the `Quota` constructor follows.
        Number::Const(path) => {
            let ty = Ident::new(ty, Span::call_site());
            let value = Ident::new("__trt_n", Span::mixed_site());
            quote!({
                let #value: ::core::primitive::#ty = #path;
                if #value == 0 { 1 } else { #value }
            })
        }
    }
}

/// A checked `period_secs`, like [`number`]: a `const` that is zero or too
/// long fails the build in `const_checks`, and the table takes 1 instead.
fn period_secs(number: &Number<u64>) -> TokenStream {
    match number {
        Number::Lit { value, .. } => value.map(Literal::u64_unsuffixed).into_token_stream(),
        Number::Const(path) => {
            let value = Ident::new("__trt_n", Span::mixed_site());
            let max = Literal::u64_unsuffixed(MAX_PERIOD_SECS);
            quote!({
                let #value: ::core::primitive::u64 = #path;
                if #value == 0 || #value > #max { 1 } else { #value }
            })
        }
    }
}

/// The body of `TierTable::default_tier`.
fn default_tier(variants: &[Variant]) -> TokenStream {
    let default = variants
        .iter()
        .find(|v| v.tier.as_ref().is_some_and(|tier| tier.default.is_some()));
    let Some(variant) = default else {
        return quote!(::core::option::Option::None);
    };
    let ident = &variant.ident;
    if variant.cfgs.is_empty() {
        return quote!(::core::option::Option::Some(Self::#ident));
    }
    // The default variant may be configured away.
    let cfgs = &variant.cfgs;
    let predicates = variant.cfgs.iter().filter_map(cfg_predicate);
    let local = Ident::new("__trt_default", Span::mixed_site());
    quote! {
        #(#cfgs)*
        let #local = ::core::option::Option::Some(Self::#ident);
        #[cfg(not(all(#(#predicates),*)))]
        let #local = ::core::option::Option::None;
        #local
    }
}

/// The body of `TierTable::tier_shadow`: whether `self` is a `shadow` tier.
fn shadowed(variants: &[Variant]) -> TokenStream {
    let arms = variants
        .iter()
        .filter(|v| v.tier.as_ref().is_some_and(|tier| tier.shadow.is_some()))
        .map(|v| {
            let (ident, cfgs) = (&v.ident, &v.cfgs);
            quote!(#(#cfgs)* Self::#ident => true,)
        });
    quote! {
        #[allow(unreachable_patterns)]
        match self {
            #(#arms)*
            _ => false,
        }
    }
}

/// The body of `TierTable::tier_concurrency`: the `concurrent` limit of
/// `self`, if it has one.
fn concurrency(variants: &[Variant]) -> TokenStream {
    let arms = variants.iter().filter_map(|v| {
        let concurrent = v.tier.as_ref()?.concurrent.as_ref()?;
        if let Number::Lit { value: None, .. } = concurrent.value {
            // reported already
            return None;
        }
        let limit = number(&concurrent.value, "u32", Literal::u32_unsuffixed);
        let (ident, cfgs) = (&v.ident, &v.cfgs);
        Some(quote!(#(#cfgs)* Self::#ident => ::core::option::Option::Some(#limit),))
    });
    quote! {
        #[allow(unreachable_patterns)]
        match self {
            #(#arms)*
            _ => ::core::option::Option::None,
        }
    }
}

/// `TierTable::tier_units` of a checked table with units: each unit with
/// its bands, in the order of the attributes. Nothing for a table without
/// units, which keeps the trait's (no unit).
fn units(variants: &[Variant], private: &TokenStream) -> TokenStream {
    let arms: Vec<TokenStream> = variants
        .iter()
        .filter(|v| !v.units.is_empty())
        .map(|v| {
            let units = v.units.iter().map(|unit| {
                let name = unit.name().map(|name| Literal::string(&name));
                let quotas = band_quotas(&unit.bands, private);
                quote!((#name, &[#quotas] as &[#private::Quota]))
            });
            let (ident, cfgs) = (&v.ident, &v.cfgs);
            quote!(#(#cfgs)* Self::#ident => const { &[#(#units),*] },)
        })
        .collect();
    if arms.is_empty() {
        return TokenStream::new();
    }
    quote! {
        fn tier_units(
            self,
        ) -> &'static [(&'static ::core::primitive::str, &'static [#private::Quota])] {
            #[allow(unreachable_patterns)]
            match self {
                #(#arms)*
                _ => &[],
            }
        }
    }
}

/// `pred` of `#[cfg(pred)]`.
fn cfg_predicate(attr: &Attribute) -> Option<&TokenStream> {
    match &attr.meta {
        Meta::List(list) => Some(&list.tokens),
        _ => None,
    }
}
