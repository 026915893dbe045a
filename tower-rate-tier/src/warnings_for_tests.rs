//! Test support: a `tracing` subscriber that counts the warnings one module
//! logs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata};

/// Counts the `WARN` events of the module `module` (a `module_path!()`).
pub(crate) struct Warnings {
    count: Arc<AtomicUsize>,
    module: &'static str,
}

impl Warnings {
    /// A subscriber counting the warnings of `module`, and its count.
    pub(crate) fn of(module: &'static str) -> (Self, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        (
            Warnings {
                count: count.clone(),
                module,
            },
            count,
        )
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        if *meta.level() == Level::WARN && meta.module_path() == Some(self.module) {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
