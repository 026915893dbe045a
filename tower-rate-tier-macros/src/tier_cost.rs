//! `#[tier_cost(n)]`: parse the cost and the handler, check them, and merge
//! the runtime's cost guard into the handler's first argument.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, FnArg, Ident, Item, ItemFn, Lit, Token, parse_quote};

use crate::errors::Errors;
use crate::krate;

/// `#[tier_cost(args)]` on `item`: the rewritten handler, or the item as it
/// was and the errors.
pub(crate) fn expand(args: TokenStream, item: Item) -> TokenStream {
    let mut errors = Errors::default();
    let cost = parse_cost(args, &mut errors);
    let handler = check_handler(item, &mut errors);
    match (cost, handler) {
        (Some(cost), Ok(handler)) if errors.is_empty() => rewrite(cost, handler).into_token_stream(),
        (_, Ok(handler)) => with_errors(handler.into_token_stream(), errors),
        (_, Err(item)) => with_errors(item, errors),
    }
}

fn with_errors(mut tokens: TokenStream, errors: Errors) -> TokenStream {
    tokens.extend(errors.into_compile_errors());
    tokens
}

/// The cost as written: a literal, or the path of a `const` (whose type the
/// compiler checks against the guard's `u32` parameter).
enum Cost {
    Lit(u32),
    Const(syn::Path),
}

/// The one integer literal that fits a `u32`, or the path of a `const`.
fn parse_cost(args: TokenStream, errors: &mut Errors) -> Option<Cost> {
    if args.is_empty() {
        errors.at(
            Span::call_site(),
            "`#[tier_cost]` needs the cost of the handler: `#[tier_cost(5)]`",
        );
        return None;
    }
    let exprs = match Punctuated::<Expr, Token![,]>::parse_terminated.parse2(args) {
        Ok(exprs) => exprs,
        Err(error) => {
            errors.push(error);
            return None;
        }
    };
    let mut exprs = exprs.into_iter();
    let first = exprs.next()?;
    let extra: TokenStream = exprs.map(ToTokens::into_token_stream).collect();
    if !extra.is_empty() {
        errors.spanned(extra, "`#[tier_cost]` takes one cost: `#[tier_cost(5)]`");
    }
    let lit = match &first {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => lit,
        Expr::Path(syn::ExprPath {
            qself: None, path, ..
        }) => return Some(Cost::Const(path.clone())),
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            errors.spanned(&first, "a cost cannot be negative");
            return None;
        }
        _ => {
            errors.spanned(&first, "expected an integer literal cost: `#[tier_cost(5)]`");
            return None;
        }
    };
    if !matches!(lit.suffix(), "" | "u32") {
        errors.spanned(lit, "a cost is a `u32`: write it without a suffix or with `u32`");
        return None;
    }
    match lit.base10_parse::<u32>() {
        Ok(cost) => Some(Cost::Lit(cost)),
        Err(_) => {
            errors.spanned(
                lit,
                format_args!("a cost must fit in a `u32` (at most {})", u32::MAX),
            );
            None
        }
    }
}

/// The handler: an `async fn` without `self`. Anything else is reported and
/// handed back as tokens, to be emitted unchanged.
fn check_handler(item: Item, errors: &mut Errors) -> Result<ItemFn, TokenStream> {
    let handler = match item {
        Item::Fn(handler) => handler,
        other => {
            let what = match &other {
                Item::Struct(item) => item.struct_token.span(),
                Item::Enum(item) => item.enum_token.span(),
                Item::Impl(item) => item.impl_token.span(),
                Item::Const(item) => item.const_token.span(),
                Item::Static(item) => item.static_token.span(),
                Item::Mod(item) => item.mod_token.span(),
                _ => Span::call_site(),
            };
            errors.at(what, "`#[tier_cost]` goes on an `async fn` handler");
            return Err(other.into_token_stream());
        }
    };
    // The attributes above this one are expanded already; those below are
    // still on the item.
    let repeated = handler.attrs.iter().filter(|attr| {
        attr.path()
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "tier_cost")
    });
    for attr in repeated {
        errors.spanned(
            attr,
            "`#[tier_cost]` specified more than once: a handler has one cost",
        );
    }
    let sig = &handler.sig;
    if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            "`#[tier_cost]` goes on an `async fn` handler; add `async`",
        );
    }
    if let Some(FnArg::Receiver(receiver)) = sig.inputs.first() {
        errors.spanned(
            receiver,
            "`#[tier_cost]` goes on a free `async fn` handler, not on a method with `self`",
        );
    }
    Ok(handler)
}

/// Merges `TierCostGuard<cost>` into the first argument (or makes it the
/// only one), so the arity stays and the guard runs first.
fn rewrite(cost: Cost, mut handler: ItemFn) -> ItemFn {
    let krate = krate::runtime();
    let cost = match cost {
        Cost::Lit(cost) => Literal::u32_unsuffixed(cost).into_token_stream(),
        // Braced: a const argument that is a path would be read as a type.
        Cost::Const(path) => quote!({ #path }),
    };
    let guard_ty = quote!(#krate::__private::TierCostGuard<#cost>);
    let guard = Ident::new("__trt_cost", Span::mixed_site());

    match handler.sig.inputs.first_mut() {
        Some(FnArg::Typed(first)) => {
            let (pat, ty) = (&first.pat, &first.ty);
            first.pat = parse_quote!((#guard, #pat));
            first.ty = parse_quote!((#guard_ty, #ty));
        }
        // `check_handler` refused receivers.
        Some(FnArg::Receiver(_)) => {}
        None => handler.sig.inputs.push(parse_quote!(#guard: #guard_ty)),
    }

    // The guard lives until the handler is done; the feature check fails
    // with a clear message when the runtime lacks `axum`.
    let require_axum = quote_spanned!(Span::call_site()=> #krate::__private::require_axum_feature!(););
    let prelude: Vec<syn::Stmt> = vec![parse_quote!(#require_axum), parse_quote!(let _ = &#guard;)];
    handler.block.stmts.splice(0..0, prelude);
    handler
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::ItemFn;

    use super::*;

    /// The expansion as a normalised string (this crate's tests see the
    /// runtime under its dev-dependency name, `trt`).
    fn expand_str(args: TokenStream, item: TokenStream) -> String {
        let item: Item = syn::parse2(item).unwrap();
        let expanded: ItemFn = syn::parse2(expand(args, item)).unwrap();
        quote!(#expanded).to_string()
    }

    fn expected(item: TokenStream) -> String {
        let item: ItemFn = syn::parse2(item).unwrap();
        quote!(#item).to_string()
    }

    #[test]
    fn merges_the_guard_into_the_first_argument() {
        let got = expand_str(
            quote!(5),
            quote! {
                /// Searches.
                #[debug_handler(state = App)]
                pub(crate) async fn search<B>(State(s): State<App>, Json(body): Json<B>) -> impl IntoResponse
                where
                    B: Send,
                {
                    body
                }
            },
        );
        let want = expected(quote! {
            /// Searches.
            #[debug_handler(state = App)]
            pub(crate) async fn search<B>(
                (__trt_cost, State(s)): (::trt::__private::TierCostGuard<5>, State<App>),
                Json(body): Json<B>
            ) -> impl IntoResponse
            where
                B: Send,
            {
                ::trt::__private::require_axum_feature!();
                let _ = &__trt_cost;
                body
            }
        });
        assert_eq!(got, want);
    }

    #[test]
    fn a_handler_without_arguments_gets_the_guard_alone() {
        let got = expand_str(
            quote!(4_294_967_295u32),
            quote!(
                async fn ping() -> &'static str {
                    "pong"
                }
            ),
        );
        let want = expected(quote! {
            async fn ping(__trt_cost: ::trt::__private::TierCostGuard<4294967295>) -> &'static str {
                ::trt::__private::require_axum_feature!();
                let _ = &__trt_cost;
                "pong"
            }
        });
        assert_eq!(got, want);
    }

    #[test]
    fn a_single_body_extractor_becomes_a_tuple_whose_last_element_is_the_body() {
        let got = expand_str(
            quote!(0),
            quote!(
                async fn echo(mut body: String) -> String {
                    body.push('!');
                    body
                }
            ),
        );
        let want = expected(quote! {
            async fn echo((__trt_cost, mut body): (::trt::__private::TierCostGuard<0>, String)) -> String {
                ::trt::__private::require_axum_feature!();
                let _ = &__trt_cost;
                body.push('!');
                body
            }
        });
        assert_eq!(got, want);
    }

    #[test]
    fn a_const_cost_is_a_braced_const_argument() {
        let got = expand_str(
            quote!(costs::SEARCH),
            quote!(
                async fn search(body: String) -> String {
                    body
                }
            ),
        );
        let want = expected(quote! {
            async fn search(
                (__trt_cost, body): (::trt::__private::TierCostGuard<{ costs::SEARCH }>, String)
            ) -> String {
                ::trt::__private::require_axum_feature!();
                let _ = &__trt_cost;
                body
            }
        });
        assert_eq!(got, want);
    }
}
