//! Test support: a `tracing` subscriber that counts the warnings one module
//! logs, and a way to install a subscriber for one test thread that other
//! test threads cannot blind.

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

/// A subscriber installed as this thread's default, for as long as the
/// guard lives.
///
/// `tracing` caches each callsite's interest process-wide, computed when the
/// callsite is first hit; while at most one dispatcher is registered, it asks
/// only the registering thread's default. A test thread without a subscriber
/// that hits a callsite first would then cache "never" for every thread, and
/// the capturing test would miss its events (tests run in parallel). A
/// second, inert dispatcher kept registered for the guard's lifetime makes
/// `tracing` ask every registered dispatcher, the capturing one included;
/// the interest of the callsites registered already is rebuilt the same way.
pub(crate) struct Scoped {
    _default: tracing::subscriber::DefaultGuard,
    _anchor: tracing::Dispatch,
}

/// Installs `subscriber` for this thread; see [`Scoped`].
pub(crate) fn scoped(subscriber: impl tracing::Subscriber + Send + Sync + 'static) -> Scoped {
    // interested in nothing; registered only so that `tracing` asks every
    // dispatcher about a callsite
    let anchor = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::new());
    let default = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    Scoped {
        _default: default,
        _anchor: anchor,
    }
}
