//! Shared helpers of the integration tests, and the reliability scenarios
//! that both the CI tests (small) and the release-mode examples (full size)
//! run; see `RELIABILITY.md`.

pub mod exactness;
pub mod flood;
pub mod heap;
pub mod http_load;
