//! Live heap bytes and open file descriptors.
//!
//! A binary that measures the heap installs the counting allocator of
//! [`stats_alloc`] (it counts the bytes each allocation asks for, not what
//! the system allocator rounds them up to, and never memory that stays
//! resident after a free):
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;
//!
//! fn main() {
//!     let before = tower_rate_tier_tests::heap::live_bytes();
//!     let held = vec![0u8; 4096];
//!     assert!(tower_rate_tier_tests::heap::live_bytes() >= before + 4096);
//!     drop(held);
//! }
//! ```

use stats_alloc::INSTRUMENTED_SYSTEM;

/// Bytes allocated and not yet freed, process-wide.
///
/// # Panics
///
/// When the binary did not install the counting allocator (nothing would be
/// measured).
pub fn live_bytes() -> usize {
    let stats = INSTRUMENTED_SYSTEM.stats();
    assert!(
        stats.allocations > 0,
        "install stats_alloc::INSTRUMENTED_SYSTEM as the #[global_allocator] of this binary"
    );
    stats.bytes_allocated.saturating_sub(stats.bytes_deallocated)
}

/// `after - before` as a signed number of bytes.
pub fn delta(before: usize, after: usize) -> i64 {
    i64::try_from(after).unwrap_or(i64::MAX) - i64::try_from(before).unwrap_or(i64::MAX)
}

/// The number of open file descriptors of this process (`/proc/self/fd`).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count())
}

/// Waits (at most `limit`) until the open file descriptor count has not
/// changed for 200 ms, and returns it: closed connections take a few
/// scheduler turns to be dropped.
pub async fn settled_fds(limit: std::time::Duration) -> usize {
    let start = std::time::Instant::now();
    let mut last = open_fds();
    let mut stable_since = std::time::Instant::now();
    while start.elapsed() < limit {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let now = open_fds();
        if now != last {
            last = now;
            stable_since = std::time::Instant::now();
        } else if stable_since.elapsed() >= std::time::Duration::from_millis(200) {
            break;
        }
    }
    last
}
