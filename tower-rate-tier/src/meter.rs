//! [`ContentMeter`]: the bytes of content a response body carried, counted
//! as its data frames are polled and charged once to the unit
//! `content-bytes` of the request's tier when the body ends or is dropped,
//! to its [`UsageSink`] (the request's charge, which knows the user and tier).
//!
//! Nothing is buffered and nothing is waited for: a frame passes as soon
//! as it is counted, so a streamed body is never slowed. The count is of
//! the data frames the limiter's caller read: `Content-Length` and the
//! body's size hint are never trusted, a body dropped half-way counts what
//! was read, and a body never read (a HEAD response, a client gone) counts
//! nothing.

use std::fmt;
use std::sync::Arc;

/// Where the bytes counted go: the request's charge.
pub(crate) trait UsageSink: Send + Sync {
    /// Charges `bytes` of content to the unit `content-bytes`, without
    /// waiting.
    fn content_bytes(&self, bytes: u64);
}

/// The bytes of one response body, charged when it is dropped.
pub(crate) struct ContentMeter {
    sink: Arc<dyn UsageSink>,
    counted: u64,
}

impl ContentMeter {
    pub(crate) fn new(sink: Arc<dyn UsageSink>) -> Self {
        ContentMeter { sink, counted: 0 }
    }

    /// Counts a data frame of `len` bytes.
    #[inline]
    pub(crate) fn count(&mut self, len: usize) {
        self.counted = self.counted.saturating_add(len as u64);
    }
}

impl Drop for ContentMeter {
    /// Charges what was counted (0 for a body never read, which settles a
    /// handler's reservation of the unit, if any).
    fn drop(&mut self) {
        self.sink.content_bytes(self.counted);
    }
}

impl fmt::Debug for ContentMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContentMeter")
            .field("counted", &self.counted)
            .finish_non_exhaustive()
    }
}
