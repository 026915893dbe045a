//! [`StorageError`]: why a storage could not decide.

use std::fmt;
use std::sync::Arc;

/// A storage failure: unreachable, timed out, full, or a bad reply.
///
/// Its `Display` says what was attempted; [`std::error::Error::source`]
/// gives the backend's own error where there is one (the `redis` crate's
/// error for the Redis storage).
#[derive(Debug, Clone)]
pub struct StorageError {
    kind: StorageErrorKind,
    message: Arc<str>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// What kind of failure a [`StorageError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StorageErrorKind {
    /// The backend did not answer within its timeout.
    Timeout,
    /// The backend could not be reached.
    Unavailable,
    /// The storage tracks as many keys as it may; a new key was refused.
    /// (The memory storage never answers it: at its cap it decides new keys
    /// in a shared overflow bucket, see
    /// [`MemoryStorage`](crate::storage::MemoryStorage).)
    Full,
    /// Anything else (a bad reply, a refused command, ...).
    Other,
}

impl StorageError {
    /// A new error of `kind`.
    pub fn new(kind: StorageErrorKind, message: impl Into<Arc<str>>) -> Self {
        StorageError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A new error of `kind`, caused by `source`.
    pub fn with_source(
        kind: StorageErrorKind,
        message: impl Into<Arc<str>>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StorageError {
            kind,
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> StorageErrorKind {
        self.kind
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            StorageErrorKind::Timeout => "timed out",
            StorageErrorKind::Unavailable => "unavailable",
            StorageErrorKind::Full => "full",
            StorageErrorKind::Other => "failed",
        };
        write!(f, "rate-limit storage {kind}: {}", self.message)
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
