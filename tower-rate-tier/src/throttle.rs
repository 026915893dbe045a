//! [`Throttle`]: a warning written at most once per 10 s, with the number of
//! occurrences not written since.

use std::sync::atomic::{AtomicU64, Ordering};

/// A warning is written at most once per this many ms.
const WARN_EVERY_MS: u64 = 10_000;

/// One kind of warning, written at most once per [`WARN_EVERY_MS`].
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    /// When it was last written, in the caller's ms plus one (0: never).
    last: AtomicU64,
    /// Occurrences not written since.
    skipped: AtomicU64,
}

impl Throttle {
    /// `Some(skipped)` when the warning is to be written now (with the
    /// number of occurrences not written since the last one), else `None`.
    pub(crate) fn due(&self, now_ms: u64) -> Option<u64> {
        let now = now_ms.saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= WARN_EVERY_MS)
            && self
                .last
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.skipped.swap(0, Ordering::Relaxed));
        }
        self.skipped.fetch_add(1, Ordering::Relaxed);
        None
    }
}
