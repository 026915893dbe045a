//! Procedural macros for [`tower-rate-tier`](https://docs.rs/tower-rate-tier).
//!
//! Use them through the runtime crate's re-exports
//! (`tower_rate_tier::rate_tiers`, `tower_rate_tier::tier_cost`).
