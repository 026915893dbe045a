//! The path of the runtime crate in the user's crate.

use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Span, TokenStream};
use quote::quote;

/// `::tower_rate_tier`, or `::<name>` when the user renamed the dependency.
///
/// Inside the runtime crate itself (its unit tests and doctests)
/// `proc-macro-crate` answers `Itself`; `::tower_rate_tier` then resolves in
/// doctests, and in the library with `extern crate self as tower_rate_tier;`.
/// When the manifest cannot be read (a build without Cargo), the plain name is
/// the best guess.
pub(crate) fn runtime() -> TokenStream {
    match crate_name("tower-rate-tier") {
        Ok(FoundCrate::Name(name)) => {
            let ident = syn::Ident::new(&name, Span::call_site());
            quote!(::#ident)
        }
        Ok(FoundCrate::Itself) | Err(_) => quote!(::tower_rate_tier),
    }
}
