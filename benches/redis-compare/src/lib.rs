//! Nothing here: the benchmark is `benches/redis_compare.rs`
//! (`cargo bench -p redis-compare`).
