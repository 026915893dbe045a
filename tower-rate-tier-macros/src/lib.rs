//! Procedural macros for `tower-rate-tier` (0.4, the successor of the 0.3
//! line on crates.io); use them through its re-exports
//! (`tower_rate_tier::{rate_tiers, tier_cost}`).
//!
//! Use them through the runtime crate's re-exports
//! (`tower_rate_tier::rate_tiers`, `tower_rate_tier::tier_cost`): the
//! expansions name that crate (found in your `Cargo.toml` even when the
//! dependency is renamed) and `::core` only.
//!
//! Every misuse is reported as a compile error on the offending tokens, all
//! independent mistakes of one item at once, and the item itself is still
//! emitted (without the macros' helper attributes) so that the rest of the
//! crate keeps compiling.

use proc_macro::TokenStream;

mod errors;
mod krate;
mod rate_tiers;
mod tier_cost;

/// Turns an enum of plans into a tier table.
///
/// ```ignore
/// use tower_rate_tier::{rate_tiers, Quota, RateTier};
///
/// #[rate_tiers]
/// pub enum Plan {
///     #[tier(per_hour = 100, default)]
///     Free,
///     #[tier(per_hour = 5_000, burst = 200)]
///     Pro,
///     #[tier(per_second = 10, per_day = 100_000, name = "team-plus")]
///     TeamPlus,
///     #[tier(unlimited)]
///     Enterprise,
/// }
///
/// assert_eq!(Plan::Pro.name(), "pro");
/// assert_eq!(Plan::Pro.quotas(), [Quota::per_hour(5_000).with_burst(200)]);
/// assert_eq!("team-plus".parse::<Plan>(), Ok(Plan::TeamPlus));
/// let tiers = RateTier::builder().tiers::<Plan>().build();
/// ```
///
/// # The `#[tier(..)]` attribute
///
/// Every variant is a unit variant with a `#[tier(..)]` attribute (its keys
/// may be split over several, which merge), whose keys are:
///
/// | key | meaning |
/// | --- | --- |
/// | `per_second = n`, `per_minute = n`, `per_hour = n`, `per_day = n`, `per_week = n` | a band: `n` requests per period (`n` a non-zero `u32`); several keys make a multi-band tier whose bands must all admit a request |
/// | `count = n, period_secs = s` | a band of `n` requests per `s` seconds (`s` from 1 to 18,446,744,073, about 584 years: a quota's period is counted in `u64` nanoseconds), for any other period; the two go together |
/// | `unlimited` | no limit (instead of bands) |
/// | `burst = n` | the burst of a one-band tier (default `n` of the band) |
/// | `concurrent = n` | at most `n` requests of one user in flight (`n` a non-zero `u32`; with `unlimited` too) |
/// | `name = ".."` | the tier's name (default: the variant in snake case, `TeamPlus` -> `team_plus`; 1 to 255 bytes) |
/// | `default` | the tier of unidentified clients (at most one variant) |
/// | `shadow` | the tier is dark-launched: decided and reported, never refused |
///
/// # Units besides requests
///
/// An attribute with `unit = "name"` gives the bands of a named unit
/// (tokens, bytes) instead, each in an attribute of its own, in any number
/// and alongside the tier's attribute:
///
/// ```ignore
/// #[rate_tiers]
/// pub enum Plan {
///     #[tier(per_minute = 20, concurrent = 2, default)]
///     #[tier(unit = "tokens", per_minute = 40_000, per_day = 1_000_000)]
///     #[tier(unit = "content-bytes", per_hour = 104_857_600)]
///     Free,
///     #[tier(unlimited)]
///     #[tier(unit = "tokens", per_minute = 1_000_000)]
///     Enterprise,
/// }
///
/// assert_eq!(
///     Plan::Free.tier_units(),
///     [
///         ("tokens", &[Quota::per_minute(40_000), Quota::per_day(1_000_000)][..]),
///         ("content-bytes", &[Quota::per_hour(104_857_600)][..]),
///     ]
/// );
/// ```
///
/// - A unit attribute takes the band keys: `per_second` .. `per_week`,
///   `count` with `period_secs`, and `burst` (one band only), with the same
///   rules as the tier's; it needs at least one band.
/// - The name is a string literal of 1 to 24 bytes: lowercase ASCII
///   letters, digits, `-` and `_`, starting with a letter. `requests`,
///   `concurrent-requests` and `concurrency` are reserved; a unit appears
///   once per variant, and two units of a variant whose ids (a 32-bit hash
///   of the name) collide are an error: rename one.
/// - `unlimited`, `concurrent`, `name`, `default` and `shadow` belong to
///   the tier's attribute, which a variant still needs (an `unlimited` tier
///   may limit its units).
///
/// A number is an integer literal or the path of a `const` of the right
/// type (`per_hour = limits::FREE_PER_HOUR`); a `const` that is zero, or a
/// `period_secs` longer than 18,446,744,073 seconds, is a compile error on
/// its path, like such a literal.
///
/// A long period refills continuously, as every quota does:
/// `count = 3_000, period_secs = 2_592_000` admits 3,000 requests at once,
/// then one more every 864 seconds; it is 30 days, not a calendar month.
///
/// ```ignore
/// mod limits {
///     pub const FREE_PER_HOUR: u32 = 100;
/// }
///
/// #[rate_tiers]
/// pub enum Plan {
///     #[tier(per_hour = limits::FREE_PER_HOUR)]
///     Free,
///     #[tier(per_second = 20, per_week = 500_000)]
///     Pro,
///     #[tier(count = 3_000, period_secs = 2_592_000)]
///     Monthly,
/// }
///
/// assert_eq!(Plan::Free.quotas(), [Quota::per_hour(100)]);
/// assert_eq!(
///     Plan::Monthly.quotas(),
///     [Quota::per_period(3_000, Duration::from_secs(30 * 86_400))]
/// );
/// ```
///
/// # What it generates
///
/// - the enum, with its attributes, doc comments and `#[cfg]`s kept and the
///   `#[tier]` attributes removed, deriving those of `Clone`, `Copy`,
///   `PartialEq`, `Eq`, `Hash` and `Debug` that its own `#[derive(..)]`
///   does not list (do not implement them by hand);
/// - with the enum's visibility: `const ALL: &'static [Self]` (declaration
///   order), `const fn name(self) -> &'static str` and
///   `const fn quotas(self) -> &'static [Quota]`;
/// - `Display` (the name; width and alignment are honoured), and `FromStr`
///   whose error, `tower_rate_tier::ParseTierError`, names the unknown name
///   and the known tiers;
/// - `tower_rate_tier::TierTable`, which `RateTierBuilder::tiers::<Plan>()`
///   (every tier, its units and the default) and
///   `TierIdentity::new(user, Plan::Pro)` take; with unit attributes, its
///   `tier_units` lists each tier's units with their bands.
#[proc_macro_attribute]
pub fn rate_tiers(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = syn::parse_macro_input!(item as syn::Item);
    rate_tiers::expand(args.into(), item).into()
}

/// Gives an axum handler a cost, charged by the router-wide
/// `TierLimitLayer` instead of the default 1.
///
/// ```ignore
/// use axum::{extract::State, Json};
/// use tower_rate_tier::tier_cost;
///
/// #[tier_cost(5)]
/// async fn search(State(app): State<App>, Json(q): Json<Query>) -> Json<Hits> {
///     /* .. */
/// }
/// ```
///
/// It takes one cost, an integer literal that fits a `u32` or the path of a
/// `u32` `const` (`#[tier_cost(costs::SEARCH)]`; 0 is a valid cost), and goes
/// once on an `async fn` that is not a method (no `self`). The expansion merges an extractor that
/// settles the charge into the handler's first argument, as a tuple
/// (`(__trt_cost, State(app)): (TierCostGuard<5>, State<App>)`), so the
/// handler keeps its arity (axum's limit of 16 extractors still holds) and
/// the charge runs before any other extractor. `get(search)` works as
/// before.
///
/// - Put `#[tier_cost]` above `#[debug_handler]`: `debug_handler` then
///   checks the rewritten signature. As the first argument is a tuple,
///   `debug_handler` cannot see a `State` inside it: name the state with
///   `#[debug_handler(state = App)]`.
/// - The function is meant to be routed, not called: a direct call must
///   pass the tuple, and the guard is not public API. Keep logic you want to
///   call directly in a plain function that the handler calls.
/// - It needs the runtime crate's `axum` feature (default); without it the
///   expansion is a compile error that says so.
#[proc_macro_attribute]
pub fn tier_cost(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = syn::parse_macro_input!(item as syn::Item);
    tier_cost::expand(args.into(), item).into()
}
