//! Procedural macros for [`tower-rate-tier`](https://docs.rs/tower-rate-tier).
//!
//! Use them through the runtime crate's re-exports
//! (`tower_rate_tier::rate_tiers`, `tower_rate_tier::tier_cost`).

use proc_macro::TokenStream;

/// Turns an enum of plans into a checked tier table (placeholder: being built).
#[proc_macro_attribute]
pub fn rate_tiers(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
