//! `#[rate_tiers]`: parse ([`ast`]), validate ([`valid`]), generate
//! ([`expand`]).

mod ast;
mod bands;
mod expand;
mod keys;
mod number;
mod unit;
mod valid;

pub(crate) use expand::expand;
