//! Shared helpers of the integration tests, and the reliability scenarios
//! that both the CI tests (small) and the release-mode examples (full size)
//! run; see `RELIABILITY.md`. [`redis`] starts real `redis-server`
//! processes for the Redis tests.

pub mod bodies;
pub mod exactness;
pub mod fields;
pub mod flaky;
pub mod flood;
pub mod heap;
pub mod http_load;
pub mod redis;
pub mod reply;
pub mod storage_ops;
pub mod units;

pub use storage_ops::StorageOps;
