//! `#[rate_tiers]`: parse ([`ast`]), validate ([`valid`]), generate
//! ([`expand`], with the checks of `const`s in [`checks`]).

mod ast;
mod bands;
mod checks;
mod expand;
mod keys;
mod number;
mod unit;
mod valid;

pub(crate) use expand::expand;
